//! `airlock bench`'s report as a table.

use super::{Report, burst, denials, egress, oneshot, session};

pub(super) fn print_table(report: &Report) {
    println!("airlock bench ({} interleaved rounds)\n", report.rounds);
    println!(
        "{:<42} {:>10} {:>10} {:>9} {:>9}",
        "start-up latency", "median ms", "p99 ms", "× floor", "× bwrap"
    );
    for l in &report.latency {
        let vs_bwrap = l.vs_bwrap.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:<42} {:>10.3} {:>10.3} {:>9.2} {:>9}",
            l.name, l.median_ms, l.p99_ms, l.vs_floor, vs_bwrap
        );
    }
    let d = &report.deadline_to_reaped_ms;
    println!("{:<42} {:>10.3} {:>10.3}", d.name, d.median_ms, d.p99_ms);
    println!(
        "\nthroughput (calls/s; airlock keeps {} idle pooled workers)",
        report.throughput_pool
    );
    for (name, value) in &report.throughput_calls_per_s {
        println!("  airlock {name:<36} {value:>8.1}");
    }
    for (name, value) in &report.bwrap_throughput_calls_per_s {
        println!("  bwrap   {name:<36} {value:>8.1}");
    }
    for r in &report.throughput_vs_bwrap {
        println!(
            "  airlock / bwrap, {} client(s)                {:>8.2}   (slices of {}: {:.2}–{:.2})",
            r.clients, r.ratio, r.slices, r.slice_ratio_min, r.slice_ratio_max
        );
    }
    for pool in &report.pool_during_throughput {
        println!(
            "  airlock, {} client(s): {} calls on pooled workers, {} cold (pool empty); {:.0} ms refilling the pool and reaping after the last call, on the clock; {} workers in a reused cgroup",
            pool.clients,
            pool.hits,
            pool.misses,
            pool.refill_seconds * 1e3,
            pool.cgroups_reused
        );
    }
    for t in &report.latency_under_load {
        println!(
            "  airlock, {} client(s) at full load: call p50 {:.3} ms, p99 {:.3} ms (p99/p50 {:.2}, {} calls)",
            t.clients, t.p50_ms, t.p99_ms, t.p99_over_p50, t.samples
        );
    }
    for t in &report.bwrap_latency_under_load {
        println!(
            "  bwrap, {} client(s) at full load: run p50 {:.3} ms, p99 {:.3} ms (p99/p50 {:.2}, {} runs)",
            t.clients, t.p50_ms, t.p99_ms, t.p99_over_p50, t.samples
        );
    }
    println!("\nmemory");
    if let Some(d) = &report.daemon_memory {
        println!(
            "  airlock serve: RSS idle                    {:>8} KiB",
            d.rss_idle_kib
        );
        println!(
            "    of which file-backed (own text) / anon  {:>8} / {} KiB",
            d.rss_idle_file_kib, d.rss_idle_anon_kib
        );
        println!(
            "  airlock serve: RSS with {:>2} pooled workers {:>7} KiB",
            report.pool_workers, d.rss_with_pool_kib
        );
        println!(
            "    per idle pooled worker: PSS              {:>8} KiB",
            d.worker_pss_kib
        );
    }
    println!(
        "  bench process: RSS idle                    {:>8} KiB",
        report.supervisor_rss_idle_kib
    );
    println!(
        "  bench process: RSS with {:>2} pooled workers {:>7} KiB",
        report.pool_workers, report.supervisor_rss_with_pool_kib
    );
    println!(
        "    of which file-backed (own text) / anon  {:>8} / {} KiB",
        report.supervisor_rss_file_kib, report.supervisor_rss_anon_kib
    );
    println!(
        "  idle pooled worker: RSS / PSS / anon       {:>8} / {} / {} KiB",
        report.worker_rss_per_idle_pooled_kib,
        report.worker_pss_per_idle_pooled_kib,
        report.worker_anon_per_idle_pooled_kib
    );
    if let Some(e) = &report.egress {
        egress::print(e);
    }
    if let Some(cost) = &report.denial_reporting {
        denials::print(cost);
    }
    if let Some(cost) = &report.landlock_audit {
        denials::print_landlock_audit(cost);
    }
    if let Some(o) = &report.oneshot {
        oneshot::print(o);
    }
    if let Some(b) = &report.burst {
        burst::print(b);
    }
    if let Some(s) = &report.session {
        session::print(s);
    }
    for note in &report.notes {
        println!("note: {note}");
    }
}
