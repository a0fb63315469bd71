//! The manifests source: a directory of Kubernetes YAML/JSON, followed as it changes.
//!
//! Every `.yaml`, `.yml` and `.json` file under the directory (recursively; entries whose names
//! start with `.` are skipped, which also skips the `..data` links of a mounted ConfigMap) is
//! read as one or more documents. A file that fails to parse is logged with its path and
//! position and keeps its last good content; an object that fails to decode is logged and
//! skipped alone. After each change the merged set of objects is diffed against the previous
//! one, so the index receives exactly the objects that changed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use notify::{RecursiveMode, Watcher};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::discovery::model::{Event, Kind, Object, ObjectRef};
use crate::kube::objects::{Decoded, decode, parse_yaml};

/// How long to let a burst of file-system events settle before re-reading.
const SETTLE: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifests directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("manifests directory {path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("watching manifests directory {path}: {source}")]
    Watch {
        path: PathBuf,
        source: notify::Error,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
}

/// What one file last contributed.
#[derive(Debug)]
struct FileState {
    stamp: Option<(SystemTime, u64)>,
    objects: Vec<Object>,
}

/// The directory's files, their last good objects, and the merged view last sent.
#[derive(Debug)]
pub struct ManifestDir {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    merged: BTreeMap<ObjectRef, Object>,
}

impl ManifestDir {
    /// Checks that `root` is a readable directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ManifestError> {
        let root = root.into();
        let meta = std::fs::metadata(&root).map_err(|source| ManifestError::Directory {
            path: root.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(ManifestError::NotADirectory { path: root });
        }
        Ok(ManifestDir {
            root,
            files: BTreeMap::new(),
            merged: BTreeMap::new(),
        })
    }

    /// Reads everything and returns the full load: a `Reset` for every kind, then `Synced`.
    pub fn load(&mut self) -> Vec<Event> {
        self.rescan(&BTreeSet::new());
        let mut by_kind: BTreeMap<Kind, Vec<Object>> =
            Kind::ALL.iter().map(|k| (*k, Vec::new())).collect();
        for object in self.merged.values() {
            by_kind
                .entry(object.kind())
                .or_default()
                .push(object.clone());
        }
        let mut events: Vec<Event> = Kind::ALL
            .iter()
            .map(|kind| Event::Reset(*kind, by_kind.remove(kind).unwrap_or_default()))
            .collect();
        events.push(Event::Synced);
        events
    }

    /// Re-reads files that changed (by stamp, or named in `touched`) and returns the objects
    /// that changed as `Apply`/`Delete` events.
    pub fn refresh(&mut self, touched: &BTreeSet<PathBuf>) -> Vec<Event> {
        let before = std::mem::take(&mut self.merged);
        self.rescan(touched);
        let mut events = Vec::new();
        for (key, object) in &self.merged {
            if before.get(key) != Some(object) {
                events.push(Event::Apply(object.clone()));
            }
        }
        for key in before.keys() {
            if !self.merged.contains_key(key) {
                events.push(Event::Delete(key.clone()));
            }
        }
        events
    }

    fn rescan(&mut self, touched: &BTreeSet<PathBuf>) {
        let mut present = Vec::new();
        collect_files(&self.root, &mut present);
        let present: BTreeSet<PathBuf> = present.into_iter().collect();
        self.files.retain(|path, _| {
            let keep = present.contains(path);
            if !keep {
                debug!(path = %path.display(), "manifest file removed");
            }
            keep
        });
        for path in present {
            let stamp = stamp(&path);
            let known = self.files.get(&path);
            let unchanged = known.is_some_and(|f| f.stamp == stamp && stamp.is_some());
            if unchanged && !touched.contains(&path) {
                continue;
            }
            match read_file(&path) {
                Ok(objects) => {
                    self.files.insert(path, FileState { stamp, objects });
                }
                Err(error) => {
                    // Keep the last good content; remember the stamp so it is not re-read
                    // until it changes again.
                    warn!(%error, "manifest file not applied; its last good content stays in effect");
                    let objects = self
                        .files
                        .remove(&path)
                        .map(|f| f.objects)
                        .unwrap_or_default();
                    self.files.insert(path, FileState { stamp, objects });
                }
            }
        }
        self.merged = BTreeMap::new();
        for state in self.files.values() {
            for object in &state.objects {
                self.merged.insert(object.object_ref(), object.clone());
            }
        }
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Every manifest file under `dir`, following symlinks, skipping dot-entries.
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            collect_files(&path, out);
        } else if meta.is_file() && is_manifest(&path) {
            out.push(path);
        }
    }
}

/// Reads one file into objects. A syntax error fails the whole file (with its position);
/// an object that cannot be decoded is logged and skipped alone.
pub fn read_file(path: &Path) -> Result<Vec<Object>, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|e| ManifestError::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    decode_text(path, &text)
}

/// [`read_file`] on text already read: `path` names the file in messages, and its extension
/// says JSON (`.json`) or YAML (anything else). Also the entry point of the `manifest_yaml` and
/// `manifest_json` fuzz targets (docs/fuzzing.md).
pub fn decode_text(path: &Path, text: &str) -> Result<Vec<Object>, ManifestError> {
    let documents = parse_documents(path, text)?;
    let mut objects = Vec::new();
    for document in documents {
        for decoded in decode(document) {
            match decoded {
                Decoded::Object(object) => objects.push(object),
                Decoded::Ignored(kind) => {
                    debug!(path = %path.display(), kind, "ignoring a kind ambientd does not read");
                }
                Decoded::Invalid(error) => {
                    warn!(path = %path.display(), %error, "skipping invalid object");
                }
            }
        }
    }
    Ok(objects)
}

fn parse_documents(path: &Path, text: &str) -> Result<Vec<Value>, ManifestError> {
    let is_json = path.extension().and_then(|e| e.to_str()) == Some("json");
    let documents = if is_json {
        serde_json::from_str::<Value>(text)
            .map(|v| vec![v])
            .map_err(|e| e.to_string())
    } else {
        parse_yaml(text)
    };
    let documents = documents.map_err(|message| ManifestError::File {
        path: path.to_path_buf(),
        // The parser adds a source snippet on later lines; the first line has the position.
        message: message
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_string(),
    })?;
    Ok(documents)
}

/// Loads `dir`, sends the full load, then follows changes until `shutdown`.
pub async fn run(
    mut dir: ManifestDir,
    events: mpsc::Sender<Event>,
    shutdown: CancellationToken,
) -> Result<(), ManifestError> {
    let (fs_tx, mut fs_rx) = mpsc::unbounded_channel::<notify::Result<notify::Event>>();
    let mut watcher = notify::recommended_watcher(move |event| {
        // The receiver only goes away at shutdown.
        let _ = fs_tx.send(event);
    })
    .map_err(|source| ManifestError::Watch {
        path: dir.root.clone(),
        source,
    })?;
    watcher
        .watch(&dir.root, RecursiveMode::Recursive)
        .map_err(|source| ManifestError::Watch {
            path: dir.root.clone(),
            source,
        })?;

    let load = dir.load();
    let objects = load
        .iter()
        .map(|e| match e {
            Event::Reset(_, objects) => objects.len(),
            _ => 0,
        })
        .sum::<usize>();
    info!(path = %dir.root.display(), files = dir.files.len(), objects, "manifests loaded");
    for event in load {
        if events.send(event).await.is_err() {
            return Ok(());
        }
    }

    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            event = fs_rx.recv() => event,
        };
        let Some(first) = first else {
            return Ok(());
        };
        let mut touched = BTreeSet::new();
        if !note(&mut touched, first) {
            continue;
        }
        // Let the burst settle (editors write, rename and chmod in quick succession).
        let settle = tokio::time::sleep(SETTLE);
        tokio::pin!(settle);
        loop {
            tokio::select! {
                _ = &mut settle => break,
                event = fs_rx.recv() => match event {
                    Some(event) => {
                        note(&mut touched, event);
                    }
                    None => break,
                },
            }
        }
        let changed = dir.refresh(&touched);
        if !changed.is_empty() {
            info!(objects = changed.len(), "manifests changed");
        }
        for event in changed {
            if events.send(event).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Records the paths of an event that may change content. Reads are ignored: our own reads
/// would otherwise trigger endless rescans. Returns whether a rescan is due.
fn note(touched: &mut BTreeSet<PathBuf>, event: notify::Result<notify::Event>) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode};
    match event {
        Ok(event) => match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Any
            | EventKind::Create(_)
            | EventKind::Modify(_)
            | EventKind::Remove(_)
            | EventKind::Other => {
                touched.extend(event.paths);
                true
            }
            EventKind::Access(_) => false,
        },
        Err(error) => {
            warn!(%error, "file watch error; rescanning");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_A: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n";

    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .flat_map(|e| match e {
                Event::Reset(_, objects) => {
                    objects.iter().map(|o| o.object_ref().to_string()).collect()
                }
                Event::Apply(o) => vec![format!("apply {}", o.object_ref())],
                Event::Delete(r) => vec![format!("delete {r}")],
                Event::Synced => vec!["synced".to_string()],
                Event::Visibility(_) => vec!["visibility".to_string()],
            })
            .collect()
    }

    #[test]
    fn load_reads_yaml_yml_json_recursively_and_skips_dot_entries() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("nested/deeper")).unwrap();
        std::fs::create_dir_all(root.join("..data")).unwrap();
        std::fs::write(
            root.join("a.yaml"),
            format!("{NODE_A}---\napiVersion: v1\nkind: Node\nmetadata: {{name: b}}\n"),
        )
        .unwrap();
        std::fs::write(
            root.join("nested/c.yml"),
            "apiVersion: v1\nkind: Node\nmetadata: {name: c}\n",
        )
        .unwrap();
        std::fs::write(
            root.join("nested/deeper/d.json"),
            r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Node","metadata":{"name":"d"}}]}"#,
        )
        .unwrap();
        std::fs::write(
            root.join("notes.txt"),
            NODE_A.replace("name: a", "name: txt"),
        )
        .unwrap();
        std::fs::write(
            root.join("..data/e.yaml"),
            NODE_A.replace("name: a", "name: hidden"),
        )
        .unwrap();

        let mut manifests = ManifestDir::open(root).unwrap();
        let events = manifests.load();
        assert_eq!(
            events.len(),
            Kind::ALL.len() + 1,
            "a Reset per kind, then Synced"
        );
        assert_eq!(events.last(), Some(&Event::Synced));
        assert_eq!(
            names(&events),
            vec!["Node a", "Node b", "Node c", "Node d", "synced"]
        );
    }

    #[test]
    fn refresh_reports_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.yaml"), NODE_A).unwrap();
        std::fs::write(
            root.join("b.yaml"),
            "apiVersion: v1\nkind: Node\nmetadata: {name: b}\n",
        )
        .unwrap();
        let mut manifests = ManifestDir::open(root).unwrap();
        manifests.load();

        let touched: BTreeSet<PathBuf> = [root.join("a.yaml")].into();
        assert!(
            manifests.refresh(&touched).is_empty(),
            "same content: no events"
        );

        std::fs::write(
            root.join("a.yaml"),
            "apiVersion: v1\nkind: Node\nmetadata: {name: a, labels: {x: y}}\n",
        )
        .unwrap();
        std::fs::remove_file(root.join("b.yaml")).unwrap();
        std::fs::write(
            root.join("c.yaml"),
            "apiVersion: v1\nkind: Node\nmetadata: {name: c}\n",
        )
        .unwrap();
        let touched: BTreeSet<PathBuf> = [root.join("a.yaml")].into();
        assert_eq!(
            names(&manifests.refresh(&touched)),
            vec!["apply Node a", "apply Node c", "delete Node b"]
        );
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_content() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.yaml"), NODE_A).unwrap();
        let mut manifests = ManifestDir::open(root).unwrap();
        manifests.load();
        std::fs::write(root.join("a.yaml"), "kind: [broken\n").unwrap();
        let touched: BTreeSet<PathBuf> = [root.join("a.yaml")].into();
        assert!(manifests.refresh(&touched).is_empty());
        let error = read_file(&root.join("a.yaml")).unwrap_err().to_string();
        assert!(
            error.contains("a.yaml") && error.contains("line 1"),
            "{error}"
        );
    }

    #[test]
    fn open_fails_clearly_for_a_missing_directory() {
        let error = ManifestDir::open("/nonexistent/ambientd-manifests").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("/nonexistent/ambientd-manifests"),
            "{error}"
        );
    }
}
