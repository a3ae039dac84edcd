//! How sessions end on their own, on an injected clock: idle ones expire, busy ones at their
//! lifetime, and what a dropped or dead supervisor left is removed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use airlock::gate::Clock;
use airlock_tests::Scratch;

#[derive(Debug)]
struct FakeClock(Mutex<SystemTime>);

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

#[test]
fn idle_sessions_expire_and_leave_nothing() {
    let _guard = airlock_tests::shared();
    let scratch = Scratch::new("workspace-expiry");
    let state = scratch.0.join("sessions");
    let clock = Arc::new(FakeClock(Mutex::new(SystemTime::now())));
    let sessions = airlock::Sessions::new(&state, (65534, 65534), clock.clone()).unwrap();
    let policy = airlock_policy::validate::SessionPolicy {
        idle_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let opened = sessions.open(&policy, None, None, 1 << 20).unwrap();
    sessions
        .put_file(&policy, &opened.session, "f", b"data")
        .unwrap();
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 1);
    *clock.0.lock().unwrap() += Duration::from_secs(59);
    assert_eq!(sessions.sweep(&policy), 0, "used 59s ago: still open");
    assert_eq!(
        sessions.get_file(&policy, &opened.session, "f").unwrap(),
        b"data"
    );
    *clock.0.lock().unwrap() += Duration::from_secs(60);
    assert_eq!(sessions.sweep(&policy), 1);
    assert!(matches!(
        sessions.get_file(&policy, &opened.session, "f"),
        Err(airlock::SessionError::Unknown { .. })
    ));
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
    // A new supervisor on the same state directory removes what a dead one left.
    let left = sessions.open(&policy, None, None, 1 << 20).unwrap();
    std::mem::forget(sessions);
    let _again = airlock::Sessions::new(&state, (65534, 65534), clock).unwrap();
    assert_eq!(
        std::fs::read_dir(&state).unwrap().count(),
        0,
        "{}",
        left.session
    );
}

#[test]
fn a_session_kept_busy_ends_at_its_lifetime() {
    let _guard = airlock_tests::shared();
    let scratch = Scratch::new("workspace-lifetime");
    let state = scratch.0.join("sessions");
    let clock = Arc::new(FakeClock(Mutex::new(SystemTime::now())));
    let sessions = airlock::Sessions::new(&state, (65534, 65534), clock.clone()).unwrap();
    let policy = airlock_policy::validate::SessionPolicy {
        idle_timeout: Duration::from_secs(60),
        max_lifetime: Duration::from_secs(150),
        ..Default::default()
    };
    let opened = sessions.open(&policy, None, None, 1 << 20).unwrap();
    // Used every 50 s, it is never idle, and lives until its lifetime all the same.
    for _ in 0..2 {
        *clock.0.lock().unwrap() += Duration::from_secs(50);
        sessions
            .put_file(&policy, &opened.session, "f", b"data")
            .unwrap();
        assert_eq!(sessions.sweep(&policy), 0);
    }
    *clock.0.lock().unwrap() += Duration::from_secs(50);
    assert!(matches!(
        sessions.get_file(&policy, &opened.session, "f"),
        Err(airlock::SessionError::Unknown { .. })
    ));
    // That operation's own sweep closed it.
    assert_eq!(sessions.sweep(&policy), 0);
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
    // One opened with a lifetime shorter than its idle timeout says when it really ends.
    let short = airlock_policy::validate::SessionPolicy {
        max_lifetime: Duration::from_secs(10),
        ..policy
    };
    let now = *clock.0.lock().unwrap();
    let opened = sessions.open(&short, None, None, 1 << 20).unwrap();
    let ends = now + Duration::from_secs(10);
    let ends_ms = ends
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    assert_eq!(u128::from(opened.expires_at), ends_ms);
    sessions.close(&opened.session).unwrap();
}

#[test]
fn sessions_dropped_without_closing_leave_no_mount_or_files() {
    let _guard = airlock_tests::shared();
    let scratch = Scratch::new("workspace-dropped");
    let state = scratch.0.join("sessions");
    let sessions =
        airlock::Sessions::new(&state, (65534, 65534), Arc::new(airlock::gate::SystemClock))
            .unwrap();
    let policy = airlock_policy::validate::SessionPolicy::default();
    for _ in 0..2 {
        let opened = sessions.open(&policy, None, None, 1 << 20).unwrap();
        sessions
            .put_file(&policy, &opened.session, "f", b"data")
            .unwrap();
    }
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 2);
    let state_text = state.display().to_string();
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|line| line.contains(&state_text))
            .count()
    };
    // As root each workspace is a tmpfs of its own.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(mounted(), 2);
    }
    drop(sessions);
    assert_eq!(std::fs::read_dir(&state).unwrap().count(), 0);
    assert_eq!(mounted(), 0);
}
