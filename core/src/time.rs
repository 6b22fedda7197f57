//! Time as the core sees it: integer milliseconds on a host-chosen epoch.

use core::fmt;
use serde::{Deserialize, Serialize};

/// An instant in milliseconds since an epoch the host chooses.
///
/// The core never reads a clock: every entry point takes a `Millis` from the host.
/// Instants only move forward inside the core; a value older than the last one seen is
/// clamped to it. Arithmetic saturates, so `u64::MAX` is a valid (if distant) instant.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    /// The epoch itself.
    pub const ZERO: Millis = Millis(0);
    /// The latest representable instant.
    pub const MAX: Millis = Millis(u64::MAX);

    /// The raw millisecond count.
    #[must_use]
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating at [`Millis::MAX`].
    #[must_use]
    pub const fn plus(self, ms: u64) -> Millis {
        Millis(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, or 0 if `earlier` is later.
    #[must_use]
    pub const fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl From<u64> for Millis {
    fn from(ms: u64) -> Self {
        Millis(ms)
    }
}

impl From<Millis> for u64 {
    fn from(t: Millis) -> Self {
        t.0
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// Longest duration any `*_ms` field may hold: 30 days.
pub const MAX_DURATION_MS: u64 = 30 * 24 * 3_600_000;
