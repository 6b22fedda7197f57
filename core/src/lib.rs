//! tokenwarden-core (skeleton; the coordinator lands in this crate).
#![no_std]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
#![deny(clippy::float_arithmetic)]

extern crate alloc;
#[cfg(any(feature = "std", test))]
extern crate std;

pub mod headers;
