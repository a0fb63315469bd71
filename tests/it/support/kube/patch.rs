//! Patch algorithms of the fake: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and the
//! leaf paths that server-side apply's field owners are tracked by.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// RFC 7386 JSON merge patch.
pub(super) fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().expect("object");
    for (key, value) in patch {
        if value.is_null() {
            map.remove(key);
        } else {
            merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Server-side apply never deletes by naming null: drop nulls from an applied configuration.
pub(super) fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

/// RFC 6902 JSON patch: add, remove, replace and test.
pub(super) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    for op in patch.as_array().ok_or("a JSON patch is an array")? {
        let path = op["path"].as_str().ok_or("op without path")?;
        let tokens: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, parents) = tokens.split_last().ok_or("empty path")?;
        let mut parent = &mut *target;
        for token in parents {
            parent = match parent {
                Value::Object(map) => map.get_mut(token).ok_or(format!("no {path}"))?,
                Value::Array(list) => {
                    let i: usize = token.parse().map_err(|_| format!("bad index in {path}"))?;
                    list.get_mut(i).ok_or(format!("no {path}"))?
                }
                _ => return Err(format!("no {path}")),
            };
        }
        let value = op["value"].clone();
        match (op["op"].as_str().unwrap_or(""), parent) {
            ("add" | "replace", Value::Object(map)) => {
                if op["op"] == "replace" && !map.contains_key(last) {
                    return Err(format!("replace: no {path}"));
                }
                map.insert(last.clone(), value);
            }
            ("add", Value::Array(list)) => {
                let i = if last == "-" {
                    list.len()
                } else {
                    last.parse().map_err(|_| "bad index")?
                };
                if i > list.len() {
                    return Err(format!("add: index out of range in {path}"));
                }
                list.insert(i, value);
            }
            ("replace", Value::Array(list)) => {
                let i: usize = last.parse().map_err(|_| "bad index")?;
                *list.get_mut(i).ok_or(format!("replace: no {path}"))? = value;
            }
            ("remove", Value::Object(map)) => {
                map.remove(last).ok_or(format!("remove: no {path}"))?;
            }
            ("remove", Value::Array(list)) => {
                let i: usize = last.parse().map_err(|_| "bad index")?;
                if i >= list.len() {
                    return Err(format!("remove: no {path}"));
                }
                list.remove(i);
            }
            ("test", parent) => {
                let actual = match parent {
                    Value::Object(map) => map.get(last),
                    Value::Array(list) => last.parse::<usize>().ok().and_then(|i| list.get(i)),
                    _ => None,
                };
                if actual != Some(&value) {
                    return Err(format!("test failed at {path}"));
                }
            }
            (other, _) => return Err(format!("unsupported JSON patch op {other:?} at {path}")),
        }
    }
    Ok(())
}

/// Leaf paths (`spec.holderIdentity`) of an object and their values: what field managers own.
/// Server-managed metadata is left out.
pub(super) fn leaves(object: &Value) -> BTreeMap<String, Value> {
    fn walk(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, value) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&path, value, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", object, &mut out);
    out.retain(|path, _| {
        !path.is_empty()
            && path != "apiVersion"
            && path != "kind"
            && !matches!(
                path.as_str(),
                "metadata.name"
                    | "metadata.namespace"
                    | "metadata.uid"
                    | "metadata.resourceVersion"
                    | "metadata.creationTimestamp"
                    | "metadata.deletionTimestamp"
                    | "metadata.generation"
            )
    });
    out
}

/// The leaves an update set to a new value: the updater takes them over.
pub(super) fn changed_leaves(old: &Value, new: &Value) -> BTreeMap<String, Value> {
    let before = leaves(old);
    leaves(new)
        .into_iter()
        .filter(|(path, value)| before.get(path) != Some(value))
        .collect()
}
