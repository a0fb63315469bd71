//! Mesh `discoverySelectors`: namespace label selectors that limit what ambientd reads.
//!
//! A namespace is *selected* when any selector matches its labels; with no selectors every
//! namespace is. Objects of namespaced kinds outside the selected namespaces are dropped as
//! they are read (istiod's `DiscoveryNamespacesFilter`); Namespaces themselves and
//! cluster-scoped kinds are always read.
//!
//! Selectors come in the two forms Kubernetes uses:
//! - text, as `kubectl -l` takes it: `istio-discovery=enabled,env in (prod,staging),!legacy`
//!   (`--discovery-selectors`; requirements joined by `,` must all hold);
//! - YAML, as in a mesh config's `discoverySelectors:` list of `matchLabels` /
//!   `matchExpressions` (`--mesh-config`).

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::discovery::model::Labels;
use crate::discovery::model::visibility::{ServiceEntryVisibility, Visibility, VisibilityPolicy};
use crate::kube::mesh::RawLabelSelector as RawNamespaceSelector;

/// One requirement on one label key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// The label is present with one of the values (`k=v`, `k==v`, `k in (a,b)`).
    In(String, Vec<String>),
    /// The label is absent or has none of the values (`k!=v`, `k notin (a,b)`).
    NotIn(String, Vec<String>),
    /// The label is present (`k`).
    Exists(String),
    /// The label is absent (`!k`).
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Requirement::In(key, values) => labels
                .get(key)
                .is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(key, values) => labels
                .get(key)
                .is_none_or(|v| !values.iter().any(|x| x == v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        }
    }
}

/// A label selector: every requirement must hold. No requirements selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl FromStr for LabelSelector {
    type Err = String;

    /// Parses kubectl's selector syntax.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                if text.trim().is_empty() {
                    continue;
                }
                return Err(format!("{text:?}: empty requirement"));
            }
            requirements.push(parse_requirement(part).map_err(|e| format!("{part:?}: {e}"))?);
        }
        Ok(LabelSelector { requirements })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str("{}");
        }
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r {
                Requirement::In(k, v) if v.len() == 1 => format!("{k}={}", v[0]),
                Requirement::In(k, v) => format!("{k} in ({})", v.join(",")),
                Requirement::NotIn(k, v) if v.len() == 1 => format!("{k}!={}", v[0]),
                Requirement::NotIn(k, v) => format!("{k} notin ({})", v.join(",")),
                Requirement::Exists(k) => k.clone(),
                Requirement::DoesNotExist(k) => format!("!{k}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("{text:?}: unbalanced ')'"))?;
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: unbalanced '('"));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim())?));
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = part.split_once(op) {
            let key = key_of(key.trim())?;
            let value = value_of(value.trim())?;
            return Ok(if negate {
                Requirement::NotIn(key, vec![value])
            } else {
                Requirement::In(key, vec![value])
            });
        }
    }
    if let Some(open) = part.find('(') {
        let close = part
            .rfind(')')
            .filter(|close| *close > open && part[close + 1..].trim().is_empty())
            .ok_or("a value set must end with ')'")?;
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let [key, op] = head[..] else {
            return Err("expected `key in (values)` or `key notin (values)`".into());
        };
        let key = key_of(key)?;
        let values = part[open + 1..close]
            .split(',')
            .map(|v| value_of(v.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        return match op {
            "in" => Ok(Requirement::In(key, values)),
            "notin" => Ok(Requirement::NotIn(key, values)),
            other => Err(format!("unknown operator {other:?} (in, notin)")),
        };
    }
    Ok(Requirement::Exists(key_of(part)?))
}

fn key_of(key: &str) -> Result<String, String> {
    let valid = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(key.to_string())
    } else {
        Err(format!("{key:?} is not a label key"))
    }
}

fn value_of(value: &str) -> Result<String, String> {
    let valid = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(value.to_string())
    } else {
        Err(format!("{value:?} is not a label value"))
    }
}

/// The mesh's discovery selectors. Empty selects every namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoverySelectors(pub Vec<LabelSelector>);

impl DiscoverySelectors {
    /// Whether a namespace with these labels is selected.
    pub fn selects(&self, labels: &Labels) -> bool {
        self.0.is_empty() || self.0.iter().any(|s| s.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses selectors in kubectl's text syntax, one per entry.
    pub fn parse_all<S: AsRef<str>>(texts: &[S]) -> Result<Self, String> {
        texts
            .iter()
            .map(|t| t.as_ref().parse())
            .collect::<Result<Vec<_>, _>>()
            .map(DiscoverySelectors)
    }

    /// Reads `discoverySelectors` from a mesh config document (istiod's `mesh` file, the
    /// `mesh` key of the `istio` ConfigMap).
    pub fn from_mesh_config(yaml: &str) -> Result<Self, String> {
        Ok(MeshSettings::parse(yaml)?.discovery_selectors)
    }
}

/// What ambientd reads from a mesh config document (istiod's `mesh` file, the `mesh` key of
/// the `istio` ConfigMap). Other fields are ignored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeshSettings {
    pub discovery_selectors: DiscoverySelectors,
    /// `rootNamespace`: where policies apply mesh-wide.
    pub root_namespace: Option<String>,
    /// `trustDomain`.
    pub trust_domain: Option<String>,
    /// `serviceEntryVisibility`; `None` when absent (the feature is then inert).
    pub service_entry_visibility: Option<ServiceEntryVisibility>,
}

impl MeshSettings {
    pub fn parse(yaml: &str) -> Result<Self, String> {
        let options = serde_saphyr::options! { strict_booleans: true };
        let mesh: Option<MeshConfig> = serde_saphyr::from_str_with_options(yaml, options)
            .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())?;
        let mesh = mesh.unwrap_or_default();
        let non_empty = |value: Option<String>| value.filter(|v| !v.is_empty());
        let mut selectors = Vec::new();
        for (i, raw) in mesh.discovery_selectors.into_iter().enumerate() {
            // A null entry selects nothing, as in istiod.
            let Some(raw) = raw else { continue };
            selectors.push(
                raw.into_selector()
                    .map_err(|e| format!("discoverySelectors[{i}]: {e}"))?,
            );
        }
        let service_entry_visibility = mesh
            .service_entry_visibility
            .map(RawVisibility::compile)
            .transpose()
            .map_err(|e| format!("serviceEntryVisibility.{e}"))?;
        Ok(MeshSettings {
            discovery_selectors: DiscoverySelectors(selectors),
            root_namespace: non_empty(mesh.root_namespace),
            trust_domain: non_empty(mesh.trust_domain),
            service_entry_visibility,
        })
    }
}

/// `serviceEntryVisibility` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawVisibility {
    default_visibility: Option<String>,
    policies: Vec<RawVisibilityPolicy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawVisibilityPolicy {
    visibility: Option<String>,
    matching_rules: Vec<RawMatchRule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawMatchRule {
    namespace_selector: Option<RawNamespaceSelector>,
}

impl RawVisibility {
    /// An unknown visibility name is an error (istiod rejects the mesh config). A rule without
    /// a `namespaceSelector` (a matcher this version does not know), or with one Kubernetes
    /// rejects, never matches, as in istiod: a malformed rule fails closed.
    fn compile(self) -> Result<ServiceEntryVisibility, String> {
        let visibility = |text: Option<String>| Visibility::parse(text.as_deref().unwrap_or(""));
        let default =
            visibility(self.default_visibility).map_err(|e| format!("defaultVisibility: {e}"))?;
        let policies = self
            .policies
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                Ok(VisibilityPolicy {
                    visibility: visibility(p.visibility)
                        .map_err(|e| format!("policies[{i}].visibility: {e}"))?,
                    rules: p
                        .matching_rules
                        .iter()
                        .enumerate()
                        .map(|(j, rule)| {
                            crate::kube::mesh::namespace_selector(
                                rule.namespace_selector.as_ref(),
                                &format!(
                                    "serviceEntryVisibility.policies[{i}].matchingRules[{j}].namespaceSelector"
                                ),
                            )
                        })
                        .collect(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(ServiceEntryVisibility { default, policies })
    }
}

impl fmt::Display for DiscoverySelectors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("all namespaces");
        }
        let parts: Vec<String> = self.0.iter().map(|s| format!("[{s}]")).collect();
        f.write_str(&parts.join(" or "))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MeshConfig {
    discovery_selectors: Vec<Option<RawLabelSelector>>,
    root_namespace: Option<String>,
    trust_domain: Option<String>,
    service_entry_visibility: Option<RawVisibility>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawLabelSelector {
    match_labels: Option<std::collections::BTreeMap<String, String>>,
    match_expressions: Option<Vec<RawExpression>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawExpression {
    key: String,
    operator: String,
    values: Option<Vec<String>>,
}

impl RawLabelSelector {
    fn into_selector(self) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        for (key, value) in self.match_labels.unwrap_or_default() {
            requirements.push(Requirement::In(key_of(&key)?, vec![value_of(&value)?]));
        }
        for (i, expr) in self
            .match_expressions
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let key = key_of(&expr.key).map_err(|e| format!("matchExpressions[{i}]: {e}"))?;
            let values = expr.values.unwrap_or_default();
            requirements.push(match expr.operator.as_str() {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => {
                    return Err(format!(
                        "matchExpressions[{i}]: {other:?} is not In, NotIn, Exists or DoesNotExist"
                    ));
                }
            });
        }
        Ok(LabelSelector { requirements })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn text_selectors_parse_and_match_as_kubectl_does() {
        let s: LabelSelector = "istio-discovery=enabled,env in (prod, staging),!legacy,team"
            .parse()
            .unwrap();
        assert_eq!(s.requirements.len(), 4);
        let good = labels(&[
            ("istio-discovery", "enabled"),
            ("env", "prod"),
            ("team", "a"),
        ]);
        assert!(s.matches(&good));
        let mut legacy = good.clone();
        legacy.insert("legacy", "");
        assert!(!s.matches(&legacy));
        assert!(!s.matches(&labels(&[
            ("istio-discovery", "enabled"),
            ("env", "dev"),
            ("team", "a")
        ])));

        let not: LabelSelector = "env!=prod,tier notin (db)".parse().unwrap();
        assert!(
            not.matches(&labels(&[])),
            "absent labels satisfy != and notin"
        );
        assert!(!not.matches(&labels(&[("env", "prod")])));
        assert!(!not.matches(&labels(&[("tier", "db")])));
        assert_eq!(
            not.to_string(),
            "env!=prod,tier!=db",
            "one-value sets print as !="
        );

        let everything: LabelSelector = "".parse().unwrap();
        assert!(everything.matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn bad_text_selectors_are_errors() {
        for bad in ["a in (b", "a b (c)", "=x", "a=b=c d", "a,,b", "a in (b)) "] {
            assert!(bad.parse::<LabelSelector>().is_err(), "{bad}");
        }
    }

    #[test]
    fn service_entry_visibility_is_read_with_go_selector_semantics() {
        use crate::discovery::model::NamespaceSelector;
        use crate::discovery::model::visibility::Visibility;
        let mesh = MeshSettings::parse(
            "serviceEntryVisibility:\n\
             \x20 defaultVisibility: NAMESPACE\n\
             \x20 applyToSidecars: true\n\
             \x20 policies:\n\
             \x20 - visibility: PUBLIC\n\
             \x20   matchingRules:\n\
             \x20   - namespaceSelector: {matchLabels: {trusted: 'true'}}\n\
             \x20   - namespaceSelector: {matchExpressions: [{key: env, operator: Exists}]}\n\
             \x20 - visibility: NONE\n\
             \x20   matchingRules:\n\
             \x20   - {}\n\
             \x20   - namespaceSelector: {matchExpressions: [{key: a, operator: Bogus}]}\n\
             \x20 - visibility: PUBLIC\n",
        )
        .unwrap();
        let visibility = mesh.service_entry_visibility.unwrap();
        assert_eq!(visibility.default, Visibility::Namespace);
        let [trusted, none, catch_all] = &visibility.policies[..] else {
            panic!("three policies: {:?}", visibility.policies);
        };
        assert_eq!(trusted.visibility, Visibility::Public);
        assert_eq!(trusted.rules.len(), 2);
        assert!(trusted.rules[0].matches(&labels(&[("trusted", "true")])));
        assert!(trusted.rules[1].matches(&labels(&[("env", "x")])));
        // A rule without a namespaceSelector, and one Kubernetes rejects, never match.
        assert_eq!(none.visibility, Visibility::None);
        assert_eq!(
            none.rules,
            [NamespaceSelector::Nothing, NamespaceSelector::Nothing]
        );
        // No rules: matches every namespace.
        assert!(catch_all.rules.is_empty());
        assert_eq!(visibility.resolve(None), Visibility::Public);
        // Absent: not configured. Present but empty: configured, everything PUBLIC.
        assert_eq!(
            MeshSettings::parse("{}").unwrap().service_entry_visibility,
            None
        );
        let empty = MeshSettings::parse("serviceEntryVisibility: {}\n").unwrap();
        assert_eq!(
            empty.service_entry_visibility.unwrap().resolve(None),
            Visibility::Public
        );
    }

    #[test]
    fn mesh_config_selectors_or_together() {
        let selectors = DiscoverySelectors::from_mesh_config(
            "defaultConfig: {discoveryAddress: istiod:15012}\ndiscoverySelectors:\n- matchLabels: {istio-discovery: enabled}\n- matchExpressions:\n  - {key: env, operator: In, values: [prod]}\n  - {key: legacy, operator: DoesNotExist}\n",
        )
        .unwrap();
        assert_eq!(selectors.0.len(), 2);
        assert!(selectors.selects(&labels(&[("istio-discovery", "enabled")])));
        assert!(selectors.selects(&labels(&[("env", "prod")])));
        assert!(!selectors.selects(&labels(&[("env", "prod"), ("legacy", "x")])));
        assert!(!selectors.selects(&labels(&[])));

        let none = DiscoverySelectors::from_mesh_config("trustDomain: x\n").unwrap();
        assert!(none.is_empty() && none.selects(&labels(&[])));
        let error = DiscoverySelectors::from_mesh_config(
            "discoverySelectors:\n- matchExpressions: [{key: a, operator: Maybe}]\n",
        )
        .unwrap_err();
        assert!(error.contains("discoverySelectors[0]"), "{error}");
    }
}
