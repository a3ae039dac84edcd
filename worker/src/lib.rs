//! airlock-worker: the single-threaded program that confines itself and runs one tool call.
