//! Counting a text's tokens as OpenAI's byte-pair encodings do (`o200k_base`,
//! `cl100k_base`): the text is cut into pieces as the encoding's expression cuts it (the
//! `split` module), and each piece's UTF-8 bytes are merged pair by pair, the pair whose
//! merge has the lowest rank first (the leftmost of equals), until no adjacent pair is a
//! token.
//! Special-token strings (`<|endoftext|>`) are ordinary text, as the API takes them in a
//! prompt.
//!
//! The ranks are data, not code: a host hands them over ([`Bpe::new`]), so a build that
//! never counts OpenAI text (the browser's) does not carry 2.3 MB of them, and one that
//! does can load them when first needed. With the `ranks` feature the crate embeds both
//! encodings' ranks (`O200K_BASE`, `CL100K_BASE`). The files are
//! `provider/data/*.bpe`, made from tiktoken's published ranks by
//! `cargo run -p tokenwarden-provider --example bpe_ranks`: a 16-byte magic
//! (`tokenwarden-bpe2`), the token count as a little-endian `u32`, each token's length in
//! rank order (a byte each), then every token's bytes in rank order (the lengths apart from
//! the bytes compress 5–6 % better: what a Worker bundle is measured by).
//!
//! ```
//! # #[cfg(feature = "ranks")] {
//! use tokenwarden_provider::bpe::{Bpe, Encoding};
//!
//! let bpe = Bpe::new(Encoding::O200kBase, tokenwarden_provider::bpe::O200K_BASE).unwrap();
//! assert_eq!(bpe.count("Hello, world!"), 4);
//! assert_eq!(Encoding::for_model("gpt-4-turbo"), Encoding::Cl100kBase);
//! # }
//! ```

use alloc::collections::BinaryHeap;
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::fmt;

mod split;

/// The byte-pair encodings of OpenAI's current models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Encoding {
    /// GPT-4o and later (GPT-4.1, GPT-4.5, GPT-5), the o-series, the codex models.
    O200kBase,
    /// GPT-4, GPT-3.5 and the `text-embedding-ada-002` / `text-embedding-3` models.
    Cl100kBase,
}

impl Encoding {
    /// Its name as tiktoken spells it: `o200k_base`, `cl100k_base`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    /// The encoding named `name` (as [`Encoding::name`] spells it), or `None`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Encoding> {
        match name {
            "o200k_base" => Some(Encoding::O200kBase),
            "cl100k_base" => Some(Encoding::Cl100kBase),
            _ => None,
        }
    }

    /// How many ordinary tokens (ranks) the encoding has: its ranks file holds exactly these.
    #[must_use]
    pub fn tokens(self) -> u32 {
        match self {
            Encoding::O200kBase => 199_998,
            Encoding::Cl100kBase => 100_256,
        }
    }

    /// The encoding of an OpenAI model by its name as the API takes it: `cl100k_base` for
    /// GPT-4 (`gpt-4`, `gpt-4-turbo`, `gpt-4-32k`, dated `gpt-4-…`), GPT-3.5 (`gpt-3.5-…`,
    /// Azure's `gpt-35-…`) and the embedding models `text-embedding-ada-002` and
    /// `text-embedding-3-*`; `o200k_base` for everything else: GPT-4o, GPT-4.1, GPT-4.5,
    /// GPT-5 and later, the o-series, the codex models, and any model not known (new
    /// models have used o200k since GPT-4o). A fine-tuned model (`ft:<base>:…`) uses its
    /// base model's, and a gateway's provider prefix (`openai/gpt-4o`) is skipped.
    #[must_use]
    pub fn for_model(model: &str) -> Encoding {
        let m = model.trim();
        let m = m
            .get(..3)
            .filter(|p| p.eq_ignore_ascii_case("ft:"))
            .map_or(m, |_| &m[3..]);
        let m = m.rsplit('/').next().unwrap_or(m);
        let starts = |p: &str| m.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p));
        let gpt4 = starts("gpt-4") && matches!(m.as_bytes().get(5), None | Some(b'-'));
        if gpt4
            || starts("gpt-3.5")
            || starts("gpt-35")
            || m.eq_ignore_ascii_case("text-embedding-ada-002")
            || starts("text-embedding-3")
        {
            Encoding::Cl100kBase
        } else {
            Encoding::O200kBase
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// o200k_base's ranks (`provider/data/o200k_base.bpe`, 1.6 MB).
#[cfg(feature = "ranks")]
pub const O200K_BASE: &[u8] = include_bytes!("../../data/o200k_base.bpe");

/// cl100k_base's ranks (`provider/data/cl100k_base.bpe`, 0.7 MB).
#[cfg(feature = "ranks")]
pub const CL100K_BASE: &[u8] = include_bytes!("../../data/cl100k_base.bpe");

/// The magic a ranks file begins with.
pub const MAGIC: &[u8; 16] = b"tokenwarden-bpe2";

/// Why a ranks file was refused by [`Bpe::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RanksError {
    /// It does not begin with [`MAGIC`].
    NotRanks,
    /// It holds `found` tokens where the encoding has `expected` (another encoding's file?).
    Count {
        /// The encoding's count.
        expected: u32,
        /// The file's.
        found: u32,
    },
    /// It ends inside token `rank`, or has bytes after the last token.
    Truncated {
        /// The token it ends in, or the count when bytes follow the last.
        rank: u32,
    },
    /// Token `rank` is empty, or repeats an earlier token.
    BadToken {
        /// Its rank.
        rank: u32,
    },
    /// The byte `byte` is no token (every byte must be one, so that any text can be encoded).
    MissingByte {
        /// The byte.
        byte: u8,
    },
}

impl fmt::Display for RanksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RanksError::NotRanks => write!(
                f,
                "not a tokenwarden ranks file (it must begin with \"tokenwarden-bpe2\")"
            ),
            RanksError::Count { expected, found } => write!(
                f,
                "the ranks file holds {found} tokens where the encoding has {expected} (is it another encoding's?)"
            ),
            RanksError::Truncated { rank } => {
                write!(
                    f,
                    "the ranks file is cut short or has bytes past its end (at token {rank})"
                )
            }
            RanksError::BadToken { rank } => {
                write!(f, "token {rank} of the ranks file is empty or a duplicate")
            }
            RanksError::MissingByte { byte } => {
                write!(f, "the ranks file has no token for the byte {byte:#04x}")
            }
        }
    }
}

impl core::error::Error for RanksError {}

/// An encoding's ranks, ready to count with.
#[derive(Clone)]
pub struct Bpe {
    encoding: Encoding,
    /// Every token's bytes, in rank order.
    pool: Vec<u8>,
    /// Where each token ends in `pool` (rank `r` is `pool[ends[r - 1]..ends[r]]`).
    ends: Vec<u32>,
    /// Open addressing by [`hash`]: rank + 1, 0 for an empty slot.
    table: Vec<u32>,
}

impl fmt::Debug for Bpe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bpe")
            .field("encoding", &self.encoding)
            .field("tokens", &self.ends.len())
            .finish_non_exhaustive()
    }
}

/// Pieces up to this many bytes are merged by scanning their pairs at each step (quadratic
/// but fastest on short pieces); longer ones through a heap, O(n log n), so that a long run
/// (40,000 letters without a space) costs what its length does.
const SCAN: usize = 128;

impl Bpe {
    /// The encoding `encoding` from its ranks file (see the module doc for the format).
    ///
    /// # Errors
    ///
    /// A [`RanksError`] naming what is wrong with the file.
    pub fn new(encoding: Encoding, ranks: &[u8]) -> Result<Bpe, RanksError> {
        let rest = ranks.strip_prefix(MAGIC).ok_or(RanksError::NotRanks)?;
        let (count, rest) = match rest.split_first_chunk::<4>() {
            Some((c, r)) => (u32::from_le_bytes(*c), r),
            None => return Err(RanksError::NotRanks),
        };
        let expected = encoding.tokens();
        if count != expected {
            return Err(RanksError::Count {
                expected,
                found: count,
            });
        }
        let Some((lens, bytes)) = rest.split_at_checked(count as usize) else {
            return Err(RanksError::Truncated { rank: 0 });
        };
        let mut ends = Vec::with_capacity(count as usize);
        let mut end = 0usize;
        for (rank, &len) in (0..count).zip(lens) {
            if len == 0 {
                return Err(RanksError::BadToken { rank });
            }
            end += usize::from(len);
            if end > bytes.len() {
                return Err(RanksError::Truncated { rank });
            }
            ends.push(u32::try_from(end).map_err(|_| RanksError::Truncated { rank })?);
        }
        if end != bytes.len() {
            return Err(RanksError::Truncated { rank: count });
        }
        let pool = bytes.to_vec();
        let size = (count as usize)
            .saturating_mul(2)
            .next_power_of_two()
            .max(2);
        let mut bpe = Bpe {
            encoding,
            pool,
            ends,
            table: alloc::vec![0; size],
        };
        for rank in 0..count {
            let bytes = bpe.token(rank);
            let mask = bpe.table.len() - 1;
            let mut i = hash(bytes) as usize & mask;
            loop {
                match bpe.table[i] {
                    0 => break,
                    r if bpe.token(r - 1) == bytes => return Err(RanksError::BadToken { rank }),
                    _ => i = (i + 1) & mask,
                }
            }
            bpe.table[i] = rank + 1;
        }
        for byte in 0..=255u8 {
            if bpe.rank(&[byte]).is_none() {
                return Err(RanksError::MissingByte { byte });
            }
        }
        Ok(bpe)
    }

    /// The encoding it counts by.
    #[must_use]
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// The bytes of token `rank` (empty past the last).
    fn token(&self, rank: u32) -> &[u8] {
        let r = rank as usize;
        let start = if r == 0 { 0 } else { self.ends[r - 1] as usize };
        self.ends
            .get(r)
            .and_then(|&end| self.pool.get(start..end as usize))
            .unwrap_or(&[])
    }

    /// The rank of the token `bytes`, if it is one.
    #[inline]
    fn rank(&self, bytes: &[u8]) -> Option<u32> {
        let mask = self.table.len() - 1;
        let mut i = hash(bytes) as usize & mask;
        loop {
            match self.table[i] {
                0 => return None,
                r if self.token(r - 1) == bytes => return Some(r - 1),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// How many tokens `text` is.
    #[must_use]
    pub fn count(&self, text: &str) -> usize {
        let mut merge = Merge::default();
        split::pieces(self.encoding, text)
            .map(|piece| self.piece(piece.as_bytes(), &mut merge, None))
            .sum()
    }

    /// The tokens (ranks) of `text`.
    #[must_use]
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut merge = Merge::default();
        let mut out = Vec::new();
        for piece in split::pieces(self.encoding, text) {
            self.piece(piece.as_bytes(), &mut merge, Some(&mut out));
        }
        out
    }

    /// The pieces `text` is cut into before merging (for checks against the expression).
    #[must_use]
    pub fn pieces<'a>(&self, text: &'a str) -> Vec<&'a str> {
        split::pieces(self.encoding, text).collect()
    }

    /// The tokens of one piece: their count, and their ranks pushed to `out`.
    fn piece(&self, piece: &[u8], merge: &mut Merge, out: Option<&mut Vec<u32>>) -> usize {
        if let Some(r) = self.rank(piece) {
            if let Some(out) = out {
                out.push(r);
            }
            return 1;
        }
        if piece.len() <= SCAN {
            self.scan(piece, merge);
        } else {
            self.heap(piece, merge);
        }
        let n = merge.bounds.len() - 1;
        if let Some(out) = out {
            for w in merge.bounds.windows(2) {
                out.extend(self.rank(&piece[w[0]..w[1]]));
            }
        }
        n
    }

    /// Merges `piece` by scanning its pairs at each step; leaves the parts' bounds in
    /// `m.bounds`.
    fn scan(&self, piece: &[u8], m: &mut Merge) {
        m.bounds.clear();
        m.bounds.extend(0..=piece.len());
        m.ranks.clear();
        let pair = |b: &[usize], i: usize| -> u32 {
            match (b.get(i), b.get(i + 2)) {
                (Some(&s), Some(&e)) => self.rank(&piece[s..e]).unwrap_or(u32::MAX),
                _ => u32::MAX,
            }
        };
        for i in 0..piece.len().saturating_sub(1) {
            m.ranks.push(pair(&m.bounds, i));
        }
        loop {
            let mut best = (u32::MAX, 0);
            for (i, &r) in m.ranks.iter().enumerate() {
                if r < best.0 {
                    best = (r, i);
                }
            }
            if best.0 == u32::MAX {
                return;
            }
            let i = best.1;
            m.bounds.remove(i + 1);
            m.ranks.remove(i);
            if i < m.ranks.len() {
                m.ranks[i] = pair(&m.bounds, i);
            }
            if i > 0 {
                m.ranks[i - 1] = pair(&m.bounds, i - 1);
            }
        }
    }

    /// Merges `piece` through a heap of its pairs (the same merges as [`Bpe::scan`]: the
    /// lowest rank first, the leftmost of equals); leaves the parts' bounds in `m.bounds`.
    fn heap(&self, piece: &[u8], m: &mut Merge) {
        const NONE: usize = usize::MAX;
        let n = piece.len();
        // Parts by their first byte: the next part's start (`n` for the last), and the
        // previous part's (`NONE` for the first); `alive` while it is not merged away.
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        prev[0] = NONE;
        let mut alive = alloc::vec![true; n];
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, s: usize, e: usize| {
            if let Some(r) = self.rank(&piece[s..e]) {
                heap.push(Reverse((r, s, e)));
            }
        };
        for i in 0..n.saturating_sub(1) {
            push(&mut heap, i, i + 2);
        }
        while let Some(Reverse((_, s, e))) = heap.pop() {
            // Still the pair of part `s` and the one after it, as it was when pushed?
            let r = next[s];
            if !alive[s] || r >= n || next[r] != e {
                continue;
            }
            alive[r] = false;
            next[s] = e;
            if e < n {
                prev[e] = s;
            }
            if prev[s] != NONE {
                push(&mut heap, prev[s], e);
            }
            if e < n {
                push(&mut heap, s, next[e]);
            }
        }
        m.bounds.clear();
        let mut s = 0;
        while s < n {
            m.bounds.push(s);
            s = next[s];
        }
        m.bounds.push(n);
    }
}

/// The scratch space of a merge, kept across the pieces of one text.
#[derive(Default)]
struct Merge {
    /// The parts' bounds: part `i` is `bounds[i]..bounds[i + 1]`.
    bounds: Vec<usize>,
    /// [`Bpe::scan`]: the rank of each adjacent pair's merge (`u32::MAX`: none).
    ranks: Vec<u32>,
}

/// The table's hash of a token's bytes: eight bytes at a time, multiplied and rotated.
#[inline]
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut w = [0u8; 8];
        w[..tail.len()].copy_from_slice(tail);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    h ^ (h >> 29)
}
