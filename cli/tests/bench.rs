//! `airlock bench --json` reports every figure, quickly enough for CI (tiny settings here).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

#[test]
fn bench_json_reports_latency_throughput_kill_and_memory_figures() {
    let out = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args([
            "bench",
            "--json",
            "--rounds",
            "3",
            "--throughput-seconds",
            "0.2",
            "--pool-workers",
            "2",
            // The defaults (60 one-shot rounds; bursts of 64 and 1,024 calls sleeping 2 s,
            // then 10 s of settling) took 40 s of CI's time; the figures' presence is what
            // this checks.
            "--oneshot-rounds",
            "3",
            "--burst",
            "4,8",
            "--burst-sleep-seconds",
            "0.2",
            "--burst-settle-seconds",
            "0.2",
        ])
        .output()
        .unwrap();
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).to_string();
        if std::env::var("AIRLOCK_MUST_WORK").is_ok_and(|v| v == "1") {
            panic!("bench failed: {why}");
        }
        eprintln!("SKIP: bench needs a working sandbox: {why}");
        return;
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = report["latency"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    for expected in [
        "floor",
        "airlock exec",
        "airlock cold call",
        "airlock warm pooled call",
        "airlock built-in",
    ] {
        assert!(
            names.iter().any(|n| n.starts_with(expected)),
            "{expected} missing from {names:?}"
        );
    }
    assert_eq!(
        report["throughput_calls_per_s"].as_array().unwrap().len(),
        2
    );
    // With bwrap installed, both client counts get a ratio from the alternating slices.
    if !report["bwrap_throughput_calls_per_s"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        let ratios = report["throughput_vs_bwrap"].as_array().unwrap();
        assert_eq!(ratios.len(), 2, "{ratios:?}");
        for r in ratios {
            let ratio = r["ratio"].as_f64().unwrap();
            assert!(ratio > 0.0 && ratio.is_finite(), "{r:?}");
            assert!(
                r["slice_ratio_min"].as_f64().unwrap() <= r["slice_ratio_max"].as_f64().unwrap()
            );
        }
    }
    // The tail at full load, airlock's and (with bwrap installed) bwrap's beside it, for
    // one and two clients.
    let tail_of = |field: &str| -> Vec<u64> {
        report[field]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let (p50, p99) = (t["p50_ms"].as_f64().unwrap(), t["p99_ms"].as_f64().unwrap());
                assert!(p50 > 0.0 && p50 <= p99, "{t}");
                assert!(t["samples"].as_u64().unwrap() > 0, "{t}");
                t["clients"].as_u64().unwrap()
            })
            .collect()
    };
    assert_eq!(tail_of("latency_under_load"), [1, 2]);
    let bwrap_tail = tail_of("bwrap_latency_under_load");
    if report["bwrap_throughput_calls_per_s"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(bwrap_tail.is_empty());
    } else {
        assert_eq!(bwrap_tail, [1, 2]);
    }
    // Each throughput run says how its calls were served. A slice ends with the pool as it
    // began, so it made one worker per call; a reused cgroup (v1, or v2 from Linux 6.12)
    // serves one of those workers at most, so never more than the calls.
    for pool in report["pool_during_throughput"].as_array().unwrap() {
        let calls = pool["hits"].as_u64().unwrap() + pool["misses"].as_u64().unwrap();
        assert!(calls > 0, "{pool:?}");
        assert!(
            pool["cgroups_reused"].as_u64().unwrap() <= calls,
            "{pool:?}"
        );
        let refill = pool["refill_seconds"].as_f64().unwrap();
        assert!(refill >= 0.0 && refill.is_finite(), "{pool:?}");
    }
    assert!(report["deadline_to_reaped_ms"]["samples"].as_u64().unwrap() > 0);
    let bursts = report["burst"]["bursts"].as_array().unwrap();
    assert_eq!(
        bursts
            .iter()
            .map(|b| b["calls"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [4, 8]
    );
    for burst in bursts {
        assert_eq!(burst["airlock_failed"], 0, "{burst}");
    }
    let oneshot = report["oneshot"]["contenders"].as_array().unwrap();
    for expected in ["airlock exec", "airlock run"] {
        let found = oneshot
            .iter()
            .find(|c| c["name"].as_str().unwrap().starts_with(expected))
            .unwrap_or_else(|| panic!("no one-shot {expected}: {oneshot:?}"));
        assert_eq!(found["samples"], 3, "{found}");
        assert!(found["median_ms"].as_f64().unwrap() > 0.0, "{found}");
    }
    // Sessions need no kernel feature the rest of the bench does not.
    assert!(report["session"].is_object(), "{}", report["notes"]);
    assert!(report["supervisor_rss_idle_kib"].as_u64().unwrap() > 0);
    // The pooled workers were found and measured (a worker maps at least libc and itself).
    assert!(report["worker_rss_per_idle_pooled_kib"].as_u64().unwrap() > 500);
    assert!(report["worker_pss_per_idle_pooled_kib"].as_u64().unwrap() > 0);
    assert!(report["worker_anon_per_idle_pooled_kib"].as_u64().unwrap() > 0);
}
