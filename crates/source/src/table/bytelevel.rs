//! GPT-2's byte-level tokenization without the library's bookkeeping, for the tokenizers that
//! use its pre-tokenizer as is (GPT-2, GPT-J, GPT-NeoX, Pythia): a document is cut into the
//! pieces of GPT-2's pattern, each piece's ids come from a cache of the pieces this thread has
//! seen, and only a piece not seen goes through the library's model. The library's own `encode`
//! builds an offset-tracked string for every piece and an owned string for every token; this
//! gives the same ids (tests compare them on random text) at several times the speed.
//!
//! A tokenizer of another shape (a normalizer, another pre-tokenizer, a post-processor that adds
//! tokens, BPE dropout) is encoded by the library whole, and so is a document that holds an
//! added token's text (`<|endoftext|>` written in the text), which the library matches first.

use std::sync::{LazyLock, Mutex};

use aho_corasick::AhoCorasick;
use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input};
use tokenizers::{Model, ModelWrapper, PostProcessor, PreTokenizerWrapper, Tokenizer};

/// GPT-2's pattern, as the library writes it, less its `\s+(?!\S)` (`regex-automata` has no
/// look-ahead): [`pieces`] takes a run of spaces back by one character where that alternative
/// would have.
static PATTERN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+")
        .expect("GPT-2's pattern compiles")
});

/// Pieces a cache keeps; past them, a new piece is encoded and not kept. About 3 MiB a cache.
const CACHED_PIECES: usize = 1 << 15;
/// Bytes of the longest piece kept: longer ones (a run of letters with no space, a line of
/// dashes) are rare and would only fill the cache.
const CACHED_BYTES: usize = 64;

/// One thread's state: the ids of pieces seen before, by the piece's text, and the pattern's
/// search cache.
pub(crate) struct Pieces {
    ids: ahash::AHashMap<Box<str>, Box<[u32]>>,
    search: Cache,
}

/// A tokenizer whose documents this module encodes.
pub(crate) struct ByteLevel {
    /// Whether a space is put before a document that does not start with one.
    prefix_space: bool,
    /// The added tokens' texts: a document holding one is the library's to encode.
    added: Option<AhoCorasick>,
    /// Each byte's character in the model's vocabulary (GPT-2's `bytes_to_unicode`).
    chars: [char; 256],
    /// Caches not in use: an encoding thread takes one and gives it back.
    caches: Mutex<Vec<Pieces>>,
}

impl ByteLevel {
    /// The fast path for `tokenizer`, if it has GPT-2's shape.
    pub(crate) fn of(tokenizer: &Tokenizer) -> Option<ByteLevel> {
        let Some(PreTokenizerWrapper::ByteLevel(pre)) = tokenizer.get_pre_tokenizer() else {
            return None;
        };
        let adds = tokenizer
            .get_post_processor()
            .is_some_and(|p| p.added_tokens(false) > 0);
        let sampled = match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) => bpe.dropout.is_some_and(|p| p > 0.0),
            _ => false,
        };
        if !pre.use_regex || tokenizer.get_normalizer().is_some() || adds || sampled {
            return None;
        }
        let added: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .filter(|c| !c.is_empty())
            .collect();
        let added = match added.is_empty() {
            true => None,
            false => Some(AhoCorasick::new(&added).ok()?),
        };
        Some(ByteLevel {
            prefix_space: pre.add_prefix_space,
            added,
            chars: byte_chars(),
            caches: Mutex::new(Vec::new()),
        })
    }

    /// Whether `text` is this module's to encode: it holds no added token's text.
    pub(crate) fn takes(&self, text: &str) -> bool {
        !text.is_empty() && self.added.as_ref().is_none_or(|a| !a.is_match(text))
    }

    /// A cache of pieces for one thread's run of documents, given back with [`Self::give`].
    pub(crate) fn take(&self) -> Pieces {
        let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        caches.pop().unwrap_or_else(|| Pieces {
            ids: Default::default(),
            search: PATTERN.create_cache(),
        })
    }

    /// Gives back a cache [`Self::take`] handed out.
    pub(crate) fn give(&self, cache: Pieces) {
        let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        caches.push(cache);
    }

    /// Appends the ids of `text` (one that [`Self::takes`]) to `out` as uint32 bytes.
    pub(crate) fn encode(
        &self,
        model: &ModelWrapper,
        text: &str,
        cache: &mut Pieces,
        out: &mut Vec<u8>,
    ) -> tokenizers::Result<()> {
        let spaced;
        let text = match self.prefix_space && !text.starts_with(' ') {
            true => {
                spaced = format!(" {text}");
                spaced.as_str()
            }
            false => text,
        };
        let mut mapped = String::new();
        let mut failed = None;
        let Pieces { ids: known, search } = cache;
        pieces(text, search, |piece| {
            if failed.is_some() {
                return;
            }
            if let Some(ids) = known.get(piece) {
                return put(out, ids);
            }
            mapped.clear();
            mapped.extend(piece.bytes().map(|b| self.chars[usize::from(b)]));
            match model.tokenize(&mapped) {
                Ok(tokens) => {
                    let ids: Box<[u32]> = tokens.iter().map(|t| t.id).collect();
                    put(out, &ids);
                    if known.len() < CACHED_PIECES && piece.len() <= CACHED_BYTES {
                        known.insert(piece.into(), ids);
                    }
                }
                Err(e) => failed = Some(e),
            }
        });
        failed.map_or(Ok(()), Err)
    }
}

fn put(out: &mut Vec<u8>, ids: &[u32]) {
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
}

/// Calls `each` with the pieces of GPT-2's pattern in `text`, in order; together they are
/// `text`. Where the pattern's `\s+(?!\S)` would match, a run of two or more spaces followed by
/// a character that is not one, the run is cut before its last space (which then leads the
/// next piece, ` word`), as that alternative's backtracking does.
pub(crate) fn pieces<'a>(text: &'a str, search: &mut Cache, mut each: impl FnMut(&'a str)) {
    let mut at = 0;
    while at < text.len() {
        // Every character is matched by one alternative: a search anchored at `at` finds its
        // end alone, with no search back for the start.
        let from = Input::new(text).range(at..).anchored(Anchored::Yes);
        let mut end = PATTERN
            .search_with(search, &from)
            .map_or(text.len(), |m| m.end());
        let piece = &text[at..end];
        if end < text.len() {
            let mut chars = piece.chars();
            let last = chars.next_back();
            let run = chars.as_str();
            if let Some(last) = last.filter(|c| c.is_whitespace()) {
                if !run.is_empty() && run.chars().all(char::is_whitespace) {
                    end -= last.len_utf8();
                }
            }
        }
        each(&text[at..end]);
        at = end;
    }
}

/// GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the others for the
/// characters from U+0100 on, in order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[usize::from(b)] = match printable(b) {
            true => char::from(b),
            false => {
                next += 1;
                char::from_u32(next - 1).expect("below U+0200")
            }
        };
    }
    chars
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel as Pre;
    use tokenizers::{AddedToken, Tokenizer};

    use super::*;

    /// Characters that reach every alternative of GPT-2's pattern and its edges: spaces of
    /// several kinds, line ends, contractions, letters and digits of other scripts (a roman
    /// numeral is a letter-number, `\p{N}`), combining marks, emoji, punctuation.
    const PARTS: &[&str] = &[
        " ",
        " ",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "\r\n",
        "\u{a0}",
        "\u{3000}",
        "'",
        "'s",
        "'t",
        "'re",
        "'ve",
        "'m",
        "'ll",
        "'d",
        "'S",
        "the",
        "The",
        "ing",
        "a",
        "Z",
        "é",
        "naïve",
        "中文",
        "Ⅻ",
        "٣",
        "0",
        "42",
        "3.14",
        "e\u{301}",
        "🙂",
        "👩‍👩‍👧",
        "!",
        "...",
        "-",
        "--",
        "\"",
        "(",
        ")",
        "<",
        "|",
        ">",
        "endoftext",
        "\u{0}",
        "\u{7f}",
        "\u{ad}",
    ];

    fn text(rng: &mut StdRng, parts: usize) -> String {
        (0..parts)
            .map(|_| PARTS[rng.random_range(0..PARTS.len())])
            .collect()
    }

    /// A byte-level BPE trained on text drawn from `PARTS`, with `<|endoftext|>` added.
    fn trained(prefix_space: bool) -> Tokenizer {
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(Pre::default().add_prefix_space(prefix_space)));
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(400)
            .show_progress(false)
            .initial_alphabet(Pre::alphabet().into_iter().collect())
            .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
            .build()
            .into();
        let mut rng = StdRng::seed_from_u64(7);
        let corpus: Vec<String> = (0..2000).map(|_| text(&mut rng, 40)).collect();
        tokenizer
            .train(&mut trainer, corpus.iter())
            .expect("trains");
        tokenizer
    }

    fn ours(fast: &ByteLevel, tokenizer: &Tokenizer, text: &str, cache: &mut Pieces) -> Vec<u32> {
        let mut out = Vec::new();
        fast.encode(tokenizer.get_model(), text, cache, &mut out)
            .expect("encodes");
        out.chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    }

    #[test]
    fn random_text_gets_the_ids_of_the_library_encode() {
        for prefix_space in [false, true] {
            let tokenizer = trained(prefix_space);
            let fast = ByteLevel::of(&tokenizer).expect("GPT-2's shape");
            let mut cache = fast.take();
            let mut rng = StdRng::seed_from_u64(11);
            for round in 0..3000 {
                let parts = rng.random_range(1..30);
                let text = text(&mut rng, parts);
                if !fast.takes(&text) {
                    continue;
                }
                let want = tokenizer.encode_fast(text.as_str(), true).expect("encodes");
                let got = ours(&fast, &tokenizer, &text, &mut cache);
                assert_eq!(
                    got,
                    want.get_ids(),
                    "{text:?} (round {round}, {prefix_space})"
                );
            }
            assert!(!cache.ids.is_empty(), "pieces are kept");
        }
    }

    #[test]
    fn a_document_holding_an_added_token_is_the_librarys() {
        let tokenizer = trained(false);
        let fast = ByteLevel::of(&tokenizer).expect("GPT-2's shape");
        assert!(fast.takes("text, then more"));
        assert!(!fast.takes("one<|endoftext|>two"));
        assert!(!fast.takes(""), "an empty document is the library's");
    }

    #[test]
    fn pieces_cut_runs_of_spaces_as_the_look_ahead_does() {
        let mut search = PATTERN.create_cache();
        let mut cut = |text: &str| {
            let mut all = Vec::new();
            pieces(text, &mut search, |p| all.push(p.to_owned()));
            all
        };
        assert_eq!(cut("a   b"), ["a", "  ", " b"]);
        assert_eq!(cut("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(cut("end  "), ["end", "  "]);
        assert_eq!(cut("it's 42!"), ["it", "'s", " 42", "!"]);
    }

    #[test]
    fn other_shapes_are_left_to_the_library() {
        let mut tokenizer = trained(false);
        let _ = tokenizer.with_normalizer(Some(tokenizers::normalizers::Lowercase));
        assert!(ByteLevel::of(&tokenizer).is_none(), "a normalizer");
        let mut tokenizer = trained(false);
        let bert = tokenizers::processors::bert::BertProcessing::new(
            ("[SEP]".into(), 1),
            ("[CLS]".into(), 0),
        );
        tokenizer.with_post_processor(Some(bert));
        assert!(
            ByteLevel::of(&tokenizer).is_none(),
            "a post-processor that adds tokens"
        );
        let mut tokenizer = trained(false);
        tokenizer.with_pre_tokenizer(Some(Pre::default().use_regex(false)));
        assert!(ByteLevel::of(&tokenizer).is_none(), "no GPT-2 pattern");
    }

    #[test]
    fn the_byte_table_is_the_librarys_alphabet() {
        let ours: std::collections::HashSet<char> = byte_chars().into_iter().collect();
        assert_eq!(ours, Pre::alphabet().into_iter().collect());
        assert_eq!(byte_chars()[usize::from(b' ')], 'Ġ');
        assert_eq!(byte_chars()[usize::from(b'\n')], 'Ċ');
    }
}
