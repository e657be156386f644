//! One way to open a token dataset as a loader source, shared by the Python bindings and the
//! command line.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use super::chunks::{chunk_bytes, documents_per_chunk, windows_per_chunk};
use super::{
    invalid, ChunkOrder, DocumentPlan, DocumentWindows, Documents, IndexedDataset, SampledWindows,
    TokenDType, TokenStream, TokenWindows,
};
use crate::rng::hash2;
use crate::{Result, Source};

/// How the windows of a token dataset are picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    /// [`SampledWindows`]: windows at uniformly random offsets drawn from `(seed, epoch, v)`.
    Random,
    /// [`TokenWindows`] every `seq_len` tokens: consecutive windows sharing one token.
    Sequential,
    /// [`DocumentWindows`]: the documents of a Megatron dataset or of a table's column (one a
    /// row) in a shuffled order, cut as `Sequential`.
    Documents,
}

impl Sample {
    /// The name users type: `random`, `sequential` or `documents`.
    pub fn name(self) -> &'static str {
        match self {
            Sample::Random => "random",
            Sample::Sequential => "sequential",
            Sample::Documents => "documents",
        }
    }
}

impl FromStr for Sample {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Sample, String> {
        by_name(
            s,
            "sample",
            &[Sample::Random, Sample::Sequential, Sample::Documents],
            Sample::name,
        )
    }
}

/// How the windows of an epoch are shuffled beyond what [`Sample`] draws: the `shuffle`
/// modes of `TokenLoader` that concern the source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenShuffle {
    /// Sequential windows in stream order. Documents in their shuffled order, windows in order:
    /// a Megatron dataset's by [`document_order`](super::document_order), a table column's rows
    /// by their row-group-aware [`ChunkOrder`].
    #[default]
    None,
    /// The loader permutes the windows (its own shuffle): the source gives them as `None`
    /// does, but a table column's documents in [`document_order`](super::document_order), so
    /// that nothing of the order depends on row groups.
    Random,
    /// A table's column only: sequential windows in the row-group-aware [`ChunkOrder`] of the
    /// windows (each counted in the chunk its first token lies in), documents in that of the
    /// rows with the windows cut from each group's documents shuffled among themselves; the
    /// loader reads them in order.
    Block,
}

impl TokenShuffle {
    /// The name users type: `none`, `random` or `block`.
    pub fn name(self) -> &'static str {
        match self {
            TokenShuffle::None => "none",
            TokenShuffle::Random => "random",
            TokenShuffle::Block => "block",
        }
    }
}

impl FromStr for TokenShuffle {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<TokenShuffle, String> {
        let all = [
            TokenShuffle::None,
            TokenShuffle::Random,
            TokenShuffle::Block,
        ];
        by_name(s, "shuffle", &all, TokenShuffle::name)
    }
}

/// The one of `all` whose [`name`](Sample::name) is `s`, or an error naming `what` and every
/// name it could be.
fn by_name<T: Copy>(
    s: &str,
    what: &str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> std::result::Result<T, String> {
    all.iter().copied().find(|&v| name(v) == s).ok_or_else(|| {
        let names: Vec<String> = all.iter().map(|&v| format!("{:?}", name(v))).collect();
        let (last, rest) = names.split_last().expect("at least one name");
        format!(
            "unknown {what} {s:?}: expected {} or {last}",
            rest.join(", ")
        )
    })
}

/// What [`open`] builds: the windows, their rule, and the steps of a random run.
#[derive(Clone, Debug)]
pub struct TokenOptions {
    /// Token type of a raw file; a `.npy` header or a Megatron index gives its own, which
    /// this must match when given.
    pub dtype: Option<TokenDType>,
    /// Input tokens of a window; windows read `seq_len + 1`.
    pub seq_len: u64,
    /// How windows are picked.
    pub sample: Sample,
    /// Seed of random offsets and of the document order.
    pub seed: u64,
    /// Epoch of random offsets and of the document order.
    pub epoch: u64,
    /// Random only: `steps × batch_size × world_size` windows, or
    /// [`SampledWindows::ENDLESS`] without steps.
    pub steps: Option<u64>,
    /// Records of a batch on one rank.
    pub batch_size: u64,
    /// Ranks that split each step.
    pub world_size: u64,
    /// Random only: steps a loader batch carries ([`SampledWindows::grouped`]); 1 for one
    /// step a batch. The record count is rounded up to whole loader batches.
    pub steps_per_batch: u64,
    /// How sequential and document windows are shuffled; `None` for random windows.
    pub shuffle: TokenShuffle,
}

/// A token dataset opened as windows, by the rule that picks them.
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// `Sample::Random`.
    Random(Arc<SampledWindows>),
    /// `Sample::Sequential`.
    Sequential(Arc<TokenWindows>),
    /// `Sample::Documents`.
    Documents(Arc<DocumentWindows>),
}

impl TokenSource {
    /// The windows as a loader source.
    pub fn source(&self) -> Arc<dyn Source> {
        match self {
            TokenSource::Random(s) => Arc::clone(s) as Arc<dyn Source>,
            TokenSource::Sequential(s) => Arc::clone(s) as Arc<dyn Source>,
            TokenSource::Documents(s) => Arc::clone(s) as Arc<dyn Source>,
        }
    }

    /// The tokens the windows are cut from.
    pub fn stream(&self) -> &Arc<TokenStream> {
        match self {
            TokenSource::Random(s) => s.stream(),
            TokenSource::Sequential(s) => s.stream(),
            TokenSource::Documents(s) => s.plan().documents().tokens(),
        }
    }
}

/// Whether `path` names a Megatron indexed dataset: a `.idx`, a `.bin` beside its `.idx`, or a
/// prefix with a `.idx`.
pub fn is_indexed(path: &Path) -> bool {
    let with = |ext: &str| {
        let mut s = path.as_os_str().to_owned();
        s.push(ext);
        PathBuf::from(s)
    };
    match path.extension().and_then(|e| e.to_str()) {
        Some("idx") => true,
        Some("bin") => path.with_extension("idx").is_file(),
        _ => !path.is_dir() && with(".idx").is_file(),
    }
}

/// Opens the token dataset at `path` as windows of `seq_len + 1` tokens picked as `options`
/// say: a raw token file (nanoGPT's `train.bin`, `dtype` required), a 1-D integer `.npy`, a
/// directory or glob of them read as one stream, or a Megatron `.bin`/`.idx` pair (its dtype
/// from the index). Errors name the file.
pub fn open(path: &Path, options: &TokenOptions) -> Result<TokenSource> {
    let name = path.display().to_string();
    if !is_indexed(path) {
        if options.sample == Sample::Documents {
            return Err(not_indexed(&name));
        }
        random_len(&name, options)?;
        return from_stream(Arc::new(TokenStream::open(path, options.dtype)?), options);
    }
    random_len(&name, options)?;
    let ds = IndexedDataset::open(path)?;
    if let Some(asked) = options.dtype.filter(|&d| d != ds.dtype()) {
        return Err(invalid(
            ds.idx_path().display(),
            format!(
                "the index says {} tokens, but dtype {asked} was given",
                ds.dtype()
            ),
        ));
    }
    windows(Arc::clone(ds.tokens()), Some(ds), options)
}

/// Windows of a stream opened elsewhere (token data in object storage, a table's column:
/// [`TokenStream::from_source`]), picked as `options` say; `Sample::Documents` needs a stream
/// that knows its documents ([`TokenStream::document_starts`]), and is refused for others.
pub fn from_stream(stream: Arc<TokenStream>, options: &TokenOptions) -> Result<TokenSource> {
    windows(stream, None, options)
}

fn not_indexed(name: &str) -> crate::SourceError {
    invalid(
        name,
        "documents sampling needs a Megatron indexed dataset (a .bin beside its .idx) or a \
         table's token or text column",
    )
}

/// Records of random windows: `steps × batch_size × world_size` rounded up to whole loader
/// batches, or whole loader batches of endless windows; 0 for other samples.
fn random_len(name: &str, options: &TokenOptions) -> Result<u64> {
    Ok(match (options.sample, options.steps) {
        // Whole loader batches of endless windows (rounded down; 2^40 windows are ample).
        (Sample::Random, None) => {
            let per_batch = options
                .steps_per_batch
                .max(1)
                .saturating_mul(options.batch_size)
                .saturating_mul(options.world_size)
                .max(1);
            (SampledWindows::ENDLESS / per_batch).max(1) * per_batch
        }
        (Sample::Random, Some(s)) => s
            .div_ceil(options.steps_per_batch.max(1))
            .checked_mul(options.steps_per_batch.max(1))
            .and_then(|n| n.checked_mul(options.batch_size))
            .and_then(|n| n.checked_mul(options.world_size))
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                invalid(
                    name,
                    format!(
                        "steps × batch_size × world_size must be between 1 and 2^64 - 1 \
                         (got {s} × {} × {})",
                        options.batch_size, options.world_size
                    ),
                )
            })?,
        _ => 0,
    })
}

/// The windows of `stream` (with its Megatron `dataset` for documents) as `options` say.
fn windows(
    stream: Arc<TokenStream>,
    dataset: Option<IndexedDataset>,
    options: &TokenOptions,
) -> Result<TokenSource> {
    let len = random_len(stream.name(), options)?;
    let (seq_len, seed, epoch) = (options.seq_len, options.seed, options.epoch);
    let chunked = chunk_rule(&stream, options)?.is_some();
    let budget = chunk_budget();
    Ok(match (options.sample, dataset) {
        (Sample::Random, _) => TokenSource::Random(Arc::new(
            SampledWindows::new(stream, seq_len, seed, epoch, len)?.grouped(
                options.batch_size,
                options.world_size,
                options.steps_per_batch.max(1),
            )?,
        )),
        (Sample::Sequential, _) => {
            let windows = TokenWindows::new(stream, seq_len, seq_len.max(1))?;
            let Some(chunks) = windows.stream().chunk_starts().filter(|_| chunked) else {
                return Ok(TokenSource::Sequential(Arc::new(windows)));
            };
            let counts = windows_per_chunk(chunks, seq_len.max(1), windows.num_records());
            let bytes = chunk_bytes(chunks, windows.stream().dtype().width());
            let order = ChunkOrder::new(seed, epoch, &counts, &bytes, budget).into_items();
            TokenSource::Sequential(Arc::new(windows.in_order(order)?))
        }
        (Sample::Documents, dataset) => {
            let name = stream.name().to_owned();
            let documents = match dataset {
                Some(ds) => Documents::Indexed(Arc::new(ds)),
                None => Documents::of_stream(stream).ok_or_else(|| not_indexed(&name))?,
            };
            TokenSource::Documents(Arc::new(match chunked {
                false => DocumentWindows::new(DocumentPlan::new(documents, seq_len, seed, epoch)?)?,
                true => chunked_documents(documents, options, budget)?,
            }))
        }
    })
}

/// The document windows of a table's column in the row-group-aware order of its rows, and
/// with [`TokenShuffle::Block`] the windows of each group shuffled among themselves.
fn chunked_documents(
    documents: Documents,
    options: &TokenOptions,
    budget: u64,
) -> Result<DocumentWindows> {
    let stream = Arc::clone(documents.tokens());
    let (Some(chunks), Some(rows)) = (stream.chunk_starts(), stream.document_starts()) else {
        return Err(not_indexed(stream.name()));
    };
    let counts = documents_per_chunk(chunks, rows);
    let bytes = chunk_bytes(chunks, stream.dtype().width());
    let order = ChunkOrder::new(options.seed, options.epoch, &counts, &bytes, budget);
    let plan = DocumentPlan::from_order(documents, options.seq_len, order.items().to_vec())?;
    if options.shuffle != TokenShuffle::Block {
        return DocumentWindows::new(plan);
    }
    // The first window that starts in each group's documents: those before it hold tokens of
    // earlier groups' documents (the window that runs from one group into the next counts in
    // the first).
    let (seq_len, windows) = (options.seq_len, plan.num_windows());
    let mut bounds = vec![0u64];
    let mut tokens = 0u64;
    for group in order.groups().windows(2) {
        tokens += order.items()[group[0]..group[1]]
            .iter()
            .map(|&d| plan.documents().document_len(d))
            .sum::<u64>();
        bounds.push(tokens.div_ceil(seq_len).min(windows));
    }
    let within = order.windows_within(&bounds);
    Ok(DocumentWindows::new(plan)?.in_order(within))
}

/// Bytes of decoded chunks a row-group-aware order takes at a time: half the chunk cache, so
/// that the group being read and the chunks decoded next fit in it together.
fn chunk_budget() -> u64 {
    crate::table::cache_limit() as u64 / 2
}

/// Which row-group-aware rule orders the windows that `options` pick of `stream`, if any: 1
/// for sequential windows, 2 for documents (their rows), 3 for documents with their windows
/// shuffled too. Errors for [`TokenShuffle::Block`] where there are no chunks, or for a
/// shuffle of random windows.
fn chunk_rule(stream: &TokenStream, options: &TokenOptions) -> Result<Option<u64>> {
    let chunks = stream.chunk_starts().is_some();
    Ok(match (options.sample, options.shuffle) {
        (Sample::Random, TokenShuffle::None) => None,
        (Sample::Random, shuffle) => {
            return Err(invalid(
                stream.name(),
                format!(
                    "shuffle {:?} applies to sequential or document windows; random windows \
                     are drawn at random already",
                    shuffle.name()
                ),
            ))
        }
        (_, TokenShuffle::Block) if !chunks => {
            return Err(invalid(
                stream.name(),
                "shuffle \"block\" orders a table's column by its row groups; token files \
                 take \"none\" or \"random\"",
            ))
        }
        (Sample::Sequential, TokenShuffle::Block) => Some(1),
        (Sample::Documents, TokenShuffle::None) if chunks => Some(2),
        (Sample::Documents, TokenShuffle::Block) => Some(3),
        _ => None,
    })
}

/// A hash of the rule that orders the windows `options` pick of `stream` beyond what the
/// seed and the epoch decide: `Some` for a table column's row-group-aware orders, covering the
/// rule, the chunks' sizes and the bytes taken at a time (all of which change the order), so
/// that a position saved under one is not resumed under another; `None` where the order is
/// not row-group aware.
pub fn order_fingerprint(stream: &TokenStream, options: &TokenOptions) -> Result<Option<u64>> {
    let Some(rule) = chunk_rule(stream, options)? else {
        return Ok(None);
    };
    let chunks = stream.chunk_starts().unwrap_or(&[]);
    let head = [rule, chunk_budget(), stream.dtype().width() as u64];
    Ok(Some(
        head.into_iter()
            .chain(chunks.iter().copied())
            .fold(0x6368_756e_6b73, hash2),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_an_unknown_one_lists_them_all() {
        for s in [Sample::Random, Sample::Sequential, Sample::Documents] {
            assert_eq!(s.name().parse::<Sample>(), Ok(s));
        }
        for s in [
            TokenShuffle::None,
            TokenShuffle::Random,
            TokenShuffle::Block,
        ] {
            assert_eq!(s.name().parse::<TokenShuffle>(), Ok(s));
        }
        assert_eq!(
            "shuffled".parse::<Sample>(),
            Err(
                r#"unknown sample "shuffled": expected "random", "sequential" or "documents""#
                    .to_owned()
            )
        );
        assert_eq!(
            "gpu".parse::<TokenShuffle>(),
            Err(r#"unknown shuffle "gpu": expected "none", "random" or "block""#.to_owned())
        );
    }
}
