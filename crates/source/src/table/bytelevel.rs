//! Byte-level BPE tokenization without the library's bookkeeping, for the tokenizers that cut
//! text as GPT-2 does (GPT-2, GPT-J, RoBERTa: the byte-level pre-tokenizer with its pattern) or
//! by a pattern of their own before a byte-level mapping (Llama 3: a split on a regex, then the
//! byte-level pre-tokenizer without its pattern), with no normalizer. A document is cut into
//! pieces, each piece's ids come from a cache of the pieces this thread has seen, and only a
//! piece not seen goes through the library's model; the tokens the post-processor puts around
//! a document (Llama 3's `<|begin_of_text|>`) are found once, by post-processing a probe. The
//! library's own `encode` builds an offset-tracked string for every piece and an owned string
//! for every token; this gives the same ids (tests compare them on random text) at several
//! times the speed.
//!
//! A tokenizer of another shape (a normalizer, another pre-tokenizer, BPE dropout) is encoded
//! by the library whole, and so is a document that holds an added token's text
//! (`<|endoftext|>` written in the text), which the library matches first.

use std::sync::{LazyLock, Mutex};

use aho_corasick::AhoCorasick;
use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input};
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::{
    Encoding, Model, ModelWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Token, Tokenizer,
};

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
/// Bytes of a piece of GPT-2's pattern past which the document is the library's: its regex
/// gives up on a run of about a million characters (its backtracking stack), and takes the
/// rest of the document as one piece.
const LONGEST_PIECE: usize = 500_000;

/// One thread's state: the ids of pieces seen before, by the piece's text, and the pattern's
/// search cache.
pub(crate) struct Pieces {
    ids: ahash::AHashMap<Box<str>, Box<[u32]>>,
    search: Cache,
    /// A piece's bytes as the model's characters, kept for the next piece not seen.
    mapped: String,
}

/// How a document is cut into pieces.
enum Cut {
    /// GPT-2's pattern, searched here; a space put before the document first, if asked.
    Gpt2 { prefix_space: bool },
    /// The tokenizer's own split pattern (its regex, the library's matches), each match and
    /// each run between matches a piece; a space put before each piece, if asked.
    Split { split: Split, prefix_space: bool },
}

/// A tokenizer whose documents this module encodes.
pub(crate) struct ByteLevel {
    cut: Cut,
    /// The ids the post-processor puts before and after a document.
    before: Vec<u32>,
    after: Vec<u32>,
    /// The added tokens' texts: a document holding one is the library's to encode.
    added: Option<AhoCorasick>,
    /// Each byte's character in the model's vocabulary (GPT-2's `bytes_to_unicode`).
    chars: [char; 256],
    /// Caches not in use: an encoding thread takes one and gives it back.
    caches: Mutex<Vec<Pieces>>,
}

/// The split of a `Sequence[Split(pattern, "isolated"), ByteLevel(use_regex=False)]`
/// pre-tokenizer, and that byte-level step's `add_prefix_space`.
fn split_then_bytes(tokenizer: &Tokenizer) -> Option<(&Split, bool)> {
    let Some(PreTokenizerWrapper::Sequence(steps)) = tokenizer.get_pre_tokenizer() else {
        return None;
    };
    match steps.as_ref() {
        [PreTokenizerWrapper::Split(split), PreTokenizerWrapper::ByteLevel(bytes)]
            if split.behavior == SplitDelimiterBehavior::Isolated
                && !split.invert
                && !bytes.use_regex =>
        {
            Some((split, bytes.add_prefix_space))
        }
        _ => None,
    }
}

/// The id of the one-token document [`post_processed`] hands the post-processor.
const PROBE: u32 = u32::MAX;

/// The ids `tokenizer`'s post-processor makes of a document of one token, [`PROBE`]; or why it
/// cannot process a document (a template that names a sequence or a token it does not hold
/// loads, then panics on every document).
pub(crate) fn post_processed(tokenizer: &Tokenizer) -> Result<Vec<u32>, String> {
    let probe = Encoding::from_tokens(vec![Token::new(PROBE, String::new(), (0, 0))], 0);
    // The library has no check of a template short of running it; a malformed one panics,
    // and the panic hook's line on stderr is printed before this turns it into an error.
    let run = std::panic::AssertUnwindSafe(|| tokenizer.post_process(probe, None, true));
    match std::panic::catch_unwind(run) {
        Ok(Ok(done)) => Ok(done.get_ids().to_vec()),
        Ok(Err(e)) => Err(format!("its post-processor fails on a document: {e}")),
        Err(_) => Err(
            "its post-processor fails on a document (a template naming a sequence \
                       or a token it does not hold)"
                .to_owned(),
        ),
    }
}

/// The ids `tokenizer`'s post-processor puts before and after a document's, from what it made
/// of the probe (`probed`, [`post_processed`]); `None` where that is not all it does.
fn around(tokenizer: &Tokenizer, probed: &[u32]) -> Option<(Vec<u32>, Vec<u32>)> {
    let at = probed.iter().position(|&id| id == PROBE)?;
    let once = probed.iter().filter(|&&id| id == PROBE).count() == 1;
    let added = tokenizer
        .get_post_processor()
        .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
    (once && probed.len() == added + 1).then(|| (probed[..at].to_vec(), probed[at + 1..].to_vec()))
}

impl ByteLevel {
    /// The fast path for `tokenizer`, if it has one of the shapes this module encodes;
    /// `probed` is what its post-processor made of the probe ([`post_processed`]).
    pub(crate) fn of(tokenizer: &Tokenizer, probed: &[u32]) -> Option<ByteLevel> {
        let cut = match tokenizer.get_pre_tokenizer() {
            Some(PreTokenizerWrapper::ByteLevel(pre)) if pre.use_regex => Cut::Gpt2 {
                prefix_space: pre.add_prefix_space,
            },
            _ => {
                let (split, prefix_space) = split_then_bytes(tokenizer)?;
                Cut::Split {
                    split: split.clone(),
                    prefix_space,
                }
            }
        };
        let sampled = match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) => bpe.dropout.is_some_and(|p| p > 0.0),
            _ => false,
        };
        if tokenizer.get_normalizer().is_some() || sampled {
            return None;
        }
        let (before, after) = around(tokenizer, probed)?;
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
            cut,
            before,
            after,
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
            mapped: String::new(),
        })
    }

    /// Gives back a cache [`Self::take`] handed out.
    pub(crate) fn give(&self, cache: Pieces) {
        let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        caches.push(cache);
    }

    /// Appends the ids of `text` (one that [`Self::takes`]) to `out` as uint32 bytes; the
    /// tokenizer is the one this was made [`Self::of`]. False, `out` as it was, where the
    /// document is the library's after all (a piece of more than [`LONGEST_PIECE`] bytes).
    pub(crate) fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        cache: &mut Pieces,
        out: &mut Vec<u8>,
    ) -> tokenizers::Result<bool> {
        let start = out.len();
        let model = tokenizer.get_model();
        let piece_space = matches!(
            self.cut,
            Cut::Split {
                prefix_space: true,
                ..
            }
        );
        let mut failed = None;
        let Pieces {
            ids: known,
            search,
            mapped,
        } = cache;
        put(out, &self.before);
        let mut each = |piece: &str| {
            if failed.is_some() || piece.is_empty() {
                return;
            }
            if let Some(ids) = known.get(piece) {
                return put(out, ids);
            }
            mapped.clear();
            if piece_space && !piece.starts_with(' ') {
                mapped.push(self.chars[usize::from(b' ')]);
            }
            mapped.extend(piece.bytes().map(|b| self.chars[usize::from(b)]));
            match model.tokenize(mapped.as_str()) {
                Ok(tokens) => {
                    let ids: Box<[u32]> = tokens.iter().map(|t| t.id).collect();
                    put(out, &ids);
                    if known.len() < CACHED_PIECES && piece.len() <= CACHED_BYTES {
                        known.insert(piece.into(), ids);
                    }
                }
                Err(e) => failed = Some(e),
            }
        };
        match &self.cut {
            Cut::Gpt2 { prefix_space } => {
                let spaced;
                let text = match *prefix_space && !text.starts_with(' ') {
                    true => {
                        spaced = format!(" {text}");
                        spaced.as_str()
                    }
                    false => text,
                };
                if !pieces(text, search, each) {
                    out.truncate(start);
                    return Ok(false);
                }
            }
            Cut::Split { split, .. } => {
                let mut from = 0;
                for (start, end) in split.regex.find_iter(text) {
                    each(&text[from..start]);
                    each(&text[start..end]);
                    from = end;
                }
                each(&text[from..]);
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        put(out, &self.after);
        Ok(true)
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
///
/// False, and no piece past it given, at a piece of more than [`LONGEST_PIECE`] bytes.
pub(crate) fn pieces<'a>(text: &'a str, search: &mut Cache, mut each: impl FnMut(&'a str)) -> bool {
    let mut at = 0;
    while at < text.len() {
        // Every character is matched by one alternative: a search anchored at `at` finds its
        // end alone, with no search back for the start.
        let from = Input::new(text).range(at..).anchored(Anchored::Yes);
        let mut end = PATTERN
            .search_with(search, &from)
            .map_or(text.len(), |m| m.end());
        let piece = &text[at..end];
        if piece.len() > LONGEST_PIECE {
            return false;
        }
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
    true
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
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::SplitPattern;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::{AddedToken, Tokenizer};

    use super::*;

    /// Characters that reach every alternative of GPT-2's and Llama 3's patterns and their
    /// edges: spaces of several kinds, line ends, contractions (either case), letters and
    /// digits of other scripts (a roman numeral is a letter-number, `\p{N}`), runs of digits,
    /// combining marks, emoji, punctuation.
    #[rustfmt::skip]
    const PARTS: &[&str] = &[
        " ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\r", "\u{a0}", "\u{3000}", "\u{2028}",
        "\u{85}", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "the", "The",
        "ing", "a", "Z", "é", "naïve", "中文", "Ⅻ", "٣", "0", "42", "12345", "3.14", "e\u{301}",
        "🙂", "👩‍👩‍👧", "!", "...", "-", "--", "\"", "(", ")", "<", "|", ">", "endoftext",
        "\u{0}", "\u{7f}", "\u{ad}",
    ];

    /// Llama 3's split pattern, as its tokenizer.json writes it.
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    fn text(rng: &mut StdRng, parts: usize) -> String {
        (0..parts)
            .map(|_| PARTS[rng.random_range(0..PARTS.len())])
            .collect()
    }

    /// A byte-level BPE with pre-tokenizer `pre`, trained on text drawn from `PARTS`, with
    /// `<|endoftext|>` and `<|begin_of_text|>` added.
    fn trained(pre: PreTokenizerWrapper) -> Tokenizer {
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(pre));
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(400)
            .show_progress(false)
            .initial_alphabet(Pre::alphabet().into_iter().collect())
            .special_tokens(vec![
                AddedToken::from("<|endoftext|>", true),
                AddedToken::from("<|begin_of_text|>", true),
            ])
            .build()
            .into();
        let mut rng = StdRng::seed_from_u64(7);
        let corpus: Vec<String> = (0..2000).map(|_| text(&mut rng, 40)).collect();
        tokenizer
            .train(&mut trainer, corpus.iter())
            .expect("trains");
        tokenizer
    }

    fn gpt2(prefix_space: bool) -> Tokenizer {
        trained(Pre::default().add_prefix_space(prefix_space).into())
    }

    /// Llama 3's shape: its pattern split, then bytes mapped without GPT-2's pattern.
    fn split(pattern: SplitPattern, prefix_space: bool) -> Tokenizer {
        let split = Split::new(pattern, SplitDelimiterBehavior::Isolated, false).expect("splits");
        let bytes = Pre::new(prefix_space, true, false);
        trained(Sequence::new(vec![split.into(), bytes.into()]).into())
    }

    /// `tokenizer` with a post-processor that puts `<|begin_of_text|>` before each document
    /// and `<|endoftext|>` after it.
    fn templated(mut tokenizer: Tokenizer) -> Tokenizer {
        let id = |t: &str| tokenizer.token_to_id(t).expect("added");
        let (bos, eos) = (id("<|begin_of_text|>"), id("<|endoftext|>"));
        let template = TemplateProcessing::builder()
            .try_single("<|begin_of_text|> $A <|endoftext|>")
            .expect("a template")
            .special_tokens(vec![("<|begin_of_text|>", bos), ("<|endoftext|>", eos)])
            .build()
            .expect("a template");
        tokenizer.with_post_processor(Some(template));
        tokenizer
    }

    fn fast_path(tokenizer: &Tokenizer) -> Option<ByteLevel> {
        ByteLevel::of(
            tokenizer,
            &post_processed(tokenizer).expect("post-processes"),
        )
    }

    fn ours(fast: &ByteLevel, tokenizer: &Tokenizer, text: &str, cache: &mut Pieces) -> Vec<u32> {
        let mut out = Vec::new();
        assert!(fast
            .encode(tokenizer, text, cache, &mut out)
            .expect("encodes"));
        out.chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    }

    #[test]
    fn random_text_gets_the_ids_of_the_library_encode() {
        let shapes = [
            ("gpt2", gpt2(false)),
            ("gpt2, prefix space", gpt2(true)),
            ("gpt2, template", templated(gpt2(false))),
            ("llama3", split(SplitPattern::Regex(LLAMA3.into()), false)),
            (
                "llama3, prefix space",
                split(SplitPattern::Regex(LLAMA3.into()), true),
            ),
            (
                "llama3, template",
                templated(split(SplitPattern::Regex(LLAMA3.into()), false)),
            ),
            (
                "split on a string",
                split(SplitPattern::String("\n".into()), false),
            ),
        ];
        for (name, tokenizer) in &shapes {
            let fast = fast_path(tokenizer).unwrap_or_else(|| panic!("{name}: a fast path"));
            let mut cache = fast.take();
            let mut rng = StdRng::seed_from_u64(11);
            let mut taken = 0;
            for round in 0..3000 {
                let parts = rng.random_range(1..30);
                let text = text(&mut rng, parts);
                if !fast.takes(&text) {
                    continue;
                }
                taken += 1;
                let want = tokenizer.encode_fast(text.as_str(), true).expect("encodes");
                let got = ours(&fast, tokenizer, &text, &mut cache);
                assert_eq!(got, want.get_ids(), "{name}: {text:?} (round {round})");
            }
            assert!(taken > 2000, "{name}: {taken} texts taken");
            assert!(!cache.ids.is_empty(), "{name}: pieces are kept");
        }
    }

    #[test]
    fn a_document_holding_an_added_token_is_the_librarys() {
        let tokenizer = gpt2(false);
        let fast = fast_path(&tokenizer).expect("GPT-2's shape");
        assert!(fast.takes("text, then more"));
        assert!(!fast.takes("one<|endoftext|>two"));
        assert!(!fast.takes(""), "an empty document is the library's");
    }

    #[test]
    fn pieces_cut_runs_of_spaces_as_the_look_ahead_does() {
        let mut search = PATTERN.create_cache();
        let mut cut = |text: &str| {
            let mut all = Vec::new();
            assert!(pieces(text, &mut search, |p| all.push(p.to_owned())));
            all
        };
        assert_eq!(cut("a   b"), ["a", "  ", " b"]);
        assert_eq!(cut("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(cut("end  "), ["end", "  "]);
        assert_eq!(cut("it's 42!"), ["it", "'s", " 42", "!"]);
    }

    #[test]
    fn other_shapes_are_left_to_the_library() {
        let mut tokenizer = gpt2(false);
        let _ = tokenizer.with_normalizer(Some(tokenizers::normalizers::Lowercase));
        assert!(fast_path(&tokenizer).is_none(), "a normalizer");
        let tokenizer = trained(Pre::default().use_regex(false).into());
        assert!(fast_path(&tokenizer).is_none(), "no pattern at all");
        let removed = Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::Removed,
            false,
        );
        let bytes = Pre::new(false, true, false);
        let pre = Sequence::new(vec![removed.expect("splits").into(), bytes.into()]);
        assert!(
            fast_path(&trained(pre.into())).is_none(),
            "a split that drops text"
        );
        let isolated = Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::Isolated,
            false,
        );
        let pre = Sequence::new(vec![
            Pre::new(false, true, false).into(),
            isolated.expect("splits").into(),
        ]);
        assert!(
            fast_path(&trained(pre.into())).is_none(),
            "bytes mapped before the split"
        );
    }

    #[test]
    fn the_tokens_a_template_adds_are_put_around_each_document() {
        let tokenizer = templated(gpt2(false));
        let fast = fast_path(&tokenizer).expect("GPT-2's shape");
        let id = |t: &str| tokenizer.token_to_id(t).expect("added");
        assert_eq!(fast.before, [id("<|begin_of_text|>")]);
        assert_eq!(fast.after, [id("<|endoftext|>")]);
    }

    #[test]
    fn a_document_of_a_very_long_piece_is_the_librarys() {
        let tokenizer = gpt2(false);
        let fast = fast_path(&tokenizer).expect("GPT-2's shape");
        let text = format!("Hello{}x it's", " ".repeat(LONGEST_PIECE + 1));
        let mut out = vec![7u8];
        let taken = fast.encode(&tokenizer, &text, &mut fast.take(), &mut out);
        assert!(!taken.expect("no error"), "left to the library");
        assert_eq!(out, [7], "nothing written");
    }

    #[test]
    fn the_byte_table_is_the_librarys_alphabet() {
        let ours: std::collections::HashSet<char> = byte_chars().into_iter().collect();
        assert_eq!(ours, Pre::alphabet().into_iter().collect());
        assert_eq!(byte_chars()[usize::from(b' ')], 'Ġ');
        assert_eq!(byte_chars()[usize::from(b'\n')], 'Ċ');
    }
}
