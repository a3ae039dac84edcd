//! Shared helpers for airlock's integration tests.
