//! Images and documents in a prompt, by each provider's published rules: an image's size
//! from its first bytes, a PDF's pages and the text its content streams show.

use alloc::string::String;
use alloc::vec::Vec;

use super::Provider;

/// Width and height of an image, px.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Size {
    pub(crate) w: u32,
    pub(crate) h: u32,
}

/// Anthropic (docs, "Vision"): an image costs width × height / 750 tokens, after it is
/// scaled down (aspect kept) to at most 1568 px on its long edge and about 1.19 megapixels
/// (1092², "~1,600 tokens"). An image whose size cannot be read costs that most: 1,590.
pub(crate) fn anthropic_image_tokens(size: Option<Size>) -> u64 {
    let Some(Size { w, h }) = size else {
        return ANTHROPIC_IMAGE_MAX;
    };
    let (mut w, mut h) = (f64::from(w), f64::from(h));
    let long = w.max(h);
    if long > 1568.0 {
        w = w * 1568.0 / long;
        h = h * 1568.0 / long;
    }
    let scaled = (w * h).min(1092.0 * 1092.0);
    ceil(scaled / 750.0).max(1)
}

/// The most an Anthropic image costs: ⌈1092² / 750⌉.
pub(crate) const ANTHROPIC_IMAGE_MAX: u64 = (1092u64 * 1092).div_ceil(750);

/// OpenAI (docs, "Images and vision", the tile rule of GPT-4o, GPT-4.1 and the o-series):
/// `detail: "low"` costs 85 tokens; otherwise the image is scaled to fit 2048 × 2048, then
/// its shortest side to 768 px, and costs 170 per 512-px tile plus 85. An image whose size
/// cannot be read costs the most a high-detail image can: 8 tiles, 1,445.
pub(crate) fn openai_image_tokens(size: Option<Size>, low: bool) -> u64 {
    if low {
        return 85;
    }
    let Some(Size { w, h }) = size else {
        return 85 + 170 * 8;
    };
    let (mut w, mut h) = (f64::from(w), f64::from(h));
    let fit = (2048.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    let short = w.min(h);
    if short > 768.0 {
        w = w * 768.0 / short;
        h = h * 768.0 / short;
    }
    85 + 170 * ceil(w / 512.0) * ceil(h / 512.0)
}

/// A PDF page as an image (each page is its extracted text plus the page as an image): a
/// letter or A4 page at any usual resolution is scaled to the image limit — Anthropic 1,590
/// tokens; OpenAI (the tile rule) 768 × 994 px, 4 tiles, 765. The text is priced apart.
pub(crate) fn pdf_page_image(provider: Provider) -> u64 {
    match provider {
        Provider::Anthropic => ANTHROPIC_IMAGE_MAX,
        Provider::Openai => 85 + 170 * 4,
    }
}

/// The most text tokens a page is assumed to hold when its text cannot be read: the top of
/// Anthropic's "1,500–3,000 tokens per page".
pub(crate) const PDF_PAGE_TEXT_MAX: u64 = 3000;

/// How much of an image is decoded to find its size (a JPEG's size follows its metadata).
pub(crate) const IMAGE_HEAD: usize = 256 * 1024;

fn ceil(x: f64) -> u64 {
    if x <= 0.0 || x.is_nan() {
        return 0;
    }
    // Exact for the magnitudes here (far below 2^53).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let t = x as u64;
    if (t as f64) < x { t + 1 } else { t }
}

/// The size of an image given as a `data:` URL, if it is one and its size can be read.
pub(crate) fn data_url_size(url: &str) -> Option<Size> {
    let rest = url.strip_prefix("data:")?;
    let b64 = rest.find(',').map_or(rest, |i| &rest[i + 1..]);
    image_size(&decode_base64(b64, IMAGE_HEAD))
}

/// The first `limit` bytes of base64 text (standard or URL-safe alphabet; whitespace and
/// padding skipped; stops at anything else).
pub(crate) fn decode_base64(s: &str, limit: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(limit.min(s.len() / 4 * 3 + 3));
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        if out.len() >= limit {
            break;
        }
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' | b'\n' | b'\r' | b' ' => continue,
            _ => break,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    out
}

/// Width and height of a PNG, GIF, JPEG or WebP image from its first bytes.
pub(crate) fn image_size(d: &[u8]) -> Option<Size> {
    let at = |i: usize| u32::from(d.get(i).copied().unwrap_or(0));
    let u16be = |i: usize| (at(i) << 8) | at(i + 1);
    let u16le = |i: usize| at(i) | (at(i + 1) << 8);
    let u32be = |i: usize| (u16be(i) << 16) | u16be(i + 2);
    let ok = |w: u32, h: u32| (w > 0 && h > 0).then_some(Size { w, h });
    if d.len() >= 24 && d.starts_with(&[0x89, b'P', b'N', b'G']) {
        return ok(u32be(16), u32be(20));
    }
    if d.len() >= 10 && d.starts_with(b"GIF") {
        return ok(u16le(6), u16le(8));
    }
    if d.len() >= 30 && d.starts_with(b"RIFF") && d.get(8..12) == Some(b"WEBP") {
        return match d.get(12..16)? {
            b"VP8 " => ok(u16le(26) & 0x3fff, u16le(28) & 0x3fff),
            b"VP8L" => {
                let b = |i: usize| at(21 + i);
                ok(
                    1 + (b(0) | ((b(1) & 0x3f) << 8)),
                    1 + ((b(1) >> 6) | (b(2) << 2) | ((b(3) & 0x0f) << 10)),
                )
            }
            b"VP8X" => {
                let u24 = |i: usize| at(i) | (at(i + 1) << 8) | (at(i + 2) << 16);
                ok(1 + u24(24), 1 + u24(27))
            }
            _ => None,
        };
    }
    if d.len() >= 4 && d[0] == 0xff && d[1] == 0xd8 {
        // JPEG: the segments up to the first start-of-frame (SOF0–SOF15 but DHT, JPG, DAC).
        let mut i = 2;
        while i + 9 < d.len() {
            if d[i] != 0xff {
                return None;
            }
            let marker = d[i + 1];
            if marker == 0xff {
                i += 1;
                continue;
            }
            if (0xc0..=0xcf).contains(&marker) && !matches!(marker, 0xc4 | 0xc8 | 0xcc) {
                return ok(u16be(i + 7), u16be(i + 5));
            }
            i += 2 + u16be(i + 2) as usize;
        }
    }
    None
}

/// A PDF's page count and text, and its size in bytes.
pub(crate) struct PdfInfo {
    pub(crate) pages: u64,
    pub(crate) text: Option<String>,
    pub(crate) bytes: u64,
}

/// A PDF's page count and text from its base64. Pages: the page objects (`/Type /Page`) or
/// the page tree's largest `/Count`, whichever is more; when neither can be read
/// (compressed object streams), one page per 50 KB of file, at least one. Text: the
/// literal strings its content streams show (`(…) Tj`, `[…] TJ`), one line each, when no
/// stream is compressed (no `/Filter`), else none.
pub(crate) fn pdf_info(b64: &str) -> PdfInfo {
    let data = decode_base64(b64, usize::MAX);
    let (mut objects, mut tree) = (0u64, 0u64);
    let mut i = 0;
    while let Some(at) = find(&data, b"/Type", i) {
        i = at + 5;
        let j = skip_space(&data, i);
        if data[j..].starts_with(b"/Page") {
            let after = data.get(j + 5).copied();
            if !after.is_some_and(|c| c.is_ascii_alphabetic()) {
                objects += 1;
            } else if after == Some(b's') && !data.get(j + 6).is_some_and(|&c| is_word(c)) {
                tree = tree.max(tree_count(&data, at, j + 6));
            }
        }
    }
    let len = data.len() as u64;
    let mut pages = objects.max(tree);
    if pages == 0 {
        pages = len.div_ceil(50_000).max(1);
    }
    let mut filtered = false;
    let mut f = 0;
    while let Some(at) = find(&data, b"/Filter", f) {
        f = at + 7;
        if !data.get(f).is_some_and(|&c| is_word(c)) {
            filtered = true;
            break;
        }
    }
    let text = if filtered { None } else { stream_text(&data) };
    PdfInfo {
        pages,
        text,
        bytes: len,
    }
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

fn skip_space(d: &[u8], mut i: usize) -> usize {
    while d.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The largest `/Count n` in the dictionary of a page tree node (`/Type /Pages` at `at`,
/// ending at `end`): between the `>` before it and the `>` after it.
fn tree_count(d: &[u8], at: usize, end: usize) -> u64 {
    let start = d[..at]
        .iter()
        .rposition(|&c| c == b'>')
        .map_or(0, |p| p + 1);
    let stop = d[end..]
        .iter()
        .position(|&c| c == b'>')
        .map_or(d.len(), |p| end + p);
    let mut best = 0;
    let mut i = start;
    while let Some(c) = find(&d[..stop], b"/Count", i) {
        i = c + 6;
        let j = skip_space(d, i);
        if j == i {
            continue;
        }
        let digits = d[j..stop].iter().take_while(|c| c.is_ascii_digit()).count();
        let n = core::str::from_utf8(&d[j..j + digits])
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        best = best.max(n);
    }
    best
}

/// The literal strings of every content stream, one line each (`\(`, `\)`, `\\` unescaped),
/// or `None` when there are none.
fn stream_text(d: &[u8]) -> Option<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut at = find(d, b"stream", 0);
    while let Some(s) = at {
        let start = s + 6;
        let Some(end) = find(d, b"endstream", start) else {
            break;
        };
        let body = &d[start..end];
        let mut i = 0;
        while i < body.len() {
            if body[i] != b'(' {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            let mut line = String::new();
            let mut closed = false;
            while j < body.len() {
                match body[j] {
                    b'\\' if j + 1 < body.len() => {
                        let c = body[j + 1];
                        if !matches!(c, b'(' | b')' | b'\\') {
                            line.push('\\');
                        }
                        line.push(char::from(c));
                        j += 2;
                    }
                    b'\\' => break,
                    b')' => {
                        closed = true;
                        break;
                    }
                    c => {
                        line.push(char::from(c));
                        j += 1;
                    }
                }
            }
            if closed {
                lines.push(line);
                i = j + 1;
            } else {
                i += 1;
            }
        }
        at = find(d, b"stream", end + 9);
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}
