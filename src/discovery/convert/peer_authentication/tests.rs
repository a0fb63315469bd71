//! PeerAuthentication tables: the peerauthn-* conformance cases, every port-level combination
//! (docs/authorization.md, "PeerAuthentication"), and each istiod quirk by name.

use super::*;

const ROOT: &str = "istio-system";

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn app_a() -> Labels {
    labels(&[("app", "a")])
}

/// A selector-less PA.
fn ns_pa(ns: &str, name: &str, mode: MtlsMode) -> PeerAuthentication {
    PeerAuthentication {
        name: name.into(),
        namespace: ns.into(),
        mode,
        ..Default::default()
    }
}

/// A PA selecting `app=a` with port-level modes.
fn wl_pa(ns: &str, name: &str, mode: MtlsMode, ports: &[(u32, MtlsMode)]) -> PeerAuthentication {
    PeerAuthentication {
        selector: Some(app_a()),
        port_level: ports.iter().copied().collect(),
        ..ns_pa(ns, name, mode)
    }
}

fn at(mut pa: PeerAuthentication, creation: &str) -> PeerAuthentication {
    pa.creation = Some(creation.into());
    pa
}

fn deny_plaintext_on(port: u32) -> Rule {
    Rule {
        clauses: vec![clause(Match {
            not_principals: vec![presence()],
            destination_ports: vec![port],
            ..Default::default()
        })],
    }
}

fn except_port(port: u32) -> Clause {
    clause(Match {
        not_destination_ports: vec![port],
        ..Default::default()
    })
}

fn plaintext() -> Clause {
    clause(deny_plaintext())
}

fn converted(ns: &str, name: &str, rules: Vec<Rule>) -> Authorization {
    Authorization {
        name: format!("converted_peer_authentication_{name}"),
        namespace: ns.into(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        rules,
        ..Default::default()
    }
}

/// Converts `pa` against `others` (every other PA in the cluster).
fn convert(pa: &PeerAuthentication, others: &[&PeerAuthentication]) -> Option<Authorization> {
    converted_policy(pa, others, others, ROOT)
}

/// The reference list of a pod `app=a` in `ns`, given every PA in the cluster.
fn refs(ns: &str, labels: &Labels, all: &[&PeerAuthentication]) -> Vec<String> {
    let in_ns: Vec<&PeerAuthentication> =
        all.iter().copied().filter(|p| p.namespace == ns).collect();
    let root: Vec<&PeerAuthentication> = all
        .iter()
        .copied()
        .filter(|p| p.namespace == ROOT)
        .collect();
    workload_references(ns, labels, &in_ns, &root, ROOT)
}

const STATIC: &str = "istio-system/istio_converted_static_strict";

#[test]
fn static_strict_policy_denies_unauthenticated() {
    let want = Authorization {
        name: "istio_converted_static_strict".into(),
        namespace: "istio-system".into(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    not_principals: vec![presence()],
                    ..Default::default()
                }],
            }],
        }],
        ..Default::default()
    };
    assert_eq!(static_strict_policy("istio-system"), want);
    assert_eq!(static_strict_key("istio-system"), STATIC);
}

#[test]
fn conformance_peerauthn_workload_policy_port_level_transitions() {
    use MtlsMode::*;
    let mesh = at(ns_pa(ROOT, "global", Permissive), "2026-01-01T00:00:01Z");
    let ns_strict = at(ns_pa("ns1", "namespace", Strict), "2026-01-01T00:00:02Z");
    let ns_permissive = at(
        ns_pa("ns1", "namespace", Permissive),
        "2026-01-01T00:00:02Z",
    );
    let other = labels(&[("app", "not-a")]);
    let key = "ns1/converted_peer_authentication_selector";
    let check = |ns: &PeerAuthentication,
                 wl: Option<PeerAuthentication>,
                 want_refs: &[&str],
                 want: Option<Vec<Rule>>| {
        let mut all = vec![&mesh, ns];
        all.extend(wl.as_ref());
        assert_eq!(refs("ns1", &app_a(), &all), want_refs, "{wl:?}");
        if let Some(wl) = &wl {
            assert_eq!(
                convert(wl, &all),
                want.map(|r| converted("ns1", "selector", r)),
                "{wl:?}"
            );
        }
    };
    check(&ns_strict, None, &[STATIC], None);
    check(
        &ns_strict,
        Some(wl_pa("ns1", "selector", Strict, &[])),
        &[STATIC],
        None,
    );
    check(
        &ns_strict,
        Some(wl_pa("ns1", "selector", Permissive, &[])),
        &[],
        None,
    );
    check(
        &ns_strict,
        Some(wl_pa("ns1", "selector", Permissive, &[(9090, Strict)])),
        &[key],
        Some(vec![deny_plaintext_on(9090)]),
    );
    // A pod outside the selector keeps the namespace policy.
    let all = [&mesh, &ns_strict];
    assert_eq!(refs("ns1", &other, &all), [STATIC]);
    // A selector PA in the root namespace is ignored for ambient.
    let root_selector = wl_pa(ROOT, "global-selector", Strict, &[(8080, Permissive)]);
    let wl = wl_pa("ns1", "selector", Permissive, &[(9090, Strict)]);
    assert_eq!(
        refs("ns1", &app_a(), &[&mesh, &ns_strict, &wl, &root_selector]),
        [key]
    );
    assert_eq!(convert(&root_selector, &[&mesh, &ns_strict]), None);

    check(
        &ns_strict,
        Some(wl_pa("ns1", "selector", Permissive, &[(9090, Permissive)])),
        &[],
        None,
    );
    check(
        &ns_permissive,
        Some(wl_pa("ns1", "selector", Permissive, &[(9090, Permissive)])),
        &[],
        None,
    );
    check(
        &ns_permissive,
        Some(wl_pa("ns1", "selector", Strict, &[])),
        &[STATIC],
        None,
    );
    check(
        &ns_permissive,
        Some(wl_pa("ns1", "selector", Strict, &[(9090, Permissive)])),
        &[key],
        Some(vec![Rule {
            clauses: vec![plaintext(), except_port(9090)],
        }]),
    );
    check(
        &ns_permissive,
        Some(wl_pa("ns1", "selector", Unset, &[(9090, Strict)])),
        &[key],
        Some(vec![deny_plaintext_on(9090)]),
    );
    check(
        &ns_strict,
        Some(wl_pa("ns1", "selector", Unset, &[(9090, Strict)])),
        &[STATIC],
        None,
    );
    check(
        &ns_strict,
        Some(wl_pa("ns1", "selector", Unset, &[(9090, Permissive)])),
        &[key],
        Some(vec![Rule {
            clauses: vec![except_port(9090), plaintext()],
        }]),
    );
    check(&ns_strict, None, &[STATIC], None);
    // No PeerAuthentication at all: nothing referenced (and the static policy is not sent).
    assert!(refs("ns1", &app_a(), &[]).is_empty());
}

#[test]
fn conformance_peerauthn_xds_static_and_converted_resources() {
    use MtlsMode::*;
    let empty = ns_pa("ns", "policy1", Unset);
    assert_eq!(convert(&empty, &[&empty]), None);
    let policy2 = PeerAuthentication {
        selector: Some(labels(&[("app", "sa")])),
        ..wl_pa("ns", "policy2", Permissive, &[(9080, Strict)])
    };
    assert_eq!(
        convert(&policy2, &[&empty, &policy2]),
        Some(converted("ns", "policy2", vec![deny_plaintext_on(9080)]))
    );
    let policy1 = PeerAuthentication {
        selector: Some(labels(&[("app", "sa")])),
        ..wl_pa("ns", "policy1", Strict, &[(8080, Disable)])
    };
    assert_eq!(
        convert(&policy1, &[&policy1]),
        Some(converted(
            "ns",
            "policy1",
            vec![Rule {
                clauses: vec![plaintext(), except_port(8080)]
            }]
        ))
    );
}

#[test]
fn conformance_peerauthn_convert_matrix() {
    use MtlsMode::*;
    // peerauthn-convert-workload-strict-without-ports
    let strict = wl_pa("foo", "strict-mtls", Strict, &[]);
    assert_eq!(convert(&strict, &[&strict]), None);
    assert_eq!(refs("foo", &app_a(), &[&strict]), [STATIC]);

    // peerauthn-convert-strict-with-permissive-or-disable-port
    for (ns, name, port_mode) in [
        ("foo", "strict-and-permissive-mtls", Permissive),
        ("bar", "strict-and-disable-mtls", Disable),
    ] {
        let pa = wl_pa(ns, name, Strict, &[(9090, port_mode)]);
        let want = converted(
            ns,
            name,
            vec![Rule {
                clauses: vec![plaintext(), except_port(9090)],
            }],
        );
        assert_eq!(convert(&pa, &[&pa]), Some(want));
        assert_eq!(
            refs(ns, &app_a(), &[&pa]),
            [format!("{ns}/converted_peer_authentication_{name}")]
        );
    }

    // peerauthn-convert-unset-with-strict-port
    let pa = wl_pa("foo", "strict-mtls", Unset, &[(8080, Strict)]);
    assert_eq!(
        convert(&pa, &[&pa]),
        Some(converted(
            "foo",
            "strict-mtls",
            vec![deny_plaintext_on(8080)]
        ))
    );
    assert_eq!(
        refs("foo", &app_a(), &[&pa]),
        ["foo/converted_peer_authentication_strict-mtls"]
    );

    // peerauthn-convert-root-permissive-workload-permissive-port-yields-nothing
    let mesh = ns_pa(ROOT, "default-mesh", Permissive);
    let pa = wl_pa("foo", "workload", Unset, &[(9090, Permissive)]);
    assert_eq!(convert(&pa, &[&mesh, &pa]), None);
    assert!(refs("foo", &app_a(), &[&mesh, &pa]).is_empty());

    // peerauthn-convert-root-strict-namespace-permissive-workload-strict-port
    let mesh = ns_pa(ROOT, "default-mesh", Strict);
    let ns = ns_pa("foo", "default-foo", Permissive);
    let pa = wl_pa("foo", "workload", Unset, &[(9090, Strict)]);
    let all = [&mesh, &ns, &pa];
    assert_eq!(
        convert(&pa, &all),
        Some(converted("foo", "workload", vec![deny_plaintext_on(9090)]))
    );
    assert_eq!(
        refs("foo", &app_a(), &all),
        ["foo/converted_peer_authentication_workload"]
    );
    assert_eq!(refs("other", &app_a(), &all), [STATIC]);
}

/// Every workload mode x port mode x inherited (ns, root) combination, against the
/// rules written out independently.
#[test]
fn port_level_combinations() {
    use MtlsMode::*;
    let modes = [Unset, Permissive, Strict, Disable];
    let parents = [
        None,
        Some(Unset),
        Some(Permissive),
        Some(Strict),
        Some(Disable),
    ];
    for wl_mode in modes {
        for port_mode in modes {
            for ns_mode in parents {
                for root_mode in parents {
                    let ns = ns_mode.map(|m| ns_pa("foo", "ns", m));
                    let root = root_mode.map(|m| ns_pa(ROOT, "mesh", m));
                    let pa = wl_pa("foo", "wl", wl_mode, &[(9090, port_mode)]);
                    let all: Vec<&PeerAuthentication> =
                        ns.iter().chain(root.iter()).chain([&pa]).collect();
                    let got = convert(&pa, &all);

                    let strict = |m: Option<MtlsMode>| m == Some(Strict);
                    let unset = |m: Option<MtlsMode>| matches!(m, None | Some(Unset));
                    let merge = (strict(root_mode) && (unset(ns_mode) || strict(ns_mode)))
                        || strict(ns_mode);
                    let want: Option<Vec<Rule>> = match (wl_mode, port_mode) {
                        (_, Unset) | (Strict, Strict) => None,
                        (Permissive | Disable, Permissive | Disable) => None,
                        // The precedence quirk: a STRICT root with no (or UNSET) ns PA skips it.
                        (Permissive | Disable, Strict) if unset(ns_mode) && strict(root_mode) => {
                            None
                        }
                        (Permissive | Disable, Strict) => Some(vec![deny_plaintext_on(9090)]),
                        (Unset, Strict)
                            if strict(ns_mode) || (unset(ns_mode) && strict(root_mode)) =>
                        {
                            None
                        }
                        (Unset, Strict) => Some(vec![deny_plaintext_on(9090)]),
                        (Strict, _) => {
                            let mut clauses = vec![plaintext(), except_port(9090)];
                            if merge {
                                clauses.push(plaintext());
                            }
                            Some(vec![Rule { clauses }])
                        }
                        (Unset, _) if ns_mode.is_some_and(|m| m != Strict) => None,
                        (Unset, _) if ns_mode.is_none() && !strict(root_mode) => None,
                        (Unset, _) => {
                            let mut clauses = vec![except_port(9090)];
                            if merge {
                                clauses.push(plaintext());
                            }
                            Some(vec![Rule { clauses }])
                        }
                    };
                    let ctx = format!(
                        "wl={wl_mode:?} port={port_mode:?} ns={ns_mode:?} root={root_mode:?}"
                    );
                    assert_eq!(got, want.map(|r| converted("foo", "wl", r)), "{ctx}");
                }
            }
        }
    }
}

#[test]
fn strict_ports_become_groups_before_the_base_group() {
    use MtlsMode::*;
    let pa = wl_pa(
        "foo",
        "wl",
        Unset,
        &[(9091, Strict), (80, Permissive), (9090, Strict)],
    );
    let ns = ns_pa("foo", "ns", Disable);
    let root = ns_pa(ROOT, "mesh", Permissive);
    // ns DISABLE: PERMISSIVE port skipped (inherited not strict); STRICT ports in ascending order.
    assert_eq!(
        convert(&pa, &[&pa, &ns, &root]),
        Some(converted(
            "foo",
            "wl",
            vec![deny_plaintext_on(9090), deny_plaintext_on(9091)]
        ))
    );
    let pa = wl_pa("foo", "wl", Strict, &[(9091, Permissive), (80, Disable)]);
    assert_eq!(
        convert(&pa, &[&pa]),
        Some(converted(
            "foo",
            "wl",
            vec![Rule {
                clauses: vec![plaintext(), except_port(80), except_port(9091)]
            }]
        ))
    );
}

#[test]
fn quirk_go_operator_precedence_skips_strict_port_of_permissive_workload() {
    use MtlsMode::*;
    for wl_mode in [Permissive, Disable] {
        let root = ns_pa(ROOT, "mesh", Strict);
        let pa = wl_pa("foo", "wl", wl_mode, &[(9090, Strict)]);
        // No policy, although port 9090 should be STRICT and the workload is not...
        assert_eq!(convert(&pa, &[&root, &pa]), None, "{wl_mode:?}");
        // ...while the workload still references the policy that was never generated.
        assert_eq!(
            refs("foo", &app_a(), &[&root, &pa]),
            ["foo/converted_peer_authentication_wl"]
        );
        // With a namespace PA present the term does not fire.
        let ns = ns_pa("foo", "ns", Permissive);
        assert_eq!(
            convert(&pa, &[&root, &ns, &pa]),
            Some(converted("foo", "wl", vec![deny_plaintext_on(9090)]))
        );
    }
}

#[test]
fn quirk_disable_port_ignored_when_unset_workload_inherits_strict() {
    use MtlsMode::*;
    let ns = ns_pa("foo", "ns", Strict);
    let pa = wl_pa("foo", "wl", Unset, &[(9090, Disable)]);
    // The converted policy is generated (DISABLE is handled there)...
    assert_eq!(
        convert(&pa, &[&ns, &pa]),
        Some(converted(
            "foo",
            "wl",
            vec![Rule {
                clauses: vec![except_port(9090), plaintext()]
            }]
        ))
    );
    // ...but the reference list only looks for PERMISSIVE ports: the static policy stays and
    // port 9090 is still STRICT at ztunnel.
    assert_eq!(refs("foo", &app_a(), &[&ns, &pa]), [STATIC]);
}

#[test]
fn port_above_65535_is_ignored_and_the_workload_stays_strict() {
    use MtlsMode::*;
    // Workload STRICT with a PERMISSIVE port above 65535: no such port can carry a connection,
    // so no converted policy is generated (istiod generates one, and ztunnel would truncate the
    // port to 4464), and the workload keeps the static strict policy. Referencing the converted
    // policy that does not exist would drop STRICT on every port (fail open).
    let pa = wl_pa("foo", "wl", Strict, &[(70000, Permissive)]);
    assert_eq!(convert(&pa, &[&pa]), None);
    assert_eq!(refs("foo", &app_a(), &[&pa]), [STATIC]);
    // The same under an inherited STRICT with an UNSET workload.
    let ns = ns_pa("foo", "ns", Strict);
    let pa = wl_pa("foo", "wl", Unset, &[(70000, Permissive)]);
    assert_eq!(convert(&pa, &[&ns, &pa]), None);
    assert_eq!(refs("foo", &app_a(), &[&ns, &pa]), [STATIC]);
    // A real port next to it still counts.
    let pa = wl_pa(
        "foo",
        "wl",
        Strict,
        &[(70000, Permissive), (8080, Permissive)],
    );
    assert!(convert(&pa, &[&pa]).is_some());
    assert_eq!(
        refs("foo", &app_a(), &[&pa]),
        ["foo/converted_peer_authentication_wl"]
    );
}

#[test]
fn quirk_empty_selector_is_namespace_level_for_references_but_not_for_conversion() {
    use MtlsMode::*;
    // An empty matchLabels PA counts as the namespace policy when computing references...
    let empty_selector = PeerAuthentication {
        selector: Some(Labels::new()),
        ..ns_pa("foo", "ns", Strict)
    };
    assert_eq!(refs("foo", &app_a(), &[&empty_selector]), [STATIC]);
    // ...but it is not a parent (nsCfg) for another PA's conversion: the STRICT port is kept.
    let pa = wl_pa("foo", "wl", Unset, &[(9090, Strict)]);
    assert_eq!(
        convert(&pa, &[&empty_selector, &pa]),
        Some(converted("foo", "wl", vec![deny_plaintext_on(9090)]))
    );
    // And with port levels it is converted itself (it has a selector field), though no
    // workload ever references it.
    let with_ports = PeerAuthentication {
        port_level: [(8080, Permissive)].into(),
        ..empty_selector
    };
    assert!(convert(&with_ports, &[&with_ports]).is_some());
    assert_eq!(
        refs("foo", &app_a(), &[&with_ports]),
        ["istio-system/istio_converted_static_strict"]
    );
}

#[test]
fn quirk_root_pa_with_empty_selector_is_ignored_outside_the_root_namespace() {
    use MtlsMode::*;
    let root = PeerAuthentication {
        selector: Some(Labels::new()),
        ..ns_pa(ROOT, "mesh", Strict)
    };
    assert!(refs("foo", &app_a(), &[&root]).is_empty());
    // In the root namespace itself it is the mesh policy.
    assert_eq!(refs(ROOT, &app_a(), &[&root]), [STATIC]);
}

#[test]
fn oldest_wins_at_each_level() {
    use MtlsMode::*;
    let old = at(ns_pa("foo", "b-old", Strict), "2026-01-01T00:00:01Z");
    let new = at(ns_pa("foo", "a-new", Permissive), "2026-01-01T00:00:05Z");
    assert_eq!(refs("foo", &app_a(), &[&new, &old]), [STATIC]);
    // No timestamp sorts first (Go's zero time); equal times fall back to the name.
    let untimed = ns_pa("foo", "z", Permissive);
    assert!(refs("foo", &app_a(), &[&old, &untimed]).is_empty());
    let twin_a = at(ns_pa("foo", "a", Permissive), "2026-01-01T00:00:01Z");
    assert!(refs("foo", &app_a(), &[&old, &twin_a]).is_empty());

    // Workload level: the oldest selector PA decides.
    let wl_old = at(
        wl_pa("foo", "wl-old", Permissive, &[(9090, Strict)]),
        "2026-01-01T00:00:01Z",
    );
    let wl_new = at(wl_pa("foo", "wl-new", Strict, &[]), "2026-01-01T00:00:09Z");
    assert_eq!(
        refs("foo", &app_a(), &[&wl_new, &wl_old]),
        ["foo/converted_peer_authentication_wl-old"]
    );
    // And the conversion's parents are the oldest too.
    let pa = wl_pa("foo", "wl", Unset, &[(9090, Strict)]);
    assert_eq!(
        convert(&pa, &[&new, &old, &pa]),
        None,
        "oldest ns PA is STRICT"
    );
}

#[test]
fn not_converted_without_selector_or_ports_or_in_root() {
    use MtlsMode::*;
    let no_selector = PeerAuthentication {
        port_level: [(80, Strict)].into(),
        ..ns_pa("foo", "x", Permissive)
    };
    assert_eq!(convert(&no_selector, &[]), None);
    assert_eq!(convert(&wl_pa("foo", "x", Permissive, &[]), &[]), None);
    assert_eq!(
        convert(&wl_pa(ROOT, "x", Permissive, &[(80, Strict)]), &[]),
        None
    );
    assert_eq!(
        convert(&wl_pa("foo", "x", Permissive, &[(80, Unset)]), &[]),
        None
    );
}
