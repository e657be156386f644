//! Tokens per second of a `tokenizer.json` on many threads: the library's `encode_fast`, all
//! threads sharing one tokenizer or each with a copy of its own, and pinfeed's reader-thread
//! encoder (`Text`, which runs a tokenizer of GPT-2's shape through `table::bytelevel`). Every
//! way's ids are checked equal to the library's.
//!
//!     cargo run --release -p pinfeed-source --example tokenize_threads -- \
//!         tokenizer.json documents.txt 1,4,16
//!
//! `documents.txt` holds one document a line. Prints, for each thread count, each way's rate.

use std::time::Instant;

use pinfeed_source::table::Text;
use tokenizers::Tokenizer;

/// How the documents are encoded.
#[derive(Clone, Copy)]
enum Way {
    Shared,
    Copies,
    Pinfeed,
}

/// The tokens of `docs` on `threads` threads, as uint32 bytes in order, and the seconds taken.
fn rate(
    tokenizer: &Tokenizer,
    text: &Text,
    docs: &[&str],
    threads: usize,
    way: Way,
) -> (Vec<u8>, f64) {
    let per = docs.len().div_ceil(threads);
    let start = Instant::now();
    let parts: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let handles: Vec<_> = docs
            .chunks(per)
            .map(|part| {
                scope.spawn(move || {
                    let mut out = Vec::new();
                    if let Way::Pinfeed = way {
                        text.encode(part, "documents", &mut out).expect("encodes");
                        return out;
                    }
                    let own = matches!(way, Way::Copies).then(|| tokenizer.clone());
                    let t = own.as_ref().unwrap_or(tokenizer);
                    for d in part {
                        let ids = t.encode_fast(*d, true).expect("encodes");
                        out.extend(ids.get_ids().iter().flat_map(|i| i.to_le_bytes()));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("joins"))
            .collect()
    });
    (parts.concat(), start.elapsed().as_secs_f64())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, path, docs, threads] = &args[..] else {
        eprintln!("usage: tokenize_threads TOKENIZER.json DOCUMENTS.txt THREADS,THREADS,...");
        std::process::exit(2);
    };
    let mut tokenizer = Tokenizer::from_file(path).expect("a tokenizer.json");
    // As `Text` does: documents whole, never cut or padded.
    tokenizer.with_truncation(None).expect("no truncation");
    tokenizer.with_padding(None);
    let text = Text::load(path, None, None).expect("a tokenizer.json");
    let file = std::fs::read_to_string(docs).expect("a text file");
    let docs: Vec<&str> = file.lines().collect();
    for threads in threads
        .split(',')
        .map(|t| t.parse::<usize>().expect("a thread count"))
    {
        let mut want = None;
        for (way, how) in [
            (Way::Shared, "library, one shared"),
            (Way::Copies, "library, a copy each"),
            (Way::Pinfeed, "pinfeed's encoder"),
        ] {
            let (ids, seconds) = rate(&tokenizer, &text, &docs, threads, way);
            let want = want.get_or_insert_with(|| ids.clone());
            assert!(ids == *want, "{how}: ids differ from the library's");
            let tokens = ids.len() / 4;
            println!(
                "{threads:>3} threads, {how:<20}: {tokens} tokens in {seconds:.2} s, {:.2} M tokens/s",
                tokens as f64 / seconds / 1e6
            );
        }
    }
}
