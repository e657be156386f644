//! Tokens per second of a `tokenizer.json` on many threads, all sharing one tokenizer (as the
//! reader threads of a text column do, `table::text`) or each with a copy of its own: whether
//! the lock in front of a BPE model's cache of words holds shared threads back.
//!
//!     cargo run --release -p pinfeed-source --example tokenize_threads -- \
//!         tokenizer.json documents.txt 1,4,16
//!
//! `documents.txt` holds one document a line. Prints, for each thread count, the rate shared
//! and with copies.

use std::time::Instant;

use tokenizers::Tokenizer;

fn rate(tokenizer: &Tokenizer, docs: &[&str], threads: usize, copies: bool) -> (usize, f64) {
    let per = docs.len().div_ceil(threads);
    let start = Instant::now();
    let tokens = std::thread::scope(|scope| {
        let handles: Vec<_> = docs
            .chunks(per)
            .map(|part| {
                scope.spawn(move || {
                    let own = copies.then(|| tokenizer.clone());
                    let t = own.as_ref().unwrap_or(tokenizer);
                    let ids = |d: &&str| t.encode_fast(*d, true).expect("encodes").len();
                    part.iter().map(ids).sum::<usize>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("joins")).sum()
    });
    (tokens, start.elapsed().as_secs_f64())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, tokenizer, docs, threads] = &args[..] else {
        eprintln!("usage: tokenize_threads TOKENIZER.json DOCUMENTS.txt THREADS,THREADS,...");
        std::process::exit(2);
    };
    let tokenizer = Tokenizer::from_file(tokenizer).expect("a tokenizer.json");
    let text = std::fs::read_to_string(docs).expect("a text file");
    let docs: Vec<&str> = text.lines().collect();
    for threads in threads
        .split(',')
        .map(|t| t.parse::<usize>().expect("a thread count"))
    {
        for copies in [false, true] {
            let (tokens, seconds) = rate(&tokenizer, &docs, threads, copies);
            let how = if copies { "a copy each" } else { "one shared" };
            println!(
                "{threads:>3} threads, {how:<11}: {tokens} tokens in {seconds:.2} s, {:.2} M tokens/s",
                tokens as f64 / seconds / 1e6
            );
        }
    }
}
