//! Conformance with istiod: the cases of `tests/fixtures/conformance.yaml` (whose header
//! documents the format), each run through the path a cluster's objects take:
//! `kube::objects::decode` -> `discovery::Index` -> `Snapshot`, then every expectation checked
//! against the decoded resources. Its modules: the fixture model (`fixture.rs`), the runner
//! (`runner.rs`), rendering of decoded protos in the fixture's encodings (`render.rs`), the
//! matching rules (`compare.rs`) and the API-server defaults normalisation (`defaults.rs`).
//!
//! One `#[test]` runs ALL cases and collects every failure, so one run shows everything:
//! * a case NOT in [`KNOWN_GAPS`] that fails fails the test, with one line per mismatch (phase,
//!   resource, field path, expected vs actual);
//! * a case in [`KNOWN_GAPS`] that passes is listed on a "now pass" line (printed, not failed):
//!   whoever implements the feature removes it from the list.
//!
//! Besides the listed expectations, after every phase the incrementally maintained index must
//! equal a fresh index fed the same objects in reverse order (same resource bytes, same lookup
//! indexes): the header says expectations hold once changes have converged, in any order.
//!
//! The only rewriting of expectations is the header's "Note on defaults" (unset targetPort ->
//! port, unset serviceAccountName -> `default`), narrowly, in `defaults.rs`. How a
//! case's settings map to `discovery::Settings` is in `fixture.rs`.
//! `policy_status` / `service_status` expectations are checked against the conditions the
//! snapshot keeps (`Snapshot::statuses`), which the leader writes on the objects.
//!
//! Environment: `CONFORMANCE_CASE=<substring>` runs only the matching cases;
//! `CONFORMANCE_VERBOSE=1` prints every failure line and note, also for known gaps.
//!
//! ```sh
//! cargo test --lib conformance:: -- --nocapture
//! ```

mod compare;
mod defaults;
mod fixture;
mod render;
mod runner;

use std::collections::BTreeSet;

use runner::Outcome;

/// Cases expected to fail with today's code, and why. Keep it accurate: the test prints the ones
/// that pass again. Reasons: "<missing feature>: ..." for kinds ambientd does not convert yet,
/// "defaults: ..." where the fixture expects a raw-object value that a defaulted object (as the API
/// server writes it, and as our decode reads it) cannot produce, "bug: ..." for a bug in src/.
const KNOWN_GAPS: &[(&str /* case name */, &str /* why */)] = &[];

fn known_gap(name: &str) -> Option<&'static str> {
    KNOWN_GAPS
        .iter()
        .find(|(gap, _)| *gap == name)
        .map(|(_, why)| *why)
}

#[test]
fn conformance_cases() {
    let cases = fixture::load().expect("the conformance fixture parses");
    let filter = std::env::var("CONFORMANCE_CASE").ok();
    let verbose = std::env::var_os("CONFORMANCE_VERBOSE").is_some_and(|v| v != "0");
    let outcomes: Vec<Outcome> = cases
        .iter()
        .filter(|c| filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .map(runner::run)
        .collect();
    assert!(!outcomes.is_empty(), "no case matches {filter:?}");

    let mut unexpected = Vec::new();
    let mut now_pass = Vec::new();
    let mut known_failing = 0;
    for outcome in &outcomes {
        let gap = known_gap(&outcome.name);
        match (outcome.passed(), gap) {
            (true, None) => {}
            (true, Some(_)) => now_pass.push(outcome.name.as_str()),
            (false, None) => unexpected.push(outcome),
            (false, Some(why)) => {
                known_failing += 1;
                let first = &outcome.failures[0];
                let more = outcome.failures.len() - 1;
                println!(
                    "known gap  {}: {why}\n           first failure: {first}{}",
                    outcome.name,
                    if more > 0 {
                        format!(" (+{more} more)")
                    } else {
                        String::new()
                    }
                );
                if verbose {
                    print_details(outcome);
                }
            }
        }
        if verbose && outcome.passed() {
            println!("pass       {}", outcome.name);
            print_details(outcome);
        }
    }
    for outcome in &unexpected {
        println!("FAIL       {}", outcome.name);
        print_details(outcome);
    }

    let passed = outcomes.iter().filter(|o| o.passed()).count();
    println!(
        "conformance: {} cases: {passed} pass, {} fail ({known_failing} known gaps, {} unexpected)",
        outcomes.len(),
        outcomes.len() - passed,
        unexpected.len(),
    );
    if !now_pass.is_empty() {
        println!(
            "conformance: KNOWN_GAPS cases that now pass (remove them from KNOWN_GAPS): {}",
            now_pass.join(", ")
        );
    }
    assert!(
        unexpected.is_empty(),
        "{} conformance case(s) not in KNOWN_GAPS failed: {}",
        unexpected.len(),
        unexpected
            .iter()
            .map(|o| o.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn print_details(outcome: &Outcome) {
    println!(
        "    source: {}{}",
        outcome.source,
        if outcome.derived {
            " (derived case)"
        } else {
            ""
        }
    );
    if let Some(from) = &outcome.derived_from {
        println!("    derived from: {from}");
    }
    if let Some(note) = &outcome.note {
        println!("    case note: {}", note.trim());
    }
    for failure in &outcome.failures {
        println!("    - {failure}");
    }
    for note in &outcome.notes {
        println!("    note: {note}");
    }
}

/// ambientd's own cases (`tests/fixtures/derived.yaml`), all of which must pass.
#[test]
fn derived_cases() {
    let cases = fixture::load_text(fixture::DERIVED).expect("the derived fixture parses");
    assert!(!cases.is_empty());
    let failed: Vec<Outcome> = cases
        .iter()
        .map(runner::run)
        .filter(|o| !o.passed())
        .collect();
    for outcome in &failed {
        println!("FAIL       {}", outcome.name);
        print_details(outcome);
    }
    let names: Vec<&str> = failed.iter().map(|o| o.name.as_str()).collect();
    assert!(
        failed.is_empty(),
        "derived case(s) failed: {}",
        names.join(", ")
    );
}

/// The fixture parses with no unknown keys, names are unique kebab-case ids, every case expects
/// something, and KNOWN_GAPS names only real cases, once each, with a reason.
#[test]
fn fixture_is_well_formed_and_known_gaps_name_real_cases() {
    let cases = fixture::load().expect("the conformance fixture parses");
    assert!(!cases.is_empty());
    let derived = fixture::load_text(fixture::DERIVED).expect("the derived fixture parses");
    assert!(
        derived
            .iter()
            .all(|c| c.derived && c.derived_from.is_some())
    );
    let mut names = BTreeSet::new();
    for case in cases.iter().chain(&derived) {
        assert!(
            names.insert(case.name.as_str()),
            "duplicate case {}",
            case.name
        );
        assert!(
            !case.name.is_empty()
                && case
                    .name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "case name {:?} is not kebab-case",
            case.name
        );
        assert!(!case.source.is_empty(), "case {} has no source", case.name);
        let expectations = case.expect.as_ref().map_or(0, |e| e.len())
            + case
                .steps
                .iter()
                .map(|s| s.expect.as_ref().map_or(0, |e| e.len()))
                .sum::<usize>();
        assert!(expectations > 0, "case {} expects nothing", case.name);
    }
    let mut gaps = BTreeSet::new();
    for (name, why) in KNOWN_GAPS {
        assert!(
            names.contains(name),
            "KNOWN_GAPS names {name:?}, which is not a case"
        );
        assert!(gaps.insert(name), "KNOWN_GAPS lists {name:?} twice");
        assert!(!why.is_empty(), "KNOWN_GAPS entry {name:?} has no reason");
    }
}

/// The harness is not vacuous: wrong expectations on a case that passes make it fail, naming the
/// field. (Mutations of `pod-namespace-enrolled-but-not-redirected-has-no-tunnel`.)
#[test]
fn harness_reports_wrong_expectations_precisely() {
    const CASE: &str = "pod-namespace-enrolled-but-not-redirected-has-no-tunnel";
    const UID: &str = "cluster0//Pod/ns1/pod3";
    let fresh = || {
        fixture::load()
            .expect("the conformance fixture parses")
            .into_iter()
            .find(|c| c.name == CASE)
            .expect("the case exists")
    };
    let case = fresh();
    assert!(runner::run(&case).passed(), "{CASE} passes unmodified");

    let failures = |mutate: &dyn Fn(&mut fixture::Expect)| {
        let mut case = fresh();
        mutate(case.expect.as_mut().expect("the case expects"));
        runner::run(&case).failures
    };
    let node = failures(&|e| {
        e.workloads.get_mut(UID).unwrap()["node"] = serde_json::json!("node2");
    });
    assert_eq!(node.len(), 1, "{node:?}");
    assert!(
        node[0].contains(UID) && node[0].contains("field node") && node[0].contains("\"node2\""),
        "{node:?}"
    );
    // The pod sets serviceAccountName, so no API-server default applies: unlisted under exact.
    let unlisted = failures(&|e| {
        e.workloads
            .get_mut(UID)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove("service_account");
    });
    assert!(
        unlisted.len() == 1
            && unlisted[0].contains("field service_account (unlisted, exact: true)"),
        "{unlisted:?}"
    );
    let lookup = failures(&|e| {
        e.lookups
            .insert("testnetwork/127.0.0.1".into(), vec!["pod2".into()]);
    });
    assert!(
        lookup.len() == 1 && lookup[0].contains("lookups[\"testnetwork/127.0.0.1\"]"),
        "{lookup:?}"
    );
    let absent = failures(&|e| e.absent.push(UID.into()));
    assert!(
        absent.len() == 1 && absent[0].contains("present as"),
        "{absent:?}"
    );
}
