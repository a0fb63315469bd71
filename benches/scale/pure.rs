//! T1 cold build, T2 memory per pod, T3 one pod change: the index alone.

use super::*;

// ---------------------------------------------------------------------------------------------
// T1 cold build, T2 memory per pod, T3 one pod change (pure)

pub(super) fn t1(o: &Opts) {
    let spec = Spec::new(if o.quick { 10_000 } else { 100_000 });
    // T1's target is for 10k services and 1k policies with 100k pods; Spec::new gives that.
    eprintln!("T1: generating {}", spec.label());
    let docs = cluster_json(&spec);
    let bytes: usize = docs.iter().map(|(_, d)| d.len()).sum();
    let mut totals = Vec::new();
    let mut parts: Vec<Breakdown> = Vec::new();
    let mut prost = Vec::new();
    let mut resources = 0;
    for run in 0..runs(o) {
        let (index, snapshot, b) = build(&docs);
        eprintln!("T1 run {run}: {:.0} ms", ms(b.total()));
        totals.push(ms(b.total()));
        parts.push(b);
        resources = snapshot.addresses.len() + snapshot.authorizations.len();
        if run == 0 || !o.quick {
            let (addresses, authorizations) = messages(&snapshot);
            let t = Instant::now();
            let mut n = 0usize;
            for a in &addresses {
                n += std::hint::black_box(a.encode_to_vec()).len();
            }
            for a in &authorizations {
                n += std::hint::black_box(a.encode_to_vec()).len();
            }
            prost.push(ms(t.elapsed()));
            std::hint::black_box(n);
        }
        drop((index, snapshot));
    }
    let med = median(&mut totals.clone());
    let part = |f: fn(&Breakdown) -> Duration| {
        median(&mut parts.iter().map(|b| ms(f(b))).collect::<Vec<_>>())
    };
    let prost_ms = median(&mut prost);
    let per_kind: Vec<String> = (0..5)
        .map(|slot| {
            let kind = parts[0].kinds[slot].0;
            let t = median(
                &mut parts
                    .iter()
                    .map(|b| ms(b.kinds[slot].1))
                    .collect::<Vec<_>>(),
            );
            format!("{kind:?} {t:.0}")
        })
        .collect();
    let full_size = spec.pods == 100_000;
    emit(row(
        "T1",
        spec.label(),
        "cold build: JSON -> snapshot",
        med,
        "ms",
        "< 2000 ms (100k)",
        full_size.then_some(med < 2000.0),
        format!(
            "parse {:.0} / decode {:.0} / index+encode {:.0} ({}) / publish {:.1} ms; {} resources, {:.0} MB JSON; raw prost encode {:.1} ms = {:.1}% of the build ({:.0}x)",
            part(|b| b.parse),
            part(|b| b.decode),
            part(|b| b.index),
            per_kind.join(", "),
            part(|b| b.snapshot),
            resources,
            bytes as f64 / 1e6,
            prost_ms,
            prost_ms / med * 100.0,
            med / prost_ms
        ),
    ));
}

pub(super) fn t2(o: &Opts) {
    let spec = Spec::new(if o.quick { 10_000 } else { 100_000 });
    eprintln!("T2: generating {}", spec.label());
    let docs = cluster_json(&spec);
    let before = rss_bytes();
    // With `--features dhat-heap`: the heap the build leaves live (index and snapshot, without
    // the allocator's retention of the parse garbage), per pod; `dhat-heap.json` lists it by
    // allocation site.
    #[cfg(feature = "dhat-heap")]
    let profiler = dhat::Profiler::builder().trim_backtraces(None).build();
    let (index, snapshot, _) = build(&docs);
    let after = rss_bytes();
    #[cfg(feature = "dhat-heap")]
    {
        let heap = dhat::HeapStats::get();
        eprintln!(
            "  T2 heap (dhat): {:.0} B in {:.1} blocks live per pod; peak {:.0} B per pod",
            heap.curr_bytes as f64 / spec.pods as f64,
            heap.curr_blocks as f64 / spec.pods as f64,
            heap.max_bytes as f64 / spec.pods as f64,
        );
        drop(profiler);
    }
    let per_pod = (after.saturating_sub(before)) as f64 / spec.pods as f64;
    // 1.5 KiB: the budget for the index's plain data (named fields and whole encoded values,
    // not hand-packed layouts).
    emit(row(
        "T2",
        spec.label(),
        "RSS delta / pods (index + snapshot, all objects)",
        per_pod,
        "B",
        "<= 1536 B",
        Some(per_pod <= 1536.0),
        format!(
            "RSS {:.0} -> {:.0} MB, {} Address resources; one sample (own process)",
            before as f64 / 1e6,
            after as f64 / 1e6,
            snapshot.addresses.len()
        ),
    ));
    drop((index, snapshot, docs));
}

/// Pre-decoded (ready, not ready) variants of a few pods, so a timed step holds no JSON work.
pub(super) fn flips(spec: &Spec, count: usize) -> Vec<(Object, Object)> {
    (0..count)
        .map(|k| {
            let i = (k * 7919 + 13) % spec.pods;
            (
                decode_one(pod_json(spec, i, true)),
                decode_one(pod_json(spec, i, false)),
            )
        })
        .collect()
}

pub(super) fn t3(o: &Opts) {
    let sizes: &[usize] = if o.quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let iterations = if o.quick { 2_000 } else { 20_000 };
    for &pods in sizes {
        let spec = Spec::new(pods);
        let docs = cluster_json(&spec);
        let (mut index, _, _) = build(&docs);
        drop(docs);
        let pairs = flips(&spec, 64);
        let mut ready = vec![true; pairs.len()];
        let mut times = Vec::with_capacity(iterations);
        let mut encode_times = Vec::new();
        let mut sizes_seen = Vec::new();
        for n in 0..iterations {
            let k = n % pairs.len();
            ready[k] = !ready[k];
            let object = if ready[k] {
                pairs[k].0.clone()
            } else {
                pairs[k].1.clone()
            };
            let t = Instant::now();
            let changes = index.apply(object);
            let snapshot = index.snapshot();
            let elapsed = t.elapsed();
            times.push(elapsed.as_secs_f64() * 1e6);
            assert_eq!(changes.addresses.upserted.len(), 1, "one workload changed");
            if n % 16 == 0 {
                let name = changes.addresses.upserted.iter().next().expect("name");
                let resource = snapshot.addresses.get(name).expect("resource");
                sizes_seen.push(resource.value_len() as f64);
                let message = Address::decode(resource.value()).expect("Address");
                let t = Instant::now();
                std::hint::black_box(message.encode_to_vec());
                encode_times.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        // A no-op update: the same object again.
        let k = 0;
        let same = if ready[k] {
            pairs[k].0.clone()
        } else {
            pairs[k].1.clone()
        };
        let noop = index.apply(same);
        let p99 = percentile(&mut times.clone(), 99.0);
        let med = median(&mut times);
        let prost = median(&mut encode_times);
        emit(row(
            "T3",
            spec.label(),
            "one pod change: apply + encode + publish",
            med,
            "µs",
            "< 20 µs, flat",
            Some(med < 20.0),
            format!(
                "p99 {p99:.1} µs over {iterations}; raw prost encode of that Workload {prost:.2} µs ({:.0}x); Workload {:.0} B; no-op update -> empty Changes: {}",
                med / prost,
                median(&mut sizes_seen),
                noop.is_empty()
            ),
        ));
        assert!(noop.is_empty(), "a no-op update produced changes");
    }
}
