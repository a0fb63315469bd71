//! ServiceEntry visibility (`meshConfig.serviceEntryVisibility`, Istio 1.31; docs/conversion.md,
//! "ServiceEntry visibility"): which namespaces may see the Services a ServiceEntry publishes,
//! decided by the mesh administrator from the labels of the entry's namespace.
//!
//! Inert unless configured. When it is, each ServiceEntry resolves to one visibility: the first
//! policy whose matching rules all match the namespace's labels, else the default.
//! - `PUBLIC`: as before.
//! - `NAMESPACE`: the Services carry `visibility: NAMESPACE` (ztunnel hides them from clients
//!   in other namespaces), are never canonical, and may not use a waypoint of another namespace.
//! - `NONE`: nothing is published: no Service, no endpoint, no membership. The entry does not
//!   even take part in hostname de-duplication.

use crate::discovery::model::kinds::NamespaceSelector;
use crate::discovery::model::labels::Labels;

/// A ServiceEntry's resolved visibility.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Visibility {
    #[default]
    Public,
    Namespace,
    None,
}

impl Visibility {
    /// The mesh config's enum name (`UNSPECIFIED` is PUBLIC, as in istiod).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        match text {
            "" | "UNSPECIFIED" | "PUBLIC" => Ok(Visibility::Public),
            "NAMESPACE" => Ok(Visibility::Namespace),
            "NONE" => Ok(Visibility::None),
            other => Err(format!(
                "{other:?} is not UNSPECIFIED, PUBLIC, NAMESPACE or NONE"
            )),
        }
    }

    /// The `istio.io/VisibilityApplied` reason: `Public`, `Namespace` (or `None`).
    pub(crate) fn as_reason(self) -> &'static str {
        match self {
            Visibility::Public => "Public",
            Visibility::Namespace => "Namespace",
            Visibility::None => "None",
        }
    }

    /// `istio.workload.Service.visibility`: NAMESPACE is 1, everything else PUBLIC (0).
    pub(crate) fn wire(self) -> i32 {
        match self {
            Visibility::Namespace => crate::pb::workload::service::Visibility::Namespace as i32,
            Visibility::Public | Visibility::None => {
                crate::pb::workload::service::Visibility::Public as i32
            }
        }
    }
}

/// One `policies[]` entry: its visibility applies when every rule matches. No rules at all
/// matches every namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct VisibilityPolicy {
    pub visibility: Visibility,
    /// `matchingRules[].namespaceSelector`. A rule without one (an unknown matcher) or with an
    /// invalid selector is [`NamespaceSelector::Nothing`]: it never matches.
    pub rules: Vec<NamespaceSelector>,
}

/// `meshConfig.serviceEntryVisibility`, compiled.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceEntryVisibility {
    /// `defaultVisibility`: when no policy matches.
    pub default: Visibility,
    pub policies: Vec<VisibilityPolicy>,
}

impl ServiceEntryVisibility {
    /// The visibility of a ServiceEntry whose namespace carries `labels` (`None`: the
    /// Namespace object is unknown, so only selectors that need no label match).
    pub(crate) fn resolve(&self, labels: Option<&Labels>) -> Visibility {
        let empty = Labels::default();
        let labels = labels.unwrap_or(&empty);
        self.policies
            .iter()
            .find(|p| p.rules.iter().all(|rule| rule.matches(labels)))
            .map_or(self.default, |p| p.visibility)
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

    fn by_name(name: &str) -> NamespaceSelector {
        NamespaceSelector::labels(labels(&[("kubernetes.io/metadata.name", name)]))
    }

    #[test]
    fn the_first_policy_whose_rules_all_match_wins_else_the_default() {
        let config = ServiceEntryVisibility {
            default: Visibility::Namespace,
            policies: vec![
                VisibilityPolicy {
                    visibility: Visibility::Public,
                    rules: vec![by_name("istio-system")],
                },
                // Two rules: both must match (AND).
                VisibilityPolicy {
                    visibility: Visibility::None,
                    rules: vec![
                        NamespaceSelector::labels(labels(&[("tier", "untrusted")])),
                        NamespaceSelector::labels(labels(&[("env", "prod")])),
                    ],
                },
                // Matches too, but comes after the first.
                VisibilityPolicy {
                    visibility: Visibility::None,
                    rules: vec![by_name("istio-system")],
                },
            ],
        };
        let system = labels(&[("kubernetes.io/metadata.name", "istio-system")]);
        assert_eq!(config.resolve(Some(&system)), Visibility::Public);
        let both = labels(&[("tier", "untrusted"), ("env", "prod")]);
        assert_eq!(config.resolve(Some(&both)), Visibility::None);
        let one = labels(&[("tier", "untrusted")]);
        assert_eq!(config.resolve(Some(&one)), Visibility::Namespace);
        assert_eq!(config.resolve(None), Visibility::Namespace);
    }

    #[test]
    fn a_policy_without_rules_matches_everything_and_a_nothing_rule_nothing() {
        let catch_all = ServiceEntryVisibility {
            default: Visibility::Public,
            policies: vec![
                VisibilityPolicy {
                    visibility: Visibility::Namespace,
                    rules: vec![NamespaceSelector::Nothing],
                },
                VisibilityPolicy {
                    visibility: Visibility::None,
                    rules: Vec::new(),
                },
            ],
        };
        assert_eq!(catch_all.resolve(None), Visibility::None);
        assert_eq!(
            ServiceEntryVisibility::default().resolve(None),
            Visibility::Public
        );
    }

    #[test]
    fn names_parse_and_map_to_the_wire() {
        assert_eq!(Visibility::parse("UNSPECIFIED"), Ok(Visibility::Public));
        assert_eq!(Visibility::parse("NAMESPACE"), Ok(Visibility::Namespace));
        assert_eq!(Visibility::parse("NONE"), Ok(Visibility::None));
        let error = Visibility::parse("namespace").unwrap_err();
        assert!(error.contains("NAMESPACE"), "{error}");
        assert_eq!(Visibility::Namespace.wire(), 1);
        assert_eq!(Visibility::Public.wire(), 0);
    }
}
