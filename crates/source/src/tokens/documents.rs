//! Document-aware windows: whole documents in a shuffled order, concatenated and cut into
//! windows, with each window's document boundaries for document masking.

use std::sync::Arc;

use super::{invalid, IndexedDataset, TokenDType, TokenStream};
use crate::rng::{fisher_yates, hash2, SplitMix64};
use crate::{check_request, Layout, Result, Source};

/// Tags the key of document shuffles.
const TAG: u64 = 0x646f_6373; // "docs"

/// The documents `0 .. num_documents` in the shuffled order of `(seed, epoch)`: a
/// Fisher-Yates shuffle driven by SplitMix64 from a key of the seed and the epoch. A
/// [`DocumentPlan`]'s order is this with empty documents left out.
pub fn document_order(seed: u64, epoch: u64, num_documents: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..num_documents).collect();
    fisher_yates(
        &mut order,
        &mut SplitMix64::new(hash2(hash2(TAG, seed), epoch)),
    );
    order
}

/// The documents a [`DocumentPlan`] orders.
#[derive(Clone, Debug)]
pub enum Documents {
    /// A Megatron dataset's: each a run of sequences of its `.bin`.
    Indexed(Arc<IndexedDataset>),
    /// A stream's own ([`TokenStream::document_starts`]): a table's token or text column, one
    /// document a row, the documents back to back.
    Rows(Arc<TokenStream>),
}

impl From<Arc<IndexedDataset>> for Documents {
    fn from(dataset: Arc<IndexedDataset>) -> Documents {
        Documents::Indexed(dataset)
    }
}

impl Documents {
    /// The documents of `stream`, or `None` when it does not know them.
    pub fn of_stream(stream: Arc<TokenStream>) -> Option<Documents> {
        stream.document_starts()?;
        Some(Documents::Rows(stream))
    }

    /// What errors call them: the `.idx` file, or the table.
    pub fn name(&self) -> String {
        match self {
            Documents::Indexed(ds) => ds.idx_path().display().to_string(),
            Documents::Rows(stream) => stream.name().to_owned(),
        }
    }

    /// The tokens the documents are read from.
    pub fn tokens(&self) -> &Arc<TokenStream> {
        match self {
            Documents::Indexed(ds) => ds.tokens(),
            Documents::Rows(stream) => stream,
        }
    }

    /// The token dtype.
    pub fn dtype(&self) -> TokenDType {
        self.tokens().dtype()
    }

    /// Where each of a stream's documents starts, its tokens' end last.
    fn starts(stream: &TokenStream) -> &[u64] {
        // `Rows` is made only of a stream that knows its documents (`of_stream`).
        stream.document_starts().unwrap_or(&[0])
    }

    /// Documents, empty ones included.
    pub fn num_documents(&self) -> u64 {
        match self {
            Documents::Indexed(ds) => ds.num_documents(),
            Documents::Rows(stream) => Documents::starts(stream).len() as u64 - 1,
        }
    }

    /// Tokens in document `d`.
    ///
    /// # Panics
    /// If `d >= num_documents()`.
    pub fn document_len(&self, d: u64) -> u64 {
        match self {
            Documents::Indexed(ds) => ds.document_len(d),
            Documents::Rows(stream) => {
                let starts = Documents::starts(stream);
                starts[d as usize + 1] - starts[d as usize]
            }
        }
    }

    /// Reads tokens `offset ..` of document `d` into `dst`; out of the document is an error
    /// naming the `.idx` or the table.
    pub fn read_document(&self, d: u64, offset: u64, dst: &mut [u8]) -> Result<()> {
        let stream = match self {
            Documents::Indexed(ds) => return ds.read_document(d, offset, dst),
            Documents::Rows(stream) => stream,
        };
        let (len, end) = (
            (dst.len() / stream.dtype().width()) as u64,
            self.document_len(d),
        );
        if offset + len > end {
            return Err(invalid(
                self.name(),
                format!(
                    "tokens {offset} .. {} of document {d} asked for, past its {end} tokens",
                    offset + len
                ),
            ));
        }
        stream.read_tokens(Documents::starts(stream)[d as usize] + offset, dst)
    }
}

/// A run of one document's tokens inside a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The document (its index in the dataset).
    pub document: u64,
    /// The first token of the run, counted from the document's start.
    pub offset: u64,
    /// Tokens in the run; never zero.
    pub len: u64,
}

/// The [`Documents`] of a Megatron dataset or a table's column in the shuffled order of
/// `(seed, epoch)` ([`document_order`], or for a table's column by default its row-group-aware
/// [`ChunkOrder`](super::ChunkOrder)), concatenated into one virtual stream and cut into
/// windows of `seq_len + 1` tokens: window
/// `w` holds stream tokens `w * seq_len ..= (w + 1) * seq_len`, so consecutive windows share one
/// token, as Megatron's GPT dataset samples do, and there are `(T - 1) / seq_len` windows of
/// `T` tokens (the tail that fills no window is left out).
///
/// Memory: the order and where each document starts in the stream, 16 bytes a document; no
/// per-token table.
#[derive(Debug)]
pub struct DocumentPlan {
    documents: Documents,
    seq_len: u64,
    /// Document ids in stream order, empty documents left out.
    order: Vec<u64>,
    /// `starts[k]` is where `order[k]` starts in the stream; the last entry is the stream's
    /// length. Strictly increasing.
    starts: Vec<u64>,
    num_windows: u64,
}

impl DocumentPlan {
    /// The plan of `epoch` under `seed`; errors when the documents hold fewer than
    /// `seq_len + 1` tokens.
    pub fn new(
        documents: impl Into<Documents>,
        seq_len: u64,
        seed: u64,
        epoch: u64,
    ) -> Result<DocumentPlan> {
        let documents = documents.into();
        let order = document_order(seed, epoch, documents.num_documents());
        DocumentPlan::from_order(documents, seq_len, order)
    }

    /// The plan of the documents in `order` (a permutation of them, such as a
    /// [`ChunkOrder`](super::ChunkOrder)'s), empty ones left out.
    pub(crate) fn from_order(
        documents: Documents,
        seq_len: u64,
        mut order: Vec<u64>,
    ) -> Result<DocumentPlan> {
        let name = documents.name();
        debug_assert_eq!(order.len() as u64, documents.num_documents());
        if seq_len == 0 {
            return Err(invalid(name, "seq_len must be at least 1"));
        }
        order.retain(|&d| documents.document_len(d) > 0);
        let mut starts = Vec::with_capacity(order.len() + 1);
        let mut total = 0u64;
        for &d in &order {
            starts.push(total);
            total += documents.document_len(d);
        }
        starts.push(total);
        if total < seq_len + 1 {
            return Err(invalid(
                name,
                format!(
                    "a window of seq_len + 1 = {} tokens is longer than the {total} tokens of \
                     the documents",
                    seq_len + 1
                ),
            ));
        }
        Ok(DocumentPlan {
            num_windows: (total - 1) / seq_len,
            documents,
            seq_len,
            order,
            starts,
        })
    }

    /// The documents ordered.
    pub fn documents(&self) -> &Documents {
        &self.documents
    }

    /// Windows in the epoch.
    pub fn num_windows(&self) -> u64 {
        self.num_windows
    }

    /// Tokens a window holds as inputs: one less than it reads.
    pub fn seq_len(&self) -> u64 {
        self.seq_len
    }

    /// The documents in stream order (those with tokens).
    pub fn order(&self) -> &[u64] {
        &self.order
    }

    /// Where each document of [`DocumentPlan::order`] starts in the plan's stream, its length
    /// last.
    pub fn starts(&self) -> &[u64] {
        &self.starts
    }

    /// The runs of documents window `w` holds, in order; their lengths add up to
    /// `seq_len + 1`.
    ///
    /// # Panics
    /// If `w >= num_windows()`.
    pub fn segments(&self, w: u64) -> Vec<Segment> {
        assert!(w < self.num_windows, "window {w} of {}", self.num_windows);
        let (mut at, end) = (w * self.seq_len, (w + 1) * self.seq_len + 1);
        // The document holding token `at`: the last one starting at or before it.
        let mut k = self.starts.partition_point(|&s| s <= at) - 1;
        let mut out = Vec::new();
        while at < end {
            let len = self.starts[k + 1].min(end) - at;
            out.push(Segment {
                document: self.order[k],
                offset: at - self.starts[k],
                len,
            });
            at += len;
            k += 1;
        }
        out
    }

    /// The document of each of window `w`'s `seq_len + 1` tokens.
    pub fn document_ids(&self, w: u64) -> Vec<u64> {
        self.segments(w)
            .iter()
            .flat_map(|s| std::iter::repeat_n(s.document, s.len as usize))
            .collect()
    }

    /// Where each document run of window `w` starts, and `seq_len + 1` last: the cumulative
    /// sequence lengths that variable-length attention kernels take (`cu_seqlens`).
    pub fn cu_seqlens(&self, w: u64) -> Vec<u64> {
        let mut out = vec![0];
        for s in self.segments(w) {
            out.push(out[out.len() - 1] + s.len);
        }
        out
    }

    /// Reads window `w`'s tokens into `dst` (`(seq_len + 1) * width` bytes): one read per
    /// sequence its documents touch.
    pub fn read_window(&self, w: u64, dst: &mut [u8]) -> Result<()> {
        let width = self.documents.dtype().width();
        let mut done = 0;
        for s in self.segments(w) {
            let bytes = s.len as usize * width;
            self.documents
                .read_document(s.document, s.offset, &mut dst[done..done + bytes])?;
            done += bytes;
        }
        Ok(())
    }
}

/// The windows of a [`DocumentPlan`] as the records of a [`Source`]: record `w` is window `w`'s
/// `seq_len + 1` tokens at the dataset's width, followed by `seq_len + 1` little-endian uint16
/// segment ids, the ordinal of each token's document within the window (`0, 0, 0, 1, 1, 2,
/// ...`), so the ids travel with the tokens in the same slot and reach the device in the same
/// copy. The layout is bytes (`uint8`, `(seq_len + 1) × (width + 2)` of them): the consumer
/// views the two parts. Requires `seq_len + 1 <= 65535`.
///
/// `DocumentWindows::in_order` numbers the windows in another order (the windows of each
/// group of a table column's [`ChunkOrder`](super::ChunkOrder) shuffled among themselves):
/// record `v` is then window [`window_of(v)`](DocumentWindows::window_of) of the plan.
#[derive(Debug)]
pub struct DocumentWindows {
    plan: DocumentPlan,
    layout: Layout,
    name: String,
    /// The plan's window each record holds, when not its own: a permutation of the windows.
    order: Option<Vec<u64>>,
}

/// The largest window whose segment ordinals fit in uint16.
const MAX_WINDOW: u64 = u16::MAX as u64;

impl DocumentWindows {
    /// The windows of `plan`; errors when `seq_len + 1` is over 65535 (segment ids are uint16).
    pub fn new(plan: DocumentPlan) -> Result<DocumentWindows> {
        let name = plan.documents.name();
        let window = plan.seq_len + 1;
        if window > MAX_WINDOW {
            return Err(invalid(
                name,
                format!(
                    "document windows of seq_len + 1 = {window} tokens are too long: segment ids \
                     are uint16, so seq_len + 1 must be at most {MAX_WINDOW}"
                ),
            ));
        }
        let bytes = window * (plan.documents.dtype().width() as u64 + 2);
        let layout = Layout::new(super::TokenDType::U8.dtype(), vec![bytes])
            .map_err(|_| invalid(&name, format!("seq_len {} is too large", plan.seq_len)))?;
        Ok(DocumentWindows {
            plan,
            layout,
            name,
            order: None,
        })
    }

    /// The same windows, record `v` holding the plan's window `order[v]`; `order` must be a
    /// permutation of the windows.
    pub(crate) fn in_order(mut self, order: Vec<u64>) -> DocumentWindows {
        debug_assert_eq!(order.len() as u64, self.plan.num_windows);
        self.order = Some(order);
        self
    }

    /// The plan's window record `v` holds: `v` unless the windows were put in another order.
    pub fn window_of(&self, v: u64) -> u64 {
        self.order.as_ref().map_or(v, |order| order[v as usize])
    }

    /// The plan: segments, document ids and `cu_seqlens` of each window.
    pub fn plan(&self) -> &DocumentPlan {
        &self.plan
    }

    /// Bytes of a record's tokens; its segment ids follow them.
    pub fn token_bytes(&self) -> usize {
        (self.plan.seq_len as usize + 1) * self.plan.documents.dtype().width()
    }
}

impl Source for DocumentWindows {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.plan.num_windows
    }

    /// Counted off the segment ordinals the records carry, for windows of a text stream (whose
    /// steps are cut by the count) alone: a read of other documents costs nothing more.
    fn documents_in(&self, records: &[u8]) -> Option<u64> {
        self.plan.documents.tokens().boundaries()?;
        let (bytes, window) = (self.layout.record_bytes(), self.plan.seq_len as usize + 1);
        Some(super::starts::segmented(
            records,
            bytes,
            self.token_bytes(),
            window,
        ))
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        check_request(self, first, dst.len())?;
        let (bytes, tokens) = (self.layout.record_bytes(), self.token_bytes());
        for (k, record) in dst.chunks_exact_mut(bytes).enumerate() {
            let w = self.window_of(first + k as u64);
            let (window, ids) = record.split_at_mut(tokens);
            self.plan.read_window(w, window)?;
            let mut out = ids.chunks_exact_mut(2);
            for (ordinal, s) in self.plan.segments(w).iter().enumerate() {
                // At most `seq_len + 1 <= 65535` segments, checked in `new`.
                let id = (ordinal as u16).to_le_bytes();
                for slot in out.by_ref().take(s.len as usize) {
                    slot.copy_from_slice(&id);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::testing::{token_bytes, write_indexed};
    use crate::tokens::TokenDType;

    /// Document `d` holds `d + 1` tokens, every one equal to `100 * d + position`; document 3
    /// is empty and document 5 is split into two sequences.
    fn dataset(dir: &std::path::Path) -> Arc<IndexedDataset> {
        let docs: Vec<Vec<Vec<i64>>> = (0..8i64)
            .map(|d| {
                let toks: Vec<i64> = if d == 3 {
                    vec![]
                } else {
                    (0..=d).map(|p| 100 * d + p).collect()
                };
                if d == 5 {
                    vec![toks[..2].to_vec(), toks[2..].to_vec()]
                } else {
                    vec![toks]
                }
            })
            .collect();
        let prefix = dir.join("docs");
        write_indexed(&prefix, TokenDType::I32, &docs);
        Arc::new(IndexedDataset::open(&prefix).unwrap())
    }

    #[test]
    fn windows_are_the_shuffled_documents_cut_with_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dataset(dir.path());
        // Windows count their documents where the stream names its boundaries (text) alone.
        let windows =
            DocumentWindows::new(DocumentPlan::new(ds.clone(), 3, 5, 0).unwrap()).unwrap();
        let mut dst = vec![0u8; windows.layout().record_bytes()];
        windows.read_records(0, &mut dst).unwrap();
        assert_eq!(windows.documents_in(&dst), None);
        ds.tokens()
            .set_boundaries(super::super::Boundaries::default());
        for seq_len in [1u64, 3, 7, 30] {
            let plan = DocumentPlan::new(ds.clone(), seq_len, 5, 0).unwrap();
            // The stream by hand: the documents of the order, back to back.
            let mut order = plan.order().to_vec();
            let stream: Vec<(i64, u64)> = order
                .iter()
                .flat_map(|&d| (0..=d as i64).map(move |p| (100 * d as i64 + p, d)))
                .collect();
            assert_eq!(stream.len(), 36 - 4); // 1 + 2 + ... + 8, less empty document 3's 4
            assert_eq!(plan.num_windows(), (stream.len() as u64 - 1) / seq_len);
            let windows =
                DocumentWindows::new(DocumentPlan::new(ds.clone(), seq_len, 5, 0).unwrap())
                    .unwrap();
            for w in 0..plan.num_windows() {
                let part = &stream[(w * seq_len) as usize..((w + 1) * seq_len + 1) as usize];
                let tokens: Vec<i64> = part.iter().map(|t| t.0).collect();
                let mut dst = vec![0u8; windows.layout().record_bytes()];
                assert_eq!(dst.len(), (seq_len as usize + 1) * 6);
                windows.read_records(w, &mut dst).unwrap();
                let (got, segment_ids) = dst.split_at(windows.token_bytes());
                assert_eq!(got, token_bytes(TokenDType::I32, &tokens), "{seq_len} {w}");
                let ids: Vec<u64> = part.iter().map(|t| t.1).collect();
                // Segment ids: the ordinal of each token's document within the window.
                let mut ordinals = vec![0u16];
                for pair in ids.windows(2) {
                    let last = ordinals[ordinals.len() - 1];
                    ordinals.push(if pair[0] == pair[1] { last } else { last + 1 });
                }
                let want: Vec<u8> = ordinals.iter().flat_map(|o| o.to_le_bytes()).collect();
                assert_eq!(segment_ids, want, "{seq_len} {w}");
                // The documents the inputs (all but the last token) touch.
                let inputs = &ids[..seq_len as usize];
                let touched = 1 + inputs.windows(2).filter(|p| p[0] != p[1]).count() as u64;
                assert_eq!(windows.documents_in(&dst), Some(touched), "{seq_len} {w}");
                assert_eq!(plan.document_ids(w), ids);
                let cu = plan.cu_seqlens(w);
                assert_eq!((cu[0], *cu.last().unwrap()), (0, seq_len + 1));
                for pair in cu.windows(2) {
                    let run = &ids[pair[0] as usize..pair[1] as usize];
                    assert!(!run.is_empty() && run.iter().all(|&d| d == run[0]));
                }
            }
            order.sort_unstable();
            assert_eq!(order, vec![0, 1, 2, 4, 5, 6, 7]);
        }
    }

    #[test]
    fn order_is_pure_in_seed_and_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dataset(dir.path());
        let order = |seed, epoch| {
            DocumentPlan::new(ds.clone(), 4, seed, epoch)
                .unwrap()
                .order()
                .to_vec()
        };
        assert_eq!(order(1, 0), order(1, 0));
        assert_ne!(order(1, 0), order(1, 1));
        assert_ne!(order(1, 0), order(2, 0));
    }

    #[test]
    fn too_short_for_a_window() {
        let dir = tempfile::tempdir().unwrap();
        let ds = dataset(dir.path());
        DocumentPlan::new(ds.clone(), 31, 0, 0).unwrap();
        let e = DocumentPlan::new(ds, 32, 0, 0).unwrap_err().to_string();
        assert!(e.contains("docs.idx") && e.contains("33 tokens"), "{e}");
    }

    #[test]
    fn windows_longer_than_uint16_segment_ids_allow_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("long");
        write_indexed(&prefix, TokenDType::U16, &[vec![vec![7i64; 70_000]]]);
        let ds = Arc::new(IndexedDataset::open(&prefix).unwrap());
        DocumentWindows::new(DocumentPlan::new(ds.clone(), 65_534, 0, 0).unwrap()).unwrap();
        let plan = DocumentPlan::new(ds, 65_535, 0, 0).unwrap();
        let e = DocumentWindows::new(plan).unwrap_err().to_string();
        assert!(e.contains("long.idx") && e.contains("at most 65535"), "{e}");
        assert!(!e.contains('\n'));
    }
}
