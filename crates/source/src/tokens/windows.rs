//! Windows of `seq_len + 1` tokens as the records of a [`Source`].

use std::sync::Arc;

use super::{invalid, TokenStream};
use crate::{check_gather_len, check_request, for_each_run, Layout, Result, Source, SourceError};

/// The windows of a token stream as fixed-size records: record `i` is the `seq_len + 1`
/// tokens from token `i * stride`, at the stream's width, so a batch of `B` records is the
/// `(B, seq_len + 1)` array whose `[:, :-1]` and `[:, 1:]` are a language model's inputs and
/// targets.
///
/// With `stride = 1` every offset is a window (nanoGPT's random sampling draws among
/// `num_tokens - seq_len` of them); with `stride = seq_len` windows follow each other, sharing
/// one token. [`read_records`](Source::read_records) of overlapping windows reads the span they
/// cover once and spreads it in place; a gather of scattered windows reads each once.
///
/// [`TokenWindows::in_order`] numbers the windows in another order (a table column's
/// row-group-aware shuffle, [`ChunkOrder`](super::ChunkOrder)): record `v` is then window
/// [`window_of(v)`](TokenWindows::window_of).
#[derive(Debug)]
pub struct TokenWindows {
    stream: Arc<TokenStream>,
    layout: Layout,
    /// Tokens in a window: `seq_len + 1`.
    window: u64,
    /// At least 1.
    stride: u64,
    /// `(num_tokens - window) / stride + 1`: every window lies inside the stream.
    num_windows: u64,
    /// The window each record holds, when not its own: a permutation of `0 .. num_windows`.
    order: Option<Vec<u64>>,
}

impl TokenWindows {
    /// Windows of `seq_len + 1` tokens every `stride` tokens of `stream`; errors when one
    /// window is longer than the stream, or `seq_len` or `stride` is 0.
    pub fn new(stream: Arc<TokenStream>, seq_len: u64, stride: u64) -> Result<TokenWindows> {
        let name = stream.name().to_owned();
        if seq_len == 0 || stride == 0 {
            return Err(invalid(
                name,
                format!("seq_len and stride must be at least 1 (got {seq_len} and {stride})"),
            ));
        }
        let window = seq_len + 1;
        if window > stream.num_tokens() {
            return Err(invalid(
                name,
                format!(
                    "a window of seq_len + 1 = {window} tokens is longer than the {} tokens \
                     of the data",
                    stream.num_tokens()
                ),
            ));
        }
        let layout = Layout::new(stream.dtype().dtype(), vec![window])
            .map_err(|_| invalid(&name, format!("seq_len {seq_len} is too large")))?;
        Ok(TokenWindows {
            num_windows: (stream.num_tokens() - window) / stride + 1,
            stream,
            layout,
            window,
            stride,
            order: None,
        })
    }

    /// The same windows, record `v` holding window `order[v]`; `order` must be a permutation
    /// of the windows (checked).
    pub fn in_order(mut self, order: Vec<u64>) -> Result<TokenWindows> {
        let mut seen = vec![false; order.len()];
        let is_permutation = order.len() as u64 == self.num_windows
            && order.iter().all(|&w| {
                (w as usize) < seen.len() && !std::mem::replace(&mut seen[w as usize], true)
            });
        if !is_permutation {
            return Err(invalid(
                self.stream.name(),
                format!(
                    "an order of {} windows that is not a permutation of the {}",
                    order.len(),
                    self.num_windows
                ),
            ));
        }
        self.order = Some(order);
        Ok(self)
    }

    /// The window record `v` holds: `v` unless [`TokenWindows::in_order`] set another order.
    pub fn window_of(&self, v: u64) -> u64 {
        self.order.as_ref().map_or(v, |order| order[v as usize])
    }

    /// The stream the windows are cut from.
    pub fn stream(&self) -> &Arc<TokenStream> {
        &self.stream
    }

    /// Tokens between the starts of consecutive windows.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Tokens a window holds as inputs: one less than it reads.
    pub fn seq_len(&self) -> u64 {
        self.window - 1
    }
}

impl TokenWindows {
    /// Reads windows `first .. first + count`, checked to lie inside the stream, into `dst`.
    fn read_span(&self, first: u64, count: u64, dst: &mut [u8]) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let width = self.stream.dtype().width() as u64;
        let start = first * self.stride;
        if self.stride >= self.window {
            // Windows that do not overlap: one read each, or one for all when they touch.
            if self.stride == self.window {
                return self.stream.read_tokens(start, dst);
            }
            let bytes = (self.window * width) as usize;
            for (k, w) in dst.chunks_exact_mut(bytes).enumerate() {
                self.stream.read_tokens(start + k as u64 * self.stride, w)?;
            }
            return Ok(());
        }
        // Overlapping windows: read the span they cover into the end of `dst`, then move each
        // window to its place, first to last. Window k's source, at byte
        // `(count - 1 - k) * (window - stride) * width` past its place, is never behind it, and
        // each move writes only up to the place of window k + 1, which is at or before where
        // window k + 1's source starts; so no window's source is overwritten before it moves.
        let span = ((count - 1) * self.stride + self.window) * width;
        let tail = dst.len() - span as usize;
        self.stream.read_tokens(start, &mut dst[tail..])?;
        let (window_bytes, stride_bytes) = (
            (self.window * width) as usize,
            (self.stride * width) as usize,
        );
        for k in 0..count as usize {
            let from = tail + k * stride_bytes;
            dst.copy_within(from..from + window_bytes, k * window_bytes);
        }
        Ok(())
    }

    /// Reads `windows` (each below `num_windows`) into `dst` in that order: from object storage
    /// all together ([`TokenStream::read_windows`]), otherwise a span for each run of
    /// consecutive windows.
    fn read_windows(&self, windows: &[u64], dst: &mut [u8]) -> Result<()> {
        if self.stream.network().is_none() {
            let bytes = self.layout.record_bytes();
            return for_each_run(windows.iter().copied().zip(0..), |first, place, count| {
                let part = &mut dst[place * bytes..(place + count) * bytes];
                self.read_span(first, count as u64, part)
            });
        }
        let starts: Vec<u64> = windows.iter().map(|&w| w * self.stride).collect();
        self.stream.read_windows(&starts, dst)
    }
}

impl Source for TokenWindows {
    fn name(&self) -> &str {
        self.stream.name()
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn num_records(&self) -> u64 {
        self.num_windows
    }

    fn documents_in(&self, records: &[u8]) -> Option<u64> {
        self.stream.documents_in(records, self.window as usize)
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        let count = check_request(self, first, dst.len())?;
        match &self.order {
            None => self.read_span(first, count, dst),
            Some(order) => self.read_windows(&order[first as usize..(first + count) as usize], dst),
        }
    }

    /// Scattered windows of token data in object storage are fetched together
    /// ([`TokenStream::read_windows`]); a local file's runs of consecutive windows are read as
    /// one span each, as any source's gather.
    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        check_gather_len(self, indices.len(), dst.len())?;
        let windows = indices
            .iter()
            .map(|&v| match v < self.num_windows {
                true => Ok(self.window_of(v)),
                false => Err(SourceError::OutOfRange {
                    name: self.name().to_owned(),
                    first: v,
                    count: 1,
                    num_records: self.num_windows,
                }),
            })
            .collect::<Result<Vec<u64>>>()?;
        self.read_windows(&windows, dst)
    }

    fn reader_description(&self) -> String {
        match self.stream.network() {
            Some(_) => "object store (ranged GETs)".into(),
            None => "pread".into(),
        }
    }
    fn network(&self) -> Option<crate::NetworkStats> {
        self.stream.network()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::testing::{gathered_stream, three_files, u16_bytes};

    /// The expected bytes of windows `first .. first + count`, by slicing.
    fn expected(seq_len: u64, stride: u64, first: u64, count: u64) -> Vec<u8> {
        (first..first + count)
            .flat_map(|i| u16_bytes(i * stride..i * stride + seq_len + 1))
            .collect()
    }

    #[test]
    fn windows_match_slicing_for_every_stride_and_range() {
        let (_dir, s) = three_files();
        for seq_len in [1u64, 4, 9, 39] {
            for stride in [1u64, 2, 3, seq_len, seq_len + 1, seq_len + 3] {
                let w = TokenWindows::new(s.clone(), seq_len, stride).unwrap();
                let n = w.num_records();
                assert_eq!(n, (40 - seq_len - 1) / stride + 1);
                assert_eq!(w.layout().record_bytes(), 2 * (seq_len as usize + 1));
                for first in 0..n {
                    for count in 0..=(n - first).min(6) {
                        let mut dst = vec![0xaau8; count as usize * w.layout().record_bytes()];
                        w.read_records(first, &mut dst).unwrap();
                        assert_eq!(
                            dst,
                            expected(seq_len, stride, first, count),
                            "{seq_len} {stride} {first} {count}"
                        );
                    }
                }
                let mut one = vec![0u8; w.layout().record_bytes()];
                assert!(w.read_records(n, &mut one).is_err());
            }
        }
    }

    #[test]
    fn windows_in_another_order_are_read_in_it() {
        let (_dir, s) = three_files();
        let w = TokenWindows::new(s.clone(), 4, 4)
            .unwrap()
            .in_order(vec![8, 0, 3, 4, 1, 2, 7, 5, 6]);
        let w = w.unwrap();
        let order = [8u64, 0, 3, 4, 1, 2, 7, 5, 6];
        let mut dst = vec![0u8; 9 * 10];
        w.read_records(0, &mut dst).unwrap();
        let want: Vec<u8> = order.iter().flat_map(|&v| expected(4, 4, v, 1)).collect();
        assert_eq!(dst, want);
        let mut two = vec![0u8; 2 * 10];
        w.gather(&[6, 2], &mut two).unwrap();
        assert_eq!(two, [expected(4, 4, 7, 1), expected(4, 4, 3, 1)].concat());
        assert!(w.gather(&[9], &mut two[..10]).is_err());
        for bad in [vec![0u64; 9], vec![0, 1, 2], (1..10).collect()] {
            let e = TokenWindows::new(s.clone(), 4, 4)
                .unwrap()
                .in_order(bad)
                .unwrap_err();
            assert!(e.to_string().contains("not a permutation"), "{e}");
        }
    }

    #[test]
    fn gathers_of_scattered_windows_match_slicing() {
        let (_dir, s) = three_files();
        let w = TokenWindows::new(s, 8, 1).unwrap();
        assert_eq!(w.num_records(), 32);
        let idx = [31u64, 0, 5, 6, 7, 20, 20, 3];
        let mut dst = vec![0u8; idx.len() * 18];
        w.gather(&idx, &mut dst).unwrap();
        let want: Vec<u8> = idx.iter().flat_map(|&i| u16_bytes(i..i + 9)).collect();
        assert_eq!(dst, want);
    }

    #[test]
    fn windows_longer_than_the_data_are_refused_naming_the_file() {
        let (dir, s) = three_files();
        TokenWindows::new(s.clone(), 39, 1).unwrap();
        let e = TokenWindows::new(s.clone(), 40, 1).unwrap_err().to_string();
        assert!(e.starts_with(&dir.path().display().to_string()), "{e}");
        assert!(e.contains("41 tokens is longer than the 40 tokens"), "{e}");
        assert!(TokenWindows::new(s.clone(), 0, 1).is_err());
        assert!(TokenWindows::new(s, 4, 0).is_err());
    }

    #[test]
    fn shuffled_windows_of_token_data_in_object_storage_are_one_gather() {
        let (s, gathers) = gathered_stream(10_000);
        let windows = TokenWindows::new(Arc::new(s), 64, 64).unwrap();
        let picked = [150u64, 3, 4, 77, 0, 155];
        let mut dst = vec![0u8; picked.len() * 130];
        windows.gather(&picked, &mut dst).unwrap();
        for (k, got) in dst.chunks_exact(130).enumerate() {
            let first = picked[k] * 64;
            assert_eq!(got, u16_bytes(first..first + 65), "window {}", picked[k]);
        }
        assert_eq!(gathers.load(std::sync::atomic::Ordering::Relaxed), 1);
        let e = windows.gather(&[0, 156], &mut dst[..260]).unwrap_err();
        assert!(
            matches!(e, SourceError::OutOfRange { first: 156, .. }),
            "{e}"
        );
    }
}
