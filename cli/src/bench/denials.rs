//! What reporting refusals costs a call that is refused nothing: the same profile's pooled
//! `/bin/true` with its seccomp program in the reporting form (a listener passed to the
//! supervisor and watched for the call) and in the errno form (no listener), interleaved
//! in one run; and what one refused syscall costs when it is reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::{SandboxRun, Supervisor};
use airlock_policy::CompiledProfile;
use airlock_policy::compile::compile_profile_as;
use airlock_policy::seccomp::Form;
use serde::Serialize;

/// The figures, milliseconds (medians).
#[derive(Debug, Clone, Serialize)]
pub struct ReportingCost {
    /// Pooled `/bin/true`, refusals reported.
    pub warm_reported_ms: f64,
    /// The same, the filter answering alone.
    pub warm_unreported_ms: f64,
    /// Reported over unreported, minus one, in percent.
    pub overhead_percent: f64,
    pub samples: usize,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

fn true_run(profile: &Arc<CompiledProfile>) -> SandboxRun {
    SandboxRun {
        call_id: "bench-denials".into(),
        tool: "true".into(),
        profile: Arc::clone(profile),
        argv: vec!["/bin/true".into()],
        stdin: Vec::new(),
        arguments_json: "{}".into(),
        timeout: Duration::from_secs(30),
        inherit_stdio: None,
        builtin: None,
    }
}

/// The `default` profile of `policy_text` in both forms.
fn both_forms(policy_text: &str) -> anyhow::Result<(Arc<CompiledProfile>, Arc<CompiledProfile>)> {
    let file = airlock_policy::parse_policy_str(policy_text, "bench.toml")
        .map_err(|_| anyhow::anyhow!("the bench policy does not parse"))?;
    let (valid, _) = airlock_policy::validate::validate_policy(
        &file,
        airlock_policy::Source::new("bench.toml", policy_text),
    )
    .map_err(|_| anyhow::anyhow!("the bench policy is invalid"))?;
    let profile = valid
        .profiles
        .get("default")
        .ok_or_else(|| anyhow::anyhow!("the bench policy has no default profile"))?;
    Ok((
        Arc::new(compile_profile_as(profile, Form::Reporting)?),
        Arc::new(compile_profile_as(profile, Form::Errno)?),
    ))
}

/// Measures `rounds` pooled calls of each form, alternating.
pub async fn measure(
    policy_text: &str,
    rounds: usize,
    options: airlock::SupervisorOptions,
) -> anyhow::Result<ReportingCost> {
    let (reported, unreported) = both_forms(policy_text)?;
    let warm = Arc::new(Supervisor::start(options)?);
    warm.keep_warm(Arc::clone(&reported), 1);
    warm.keep_warm(Arc::clone(&unreported), 1);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (profile, samples) in [(&reported, &mut with), (&unreported, &mut without)] {
            // A pooled worker waiting: the call measures the pooled path only.
            let deadline = Instant::now() + Duration::from_secs(30);
            while warm.pool_stats().idle < 2 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let started = Instant::now();
            if warm.run(true_run(profile), None).await.ok {
                samples.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
    warm.close().await;
    let samples = with.len().min(without.len());
    let (with, without) = (median(with), median(without));
    Ok(ReportingCost {
        warm_reported_ms: with,
        warm_unreported_ms: without,
        overhead_percent: (with / without - 1.0) * 100.0,
        samples,
    })
}

/// The table's line.
pub fn print(cost: &ReportingCost) {
    println!(
        "denial reporting: pooled /bin/true {:.3} ms reported, {:.3} ms unreported ({:+.1} %)",
        cost.warm_reported_ms, cost.warm_unreported_ms, cost.overhead_percent
    );
}

/// What reading Landlock's refusals from the audit costs a pooled call refused nothing
/// (milliseconds, medians): the same profile's pooled `/bin/true` on a supervisor that
/// reads them and on one that does not, alternating in one run.
#[derive(Debug, Clone, Serialize)]
pub struct LandlockAuditCost {
    pub warm_read_ms: f64,
    pub warm_unread_ms: f64,
    /// Read over unread, minus one, in percent.
    pub overhead_percent: f64,
    pub samples: usize,
}

/// Measures `rounds` pooled calls on each supervisor; an error where the host cannot read
/// the audit (it is never switched on here).
pub async fn measure_landlock_audit(
    policy_text: &str,
    rounds: usize,
    options: fn() -> airlock::SupervisorOptions,
) -> anyhow::Result<LandlockAuditCost> {
    let (profile, _) = both_forms(policy_text)?;
    let read = Arc::new(Supervisor::start(airlock::SupervisorOptions {
        landlock_audit: true,
        ..options()
    })?);
    if let airlock::LandlockAuditState::Unavailable(why) = read.landlock_audit() {
        anyhow::bail!("{why}");
    }
    let unread = Arc::new(Supervisor::start(options())?);
    read.keep_warm(Arc::clone(&profile), 1);
    unread.keep_warm(Arc::clone(&profile), 1);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (supervisor, samples) in [(&read, &mut with), (&unread, &mut without)] {
            let deadline = Instant::now() + Duration::from_secs(30);
            while supervisor.pool_stats().idle < 1 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let started = Instant::now();
            let result = supervisor.run(true_run(&profile), None).await;
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            let reported = result.isolation.as_ref().is_some_and(|i| {
                i.denial_reporting.landlock == airlock::result::Coverage::Reported
            });
            if result.ok && reported == Arc::ptr_eq(supervisor, &read) {
                samples.push(elapsed);
            }
        }
    }
    read.close().await;
    unread.close().await;
    let samples = with.len().min(without.len());
    if samples == 0 {
        anyhow::bail!("no call said landlock: reported");
    }
    let (with, without) = (median(with), median(without));
    Ok(LandlockAuditCost {
        warm_read_ms: with,
        warm_unread_ms: without,
        overhead_percent: (with / without - 1.0) * 100.0,
        samples,
    })
}

/// The table's line.
pub fn print_landlock_audit(cost: &LandlockAuditCost) {
    println!(
        "landlock audit: pooled /bin/true {:.3} ms read, {:.3} ms not ({:+.1} %)",
        cost.warm_read_ms, cost.warm_unread_ms, cost.overhead_percent
    );
}
