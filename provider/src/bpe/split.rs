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

impl Class {
    fn of(c: char) -> Class {
        if c.is_ascii() {
            let space = c.is_ascii_whitespace() || c == '\x0b';
            return Class {
                letter: c.is_ascii_alphabetic(),
                upper: c.is_ascii_uppercase(),
                lower: c.is_ascii_lowercase(),
                number: c.is_ascii_digit(),
                space,
                newline: c == '\r' || c == '\n',
            };
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

/// Characters of the text from byte `from`, decoded on demand.
struct Scan<'a, 'b> {
    text: &'a str,
    chars: &'b mut alloc::vec::Vec<(usize, char, Class)>,
    from: usize,
}

impl Scan<'_, '_> {
    /// The class of the `i`-th character from the start, `None` past the end.
    fn class(&mut self, i: usize) -> Option<Class> {
        while self.chars.len() <= i {
            let at = self
                .chars
                .last()
                .map_or(self.from, |&(o, c, _)| o + c.len_utf8());
            let c = self.text.get(at..)?.chars().next()?;
            self.chars.push((at, c, Class::of(c)));
        }
        self.chars.get(i).map(|&(_, _, k)| k)
    }

    fn char(&mut self, i: usize) -> Option<char> {
        self.class(i)?;
        self.chars.get(i).map(|&(_, c, _)| c)
    }

    /// The byte offset of the `i`-th character (the end of the text past it).
    fn offset(&mut self, i: usize) -> usize {
        if self.class(i).is_some() {
            self.chars.get(i).map_or(self.text.len(), |&(o, _, _)| o)
        } else {
            self.text.len()
        }
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
