//! Runs one conformance case against an `crate::discovery::Index` through the public API only:
//! `kube::objects::decode` for every input object, `Index::apply` / `Index::delete`, then checks
//! each `expect` block against `Index::snapshot()`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::discovery::model::status::{StatusCondition, StatusKind, StatusTarget};
use crate::discovery::names::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use crate::discovery::{Index, Kind, Object, ObjectRef, Settings, Snapshot};
use crate::kube::objects::{Decoded, decode};
use crate::pb::security::Authorization;
use crate::pb::workload::{Address, address};
use prost::Message;
use serde_json::Value;

use super::compare;
use super::defaults;
use super::fixture::{self, Case, Expect};
use super::render;

/// What running one case produced.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) name: String,
    /// The istio test(s) the case comes from, and whether its expectations were read from code.
    pub(super) source: String,
    pub(super) derived: bool,
    pub(super) derived_from: Option<String>,
    /// The case's own `note`, if any.
    pub(super) note: Option<String>,
    /// Every failed expectation, as one self-contained line (phase, resource, field, values).
    pub(super) failures: Vec<String>,
    /// How the case was run (settings chosen, defaults normalised, objects skipped as invalid).
    pub(super) notes: Vec<String>,
}

impl Outcome {
    pub(super) fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The kind string of a fixture object or delete, as an index `Kind` if ambientd has it.
pub(super) fn index_kind(kind: &str) -> Option<Kind> {
    Kind::ALL.into_iter().find(|k| k.to_string() == kind)
}

/// Whether an object of this kind has no namespace (for keying raw inputs).
fn cluster_scoped(kind: &str) -> bool {
    matches!(kind, "Namespace" | "Node" | "GatewayClass")
}

/// `(kind, namespace, name)` of a raw input object; namespaced kinds default to `default`.
pub(super) type RawKey = (String, String, String);

fn raw_key(value: &Value) -> RawKey {
    let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str);
    let kind = text("/kind").unwrap_or_default().to_string();
    let namespace = match text("/metadata/namespace") {
        _ if cluster_scoped(&kind) => String::new(),
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => "default".to_string(),
    };
    let name = text("/metadata/name").unwrap_or_default().to_string();
    (kind, namespace, name)
}

/// Runs every phase of a case (initial input, then each step) and checks its expectations.
pub(super) fn run(case: &Case) -> Outcome {
    let mut outcome = Outcome {
        name: case.name.clone(),
        source: case.source.clone(),
        derived: case.derived,
        derived_from: case.derived_from.clone(),
        note: case.note.clone(),
        ..Outcome::default()
    };
    let settings = match fixture::settings(case) {
        Ok((settings, notes)) => {
            outcome.notes.extend(notes);
            settings
        }
        Err(reason) => {
            outcome.failures.push(format!("cannot run: {reason}"));
            return outcome;
        }
    };
    let mut run = Run {
        index: Index::new(settings.clone()),
        settings,
        objects: BTreeMap::new(),
        raw: BTreeMap::new(),
        unsupported: BTreeSet::new(),
        outcome,
    };
    for object in &case.input {
        run.apply("input", object);
    }
    if let Some(expect) = &case.expect {
        run.check("expect", expect);
    }
    for (i, step) in case.steps.iter().enumerate() {
        let phase = format!("step {} ({:?})", i + 1, step.desc);
        // A step's changes may be applied in any order; deletes go first.
        for target in &step.delete {
            run.delete(&target.kind, &target.namespace, &target.name);
        }
        for object in &step.apply {
            run.apply(&phase, object);
        }
        if let Some(expect) = &step.expect {
            run.check(&phase, expect);
        }
    }
    let mut outcome = run.outcome;
    if !run.unsupported.is_empty() {
        let kinds: Vec<_> = run.unsupported.into_iter().collect();
        outcome.failures.insert(
            0,
            format!(
                "cannot run faithfully: ambientd does not support {}",
                kinds.join(", ")
            ),
        );
    }
    outcome
}

struct Run {
    settings: Settings,
    index: Index,
    /// The decoded objects currently applied, for the from-scratch comparison.
    objects: BTreeMap<ObjectRef, Object>,
    /// The raw input objects currently applied, for the API-server defaults normalisation.
    raw: BTreeMap<RawKey, Value>,
    /// Kinds that could not be applied (decoded as Ignored) or deleted (no `Kind`).
    unsupported: BTreeSet<String>,
    outcome: Outcome,
}

impl Run {
    fn fail(&mut self, line: String) {
        self.outcome.failures.push(line);
    }

    fn apply(&mut self, phase: &str, value: &Value) {
        let key = raw_key(value);
        self.raw.insert(key.clone(), value.clone());
        for decoded in decode(value.clone()) {
            match decoded {
                Decoded::Object(object) => {
                    self.objects.insert(object.object_ref(), object.clone());
                    self.index.apply(object);
                }
                Decoded::Ignored(kind) => {
                    self.unsupported
                        .insert(format!("kind {kind} (decoded as Ignored)"));
                }
                Decoded::Invalid(error) => {
                    // As the manifests source does: an invalid object is skipped, so it replaces
                    // (removes) whatever was applied under its name before.
                    self.outcome
                        .notes
                        .push(format!("{phase}: skipped invalid object: {error}"));
                    if let Some(kind) = index_kind(&key.0) {
                        let object = ObjectRef::new(kind, &key.1, &key.2);
                        if self.objects.remove(&object).is_some() {
                            self.index.delete(&object);
                        }
                    }
                }
            }
        }
    }

    /// `policy_status` / `service_status`: the condition the snapshot keeps for the object
    /// `key` (`ns/name`) of one of `kinds` (a service_status key may name a Service, a
    /// ServiceEntry or a WorkloadEntry). `derived_fields` is provenance, not a condition.
    fn check_status(
        &mut self,
        phase: &str,
        snapshot: &crate::discovery::Snapshot,
        (what, kinds): (&str, &[StatusKind]),
        key: &str,
        conditions: &serde_json::Value,
    ) {
        let label = format!("{phase}: {what} {key:?}");
        let Some(conditions) = conditions.as_object() else {
            self.fail(format!("{label}: expected a map of conditions"));
            return;
        };
        let Some((namespace, name)) = key.split_once('/') else {
            self.fail(format!("{label}: expected a ns/name key"));
            return;
        };
        let held: Vec<&StatusCondition> = kinds
            .iter()
            .filter_map(|&kind| {
                let object = StatusTarget {
                    kind,
                    namespace: namespace.into(),
                    name: name.into(),
                };
                snapshot.statuses.get(&object)?.condition.as_deref()
            })
            .collect();
        for (condition, expected) in conditions {
            if condition == "derived_fields" {
                continue;
            }
            let actual = held.iter().find(|s| s.condition_type == condition.as_str());
            let Some(actual) = actual else {
                self.fail(format!("{label}: no {condition} condition"));
                continue;
            };
            let field = |name: &str| expected.get(name).and_then(|v| v.as_str());
            let status = if actual.status { "True" } else { "False" };
            for (name, actual) in [
                ("status", status),
                ("reason", actual.reason.as_str()),
                ("message", actual.message.as_str()),
            ] {
                if let Some(expected) = field(name)
                    && expected != actual
                {
                    self.fail(format!(
                        "{label}: {condition}.{name}: expected {expected:?}, got {actual:?}"
                    ));
                }
            }
        }
    }

    fn delete(&mut self, kind: &str, namespace: &str, name: &str) {
        let namespace = if cluster_scoped(kind) { "" } else { namespace };
        self.raw
            .remove(&(kind.to_string(), namespace.to_string(), name.to_string()));
        let Some(index_kind) = index_kind(kind) else {
            self.unsupported.insert(format!(
                "deleting kind {kind} (not in crate::discovery::Kind)"
            ));
            return;
        };
        let object = ObjectRef::new(index_kind, namespace, name);
        self.objects.remove(&object);
        self.index.delete(&object);
    }

    fn check(&mut self, phase: &str, expect: &Expect) {
        let snapshot = self.index.snapshot();
        self.check_converged(phase, &snapshot);
        let view = View::new(&snapshot);
        for problem in &view.problems {
            self.fail(format!("{phase}: {problem}"));
        }
        let policies = (
            "policy_status",
            &[StatusKind::AuthorizationPolicy, StatusKind::WaypointPolicy][..],
        );
        for (key, conditions) in &expect.policy_status {
            self.check_status(phase, &snapshot, policies, key, conditions);
        }
        let services = (
            "service_status",
            &[
                StatusKind::Service,
                StatusKind::ServiceEntry,
                StatusKind::WorkloadEntry,
                StatusKind::ServiceEntryVisibility,
            ][..],
        );
        for (key, conditions) in &expect.service_status {
            self.check_status(phase, &snapshot, services, key, conditions);
        }

        for (uid, expected) in &expect.workloads {
            let label = format!("{phase}: workload {uid:?}");
            let actual = match view.addresses.get(uid) {
                Some(Addr::Workload(w)) => render::workload(w),
                Some(Addr::Service(_)) => {
                    self.fail(format!("{label}: is a Service, expected a Workload"));
                    continue;
                }
                None => {
                    self.fail(format!(
                        "{label}: missing (no Address resource of that name)"
                    ));
                    continue;
                }
            };
            let (expected, notes) =
                defaults::workload(&self.settings, &self.raw, uid, expected.clone());
            self.note_defaults(phase, notes);
            self.compare(&label, &expected, &actual);
        }
        for (key, expected) in &expect.services {
            let label = format!("{phase}: service {key:?}");
            let actual = match view.addresses.get(key) {
                Some(Addr::Service(s)) => render::service(s),
                Some(Addr::Workload(_)) => {
                    self.fail(format!("{label}: is a Workload, expected a Service"));
                    continue;
                }
                None => {
                    self.fail(format!(
                        "{label}: missing (no Address resource of that name)"
                    ));
                    continue;
                }
            };
            let (expected, notes) =
                defaults::service(&self.settings, &self.raw, key, expected.clone());
            self.note_defaults(phase, notes);
            self.compare(&label, &expected, &actual);
        }
        for (key, expected) in &expect.authorizations {
            let label = format!("{phase}: authorization {key:?}");
            match view.authorizations.get(key) {
                Some(a) => self.compare(&label, expected, &render::authorization(a)),
                None => self.fail(format!(
                    "{label}: missing (no Authorization resource of that name)"
                )),
            }
        }
        for name in &expect.absent {
            if let Some(addr) = view.addresses.get(name) {
                self.fail(format!(
                    "{phase}: absent {name:?}: present as {}",
                    addr.render()
                ));
            }
            if let Some(a) = view.authorizations.get(name) {
                self.fail(format!(
                    "{phase}: absent {name:?}: present as Authorization {}",
                    render::authorization(a)
                ));
            }
        }
        for (key, want) in &expect.lookups {
            let got = view.lookup(&snapshot, key, false);
            self.compare_sets(&format!("{phase}: lookups[{key:?}]"), want, got);
        }
        for (key, want) in &expect.lookup_workloads {
            let got = view.lookup(&snapshot, key, true);
            self.compare_sets(&format!("{phase}: lookup_workloads[{key:?}]"), want, got);
        }
        if let Some(want) = &expect.all_names {
            let got = view
                .addresses
                .values()
                .map(|a| a.name().to_string())
                .collect();
            self.compare_sets(&format!("{phase}: all_names"), want, got);
        }
    }

    fn note_defaults(&mut self, phase: &str, notes: Vec<String>) {
        self.outcome
            .notes
            .extend(notes.into_iter().map(|n| format!("{phase}: {n}")));
    }

    fn compare(&mut self, label: &str, expected: &Value, actual: &Value) {
        match compare::resource(expected, actual) {
            Ok(mismatches) => {
                for m in mismatches {
                    self.fail(format!("{label}: {m}"));
                }
            }
            Err(problem) => self.fail(format!("{label}: bad expectation: {problem}")),
        }
    }

    fn compare_sets(&mut self, label: &str, want: &[String], got: BTreeSet<String>) {
        let want: BTreeSet<String> = want.iter().cloned().collect();
        if want != got {
            let missing: Vec<_> = want.difference(&got).collect();
            let extra: Vec<_> = got.difference(&want).collect();
            self.fail(format!(
                "{label}: expected {want:?}, actual {got:?} (missing {missing:?}, unexpected {extra:?})"
            ));
        }
    }

    /// The header says expectations hold "after the changes have converged", in any order. So
    /// the incrementally maintained index must equal a fresh index fed the same objects in the
    /// opposite order (contents before containers): same resource bytes, same lookup indexes.
    fn check_converged(&mut self, phase: &str, incremental: &Snapshot) {
        let mut fresh = Index::new(self.settings.clone());
        for object in self.objects.values().rev() {
            fresh.apply(object.clone());
        }
        let fresh = fresh.snapshot();
        let label = format!(
            "{phase}: incremental index differs from a fresh index fed the same objects in reverse order"
        );
        let mut differences = Vec::new();
        for (kind, a, b) in [
            ("Address", &incremental.addresses, &fresh.addresses),
            (
                "Authorization",
                &incremental.authorizations,
                &fresh.authorizations,
            ),
        ] {
            let names: BTreeSet<&crate::discovery::snapshot::Name> =
                a.keys().chain(b.keys()).collect();
            for name in names {
                let (x, y) = (a.get(&**name), b.get(&**name));
                if x.map(|r| r.value()) != y.map(|r| r.value()) {
                    differences.push(format!(
                        "{kind} {name:?}: incremental {}, fresh {}",
                        summary(x),
                        summary(y)
                    ));
                }
            }
        }
        for (index, a, b) in [
            ("aliases", alias_texts(incremental), alias_texts(&fresh)),
            (
                "members",
                sorted(incremental.members.iter()),
                sorted(fresh.members.iter()),
            ),
            (
                "by_node",
                sorted(incremental.by_node.iter()),
                sorted(fresh.by_node.iter()),
            ),
        ] {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                if a.get(key) != b.get(key) {
                    differences.push(format!(
                        "{index}[{key:?}]: incremental {:?}, fresh {:?}",
                        a.get(key),
                        b.get(key)
                    ));
                }
            }
        }
        let statuses: BTreeSet<&StatusTarget> = incremental
            .statuses
            .keys()
            .chain(fresh.statuses.keys())
            .collect();
        for object in statuses {
            let (x, y) = (incremental.statuses.get(object), fresh.statuses.get(object));
            if x != y {
                differences.push(format!(
                    "status of {object}: incremental {x:?}, fresh {y:?}"
                ));
            }
        }
        for difference in differences {
            self.fail(format!("{label}: {difference}"));
        }
    }
}

fn summary(resource: Option<&Arc<crate::discovery::Resource>>) -> String {
    match resource {
        None => "absent".into(),
        Some(r) => match decode_address(r) {
            Ok(addr) => addr.render().to_string(),
            Err(_) => format!("version {}", r.version),
        },
    }
}

/// A lookup index (`name -> set of names`) as sorted plain collections.
/// The alias index by its keys' text.
fn alias_texts(snapshot: &Snapshot) -> BTreeMap<String, Vec<String>> {
    snapshot
        .alias_texts()
        .map(|(k, v)| (k, v.iter().map(|n| n.to_string()).collect()))
        .collect()
}

fn sorted<'a, S: 'a + ?Sized>(
    entries: impl Iterator<Item = (&'a crate::discovery::snapshot::Name, &'a S)>,
) -> BTreeMap<String, Vec<String>>
where
    &'a S: IntoIterator<Item = &'a crate::discovery::snapshot::Name>,
{
    entries
        .map(|(k, v)| {
            (
                k.to_string(),
                v.into_iter().map(|n| n.to_string()).collect(),
            )
        })
        .collect()
}

/// A decoded Address resource.
enum Addr {
    Workload(Box<crate::pb::workload::Workload>),
    Service(Box<crate::pb::workload::Service>),
}

impl Addr {
    fn name(&self) -> &str {
        match self {
            Addr::Workload(w) => &w.name,
            Addr::Service(s) => &s.name,
        }
    }

    fn render(&self) -> Value {
        match self {
            Addr::Workload(w) => serde_json::json!({"Workload": render::workload(w)}),
            Addr::Service(s) => serde_json::json!({"Service": render::service(s)}),
        }
    }
}

fn decode_address(resource: &crate::discovery::Resource) -> Result<Addr, String> {
    if resource.type_url() != ADDRESS_TYPE {
        return Err(format!("type_url {:?}", resource.type_url()));
    }
    let message = Address::decode(resource.value()).map_err(|e| e.to_string())?;
    match message.r#type {
        Some(address::Type::Workload(w)) => Ok(Addr::Workload(Box::new(w))),
        Some(address::Type::Service(s)) => Ok(Addr::Service(Box::new(s))),
        None => Err("Address with neither workload nor service".into()),
    }
}

/// Every resource of a snapshot, decoded, plus what was wrong with any of them.
struct View {
    addresses: BTreeMap<String, Addr>,
    authorizations: BTreeMap<String, Authorization>,
    /// Resources that failed to decode or whose xDS name disagrees with their content.
    problems: Vec<String>,
}

impl View {
    fn new(snapshot: &Snapshot) -> Self {
        let mut view = View {
            addresses: BTreeMap::new(),
            authorizations: BTreeMap::new(),
            problems: Vec::new(),
        };
        for (name, resource) in snapshot.addresses.iter() {
            match decode_address(resource) {
                Ok(addr) => {
                    let expected_name = match &addr {
                        Addr::Workload(w) => w.uid.clone(),
                        Addr::Service(s) => format!("{}/{}", s.namespace, s.hostname),
                    };
                    if *expected_name != **name || resource.name != *name {
                        view.problems.push(format!(
                            "invariant: Address resource {name:?} (Resource.name {:?}) holds {expected_name:?}",
                            resource.name
                        ));
                    }
                    view.addresses.insert(name.to_string(), addr);
                }
                Err(e) => view.problems.push(format!(
                    "invariant: Address resource {name:?} does not decode: {e}"
                )),
            }
        }
        for (name, resource) in snapshot.authorizations.iter() {
            if resource.type_url() != AUTHORIZATION_TYPE {
                view.problems.push(format!(
                    "invariant: Authorization resource {name:?} has type_url {:?}",
                    resource.type_url()
                ));
                continue;
            }
            match Authorization::decode(resource.value()) {
                Ok(a) => {
                    if format!("{}/{}", a.namespace, a.name) != **name {
                        view.problems.push(format!(
                            "invariant: Authorization resource {name:?} holds {}/{}",
                            a.namespace, a.name
                        ));
                    }
                    view.authorizations.insert(name.to_string(), a);
                }
                Err(e) => view.problems.push(format!(
                    "invariant: Authorization resource {name:?} does not decode: {e}"
                )),
            }
        }
        view
    }

    /// `Snapshot::lookup_addresses`, as the set of Workload.name / Service.name it returns.
    fn lookup(&self, snapshot: &Snapshot, key: &str, workloads_only: bool) -> BTreeSet<String> {
        snapshot
            .lookup_addresses(key)
            .iter()
            .filter_map(|name| match self.addresses.get(name) {
                Some(Addr::Service(_)) if workloads_only => None,
                Some(addr) => Some(addr.name().to_string()),
                None => Some(format!("<no resource {name:?}>")),
            })
            .collect()
    }
}
