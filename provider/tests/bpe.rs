//! The tokenizer against tiktoken (`tiktoken-rs`, OpenAI's reference implementation in
//! Rust): the same tokens for every text, on both encodings.
use std::sync::OnceLock;

use proptest::prelude::*;
use tokenwarden_provider::bpe::{self, Bpe, Encoding, RanksError};

fn ours(e: Encoding) -> &'static Bpe {
    static O: OnceLock<Bpe> = OnceLock::new();
    static C: OnceLock<Bpe> = OnceLock::new();
    match e {
        Encoding::O200kBase => O.get_or_init(|| Bpe::new(e, bpe::O200K_BASE).unwrap()),
        Encoding::Cl100kBase => C.get_or_init(|| Bpe::new(e, bpe::CL100K_BASE).unwrap()),
    }
}

fn reference(e: Encoding) -> &'static tiktoken_rs::CoreBPE {
    match e {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    }
}

fn same(text: &str) {
    for e in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let want = reference(e).encode_ordinary(text);
        let got = ours(e).encode(text);
        assert_eq!(
            got,
            want,
            "{e} on {text:?}: pieces {:?}",
            ours(e).pieces(text)
        );
        assert_eq!(ours(e).count(text), want.len(), "{e} count on {text:?}");
        let pieces = ours(e).pieces(text);
        assert!(pieces.iter().all(|p| !p.is_empty()), "{e}: an empty piece");
        assert_eq!(pieces.concat(), text, "{e}: the pieces are not the text");
    }
}

#[test]
fn texts_as_agents_send_them() {
    for text in [
        "",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog's back; it's 12345 km away.",
        "I'LL be there, you'RE late, they'Ve gone, we'd, I'm, don't, 'S",
        "fn main() {\n    let x: Vec<u32> = (0..10).collect();\n    println!(\"{x:?}\");\n}\n",
        "{\"type\":\"tool_use\",\"id\":\"toolu_01\",\"name\":\"Bash\",\"input\":{\"command\":\"ls -la /tmp\"}}",
        "   12\tconst a = 1;\r\n   13\t// comment\r\n\r\n\n\n  trailing   \n  ",
        "日本語のテキストと中文文本，还有한국어 텍스트。",
        "Ünïcödé wörds: naïve café résumé, ΑΒΓ αβγ, Ωmega, ǅemal, ʰmodifier",
        "emoji 👩‍💻 and 🇫🇷 flags, ✓ checks, → arrows, …",
        "a\u{0301}b\u{0308} marks: \u{0301}\u{0301}x \u{20dd}",
        "numbers 1234567890 ١٢٣٤ ⅣⅫ ½ ²³",
        "spaces\u{00a0}nbsp\u{2003}em\u{3000}ideographic\u{0085}nel\u{000b}vt\u{000c}ff",
        "<|endoftext|> is ordinary text here, and so is <|fim_prefix|>",
        "path/to/file.rs:12:5 https://example.com/a/b?c=d&e=f#g //comment/*x*/",
        "\n\n\n",
        "   ",
        " \n ",
        "x\r\n\r\ny",
        "CamelCaseWordsAndHTTPServer XMLHttpRequest iOS macOS",
        "'s",
        "'",
        "a'",
        "\u{fe0f}\u{200d}",
        "it'ſ and it'\u{212a}",
    ] {
        same(text);
    }
}

#[test]
fn long_runs_merge_as_tiktoken_does() {
    // Longer than the scan's limit: merged through the heap.
    same(&"a".repeat(5000));
    same(&"ab".repeat(700));
    same(&"xyzzy".repeat(300));
    same(&"日本".repeat(400));
    let mut s = String::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..3000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(char::from(b'a' + (x % 26) as u8));
    }
    same(&s);
    same(&format!("{s}{}", s.to_uppercase()));
}

/// Characters of every class the cuts tell apart.
fn alphabet() -> Vec<char> {
    let mut v: Vec<char> = " \t\n\r\u{b}\u{c}".chars().collect();
    v.extend("abcXYZ019'sStTlLrevVmMdD.,;:!?-_/\\(){}[]<>\"`~@#$%^&*+=|".chars());
    v.extend([
        '\u{a0}', '\u{85}', '\u{2003}', '\u{3000}', // spaces
        'é', 'Ü', 'ß', 'ǅ', 'ʰ', 'ª', // Ll, Lu, Lt, Lm, Lo
        '日', 'テ', '한', // Lo
        '\u{301}', '\u{903}', '\u{20dd}', // Mn, Mc, Me
        '٣', 'Ⅻ', '½', '²', // Nd, Nl, No
        '👩', '\u{200d}', '\u{fe0f}', '€', '→', '—', // symbols, joiners
    ]);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn any_text_tokenizes_as_tiktoken_does(idx in proptest::collection::vec(0usize..1000, 0..60)) {
        let a = alphabet();
        let text: String = idx.iter().map(|i| a[i % a.len()]).collect();
        same(&text);
    }
}

#[test]
fn a_ranks_file_that_is_wrong_is_refused_by_what_is_wrong() {
    let o = bpe::O200K_BASE;
    assert_eq!(
        Bpe::new(Encoding::O200kBase, b"hello").unwrap_err(),
        RanksError::NotRanks
    );
    assert_eq!(
        Bpe::new(Encoding::Cl100kBase, o).unwrap_err(),
        RanksError::Count {
            expected: 100_256,
            found: 199_998
        }
    );
    let cut = &o[..o.len() - 3];
    assert!(matches!(
        Bpe::new(Encoding::O200kBase, cut).unwrap_err(),
        RanksError::Truncated { rank: 199_997 }
    ));
    let mut longer = o.to_vec();
    longer.push(0);
    assert_eq!(
        Bpe::new(Encoding::O200kBase, &longer).unwrap_err(),
        RanksError::Truncated { rank: 199_998 }
    );
    // Token 1 made a copy of token 0 (both single bytes).
    let mut dup = o.to_vec();
    let lens = 20; // magic 16, count 4: then the lengths, then the bytes
    let bytes = lens + 199_998;
    assert_eq!((dup[lens], dup[lens + 1]), (1, 1));
    dup[bytes + 1] = dup[bytes];
    assert_eq!(
        Bpe::new(Encoding::O200kBase, &dup).unwrap_err(),
        RanksError::BadToken { rank: 1 }
    );
    let msg = Bpe::new(Encoding::Cl100kBase, o).unwrap_err().to_string();
    assert!(
        msg.contains("199998 tokens") && msg.contains("100256"),
        "{msg}"
    );
}

#[test]
fn models_use_the_encodings_openai_names() {
    for (model, e) in [
        ("gpt-4o", Encoding::O200kBase),
        ("gpt-4o-mini", Encoding::O200kBase),
        ("gpt-4.1", Encoding::O200kBase),
        ("gpt-5-codex", Encoding::O200kBase),
        ("o3", Encoding::O200kBase),
        ("something-new", Encoding::O200kBase),
        ("gpt-4", Encoding::Cl100kBase),
        ("GPT-4-turbo", Encoding::Cl100kBase),
        ("gpt-4-0613", Encoding::Cl100kBase),
        ("gpt-3.5-turbo", Encoding::Cl100kBase),
        ("gpt-35-turbo", Encoding::Cl100kBase),
        ("text-embedding-3-small", Encoding::Cl100kBase),
        ("text-embedding-ada-002", Encoding::Cl100kBase),
        ("ft:gpt-4-0613:acme::abc", Encoding::Cl100kBase),
        ("ft:gpt-4o-2024-08-06:acme::abc", Encoding::O200kBase),
        ("openai/gpt-4", Encoding::Cl100kBase),
        (" gpt-4 ", Encoding::Cl100kBase),
    ] {
        assert_eq!(Encoding::for_model(model), e, "{model}");
    }
    assert_eq!(Encoding::from_name("o200k_base"), Some(Encoding::O200kBase));
    assert_eq!(Encoding::from_name("p50k_base"), None);
}
