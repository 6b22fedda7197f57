//! The pieces a text is cut into before byte-pair merging, as OpenAI's encodings cut it.
//!
//! Each encoding defines its cut as a regular expression (tiktoken's `pat_str`); this is
//! that expression written out as code over the characters' Unicode general categories,
//! with the same leftmost-first choice among its alternatives and the same greedy
//! repetition (backtracking where the expression would). `\s` is Unicode `White_Space`, as
//! in tiktoken. Every character starts a match of some alternative, so the pieces tile the
//! text: a piece is never empty, and their concatenation is the text.
//!
//! o200k_base:
//!
//! ```text
//! [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! cl100k_base:
//!
//! ```text
//! '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+
//! |\s++$|\s*[\r\n]|\s+(?!\S)|\s
//! ```

use unicode_general_category::{GeneralCategory as G, get_general_category};

use super::Encoding;

/// What the expressions ask of one character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Class {
    /// `\p{L}`.
    letter: bool,
    /// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`: o200k's upper-case part of a word.
    upper: bool,
    /// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`: o200k's lower-case part of a word.
    lower: bool,
    /// `\p{N}`.
    number: bool,
    /// `\s`.
    space: bool,
    /// `\r` or `\n`.
    newline: bool,
}

/// The classes of the 128 ASCII characters, by code.
const ASCII: [Class; 128] = {
    let mut t = [Class {
        letter: false,
        upper: false,
        lower: false,
        number: false,
        space: false,
        newline: false,
    }; 128];
    let mut i = 0;
    while i < 128 {
        #[allow(clippy::cast_possible_truncation)]
        let c = i as u8;
        t[i] = Class {
            letter: c.is_ascii_alphabetic(),
            upper: c.is_ascii_uppercase(),
            lower: c.is_ascii_lowercase(),
            number: c.is_ascii_digit(),
            space: c.is_ascii_whitespace() || c == 0x0b,
            newline: c == b'\r' || c == b'\n',
        };
        i += 1;
    }
    t
};

impl Class {
    #[inline]
    fn of(c: char) -> Class {
        if let Some(&k) = ASCII.get(c as usize) {
            return k;
        }
        let g = get_general_category(c);
        let mark = matches!(g, G::NonspacingMark | G::SpacingMark | G::EnclosingMark);
        let (lu, ll, lt, lm, lo) = (
            g == G::UppercaseLetter,
            g == G::LowercaseLetter,
            g == G::TitlecaseLetter,
            g == G::ModifierLetter,
            g == G::OtherLetter,
        );
        Class {
            letter: lu || ll || lt || lm || lo,
            upper: lu || lt || lm || lo || mark,
            lower: ll || lm || lo || mark,
            number: matches!(g, G::DecimalNumber | G::LetterNumber | G::OtherNumber),
            space: c.is_whitespace(),
            newline: false,
        }
    }

    /// `[^\r\n\p{L}\p{N}]`: what may stand before a word.
    fn lead(self) -> bool {
        !(self.newline || self.letter || self.number)
    }

    /// `[^\s\p{L}\p{N}]`: punctuation and symbols.
    fn symbol(self) -> bool {
        !(self.space || self.letter || self.number)
    }
}

/// The pieces of `text` under `encoding`'s cut, in order.
pub(crate) fn pieces(encoding: Encoding, text: &str) -> Pieces<'_> {
    Pieces {
        encoding,
        text,
        chars: alloc::vec::Vec::new(),
        at: 0,
    }
}

/// An iterator over a text's pieces (see [`pieces`]).
pub(crate) struct Pieces<'a> {
    encoding: Encoding,
    text: &'a str,
    /// The characters of the piece being cut (and the few after it the cut looks at), with
    /// their byte offsets and classes, decoded as the cut asks for them.
    chars: alloc::vec::Vec<(usize, char, Class)>,
    at: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.at >= self.text.len() {
            return None;
        }
        if let Some(n) = Ascii(&self.text.as_bytes()[self.at..]).cut(self.encoding) {
            let piece = &self.text[self.at..self.at + n];
            self.at += n;
            return Some(piece);
        }
        let mut s = Scan {
            text: self.text,
            chars: &mut self.chars,
            from: self.at,
        };
        s.chars.clear();
        let end_char = match self.encoding {
            Encoding::O200kBase => o200k(&mut s),
            Encoding::Cl100kBase => cl100k(&mut s),
        };
        let end = s.offset(end_char.max(1));
        let piece = &self.text[self.at..end];
        self.at = end;
        Some(piece)
    }
}

/// The cut over bytes where it sees only ASCII (most of what agents send): the same
/// expression as [`o200k`] and [`cl100k`] with the classes of ASCII alone, which `None`
/// hands to them whenever the cut would look at a byte of another character (a run that
/// might go on through it, a class that decides). Over ASCII, upper- and lower-case letters
/// are apart (no marks, no other letters), so the word's `[upper]*[lower]+` never gives
/// back.
struct Ascii<'a>(&'a [u8]);

/// What a cut over ASCII needs at a byte: its class, or past the end of the text.
enum At {
    Char(Class),
    End,
}

impl Ascii<'_> {
    /// The class at byte `i`; `None` when the byte is not ASCII.
    #[inline]
    fn at(&self, i: usize) -> Option<At> {
        match self.0.get(i) {
            None => Some(At::End),
            Some(&b) => ASCII.get(usize::from(b)).map(|&k| At::Char(k)),
        }
    }

    /// Whether byte `i` satisfies `f` (`false` past the end; `None` on a byte not ASCII).
    #[inline]
    fn is(&self, i: usize, f: impl Fn(Class) -> bool) -> Option<bool> {
        Some(match self.at(i)? {
            At::Char(k) => f(k),
            At::End => false,
        })
    }

    /// The end of the run from `i` of bytes that satisfy `f`, if it ends at an ASCII byte
    /// or the end of the text.
    #[inline]
    fn run(&self, mut i: usize, f: impl Fn(Class) -> bool) -> Option<usize> {
        while self.is(i, &f)? {
            i += 1;
        }
        Some(i)
    }

    /// The end of a contraction at `i` (a byte of another character matches none).
    fn contraction(&self, i: usize) -> Option<usize> {
        if self.0.get(i) != Some(&b'\'') {
            return None;
        }
        let a = self.0.get(i + 1).map(u8::to_ascii_lowercase);
        let b = self.0.get(i + 2).map(u8::to_ascii_lowercase);
        match (a?, b) {
            (b's' | b't' | b'm' | b'd', _) => Some(i + 2),
            (b'r' | b'v', Some(b'e')) | (b'l', Some(b'l')) => Some(i + 3),
            _ => None,
        }
    }

    /// `\p{N}{1,3}` at the start, if a number starts there: `Some(None)` when none does.
    fn number(&self) -> Option<Option<usize>> {
        if !self.is(0, |k| k.number)? {
            return Some(None);
        }
        let mut end = 1;
        while end < 3 && self.is(end, |k| k.number)? {
            end += 1;
        }
        Some(Some(end))
    }

    /// ` ?[^\s\p{L}\p{N}]+` then the run of `tail` bytes: `Some(None)` when it does not
    /// match.
    fn symbols(&self, tail: impl Fn(u8) -> bool) -> Option<Option<usize>> {
        let start = if self.0.first() == Some(&b' ') && self.is(1, Class::symbol)? {
            1
        } else if self.is(0, Class::symbol)? {
            0
        } else {
            return Some(None);
        };
        let mut end = self.run(start, Class::symbol)?;
        while self.0.get(end).is_some_and(|&b| tail(b)) {
            end += 1;
        }
        Some(Some(end))
    }

    /// The spaces' alternatives: `\s*[\r\n]+` (o200k) or `\s*[\r\n]` (cl100k, `+` false)
    /// then `\s+(?!\S)` and `\s+` (cl100k: `\s++$` first, and `\s` last).
    fn spaces(&self, newlines_run: bool) -> Option<usize> {
        let run = self.run(0, |k| k.space)?;
        let at_end = run == self.0.len();
        if at_end && !newlines_run {
            return Some(run);
        }
        if let Some(k) = (0..run).rev().find(|&k| matches!(self.0[k], b'\r' | b'\n')) {
            return Some(k + 1);
        }
        Some(if at_end || run < 2 { run } else { run - 1 })
    }

    /// The length of the first piece, or `None` for the general cut.
    fn cut(&self, encoding: Encoding) -> Option<usize> {
        match encoding {
            Encoding::O200kBase => self.o200k(),
            Encoding::Cl100kBase => self.cl100k(),
        }
    }

    fn o200k(&self) -> Option<usize> {
        // A word: an optional lead, then upper then lower case; over ASCII the lead is
        // taken whenever there is one (a lead is not a letter, so without it no word
        // starts there).
        let j = usize::from(self.is(0, Class::lead)?);
        let upper_end = self.run(j, |k| k.upper)?;
        if self.is(upper_end, |k| k.lower)? {
            let end = self.run(upper_end, |k| k.lower)?;
            return Some(self.contraction(end).unwrap_or(end));
        }
        if upper_end > j {
            return Some(self.contraction(upper_end).unwrap_or(upper_end));
        }
        if let Some(end) = self.number()? {
            return Some(end);
        }
        if let Some(end) = self.symbols(|b| matches!(b, b'\r' | b'\n' | b'/'))? {
            return Some(end);
        }
        self.spaces(true)
    }

    fn cl100k(&self) -> Option<usize> {
        if let Some(end) = self.contraction(0) {
            return Some(end);
        }
        let j = usize::from(self.is(0, Class::lead)?);
        if self.is(j, |k| k.letter)? {
            return self.run(j, |k| k.letter);
        }
        if let Some(end) = self.number()? {
            return Some(end);
        }
        if let Some(end) = self.symbols(|b| matches!(b, b'\r' | b'\n'))? {
            return Some(end);
        }
        self.spaces(false)
    }
}

/// Characters of the text from byte `from`, decoded on demand (the pieces [`Ascii`] hands
/// on).
struct Scan<'a, 'b> {
    text: &'a str,
    chars: &'b mut alloc::vec::Vec<(usize, char, Class)>,
    from: usize,
}

impl Scan<'_, '_> {
    /// Character `i` from the start (its byte offset, itself, its class), `None` past the end.
    fn decode(&mut self, i: usize) -> Option<(usize, char, Class)> {
        while self.chars.len() <= i {
            let at = self
                .chars
                .last()
                .map_or(self.from, |&(o, c, _)| o + c.len_utf8());
            let c = self.text.get(at..)?.chars().next()?;
            self.chars.push((at, c, Class::of(c)));
        }
        self.chars.get(i).copied()
    }

    /// The class of the `i`-th character from the start, `None` past the end.
    fn class(&mut self, i: usize) -> Option<Class> {
        self.decode(i).map(|(_, _, k)| k)
    }

    fn char(&mut self, i: usize) -> Option<char> {
        self.decode(i).map(|(_, c, _)| c)
    }

    /// The byte offset of the `i`-th character (the end of the text past it).
    fn offset(&mut self, i: usize) -> usize {
        self.decode(i).map_or(self.text.len(), |(o, _, _)| o)
    }

    fn is(&mut self, i: usize, f: impl Fn(Class) -> bool) -> bool {
        self.class(i).is_some_and(f)
    }

    /// The end of the run of characters from `i` that satisfy `f`.
    fn run(&mut self, mut i: usize, f: impl Fn(Class) -> bool) -> usize {
        while self.is(i, &f) {
            i += 1;
        }
        i
    }

    /// The end of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`, any case)
    /// starting at `i`, if one does.
    fn contraction(&mut self, i: usize) -> Option<usize> {
        if self.char(i)? != '\'' {
            return None;
        }
        let a = self.char(i + 1).map(|c| c.to_ascii_lowercase());
        let b = self.char(i + 2).map(|c| c.to_ascii_lowercase());
        match (a?, b) {
            ('s' | 't' | 'm' | 'd', _) => Some(i + 2),
            ('r' | 'v', Some('e')) | ('l', Some('l')) => Some(i + 3),
            _ => None,
        }
    }

    /// ` ?[^\s\p{L}\p{N}]+` then the run of `tail` characters: its end, or `None`.
    fn symbols(&mut self, tail: impl Fn(char) -> bool) -> Option<usize> {
        let start = if self.char(0) == Some(' ') && self.is(1, Class::symbol) {
            1
        } else if self.is(0, Class::symbol) {
            0
        } else {
            return None;
        };
        let mut end = self.run(start, Class::symbol);
        while self.char(end).is_some_and(&tail) {
            end += 1;
        }
        Some(end)
    }

    /// The run of `\s` from the start, and whether it reaches the end of the text.
    fn spaces(&mut self) -> (usize, bool) {
        let end = self.run(0, |k| k.space);
        (end, self.class(end).is_none())
    }

    /// `\s*[\r\n]`: the end of the last newline in the run of spaces `..run`, if any.
    fn through_newline(&mut self, run: usize) -> Option<usize> {
        (0..run)
            .rev()
            .find(|&k| self.is(k, |c| c.newline))
            .map(|k| k + 1)
    }
}

/// The o200k_base cut at the start of `s`: the end of the piece, in characters.
fn o200k(s: &mut Scan<'_, '_>) -> usize {
    // A word: an optional lead, then upper-case-ish and lower-case-ish letters (marks and
    // other letters count as both), then a contraction.
    for lead in [true, false] {
        let j = usize::from(lead);
        if lead && !s.is(0, Class::lead) {
            continue;
        }
        // [upper]*[lower]+: the longest run of upper then, giving back from its end, the
        // first place a lower starts; the run of lower from there.
        let upper_end = s.run(j, |k| k.upper);
        let start = if s.is(upper_end, |k| k.lower) {
            Some(upper_end)
        } else {
            (j..upper_end).rev().find(|&k| s.is(k, |c| c.lower))
        };
        if let Some(k) = start {
            let end = s.run(k, |c| c.lower);
            return s.contraction(end).unwrap_or(end);
        }
    }
    for lead in [true, false] {
        let j = usize::from(lead);
        if lead && !s.is(0, Class::lead) {
            continue;
        }
        // [upper]+[lower]*.
        let upper_end = s.run(j, |k| k.upper);
        if upper_end > j {
            let end = s.run(upper_end, |c| c.lower);
            return s.contraction(end).unwrap_or(end);
        }
    }
    if s.is(0, |k| k.number) {
        return s.run(0, |k| k.number).min(3);
    }
    if let Some(end) = s.symbols(|c| c == '\r' || c == '\n' || c == '/') {
        return end;
    }
    let (run, at_end) = s.spaces();
    if let Some(end) = s.through_newline(run) {
        return end;
    }
    // \s+(?!\S), else \s+.
    if at_end || run < 2 { run } else { run - 1 }
}

/// The cl100k_base cut at the start of `s`: the end of the piece, in characters.
fn cl100k(s: &mut Scan<'_, '_>) -> usize {
    if let Some(end) = s.contraction(0) {
        return end;
    }
    // [^\r\n\p{L}\p{N}]?+\p{L}++ (the lead is possessive: taken, it is not given back).
    let j = usize::from(s.is(0, Class::lead));
    if s.is(j, |k| k.letter) {
        return s.run(j, |k| k.letter);
    }
    if s.is(0, |k| k.number) {
        return s.run(0, |k| k.number).min(3);
    }
    if let Some(end) = s.symbols(|c| c == '\r' || c == '\n') {
        return end;
    }
    let (run, at_end) = s.spaces();
    // \s++$
    if at_end {
        return run;
    }
    if let Some(end) = s.through_newline(run) {
        return end;
    }
    // \s+(?!\S), else \s.
    if run < 2 { run } else { run - 1 }
}
