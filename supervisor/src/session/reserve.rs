//! A place among `max_sessions` held by an open that is still making its storage.
//!
//! The storage (a tmpfs mount, perhaps a copy of a base) takes a while, so it is made
//! outside the table's lock; opens in progress are counted beside the open sessions, so
//! that opens running side by side cannot pass the limit together.

use std::sync::atomic::{AtomicUsize, Ordering};

/// One open's place, given back when it is dropped: on success (once the session is in
/// the table) and on every error alike.
#[derive(Debug)]
pub(super) struct Reservation<'a> {
    opening: &'a AtomicUsize,
}

impl<'a> Reservation<'a> {
    /// A place, if the `open` sessions and the opens in progress (`opening`) leave one
    /// under `max`. The caller holds the table's lock, so that no two opens take the last
    /// place together and a session moving into the table is never counted out of both.
    pub(super) fn take(opening: &'a AtomicUsize, open: usize, max: usize) -> Option<Self> {
        let in_progress = opening.load(Ordering::SeqCst);
        if open.saturating_add(in_progress) >= max {
            return None;
        }
        opening.fetch_add(1, Ordering::SeqCst);
        Some(Self { opening })
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.opening.fetch_sub(1, Ordering::SeqCst);
    }
}
