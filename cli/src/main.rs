//! The `airlock` binary.
fn main() {}
