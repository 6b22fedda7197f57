//! Test support shared by the core's integration tests.

pub mod host;
