//! Writes the ranks files `provider/data/o200k_base.bpe` and `cl100k_base.bpe` (the format
//! is in `tokenwarden_provider::bpe`'s doc) from tiktoken's published ranks, as the
//! `tiktoken-rs` crate carries them:
//!
//! ```text
//! cargo run -p tokenwarden-provider --example bpe_ranks
//! ```
//!
//! The files are committed; run this only to check them (`--check`: fails if a file
//! differs from what it would write) or after a new encoding is added.
use std::path::PathBuf;

use tokenwarden_provider::bpe::{Encoding, MAGIC};

fn main() {
    let check = std::env::args().any(|a| a == "--check");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data");
    let mut differs = false;
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let bpe = match encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base(),
        }
        .expect("tiktoken-rs loads its own ranks");
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&encoding.tokens().to_le_bytes());
        let mut bytes = Vec::new();
        for rank in 0..encoding.tokens() {
            let token = bpe
                .decode_bytes(&[rank])
                .unwrap_or_else(|e| panic!("{encoding} has no token {rank}: {e}"));
            let len = u8::try_from(token.len()).expect("a token is at most 255 bytes");
            out.push(len);
            bytes.extend_from_slice(&token);
        }
        out.extend_from_slice(&bytes);
        assert!(
            bpe.decode_bytes(&[encoding.tokens()]).is_err(),
            "{encoding} has more than {} ordinary tokens",
            encoding.tokens()
        );
        let path = dir.join(format!("{}.bpe", encoding.name()));
        if check {
            if std::fs::read(&path).ok().as_deref() != Some(&out[..]) {
                eprintln!("{} differs from tiktoken's ranks", path.display());
                differs = true;
            }
        } else {
            std::fs::write(&path, &out).expect("write the ranks file");
            println!(
                "{}: {} tokens, {} bytes",
                path.display(),
                encoding.tokens(),
                out.len()
            );
        }
    }
    if differs {
        std::process::exit(1);
    }
}
