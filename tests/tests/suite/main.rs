//! The integration suite of `airlock-tests`, one test binary with a module per concern: the
//! crate graph is linked once instead of once per file. `cargo test -p airlock-tests --test
//! suite escape::` runs one module; test names are `module::test`.
//!
//! One binary is one process, and libtest runs tests of different modules at the same time.
//! Some tests observe what belongs to the whole process, which every other test disturbs —
//! its children, its worker cgroups, its descriptors — or change what the others rely on,
//! its environment: `abandon`, `cleanup`, `soak`, `escape_pooled` and `spawn`. So every
//! test begins by taking the suite's lock: those alone (`airlock_tests::exclusive()`),
//! every other one shared (`airlock_tests::shared()`). `suite_rules` fails the suite when a test does not
//! begin so, or when a file here is not one of its modules.

mod abandon;
mod bench;
mod builtins;
mod cancel;
mod cleanup;
mod cli;
mod daemon;
mod daemon_descriptors;
mod daemon_hostile;
mod daemon_queue;
mod daemon_stall;
mod denials;
mod egress;
mod escape;
mod escape_pooled;
mod gate;
mod isolation;
mod kernel_matrix;
mod landlock_audit;
mod learn;
mod library;
mod limits;
mod logs;
mod mcp;
mod mounts;
mod netns;
mod network;
mod operations;
mod pool;
mod protocol_hostile;
mod session_calls;
mod session_expiry;
mod session_pool;
mod session_settings;
mod soak;
mod source_layout;
mod spawn;
mod suite_rules;
mod tool_contract;
mod workspace;
