//! airlock: the trusted supervisor — gate, spawn, cgroups, deadlines, results.
