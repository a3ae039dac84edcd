//! Fuzz target: arbitrary UTF-8 as a policy file, through `airlock_policy::parse_policy_str`.
//!
//! The parser must return an error (with a location) for anything invalid and never panic,
//! overflow the stack or hang. Seeds: `corpus/parse_policy/*.toml`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(source) = std::str::from_utf8(data) {
        let _ = airlock_policy::parse_policy_str(source, "fuzz.toml");
    }
});
