//! A tokenizer as the estimator counts with it: counts of long strings remembered (a
//! conversation's turns share most of their text), and bounded work whatever it is given.

use alloc::sync::Arc;
use core::cell::RefCell;

use super::lru::Lru;
use super::prompt::{Hash, LONG};
use crate::bpe::{Bpe, Encoding};

/// Strings at least this long have their counts remembered.
const MEMO_MIN: usize = 256;
/// The most bytes of remembered strings (about 4 MB), least recently used forgotten first.
const MEMO_BYTES: usize = 4 << 20;
/// The most text tokenized per string; beyond it the count is extrapolated.
pub(crate) const MAX_TOKENIZED: usize = 1 << 20;

/// One encoding's tokenizer with its memo.
pub(crate) struct Counter {
    bpe: Arc<Bpe>,
    memo: RefCell<Memo>,
}

struct Memo {
    counts: Lru<u64, (u64, usize)>,
    bytes: usize,
}

impl Counter {
    pub(crate) fn new(bpe: Arc<Bpe>) -> Counter {
        Counter {
            bpe,
            memo: RefCell::new(Memo {
                counts: Lru::new(usize::MAX),
                bytes: 0,
            }),
        }
    }

    pub(crate) fn encoding(&self) -> Encoding {
        self.bpe.encoding()
    }

    /// The tokens of `s`, exactly below [`MAX_TOKENIZED`] bytes (past it, the rest at the
    /// rate of the first part); remembered for long strings.
    pub(crate) fn count(&self, s: &str) -> u64 {
        if s.len() < MEMO_MIN {
            return self.bounded(s);
        }
        self.remembered(s, 0, || self.bounded(s))
    }

    /// The memo's figure for `s` under `rule` (0: the count; else the run cut), or
    /// `figure()` remembered.
    fn remembered(&self, s: &str, rule: usize, figure: impl FnOnce() -> u64) -> u64 {
        let key = {
            let mut h = Hash::new();
            h.push(&(rule as u64).to_le_bytes());
            if s.len() > LONG {
                h.push(super::prompt::digest(s).as_bytes());
            } else {
                h.push(s.as_bytes());
            }
            h.finish()
        };
        if let Some(&(n, _)) = self.memo.borrow_mut().counts.get(&key) {
            return n;
        }
        let n = figure();
        let mut memo = self.memo.borrow_mut();
        let weight = s.len().min(LONG);
        memo.counts.insert(key, (n, weight));
        memo.bytes += weight;
        while memo.bytes > MEMO_BYTES {
            match memo.counts.pop_oldest() {
                Some((_, (_, w))) => memo.bytes -= w,
                None => break,
            }
        }
        n
    }

    fn bounded(&self, s: &str) -> u64 {
        if s.len() <= MAX_TOKENIZED {
            return self.bpe.count(s) as u64;
        }
        let mut cut = MAX_TOKENIZED;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        let head = self.bpe.count(&s[..cut]) as u64;
        (u128::from(head) * s.len() as u128).div_ceil(cut as u128) as u64
    }

    /// The tokens of `s` with runs without whitespace cut at `max_run` characters and
    /// counted apart (about a token more per cut: the Anthropic proxy's rule).
    pub(crate) fn count_runs(&self, s: &str, max_run: usize) -> u64 {
        if s.len() < MEMO_MIN {
            return self.cut_runs(s, max_run);
        }
        // A long string's figure is remembered whole: a conversation's earlier turns are
        // not walked again.
        self.remembered(s, max_run.max(1), || self.cut_runs(s, max_run))
    }

    fn cut_runs(&self, s: &str, max_run: usize) -> u64 {
        let mut run = 0;
        let mut from = 0;
        let mut n = 0;
        for (i, c) in s.char_indices() {
            if matches!(c, ' ' | '\n' | '\t' | '\r') {
                run = 0;
                continue;
            }
            run += 1;
            if run >= max_run {
                let end = i + c.len_utf8();
                n += self.count(&s[from..end]);
                from = end;
                run = 0;
            }
        }
        if from == 0 {
            // No run was cut: the whole string's count (remembered by `count_runs`).
            self.bounded(s)
        } else {
            n + if from < s.len() {
                self.count(&s[from..])
            } else {
                0
            }
        }
    }
}
