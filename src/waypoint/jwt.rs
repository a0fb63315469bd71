//! RequestAuthentications with `targetRefs` -> a waypoint HTTP chain's `jwt_authn` filter
//! (istio/istio `pilot/pkg/security/authn/`), as istiod builds it (`pilot/pkg/security/authn/policy_applier.go`
//! `convertToEnvoyJwtConfig`), and the RBAC principals that read what it verified
//! (`pilot/pkg/security/authz/model/generator.go`, `util.go`).
//!
//! - The rules of every attached RequestAuthentication (oldest first) are sorted by issuer and
//!   become providers `origins-<i>`.
//! - The requirement lets a request with no token through to RBAC, which decides, and rejects
//!   one with an invalid token with 401: `requires_any [origins-0, allow_missing]` for one
//!   provider; for several, any provider alone, or all of `requires_any [origins-i,
//!   allow_missing]` together (so a token must be valid for the provider whose location it is
//!   in).
//! - Each provider writes the verified payload into the dynamic metadata
//!   `envoy.filters.http.jwt_authn` under `payload`; RBAC's `metadata` principals match there.
//! - Keys are inline (`local_jwks`), as istiod sends them by default: the rule's `jwks`, else
//!   the key set ambientd fetched (`kube::jwks`) from its `jwksUri` (or the issuer's OpenID
//!   discovery). Until a fetch has succeeded, the provider gets [`PUBLIC_ONLY_JWKS`], a key
//!   whose private half was never kept: every token fails, closed, as istiod does. So does a
//!   key set Envoy would refuse (`key_set`), which would otherwise fail the whole listener.

use std::collections::BTreeMap;

use crate::discovery::Snapshot;
use crate::discovery::model::{JwtRule, RequestAuthentication};
use crate::pb::envoy::config::core::v3::{DataSource, data_source};
use crate::pb::envoy::config::rbac::v3 as rbac;
use crate::pb::envoy::config::route::v3::{RouteMatch, route_match};
use crate::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    self as jwt, JwtAuthentication, JwtProvider, JwtRequirement, RequirementRule,
    jwt_requirement::RequiresType,
};
use crate::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, StringMatcher, ValueMatcher, list_matcher,
    metadata_matcher, value_matcher,
};
use crate::pb::google::protobuf::Empty;
use crate::waypoint::envoy::{exact, prefix_match, regex_match, suffix_match};
use crate::waypoint::key_set::check_key_set;

/// The filter's name, which is also the dynamic-metadata namespace of what it verified.
pub(crate) const JWT_AUTHN: &str = "envoy.filters.http.jwt_authn";
/// The metadata key each provider writes the verified payload under.
pub(crate) const PAYLOAD: &str = "payload";

/// A JWKS holding one RSA public key whose private key was discarded when it was made (never
/// written anywhere): no token verifies against it. Inlined for a `jwksUri` not yet (or never)
/// fetched, so that requests with a token fail closed (istiod's `PublicOnlyJwks`).
pub(crate) const PUBLIC_ONLY_JWKS: &str = r#"{"keys":[{"kty":"RSA","e":"AQAB","n":"01kA6YazNqjp1JUPBpWJJKe76yW5GUX6NbdzrhME3S7ElKBEq9zhGZBqKi1G2JLiCMFWB9rK9SKnlv8O6Qt__vtwvt82WEWN1slK4k41OPyHKBfSkYdr45BjTVzKORvBwablDQQKUt5qPqp0KNFvfDWX95J6lgVTLE6Gockcw36EX5b1_iCcjAkU7yzaDGDHG3W9dhH0d5UDaTQWffpvVK6w-h2ugeUig7xONo7JbZHeC_jQgLtkg_79tvODohsnEPmtl6vvQYE6f9NEF0qUhru4srnTGzDA0QjxBbXdXT4NqjvRLEVb5FIijMKMnGA6geqp5K1nXRn0ZQd84k_ldw"}]}"#;

/// Claims Envoy splits on spaces before matching (istiod always adds these two).
const SPACE_DELIMITED: [&str; 2] = ["permission", "scope"];

/// The `jwt_authn` config for the RequestAuthentications attached to one chain, or `None`
/// when they have no rule (no filter).
pub(crate) fn jwt_authn<'a>(
    authentications: impl Iterator<Item = &'a RequestAuthentication>,
    snapshot: &Snapshot,
) -> Option<JwtAuthentication> {
    let mut rules: Vec<&JwtRule> = authentications.flat_map(|ra| &ra.jwt_rules).collect();
    if rules.is_empty() {
        return None;
    }
    // Stable: rules of one issuer keep the age order of their policies.
    rules.sort_by(|a, b| a.issuer.cmp(&b.issuer));
    let mut providers = BTreeMap::new();
    let mut each = Vec::new();
    let mut any_of = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let name = format!("origins-{i}");
        providers.insert(name.clone(), provider(rule, snapshot));
        each.push(requires_any(vec![
            provider_named(&name),
            requirement(RequiresType::AllowMissing(Empty {})),
        ]));
        any_of.push(provider_named(&name));
    }
    let requires = if each.len() == 1 {
        each.remove(0)
    } else {
        any_of.push(requirement(RequiresType::RequiresAll(
            jwt::JwtRequirementAndList { requirements: each },
        )));
        requires_any(any_of)
    };
    Some(JwtAuthentication {
        providers,
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(jwt::requirement_rule::RequirementType::Requires(requires)),
        }],
        bypass_cors_preflight: true,
    })
}

fn provider(rule: &JwtRule, snapshot: &Snapshot) -> JwtProvider {
    let keys = if !rule.jwks.is_empty() {
        Some(rule.jwks.as_str())
    } else {
        rule.jwks_source()
            .and_then(|source| snapshot.key_set(&source.key()))
            .map(|fetched| fetched.keys.as_str())
    };
    // Both sources are checked before they get here (the decoder, the fetcher); a key set
    // Envoy would refuse must still never reach a listener, which Envoy would refuse whole.
    let jwks = keys
        .filter(|keys| check_key_set(keys).is_ok())
        .unwrap_or(PUBLIC_ONLY_JWKS)
        .to_string();
    let mut space_delimited: Vec<String> = rule.space_delimited_claims.clone();
    space_delimited.extend(SPACE_DELIMITED.iter().map(|c| c.to_string()));
    space_delimited.sort();
    space_delimited.dedup();
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        jwks_source_specifier: Some(jwt::jwt_provider::JwksSourceSpecifier::LocalJwks(
            DataSource {
                specifier: Some(data_source::Specifier::InlineString(jwks)),
            },
        )),
        forward: rule.forward_original_token,
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| jwt::JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: PAYLOAD.into(),
        normalize_payload_in_metadata: Some(jwt::jwt_provider::NormalizePayload {
            space_delimited_claims: space_delimited,
        }),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| jwt::JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
            })
            .collect(),
        // A waypoint's routes may match on what the filter adds (istiod sets this for every
        // proxy but a sidecar).
        clear_route_cache: true,
    }
}

fn requirement(requires: RequiresType) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(requires),
    }
}

fn provider_named(name: &str) -> JwtRequirement {
    requirement(RequiresType::ProviderName(name.into()))
}

fn requires_any(requirements: Vec<JwtRequirement>) -> JwtRequirement {
    requirement(RequiresType::RequiresAny(jwt::JwtRequirementOrList {
        requirements,
    }))
}

/// `requestPrincipals` / `request.auth.principal` values (`<iss>/<sub>`, split at the last
/// `/`, with istiod's wildcards): any of them, each an AND of the verified `iss` and `sub`.
pub(crate) fn request_principals(values: &[String]) -> rbac::Principal {
    let any = || regex_match(".+");
    let mut each: Vec<rbac::Principal> = values
        .iter()
        .map(|value| {
            let split = value.rfind('/');
            let (iss, sub) = match split {
                Some(at) => (&value[..at], &value[at + 1..]),
                None => (value.as_str(), ""),
            };
            let (iss, sub) = if value == "*" {
                (any(), any())
            } else if let Some(rest) = value.strip_prefix('*') {
                match split {
                    Some(_) if iss == "*" => (any(), exact(sub)),
                    Some(_) => (suffix_match(&iss[1..]), exact(sub)),
                    None => (any(), suffix_match(rest)),
                }
            } else if let Some(rest) = value.strip_suffix('*') {
                match split {
                    Some(_) if sub == "*" => (exact(iss), any()),
                    Some(_) => (exact(iss), prefix_match(&sub[..sub.len() - 1])),
                    None => (prefix_match(rest), any()),
                }
            } else {
                (exact(iss), exact(sub))
            };
            and_ids(vec![
                metadata_principal(claim_string("iss", iss)),
                metadata_principal(claim_string("sub", sub)),
            ])
        })
        .collect();
    if each.len() == 1 {
        each.remove(0)
    } else {
        principal_of(rbac::principal::Identifier::OrIds(rbac::principal::Set {
            ids: each,
        }))
    }
}

/// A claim (by its path of names: `aud`, `azp`, or `request.auth.claims[a][b]`'s names) that
/// equals one of `values` or, for a list claim, has one of them as an item.
pub(crate) fn claim_principal(claims: &[&str], values: &[String]) -> rbac::Principal {
    let mut any_of: Vec<ValueMatcher> = values
        .iter()
        .map(|v| string_value(wildcard_value(v)))
        .collect();
    let value = if any_of.len() == 1 {
        any_of.remove(0)
    } else {
        or_values(any_of)
    };
    let in_list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(value.clone()))),
            },
        ))),
    };
    let mut path = vec![PAYLOAD];
    path.extend_from_slice(claims);
    metadata_principal(MetadataMatcher {
        filter: JWT_AUTHN.into(),
        path: path.into_iter().map(segment).collect(),
        value: Some(or_values(vec![in_list, value])),
    })
}

/// `request.auth.claims[a][b]`'s names (`a`, `b`), as istiod's `extractNameInNestedBrackets`
/// reads them; `None` when malformed or a name is empty. Shared with the policy status.
pub(crate) use crate::discovery::convert::waypoint_authorization::claim_names;

/// Istio's wildcard strings for JWT values: `*` any, `x*` prefix, `*x` suffix, else exact.
fn wildcard_value(value: &str) -> StringMatcher {
    if value == "*" {
        regex_match(".+")
    } else if let Some(rest) = value.strip_prefix('*') {
        suffix_match(rest)
    } else if let Some(rest) = value.strip_suffix('*') {
        prefix_match(rest)
    } else {
        exact(value)
    }
}

/// The verified claim `claim` matched as a string.
fn claim_string(claim: &str, matcher: StringMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: JWT_AUTHN.into(),
        path: vec![segment(PAYLOAD), segment(claim)],
        value: Some(string_value(matcher)),
    }
}

fn segment(key: &str) -> metadata_matcher::PathSegment {
    metadata_matcher::PathSegment {
        segment: Some(metadata_matcher::path_segment::Segment::Key(key.into())),
    }
}

fn string_value(matcher: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(matcher)),
    }
}

fn or_values(value_matchers: Vec<ValueMatcher>) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers,
        })),
    }
}

fn metadata_principal(matcher: MetadataMatcher) -> rbac::Principal {
    principal_of(rbac::principal::Identifier::Metadata(matcher))
}

fn and_ids(ids: Vec<rbac::Principal>) -> rbac::Principal {
    principal_of(rbac::principal::Identifier::AndIds(rbac::principal::Set {
        ids,
    }))
}

fn principal_of(identifier: rbac::principal::Identifier) -> rbac::Principal {
    rbac::Principal {
        identifier: Some(identifier),
    }
}

#[cfg(test)]
mod tests;
