//! The loader's integration tests, one binary (a module per former binary). `limits` stays a
//! binary of its own: it checks the process's peak RSS, which other tests' threads would raise.

mod edges;
mod formats_modelopt;
mod fuzz;
mod malformed;
mod structure;
