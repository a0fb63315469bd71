//! The shape of `src/discovery`, checked on every `cargo test`.
//!
//! Each top-level module sits in a layer ([`LAYERS`]) and refers only to modules in layers
//! below its own: the model knows nothing of the store, conversion never reaches into the
//! index, and so on. Inside a module, no file refers to a module that refers back to it (a
//! folder's `mod.rs`, or `x.rs` beside `x/`, may re-export its children; its children never
//! reach up into it). Test code (`#[cfg(test)]` modules) may use anything.
//!
//! References are read with `syn` from `use` trees and from paths in code, through
//! `crate::discovery::…`, `super::…`, `self::…` and a module's own children.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Bottom first. A module may refer to modules in earlier entries only.
const LAYERS: &[&[&str]] = &[
    // Leaves: resource-name conventions and type URLs; the persistent trie.
    &["names", "trie"],
    // The reduced objects the sources send, and the status conditions as data.
    &["model"],
    &["settings"],
    // Encoded resources, their versions and lookups, and the published snapshot.
    &["snapshot"],
    // Stored objects and the reverse indexes over them.
    &["store"],
    // Objects in the store to resources and status conditions.
    &["convert"],
    // apply / delete / reset: what a change touches, rebuilt and published.
    &["index"],
    // Readers of what the index publishes.
    &["evaluator"],
];

type Module = Vec<String>;

fn layer(top: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&top))
}

/// Every module of `src/discovery` with its file: `[]` is `mod.rs`, `["convert", "service"]`
/// is `convert/service.rs`.
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src/discovery") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let relative = path
                .strip_prefix(root)
                .expect("under root")
                .with_extension("");
            let mut module: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            found.insert(module, path);
        }
    }
    found
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Paths a file's non-test code refers to, each as written (`crate::discovery::x::Y`,
/// `super::Y`, `child::Y`), and the child modules it declares for tests only.
#[derive(Default)]
struct References {
    paths: Vec<Vec<String>>,
    test_children: Vec<String>,
}

impl References {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                self.paths.push(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.paths.push(path);
            }
            syn::UseTree::Glob(_) => self.paths.push(prefix.clone()),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for References {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if is_cfg_test(&item.attrs) {
            if item.content.is_none() {
                self.test_children.push(item.ident.to_string());
            }
            return;
        }
        syn::visit::visit_item_mod(self, item);
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_cfg_test(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_cfg_test(&item.attrs) {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    /// `pub(super)` names who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.paths
            .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }
}

/// The module a path refers to, from inside `module`: the longest prefix that is a module.
/// `None` for paths that leave `src/discovery` or name no module of it.
fn target(module: &Module, path: &[String], all: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let mut absolute: Module = match path.first().map(String::as_str) {
        Some("crate") => {
            if path.get(1).map(String::as_str) != Some("discovery") {
                return None;
            }
            path[2..].to_vec()
        }
        Some("super") => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let mut base = module.clone();
            for _ in 0..ups {
                base.pop()?;
            }
            base.extend(path[ups..].iter().cloned());
            base
        }
        Some("self") => {
            let mut base = module.clone();
            base.extend(path[1..].iter().cloned());
            base
        }
        Some(first) => {
            // A child module named by its bare name.
            let mut child = module.clone();
            child.push(first.to_string());
            if !all.contains_key(&child) {
                return None;
            }
            let mut base = module.clone();
            base.extend(path.iter().cloned());
            base
        }
        None => return None,
    };
    while !absolute.is_empty() && !all.contains_key(&absolute) {
        absolute.pop();
    }
    Some(absolute)
}

/// `module -> modules it refers to`, for non-test code.
fn graph(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let all = modules(root);
    let mut test_modules: BTreeSet<Module> = BTreeSet::new();
    let mut references = BTreeMap::new();
    for (module, path) in &all {
        let text = std::fs::read_to_string(path).expect("read source");
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut found = References::default();
        found.visit_file(&file);
        for child in &found.test_children {
            let mut m = module.clone();
            m.push(child.clone());
            test_modules.insert(m);
        }
        references.insert(module.clone(), found.paths);
    }
    let is_test = |m: &Module| (1..=m.len()).any(|n| test_modules.contains(&m[..n]));
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, paths) in references {
        if is_test(&module) {
            continue;
        }
        let out = edges.entry(module.clone()).or_default();
        for path in paths {
            if let Some(to) = target(&module, &path, &all)
                && to != module
                && !is_test(&to)
            {
                out.insert(to);
            }
        }
    }
    edges
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "discovery".to_string()
    } else {
        module.join("::")
    }
}

/// A cycle through `start`, if there is one.
fn cycle_from(start: &Module, edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    let mut stack = vec![(start.clone(), vec![start.clone()])];
    let mut seen = BTreeSet::new();
    while let Some((at, trail)) = stack.pop() {
        for next in edges.get(&at).into_iter().flatten() {
            if next == start {
                return Some(trail.clone());
            }
            if seen.insert(next.clone()) {
                let mut longer = trail.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/discovery")
}

#[test]
fn every_module_refers_only_to_layers_below_its_own() {
    let edges = graph(&root());
    let mut wrong = Vec::new();
    for (from, targets) in &edges {
        let Some(top) = from.first() else {
            continue; // mod.rs: the facade may re-export anything.
        };
        let Some(own) = layer(top) else {
            wrong.push(format!(
                "{top}: in no layer (add it to LAYERS in layers.rs)"
            ));
            continue;
        };
        for to in targets {
            let Some(to_top) = to.first() else {
                wrong.push(format!("{} refers to the discovery facade", name(from)));
                continue;
            };
            if to_top == top {
                continue;
            }
            match layer(to_top) {
                Some(l) if l < own => {}
                _ => wrong.push(format!(
                    "{} refers to {} (layer {:?}), not below its own ({own})",
                    name(from),
                    name(to),
                    layer(to_top)
                )),
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_file_refers_to_a_module_that_refers_back() {
    let edges = graph(&root());
    let cycles: Vec<String> = edges
        .keys()
        .filter_map(|m| cycle_from(m, &edges))
        .map(|c| c.iter().map(name).collect::<Vec<_>>().join(" -> "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_checker_sees_references_and_cycles() {
    let all: BTreeMap<Module, PathBuf> = [
        vec![],
        vec!["a".to_string()],
        vec!["a".to_string(), "b".to_string()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let a = vec!["a".to_string()];
    let ab = vec!["a".to_string(), "b".to_string()];
    let path = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    assert_eq!(target(&ab, &path("super::X"), &all), Some(a.clone()));
    assert_eq!(target(&a, &path("b::f"), &all), Some(ab.clone()));
    assert_eq!(
        target(&a, &path("crate::discovery::a::b::Y"), &all),
        Some(ab.clone())
    );
    assert_eq!(target(&a, &path("crate::pb::X"), &all), None);
    assert_eq!(target(&a, &path("std::fmt"), &all), None);
    let mut edges = BTreeMap::new();
    edges.insert(a.clone(), BTreeSet::from([ab.clone()]));
    edges.insert(ab.clone(), BTreeSet::from([a.clone()]));
    assert!(cycle_from(&a, &edges).is_some());
    edges.insert(ab.clone(), BTreeSet::new());
    assert!(cycle_from(&a, &edges).is_none());
    // The real tree is read: the model's modules are found and refer to each other.
    let real = graph(&root());
    assert!(real.contains_key(&vec!["model".to_string(), "pod".to_string()]));
    assert!(
        real[&vec!["model".to_string(), "pod".to_string()]]
            .contains(&vec!["model".to_string(), "labels".to_string()])
    );
}
