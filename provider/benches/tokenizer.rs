//! The provider crate's tokenizer: tokens per second counting 50 KB texts of this
//! repository's own sources (code, comments and prose, as a coding agent's prompt holds),
//! for both encodings, and the pre-merge cut alone; and what the estimator pays for a ~50 KB
//! conversation whose earlier turns it has seen, only the last message new (as each turn of
//! a coding agent's session is). BENCHMARKS.md, "The tokenizer's speed".
//!
//! Run with `cargo bench -p tokenwarden-provider --features ranks --bench tokenizer`.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_main};
use std::sync::Arc;

use tokenwarden_provider::bpe::{self, Bpe, Encoding};
use tokenwarden_provider::estimate::{Estimator, Options, Parsed, Provider};

/// Four 50 KB slices of the sources under `core/src` and `docs`, each cut at a character.
fn texts() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut dirs = vec![root.join("core/src"), root.join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("a source folder").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    let all: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut at = 0;
    while out.len() < 4 && at + 50 * 1024 < all.len() {
        let mut end = at + 50 * 1024;
        while !all.is_char_boundary(end) {
            end += 1;
        }
        out.push(all[at..end].to_string());
        at = end;
    }
    out
}

fn tokenizer(c: &mut Criterion) {
    let texts = texts();
    assert_eq!(
        texts.len(),
        4,
        "the sources are too small for four 50 KB texts"
    );
    let mut g = c.benchmark_group("tokenizer");
    for (name, encoding, ranks) in [
        ("o200k", Encoding::O200kBase, bpe::O200K_BASE),
        ("cl100k", Encoding::Cl100kBase, bpe::CL100K_BASE),
    ] {
        let bpe = Bpe::new(encoding, ranks).expect("the embedded ranks");
        let tokens: usize = texts.iter().map(|t| bpe.count(t)).sum();
        g.throughput(Throughput::Elements(tokens as u64));
        g.bench_function(format!("count/{name}/4x50KB"), |b| {
            b.iter(|| texts.iter().map(|t| bpe.count(black_box(t))).sum::<usize>());
        });
        g.bench_function(format!("pieces/{name}/4x50KB"), |b| {
            b.iter(|| {
                texts
                    .iter()
                    .map(|t| bpe.pieces(black_box(t)).len())
                    .sum::<usize>()
            });
        });
    }
    g.finish();
}

/// A ~50 KB Messages body: three long turns the same each call, the last message new.
fn conversation(call: u64) -> String {
    const PROSE: &str = "The agent opened src/lib.rs, read the function that parses the config, and found that the error path drops the file name; it proposes a patch and a test. ";
    let fill = |n: usize| PROSE.repeat(n / PROSE.len() + 1)[..n].to_owned();
    serde_json::json!({
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "messages": [
            { "role": "user", "content": format!("turn 1: {}", fill(16_500)) },
            { "role": "assistant", "content": format!("turn 2: {}", fill(16_500)) },
            { "role": "user", "content": format!("turn 3: {}", fill(16_500)) },
            { "role": "assistant", "content": "Done." },
            { "role": "user", "content": format!("call {call}: {}", fill(90)) },
        ],
    })
    .to_string()
}

fn estimator(c: &mut Criterion) {
    let mut e = Estimator::new(Options::default()).expect("the default options");
    e.use_tokenizer(Arc::new(
        Bpe::new(Encoding::O200kBase, bpe::O200K_BASE).expect("the embedded ranks"),
    ));
    let mut g = c.benchmark_group("estimator");
    let mut call = 0;
    g.bench_function("conversation_50KB_last_message_new/parse", |b| {
        b.iter(|| {
            call += 1;
            Parsed::new(black_box(&conversation(call))).expect("a JSON object")
        });
    });
    g.bench_function("conversation_50KB_last_message_new/parse+estimate", |b| {
        b.iter(|| {
            call += 1;
            let mut p = Parsed::new(&conversation(call)).expect("a JSON object");
            e.estimate_parsed(
                call,
                Provider::Anthropic,
                "claude-sonnet-4-6",
                black_box(&mut p),
            )
        });
    });
    g.finish();
}

/// The benchmarks, with criterion's settings from the command line.
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    tokenizer(&mut c);
    estimator(&mut c);
}

criterion_main!(benches);
