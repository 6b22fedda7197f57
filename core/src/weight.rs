//! Virtual time for the weighted fair queue: what a call of a share costs at a weight,
//! quanta and small calls (the arithmetic; a request's weight is the coordinator's, see
//! `coordinator/weigh.rs`).

use crate::bucket::SHARE_UNIT;
use crate::config::WeightConfig;
use crate::lease::Fair;

/// `a × b / 1000`, in 64-bit arithmetic when the product fits (it does for every valid
/// configuration), so the common case needs no 128-bit division. Same result either way.
pub(crate) fn mul_permille(a: u128, b: u128) -> u128 {
    if let (Ok(a), Ok(b)) = (u64::try_from(a), u64::try_from(b)) {
        if let Some(p) = a.checked_mul(b) {
            return u128::from(p / 1000);
        }
    }
    a.saturating_mul(b) / 1000
}

/// Virtual time per part of dominant share at weight 1 (a weight of 1,000 is 1.0): a request
/// of share `s` (parts per 10⁹ of the limit that binds it, see `Pool::dominant_share`) at
/// weight `w` costs `(s + 1)·SCALE / w`.
pub(crate) const SCALE: u128 = 1_000_000;

/// A ticket's length in virtual time: `(share + 1) × 10^6 / weight` (weight ≥ 1), in
/// 64-bit arithmetic when the operands fit. Same result either way.
pub(crate) fn virtual_cost(share: u64, weight: u128) -> u128 {
    if let (Some(scaled), Ok(w)) = (
        share
            .checked_add(1)
            .and_then(|c| c.checked_mul(SCALE as u64)),
        u64::try_from(weight),
    ) {
        return u128::from(scaled / w.max(1));
    }
    let cost = u128::from(share).saturating_add(1);
    cost.saturating_mul(SCALE) / weight.max(1)
}

/// The fair order's quantum in dominant share: `weights.quantum_permille` of a limit.
pub(crate) fn quantum(w: WeightConfig) -> u64 {
    u64::from(w.quantum_permille).saturating_mul(SHARE_UNIT / 1000)
}

/// How far past its virtual start a request of `share` is placed in line: its whole cost
/// (`fair.cost`), or for its agent's first call in the pool the virtual cost of at most a
/// quantum of it (see `weights.quantum_permille`).
pub(crate) fn place_cost(share: u64, fair: &Fair, w: WeightConfig) -> u128 {
    if fair.first && share > quantum(w) {
        virtual_cost(quantum(w), u128::from(fair.weight))
    } else {
        fair.cost
    }
}

/// Whether a call of dominant share `share` is small: no bigger than a quantum (see
/// `weights.quantum_permille`). An agent's small calls are placed by a clock of their own
/// — its previous small call's virtual finish — but at most `weights.small_lead_permille`
/// of a limit before its clock of every call, by which its big calls are placed. So a
/// small call after a big one waits for its own share and what the lead leaves of the big
/// one's, not for the big one's whole share (small calls are not taxed by the fair order
/// for the big calls around them), and the agent is served at most the lead beyond its
/// share at any time (the queued tickets' bounds count it).
pub(crate) fn small(share: u64, w: WeightConfig) -> bool {
    share <= quantum(w)
}

/// `weights.small_lead_permille` as a dominant share.
pub(crate) fn small_lead(w: WeightConfig) -> u64 {
    u64::from(w.small_lead_permille).saturating_mul(SHARE_UNIT / 1000)
}
