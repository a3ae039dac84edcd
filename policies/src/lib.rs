//! airlock-policy: policy files from TOML text to a compiled sandbox spec.
#![forbid(unsafe_code)]
