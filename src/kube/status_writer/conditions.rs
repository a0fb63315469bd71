//! The pure half of the status writer: reading ambientd's condition off an object's
//! `status.conditions`, and merging the desired one in while leaving every other condition as
//! it is. No I/O; the clock is passed in.
//!
//! Kubernetes condition semantics: `lastTransitionTime` changes only when `status` flips (a new
//! reason or message keeps it); `observedGeneration` is the `metadata.generation` the condition
//! was computed from (left out when the object has none). The same shape is valid for a
//! Service's `metav1.Condition` and an Istio CRD's `IstioCondition`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::discovery::model::status::{DesiredStatus, StatusCondition};

/// ambientd's condition as found on an object (or as last written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub status: bool,
    pub reason: String,
    pub message: String,
    pub observed_generation: i64,
}

impl Observed {
    /// What writing `desired` leaves on the object.
    pub fn of(desired: &DesiredStatus) -> Option<Observed> {
        desired.condition.as_ref().map(|c| Observed {
            status: c.status,
            reason: c.reason.clone(),
            message: c.message.clone(),
            observed_generation: desired.generation,
        })
    }
}

/// Whether an object carrying `observed` (of our type) already shows `desired`.
pub fn satisfied(desired: &DesiredStatus, observed: Option<&Observed>) -> bool {
    Observed::of(desired).as_ref() == observed
}

/// Our condition (`condition_type`) in a `status.conditions` list, if any. A condition whose
/// `status` is neither `True` nor `False` reads as absent, so it gets rewritten.
pub fn find(conditions: &[Value], condition_type: &str) -> Option<Observed> {
    let c = conditions
        .iter()
        .find(|c| c["type"].as_str() == Some(condition_type))?;
    let status = match c["status"].as_str()? {
        "True" => true,
        "False" => false,
        _ => return None,
    };
    let observed_generation = match &c["observedGeneration"] {
        Value::Number(n) => n.as_i64().unwrap_or_default(),
        // Istio's protobuf JSON writes int64 as a string.
        Value::String(s) => s.parse().unwrap_or_default(),
        _ => 0,
    };
    Some(Observed {
        status,
        reason: c["reason"].as_str().unwrap_or_default().to_string(),
        message: c["message"].as_str().unwrap_or_default().to_string(),
        observed_generation,
    })
}

/// The object's `status.conditions` with ours set to `desired` (or removed when `desired` has
/// none), every other condition kept in place. `None` when nothing would change.
pub fn merge(
    conditions: &[Value],
    condition_type: &str,
    desired: &DesiredStatus,
    now: SystemTime,
) -> Option<Vec<Value>> {
    let position = conditions
        .iter()
        .position(|c| c["type"].as_str() == Some(condition_type));
    let existing = position.and_then(|_| find(conditions, condition_type));
    let Some(wanted) = &desired.condition else {
        let mut merged = conditions.to_vec();
        merged.remove(position?);
        return Some(merged);
    };
    let has_time = position.is_some_and(|i| conditions[i]["lastTransitionTime"].is_string());
    if has_time && satisfied(desired, existing.as_ref()) {
        return None;
    }
    // The transition time moves only when the status flips.
    let transition = match (position, &existing) {
        (Some(i), Some(old)) if old.status == wanted.status && has_time => {
            conditions[i]["lastTransitionTime"].clone()
        }
        _ => json!(rfc3339(now)),
    };
    let condition = render(wanted, desired.generation, transition);
    let mut merged = conditions.to_vec();
    match position {
        Some(i) => merged[i] = condition,
        None => merged.push(condition),
    }
    Some(merged)
}

fn render(c: &StatusCondition, generation: i64, transition: Value) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), json!(c.condition_type));
    out.insert(
        "status".into(),
        json!(if c.status { "True" } else { "False" }),
    );
    if generation > 0 {
        out.insert("observedGeneration".into(), json!(generation));
    }
    out.insert("lastTransitionTime".into(), transition);
    out.insert("reason".into(), json!(c.reason));
    out.insert("message".into(), json!(c.message));
    Value::Object(out)
}

/// `YYYY-MM-DDTHH:MM:SSZ` (whole seconds, UTC), as Kubernetes writes times.
pub fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::discovery::model::status::WAYPOINT_BOUND;

    const T0: &str = "2026-01-02T03:04:05Z";

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn desired(status: bool, reason: &str, generation: i64) -> DesiredStatus {
        DesiredStatus {
            generation,
            condition: Some(Box::new(StatusCondition {
                condition_type: WAYPOINT_BOUND,
                status,
                reason: reason.into(),
                message: format!("m-{reason}"),
            })),
        }
    }

    fn none() -> DesiredStatus {
        DesiredStatus {
            generation: 1,
            condition: None,
        }
    }

    fn ours(status: &str, reason: &str, generation: i64) -> Value {
        json!({"type": WAYPOINT_BOUND, "status": status, "observedGeneration": generation,
               "lastTransitionTime": T0, "reason": reason, "message": format!("m-{reason}")})
    }

    fn other() -> Value {
        json!({"type": "Other", "status": "True", "lastTransitionTime": T0, "reason": "R", "message": ""})
    }

    #[test]
    fn formats_times_like_kubernetes() {
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(1_767_323_045)), T0);
        assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn adds_ours_after_the_others() {
        let merged = merge(&[other()], WAYPOINT_BOUND, &desired(true, "A", 2), at(0)).unwrap();
        assert_eq!(merged[0], other());
        assert_eq!(merged[1]["status"], "True");
        assert_eq!(merged[1]["observedGeneration"], 2);
        assert_eq!(merged[1]["lastTransitionTime"], "1970-01-01T00:00:00Z");
    }

    #[test]
    fn unchanged_is_no_write() {
        let conditions = [other(), ours("True", "A", 2)];
        assert_eq!(
            merge(&conditions, WAYPOINT_BOUND, &desired(true, "A", 2), at(0)),
            None
        );
        assert_eq!(merge(&[other()], WAYPOINT_BOUND, &none(), at(0)), None);
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let conditions = [ours("True", "A", 2), other()];
        let reworded = merge(&conditions, WAYPOINT_BOUND, &desired(true, "B", 3), at(0)).unwrap();
        assert_eq!(reworded[0]["lastTransitionTime"], T0);
        assert_eq!(reworded[0]["reason"], "B");
        assert_eq!(reworded[0]["observedGeneration"], 3);
        assert_eq!(reworded[1], other());
        let flipped = merge(&conditions, WAYPOINT_BOUND, &desired(false, "B", 3), at(0)).unwrap();
        assert_eq!(flipped[0]["lastTransitionTime"], "1970-01-01T00:00:00Z");
        assert_eq!(flipped[0]["status"], "False");
    }

    #[test]
    fn a_new_generation_alone_is_rewritten() {
        let conditions = [ours("True", "A", 2)];
        let merged = merge(&conditions, WAYPOINT_BOUND, &desired(true, "A", 3), at(0)).unwrap();
        assert_eq!(merged[0]["observedGeneration"], 3);
        assert_eq!(merged[0]["lastTransitionTime"], T0);
    }

    #[test]
    fn removes_only_ours() {
        let merged = merge(
            &[other(), ours("True", "A", 2)],
            WAYPOINT_BOUND,
            &none(),
            at(0),
        )
        .unwrap();
        assert_eq!(merged, vec![other()]);
    }

    #[test]
    fn reads_istio_string_generations() {
        let mut c = ours("False", "A", 0);
        c["observedGeneration"] = json!("4");
        let found = find(&[c], WAYPOINT_BOUND).unwrap();
        assert_eq!((found.status, found.observed_generation), (false, 4));
    }
}
