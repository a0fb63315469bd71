//! The header's matching rules, applied to one expected resource and its rendered actual value.
//!
//! * Partial at the top level: listed fields must match; unlisted ones are unconstrained, except
//!   with `exact: true`, where every unlisted field must be at its proto3 default.
//! * A listed field is compared in full: nested messages with unlisted sub-fields at their
//!   defaults, lists element by element in order, maps exactly.
//! * `null` = unset / empty list / empty map; an omitted numeric/enum/bool sub-field = 0 / first
//!   enum value / false.
//! * `derived_fields` (any mapping level) is metadata, not a field: it is dropped before matching,
//!   and the fields it names are compared like any other (a mismatch on one is labelled
//!   "derived", since its value was read from istio code rather than asserted by an istio test).
//!
//! Both sides are brought to the renderer's minimal form (defaults left out, see `render`), after
//! which "compared in full" is plain equality. Known limitation: `serde_json` maps are sorted, so
//! the key order of `Workload.services` / `ports` maps cannot be checked (our proto map is a
//! BTreeMap anyway).

use serde_json::{Map, Value};

/// Field name -> name of its enum's first value (the proto3 default, rendered as absent).
const ENUM_DEFAULTS: &[(&str, &str)] = &[
    ("status", "HEALTHY"),
    ("tunnel_protocol", "NONE"),
    ("network_mode", "STANDARD"),
    ("workload_type", "DEPLOYMENT"),
    ("app_protocol", "UNKNOWN"),
    ("ip_families", "AUTOMATIC"),
    ("visibility", "PUBLIC"),
    ("mode", "UNSPECIFIED_MODE"),
    ("health_policy", "ONLY_HEALTHY"),
    ("protocol", "NONE"),
    ("scope", "GLOBAL"),
    ("action", "ALLOW"),
];

/// Keys whose value is a map (`Workload.services`) or the fixture's map encoding of a port list
/// (`services[*].ports`): for these, `{}` is "empty" and therefore the default. Elsewhere `{}` is a
/// set-but-empty message (`presence: {}`, an empty `Match`) and is kept.
const MAP_KEYS: &[&str] = &["services", "ports"];

/// Metadata keys of an expected resource, never compared as fields.
const EXACT: &str = "exact";
const DERIVED: &str = "derived_fields";

/// One field that does not match.
#[derive(Debug)]
pub(super) struct Mismatch {
    /// Dotted path of the first difference (`groups[3].rules[0].matches[0].source_ips`).
    pub(super) path: String,
    pub(super) expected: Option<Value>,
    pub(super) actual: Option<Value>,
    /// The listed field, in full, when the first difference is deeper than the field itself.
    pub(super) whole: Option<(Option<Value>, Option<Value>)>,
    /// The field is named by `derived_fields`.
    pub(super) derived: bool,
    /// Set for unlisted fields of an `exact: true` resource.
    pub(super) unlisted: bool,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<Value>| v.as_ref().map_or("<unset>".to_string(), |v| v.to_string());
        write!(f, "field {}", self.path)?;
        if self.derived {
            write!(f, " (derived)")?;
        }
        if self.unlisted {
            write!(f, " (unlisted, exact: true)")?;
        }
        write!(
            f,
            ": expected {}, actual {}",
            show(&self.expected),
            show(&self.actual)
        )?;
        if let Some((expected, actual)) = &self.whole {
            let (expected, actual) = (show(expected), show(actual));
            if expected.len() + actual.len() <= 400 {
                write!(f, " [whole field: expected {expected}, actual {actual}]")?;
            }
        }
        Ok(())
    }
}

/// An expected value in minimal form: metadata dropped, defaults left out.
pub(super) fn normalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != DERIVED)
                .filter_map(|(k, v)| normalize_field(k, v).map(|v| (k.clone(), v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

/// One field's expected value in minimal form; `None` when it is the field's default.
pub(super) fn normalize_field(key: &str, value: &Value) -> Option<Value> {
    let value = normalize(value);
    let is_default = match &value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty() || ENUM_DEFAULTS.contains(&(key, s.as_str())),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty() && MAP_KEYS.contains(&key),
    };
    (!is_default).then_some(value)
}

/// Compares one expected resource (a mapping of fields) with the rendered actual one.
pub(super) fn resource(expected: &Value, actual: &Value) -> Result<Vec<Mismatch>, String> {
    let Value::Object(expected) = expected else {
        return Err(format!("expectation is not a mapping: {expected}"));
    };
    let empty = Map::new();
    let actual = actual.as_object().unwrap_or(&empty);
    let exact = match expected.get(EXACT) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("exact must be a bool, got {other}")),
    };
    let derived: Vec<String> = match expected.get(DERIVED) {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(String::from)
                    .ok_or(format!("bad {DERIVED}: {i}"))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("{DERIVED} must be a list, got {other}")),
    };
    let is_derived = |path: &str| {
        derived.iter().any(|d| {
            path == d
                || path.starts_with(&format!("{d}."))
                || path.starts_with(&format!("{d}["))
                || d.starts_with(&format!("{path}."))
        })
    };
    let mut mismatches = Vec::new();
    for (key, raw) in expected {
        if key == EXACT || key == DERIVED {
            continue;
        }
        let want = normalize_field(key, raw);
        let have = actual.get(key).cloned();
        if want == have {
            continue;
        }
        let (path, e, a) = first_difference(key.clone(), want.as_ref(), have.as_ref());
        let whole = (path != *key).then(|| (want.clone(), have.clone()));
        mismatches.push(Mismatch {
            derived: is_derived(&path),
            path,
            expected: e,
            actual: a,
            whole,
            unlisted: false,
        });
    }
    if exact {
        for (key, value) in actual {
            if !expected.contains_key(key) {
                mismatches.push(Mismatch {
                    path: key.clone(),
                    expected: None,
                    actual: Some(value.clone()),
                    whole: None,
                    derived: false,
                    unlisted: true,
                });
            }
        }
    }
    Ok(mismatches)
}

/// The first place two values differ: its path and the two sub-values there.
fn first_difference(
    path: String,
    expected: Option<&Value>,
    actual: Option<&Value>,
) -> (String, Option<Value>, Option<Value>) {
    match (expected, actual) {
        (Some(Value::Object(e)), Some(Value::Object(a))) => {
            let mut keys: Vec<&String> = e.keys().chain(a.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                if e.get(key) != a.get(key) {
                    return first_difference(format!("{path}.{key}"), e.get(key), a.get(key));
                }
            }
        }
        (Some(Value::Array(e)), Some(Value::Array(a))) => {
            for i in 0..e.len().max(a.len()) {
                if e.get(i) != a.get(i) {
                    return first_difference(format!("{path}[{i}]"), e.get(i), a.get(i));
                }
            }
        }
        _ => {}
    }
    (path, expected.cloned(), actual.cloned())
}

/// The matching rules themselves, on small synthetic values.
mod tests {
    use serde_json::json;

    use super::resource;

    /// The mismatching paths (with a `!` suffix for unlisted fields under `exact: true`).
    fn paths(expected: serde_json::Value, actual: serde_json::Value) -> Vec<String> {
        resource(&expected, &actual)
            .expect("valid expectation")
            .into_iter()
            .map(|m| format!("{}{}", m.path, if m.unlisted { "!" } else { "" }))
            .collect()
    }

    #[test]
    fn partial_at_the_top_level_unless_exact() {
        let actual = json!({"name": "a", "node": "n"});
        assert!(paths(json!({"name": "a"}), actual.clone()).is_empty());
        assert_eq!(paths(json!({"name": "b"}), actual.clone()), ["name"]);
        assert_eq!(
            paths(json!({"exact": true, "name": "a"}), actual.clone()),
            ["node!"]
        );
        assert!(paths(json!({"exact": true, "name": "a", "node": "n"}), actual).is_empty());
    }

    #[test]
    fn null_and_omitted_sub_fields_mean_defaults() {
        let expected = json!({
            "services": null, "waypoint": null, "authorization_policies": null,
            "status": "HEALTHY", "tunnel_protocol": "NONE", "native_tunnel": false,
            "cluster_id": "", "ports": [{"service_port": 80, "target_port": 0, "app_protocol": "UNKNOWN"}],
        });
        assert!(paths(expected.clone(), json!({"ports": [{"service_port": 80}]})).is_empty());
        assert_eq!(
            paths(
                expected,
                json!({"ports": [{"service_port": 80}], "waypoint": {"hbone_mtls_port": 15008}})
            ),
            ["waypoint"]
        );
        assert_eq!(
            paths(json!({"status": "UNHEALTHY"}), json!({})),
            ["status"],
            "a non-default enum is compared"
        );
    }

    #[test]
    fn listed_fields_are_compared_in_full_and_lists_in_order() {
        let expected =
            json!({"waypoint": {"hostname": {"hostname": "h"}, "hbone_mtls_port": 15008}});
        let actual = json!({"waypoint": {"hostname": {"hostname": "h", "namespace": "ns"}, "hbone_mtls_port": 15008}});
        assert_eq!(paths(expected, actual), ["waypoint.hostname.namespace"]);
        assert_eq!(
            paths(
                json!({"addresses": ["a", "b"]}),
                json!({"addresses": ["b", "a"]})
            ),
            ["addresses[0]"]
        );
        assert_eq!(
            paths(
                json!({"addresses": ["a"]}),
                json!({"addresses": ["a", "b"]})
            ),
            ["addresses[1]"]
        );
    }

    #[test]
    fn maps_are_exact_and_an_empty_port_list_is_a_present_entry() {
        let entry = json!({"services": {"ns/h": {"ports": {}}}});
        assert!(paths(entry.clone(), json!({"services": {"ns/h": {}}})).is_empty());
        assert_eq!(paths(entry, json!({})), ["services"]);
        assert_eq!(
            paths(
                json!({"services": {"ns/h": {"ports": {"80": 8080}}}}),
                json!({"services": {"ns/h": {"ports": {"80": 8080}}, "ns/other": {}}})
            ),
            ["services.ns/other"]
        );
    }

    #[test]
    fn presence_and_empty_matches_are_set_messages() {
        let presence =
            json!({"groups": [{"rules": [{"matches": [{"not_principals": [{"presence": {}}]}]}]}]});
        assert!(paths(presence.clone(), presence.clone()).is_empty());
        let empty_match = json!({"groups": [{"rules": [{"matches": [{}]}]}]});
        assert!(paths(empty_match.clone(), empty_match.clone()).is_empty());
        assert_eq!(
            paths(presence, empty_match),
            ["groups[0].rules[0].matches[0].not_principals"]
        );
        assert!(
            paths(
                json!({"groups": [{"rules": null}]}),
                json!({"groups": [{}]})
            )
            .is_empty(),
            "a group with no clauses"
        );
    }

    #[test]
    fn derived_fields_is_metadata_but_the_fields_it_names_are_compared() {
        let expected = json!({"exact": true, "name": "x", "derived_fields": ["name"]});
        let mismatches = resource(&expected, &json!({"name": "y"})).unwrap();
        assert_eq!(mismatches.len(), 1);
        assert!(mismatches[0].derived && mismatches[0].path == "name");
        assert!(
            resource(&expected, &json!({"name": "x"}))
                .unwrap()
                .is_empty()
        );
        let nested = json!({"w": {"a": 1, "derived_fields": ["a"]}});
        assert!(
            resource(&nested, &json!({"w": {"a": 1}}))
                .unwrap()
                .is_empty()
        );
    }
}
