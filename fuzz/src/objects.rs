//! The sources' decoders: manifest files (YAML and JSON) as the manifests source reads them,
//! and Kubernetes objects as the watchers decode them; what they yield goes into an index, as
//! the index task applies it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use ambientd::discovery::{Event, Index, Kind, Object, Settings, Snapshot};
use ambientd::kube::cluster::kinds::{Reduced, WatchedKind, WatchedObject, reduce};

/// A manifest file's text (`.yaml` or `.json`, by `json`): decoded into objects as the
/// manifests source decodes a file, then loaded into an index as its first full load is (a
/// `Reset` of every kind, then `Synced`). A file that is not UTF-8 fails to read: not decoded.
pub fn manifest(data: &[u8], json: bool) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new(if json { "fuzz.json" } else { "fuzz.yaml" });
    match ambientd::kube::manifests::decode_text(path, text) {
        Ok(objects) => {
            load(objects);
        }
        // A bad file is reported with its path and kept at its last good content.
        Err(error) => assert!(error.to_string().starts_with("fuzz."), "{error}"),
    }
}

/// An index after the full load of `objects`.
pub fn load(objects: Vec<Object>) -> Arc<Snapshot> {
    let mut by_kind: BTreeMap<Kind, Vec<Object>> = BTreeMap::new();
    for object in objects {
        by_kind.entry(object.kind()).or_default().push(object);
    }
    let mut index = Index::new(Settings::default());
    for kind in Kind::ALL {
        index.handle(Event::Reset(
            kind,
            by_kind.remove(&kind).unwrap_or_default(),
        ));
    }
    index.handle(Event::Synced);
    index.snapshot()
}

fn watched() -> &'static [WatchedKind] {
    static KINDS: LazyLock<Vec<WatchedKind>> =
        LazyLock::new(ambientd::kube::cluster::watched_kinds);
    &KINDS
}

/// A watched object: the first byte picks the kind (of the watched kinds, in `Kind::ALL`
/// order, modulo their number), the rest is the object's JSON as the API server sends it in a
/// list or a watch event. Decoded as the watcher decodes it ([`WatchedObject`]), reduced, and
/// applied to an index.
pub fn kube_object(data: &[u8]) {
    let Some((&which, json)) = data.split_first() else {
        return;
    };
    let kinds = watched();
    let watched = &kinds[usize::from(which) % kinds.len()];
    let Ok(object) = serde_json::from_slice::<WatchedObject>(json) else {
        return;
    };
    match reduce(watched, object) {
        Reduced::Object(object) => {
            assert_eq!(object.kind(), watched.kind);
            let mut index = Index::new(Settings::default());
            index.handle(Event::Apply(object));
            index.handle(Event::Synced);
            index.snapshot();
        }
        Reduced::Invalid(reference, error) => {
            assert_eq!(reference.kind, watched.kind);
            assert!(!error.reason.is_empty());
        }
    }
}
