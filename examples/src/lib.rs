//! Runnable programs over `tokenwarden-core`.
//!
//! [`sim`] is a deterministic discrete-event simulator of a fleet of coding agents sharing
//! one API key: it reproduces the fleet of the "rate limits for agent fleets" write-up (20
//! agents in lock step, 80k- and 2k-token turns, prompt-cache expiry, a re-plan costing
//! 5–20× the failed call) and measures per-agent backoff, SDK defaults, a shared RPM
//! counter and the coordinator side by side. The `fleet` binary runs it and writes the
//! report.

pub mod sim;
