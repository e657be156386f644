//! Flat token files, one or several, read as one stream of tokens.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use super::{invalid, Boundaries, TokenDType};
use crate::read::{open_regular, read_exact_at};
use crate::shards::{glob_match, is_pattern};
use crate::{npy, Result, SourceError};

/// One file's share of a stream: its tokens are tokens `first .. first + tokens` of the
/// stream.
#[derive(Debug)]
struct Piece {
    backing: Backing,
    path: PathBuf,
    first: u64,
    /// Never zero: empty files are refused at open.
    tokens: u64,
}

/// Where a piece's tokens are read from.
#[derive(Debug)]
enum Backing {
    /// A local file, its tokens at `data_offset ..`.
    File { file: File, data_offset: u64 },
    /// A source whose records are single tokens: objects in object storage
    /// ([`TokenStream::from_source`]).
    Records(Box<dyn crate::Source>),
}

/// The tokens of one or more files back to back: a raw token file (nanoGPT's `train.bin`), a
/// 1-D integer `.npy`, or a directory or glob pattern of such files in sorted name order.
///
/// Reads that cross from one file into the next are split between them.
#[derive(Debug)]
pub struct TokenStream {
    name: String,
    dtype: TokenDType,
    /// In stream order; `pieces[k + 1].first == pieces[k].first + pieces[k].tokens`.
    pieces: Vec<Piece>,
    num_tokens: u64,
    /// The [`TokenDType::code`] of the integer type the consumer converts tokens to, when some
    /// stored values would not fit it (0: nothing to check); see [`TokenStream::set_output`].
    output: AtomicU8,
    /// [`TokenStream::fingerprint`], once computed.
    fingerprint: OnceLock<u64>,
    /// Where each document starts, for a stream of documents back to back (a table's token or
    /// text column, one document a row): `documents[d] .. documents[d + 1]` are document `d`'s
    /// tokens; non-decreasing, from 0 to `num_tokens`. `None` for other streams.
    documents: Option<Vec<u64>>,
    /// Where each chunk decoded whole starts (a table's row groups: [`Source::chunk_lengths`]),
    /// the last entry `num_tokens`; non-decreasing. `None` for streams read token by token.
    ///
    /// [`Source::chunk_lengths`]: crate::Source::chunk_lengths
    chunks: Option<Vec<u64>>,
    /// The ids that open and close each document of tokenized text ([`TokenStream::set_boundaries`]).
    boundaries: OnceLock<Boundaries>,
}

impl TokenStream {
    /// Opens a file, a directory (its `*.bin` and `*.npy` files, hidden ones skipped) or a glob
    /// pattern such as `data/shard_*.bin`.
    ///
    /// `dtype` is required for raw files; a `.npy` file's header gives its own, which must
    /// agree with `dtype` when both are given. All files of a stream share one dtype.
    pub fn open(path: impl AsRef<Path>, dtype: Option<TokenDType>) -> Result<TokenStream> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path);
        let files = if meta.as_ref().is_ok_and(|m| m.is_dir()) {
            list(path, path, false, |name| {
                let lower = name.to_ascii_lowercase();
                !name.starts_with(b".") && (lower.ends_with(b".bin") || lower.ends_with(b".npy"))
            })?
        } else if meta.is_err() && is_pattern(path) {
            list_pattern(path)?
        } else {
            vec![path.to_path_buf()]
        };
        TokenStream::from_files(path.display().to_string(), &files, dtype)
    }

    /// The tokens of `files` in the order given; `name` is what errors call the stream.
    pub fn from_files(
        name: String,
        files: &[PathBuf],
        dtype: Option<TokenDType>,
    ) -> Result<TokenStream> {
        let mut pieces: Vec<Piece> = Vec::with_capacity(files.len());
        let mut dtype = dtype;
        let mut num_tokens = 0u64;
        for path in files {
            // The first `.npy` file fixes the dtype of any file after it.
            let (file, data_offset, found, tokens) = open_piece(path, dtype)?;
            dtype = found.or(dtype);
            pieces.push(Piece {
                backing: Backing::File { file, data_offset },
                path: path.clone(),
                first: num_tokens,
                tokens,
            });
            num_tokens = num_tokens
                .checked_add(tokens)
                .ok_or_else(|| invalid(&name, "more than 2^64 tokens"))?;
        }
        let dtype = match dtype {
            Some(d) if !pieces.is_empty() => d,
            _ => return Err(invalid(&name, "no token files (*.bin, *.npy) found")),
        };
        Ok(TokenStream {
            name,
            dtype,
            pieces,
            num_tokens,
            output: AtomicU8::new(0),
            fingerprint: OnceLock::new(),
            boundaries: OnceLock::new(),
            documents: None,
            chunks: None,
        })
    }

    /// The tokens of `source`, whose records must be single integers (a raw object opened with
    /// the token dtype as its layout, a 1-D integer `.npy`, a table's token or text column):
    /// how token data in object storage and tables become a stream. `dtype`, when given, must
    /// be the source's. Where the source knows its documents ([`Source::document_lengths`]),
    /// so does the stream ([`TokenStream::document_starts`]).
    ///
    /// [`Source::document_lengths`]: crate::Source::document_lengths
    pub fn from_source(
        source: Box<dyn crate::Source>,
        dtype: Option<TokenDType>,
    ) -> Result<TokenStream> {
        let name = source.name().to_owned();
        let layout = source.layout();
        if !layout.shape.is_empty() {
            return Err(invalid(
                &name,
                format!(
                    "a token file holds a 1-D array of tokens, not records of shape {:?}",
                    layout.shape
                ),
            ));
        }
        let found = TokenDType::from_dtype(&layout.dtype).map_err(|reason| SourceError::DType {
            path: None,
            descr: layout.dtype.to_string(),
            reason: format!("{name}: {reason}"),
        })?;
        if let Some(asked) = dtype.filter(|&d| d != found) {
            return Err(invalid(
                &name,
                format!("the data holds {found} tokens but {asked} was given"),
            ));
        }
        let tokens = source.num_records();
        let documents = match source.document_lengths() {
            Some(lengths) => Some(starts_of(&name, &lengths, tokens)?),
            None => None,
        };
        let chunks = match source.chunk_lengths() {
            Some(lengths) => Some(starts_of(&name, &lengths, tokens)?),
            None => None,
        };
        Ok(TokenStream {
            name: name.clone(),
            dtype: found,
            pieces: vec![Piece {
                backing: Backing::Records(source),
                path: PathBuf::from(name),
                first: 0,
                tokens,
            }],
            num_tokens: tokens,
            output: AtomicU8::new(0),
            fingerprint: OnceLock::new(),
            boundaries: OnceLock::new(),
            documents,
            chunks,
        })
    }

    /// What the stream's object-storage source fetched so far; `None` for local files.
    pub fn network(&self) -> Option<crate::NetworkStats> {
        self.pieces.iter().find_map(|p| match &p.backing {
            Backing::Records(source) => source.network(),
            Backing::File { .. } => None,
        })
    }

    /// What errors call the stream: the path or pattern as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The token dtype.
    pub fn dtype(&self) -> TokenDType {
        self.dtype
    }

    /// Tokens in the stream; never zero.
    pub fn num_tokens(&self) -> u64 {
        self.num_tokens
    }

    /// Where each document starts, for a stream of documents back to back (a table's token or
    /// text column opened with [`DOCUMENTS`](crate::table::DOCUMENTS), one document a row):
    /// document `d` is tokens `starts[d] .. starts[d + 1]`, the last entry `num_tokens`.
    /// `None` for a stream that does not know its documents.
    pub fn document_starts(&self) -> Option<&[u64]> {
        self.documents.as_deref()
    }

    /// Where each chunk that a read decodes whole starts (a table's row groups, record batches
    /// or JSON-lines files), the last entry `num_tokens`: chunk `c` is tokens
    /// `starts[c] .. starts[c + 1]`. `None` for a stream whose tokens cost the same read in any
    /// order (token files, object storage).
    pub fn chunk_starts(&self) -> Option<&[u64]> {
        self.chunks.as_deref()
    }

    /// Chunks (see [`TokenStream::chunk_starts`]) decoded by reads so far; `None` for a stream
    /// without chunks.
    pub fn chunk_decodes(&self) -> Option<u64> {
        self.pieces.iter().find_map(|p| match &p.backing {
            Backing::Records(source) => source.chunk_decodes(),
            Backing::File { .. } => None,
        })
    }

    /// The files, in stream order, with the number of tokens each holds.
    pub fn files(&self) -> impl Iterator<Item = (&Path, u64)> {
        self.pieces.iter().map(|p| (p.path.as_path(), p.tokens))
    }

    /// Makes every later read check that its tokens fit `out`, the integer type the consumer
    /// converts them to (`TokenLoader`'s output dtype), where this stream's dtype holds values
    /// `out` cannot (uint32 tokens as int32, uint64 as int64): a token of 2^31 would come out
    /// as -2^31. A read holding one fails naming the file, the token's offset in it and its
    /// value. Where every stored value fits, nothing is checked.
    pub fn set_output(&self, out: TokenDType) {
        let code = if self.dtype.fits_in(out) {
            0
        } else {
            out.code()
        };
        self.output.store(code, Ordering::Relaxed);
    }

    /// Says which ids open and close each document (text tokenized with `bos`/`eos` tokens), so
    /// that windows cut from the stream count the documents they pack
    /// ([`Source::documents_in`](crate::Source::documents_in)); the first call holds.
    pub fn set_boundaries(&self, boundaries: Boundaries) {
        let _ = self.boundaries.set(boundaries);
    }

    /// The ids that open and close each document, where [`TokenStream::set_boundaries`] said.
    pub fn boundaries(&self) -> Option<Boundaries> {
        self.boundaries.get().copied()
    }

    /// The documents packed into `records`, windows of `window` of this stream's tokens back to
    /// back ([`Boundaries::documents`]); `None` where no boundaries were set.
    pub fn documents_in(&self, records: &[u8], window: usize) -> Option<u64> {
        Some(self.boundaries()?.documents(self.dtype, records, window))
    }

    /// The output type reads check their tokens against (see [`TokenStream::set_output`]).
    fn output(&self) -> Option<TokenDType> {
        TokenDType::from_code(self.output.load(Ordering::Relaxed))
    }

    /// Fails when a token of `bytes`, the tokens from token `first` of file `path`, does not fit
    /// `out`.
    fn check_output(&self, out: TokenDType, path: &Path, first: u64, bytes: &[u8]) -> Result<()> {
        let Some((i, value)) = self.dtype.first_outside(bytes, out) else {
            return Ok(());
        };
        let (lo, hi) = out.range();
        let side = if value > hi { "more" } else { "less" };
        let bits = 8 * out.width() as u32;
        // Two's complement keeps the low bits: what the conversion on the device gives.
        let wrapped = ((value - lo).rem_euclid(hi - lo + 1)) + lo;
        let fix = if TokenDType::I64.range().0 <= value && value <= TokenDType::I64.range().1 {
            "read them as int64 (TokenLoader(dtype=\"int64\"))".to_string()
        } else {
            format!(
                "no output type holds it: {} tokens must lie in int64's range",
                self.dtype
            )
        };
        Err(invalid(
            crate::escape_path(path),
            format!(
                "token {} is {value}, {side} than {out} holds (it would come out as {wrapped}, \
                 {bits} bits); {fix}",
                first + i as u64
            ),
        ))
    }

    /// A hash of the stream's dtype, its number of tokens and up to `FINGERPRINT_WINDOWS`
    /// windows of `FINGERPRINT_TOKENS` tokens spread evenly over it (all of it when it is no
    /// longer): the same for a copy of the data anywhere, under any name or split into other
    /// files, and different for other data of the same size, so that a saved position is not
    /// resumed on other tokens; a stream that knows its documents hashes where each starts too.
    /// Computed once a stream (one read of every window together).
    pub fn fingerprint(&self) -> Result<u64> {
        if let Some(&f) = self.fingerprint.get() {
            return Ok(f);
        }
        let width = self.dtype.width();
        let per = FINGERPRINT_TOKENS.min(self.num_tokens);
        let count = self.num_tokens.div_ceil(per).min(FINGERPRINT_WINDOWS);
        let span = self.num_tokens - per;
        let starts: Vec<u64> = (0..count)
            .map(|k| match count {
                1 => 0,
                _ => (u128::from(span) * u128::from(k) / u128::from(count - 1)) as u64,
            })
            .collect();
        let mut tokens = vec![0u8; starts.len() * per as usize * width];
        self.read_windows_checked(&starts, &mut tokens, false)?;
        let head = [self.dtype.code().into(), self.num_tokens];
        // Documents cut the same tokens otherwise: another order, other windows.
        let documents = self.documents.as_deref().unwrap_or_default();
        let f = head
            .into_iter()
            .chain(documents.iter().copied())
            .chain(tokens.chunks(8).map(|c| {
                let mut word = [0u8; 8];
                word[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(word)
            }))
            .fold(0x746f_6b65_6e73_6670, crate::rng::hash2);
        Ok(*self.fingerprint.get_or_init(|| f))
    }

    /// Reads `dst.len() / width` tokens from token `first` into `dst`: one positioned read per
    /// file the range touches.
    pub fn read_tokens(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        self.read_tokens_checked(first, dst, true)
    }

    /// [`TokenStream::read_tokens`], checking the tokens against the output type or not.
    fn read_tokens_checked(&self, first: u64, dst: &mut [u8], check: bool) -> Result<()> {
        self.check_range(first, dst.len())?;
        let out = self.output().filter(|_| check);
        let width = self.dtype.width();
        // The last piece starting at or before `first`.
        let mut k = self.pieces.partition_point(|p| p.first <= first) - 1;
        let (mut at, mut done) = (first, 0usize);
        while done < dst.len() {
            let p = &self.pieces[k];
            let within = at - p.first;
            let n = (p.tokens - within).min(((dst.len() - done) / width) as u64) as usize;
            let part = &mut dst[done..done + n * width];
            match &p.backing {
                Backing::File { file, data_offset } => {
                    read_exact_at(file, &p.path, data_offset + within * width as u64, part)?
                }
                Backing::Records(source) => source.read_records(within, part)?,
            }
            if let Some(out) = out {
                self.check_output(out, &p.path, within, part)?;
            }
            done += n * width;
            at += n as u64;
            k += 1;
        }
        Ok(())
    }
}

/// Where each document (or chunk) of `lengths` starts, and their total last, checked to be
/// `tokens`.
fn starts_of(name: &str, lengths: &[u64], tokens: u64) -> Result<Vec<u64>> {
    let mut starts = Vec::with_capacity(lengths.len() + 1);
    let mut total = 0u64;
    for &len in lengths {
        starts.push(total);
        total = total.saturating_add(len);
    }
    if total != tokens {
        return Err(invalid(
            name,
            format!("its documents hold {total} tokens, its records {tokens}"),
        ));
    }
    starts.push(total);
    Ok(starts)
}

impl TokenStream {
    /// Reads `starts.len()` windows of equal length, window `k` from token `starts[k]` into
    /// the `k`-th of as many equal chunks of `dst`. Local files read a window at a time; token
    /// data in object storage is handed over as gathers of many windows, so that their ranged
    /// GETs are in flight together (up to the queue depth, neighbours coalesced) rather than
    /// one round trip after another.
    pub fn read_windows(&self, starts: &[u64], dst: &mut [u8]) -> Result<()> {
        self.read_windows_checked(starts, dst, true)
    }

    /// [`TokenStream::read_windows`] to chosen places: windows of `window` bytes, each
    /// `(first token, place)` of `windows` into bytes `place × window ..` of `dst`, the places
    /// strictly increasing and inside `dst` ([`SourceError::Destination`] otherwise); places
    /// not named are left as they are. A mixture's source reads its windows of a batch, spread
    /// among the other sources', this way.
    pub fn read_windows_at(
        &self,
        windows: &[(u64, usize)],
        window: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let increasing = windows.windows(2).all(|w| w[0].1 < w[1].1);
        let inside = windows
            .last()
            .is_none_or(|&(_, place)| (place + 1).saturating_mul(window) <= dst.len());
        if !increasing || !inside {
            return Err(SourceError::Destination {
                name: self.name.clone(),
                len: dst.len(),
                expected: format!(
                    "windows of {window} bytes at places strictly increasing inside it (found {} \
                     windows for places {:?} .. {:?})",
                    windows.len(),
                    windows.first().map(|w| w.1),
                    windows.last().map(|w| w.1)
                ),
            });
        }
        self.read_placed(windows, window, dst, true)
    }

    /// [`TokenStream::read_windows`], checking the tokens against the output type or not.
    fn read_windows_checked(&self, starts: &[u64], dst: &mut [u8], check: bool) -> Result<()> {
        let Some(window) = dst.len().checked_div(starts.len()) else {
            return Ok(()); // no windows
        };
        if window * starts.len() != dst.len() {
            return Err(SourceError::Destination {
                name: self.name.clone(),
                len: dst.len(),
                expected: format!("{} windows of equal length", starts.len()),
            });
        }
        let placed: Vec<(u64, usize)> = starts.iter().copied().zip(0..).collect();
        self.read_placed(&placed, window, dst, check)
    }

    /// Reads each `(first token, place)` of `windows` into bytes `place × window ..` of `dst`
    /// (checked by the callers to lie inside it, in increasing places).
    fn read_placed(
        &self,
        windows: &[(u64, usize)],
        window: usize,
        dst: &mut [u8],
        check: bool,
    ) -> Result<()> {
        if window == 0 {
            return Ok(());
        }
        let [Piece {
            backing: Backing::Records(source),
            ..
        }] = self.pieces.as_slice()
        else {
            for &(first, place) in windows {
                let w = &mut dst[place * window..(place + 1) * window];
                self.read_tokens_checked(first, w, check)?;
            }
            return Ok(());
        };
        let out = self.output().filter(|_| check);
        let path = &self.pieces[0].path;
        for &(first, _) in windows {
            self.check_range(first, window)?;
        }
        // A gather names every token (16 bytes each): windows go in groups of at most
        // GATHER_TOKENS tokens, still far more requests than a queue depth.
        let tokens = (window / self.dtype.width()).max(1);
        let per_gather = (GATHER_TOKENS / tokens).max(1);
        let mut records: Vec<(u64, usize)> =
            Vec::with_capacity(per_gather.min(windows.len()) * tokens);
        for group in windows.chunks(per_gather) {
            records.clear();
            for &(first, place) in group {
                records.extend((0..tokens).map(|t| (first + t as u64, place * tokens + t)));
            }
            source.gather_at(&records, dst)?;
            if let Some(out) = out {
                for &(first, place) in group {
                    let w = &dst[place * window..(place + 1) * window];
                    self.check_output(out, path, first, w)?;
                }
            }
        }
        Ok(())
    }

    /// Checks that `bytes` of tokens from token `first` are whole tokens inside the stream.
    fn check_range(&self, first: u64, bytes: usize) -> Result<()> {
        let width = self.dtype.width();
        let count = (bytes / width) as u64;
        if bytes % width != 0 || first.checked_add(count).is_none_or(|e| e > self.num_tokens) {
            return Err(SourceError::OutOfRange {
                name: self.name.clone(),
                first,
                count,
                num_records: self.num_tokens,
            });
        }
        Ok(())
    }
}

/// Windows [`TokenStream::fingerprint`] reads at most, and tokens in each.
const FINGERPRINT_WINDOWS: u64 = 16;
const FINGERPRINT_TOKENS: u64 = 256;

/// Tokens one gather of [`TokenStream::read_windows`] names at most.
const GATHER_TOKENS: usize = 64 << 10;

/// Opens one token file: the file, where its tokens start, the dtype its `.npy` header names
/// (`None` for a raw file) and its token count.
fn open_piece(
    path: &Path,
    dtype: Option<TokenDType>,
) -> Result<(File, u64, Option<TokenDType>, u64)> {
    let (file, size) = open_regular(path)?;
    let mut magic = [0u8; 6];
    let n = size.min(6) as usize;
    read_exact_at(&file, path, 0, &mut magic[..n])?;
    let is_npy = npy::has_magic(&magic[..n]) || path.extension().is_some_and(|e| e == "npy");
    let (data_offset, found, data) = if is_npy {
        let npy = npy::NpyFile::open(path)?;
        let header = npy.header();
        if header.shape.len() != 1 {
            return Err(SourceError::Shape {
                path: path.to_path_buf(),
                shape: header.shape.clone(),
                descr: header.descr.to_string(),
                reason: "a token file holds a 1-D array of tokens",
            });
        }
        let found = TokenDType::from_dtype(&header.descr).map_err(|reason| SourceError::DType {
            path: Some(path.to_path_buf()),
            descr: header.descr.to_string(),
            reason,
        })?;
        if let Some(asked) = dtype.filter(|&d| d != found) {
            return Err(invalid(
                path.display(),
                format!("the .npy header says {found} tokens but the stream holds {asked}"),
            ));
        }
        (header.data_offset, found, header.data_bytes())
    } else {
        let Some(d) = dtype else {
            return Err(SourceError::TokenDtypeMissing {
                path: path.to_path_buf(),
            });
        };
        (0, d, size)
    };
    let width = found.width() as u64;
    if data % width != 0 {
        return Err(SourceError::RecordSize {
            name: path.display().to_string(),
            size: data,
            record_bytes: width as usize,
            trailing: data % width,
        });
    }
    if data == 0 {
        return Err(SourceError::Empty {
            name: path.display().to_string(),
        });
    }
    Ok((file, data_offset, is_npy.then_some(found), data / width))
}

/// Regular files in `dir` whose names `keep` accepts, sorted by name, by the record shards'
/// rule ([`crate::shards::list`]: an entry named like a token file that is not one is refused,
/// a directory too unless a pattern matched it); `name` is what errors call the dataset.
fn list(
    name: &Path,
    dir: &Path,
    dirs_too: bool,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<Vec<PathBuf>> {
    let files = crate::shards::list(dir, dirs_too, keep)?;
    if files.is_empty() {
        return Err(invalid(
            name.display(),
            "no token files (*.bin, *.npy) found",
        ));
    }
    Ok(files)
}

/// The files a pattern's last component matches, in its directory.
fn list_pattern(path: &Path) -> Result<Vec<PathBuf>> {
    let (dir, Some(pattern)) = (path.parent().unwrap_or(Path::new("")), path.file_name()) else {
        return Err(invalid(
            path.display(),
            "expected a file, directory or pattern",
        ));
    };
    if is_pattern(dir) {
        return Err(invalid(
            path.display(),
            "wildcards are supported in the file name only, not in directories",
        ));
    }
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let pattern = OsStr::as_bytes(pattern);
    list(path, dir, true, |name| {
        (pattern.starts_with(b".") || !name.starts_with(b".")) && glob_match(pattern, name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    use crate::tokens::testing::{gathered_stream, u16_bytes, write_npy};

    #[test]
    fn raw_file_reads_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("train.bin");
        std::fs::write(&p, u16_bytes(0..50)).unwrap();
        let s = TokenStream::open(&p, Some(TokenDType::U16)).unwrap();
        assert_eq!((s.num_tokens(), s.dtype()), (50, TokenDType::U16));
        let mut dst = vec![0u8; 10];
        s.read_tokens(45, &mut dst).unwrap();
        assert_eq!(dst, u16_bytes(45..50));
        assert!(s.read_tokens(46, &mut dst).is_err());
        // As uint32 the same 100 bytes are 25 tokens.
        let s = TokenStream::open(&p, Some(TokenDType::U32)).unwrap();
        assert_eq!(s.num_tokens(), 25);
    }

    #[test]
    fn directory_is_one_stream_across_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.bin"), u16_bytes(3..7)).unwrap();
        std::fs::write(dir.path().join("a.bin"), u16_bytes(0..3)).unwrap();
        write_npy(&dir.path().join("c.npy"), "<u2", &u16_bytes(7..20), &[13]);
        std::fs::write(dir.path().join("meta.pkl"), b"ignored").unwrap();
        let s = TokenStream::open(dir.path(), Some(TokenDType::U16)).unwrap();
        assert_eq!(s.num_tokens(), 20);
        let names: Vec<_> = s
            .files()
            .map(|(p, n)| (p.file_name().unwrap().to_owned(), n))
            .collect();
        assert_eq!(names.len(), 3);
        assert_eq!(names[0].1, 3);
        // Every range, crossing both boundaries.
        for first in 0..20u64 {
            for count in 0..=(20 - first) {
                let mut dst = vec![0u8; 2 * count as usize];
                s.read_tokens(first, &mut dst).unwrap();
                assert_eq!(dst, u16_bytes(first..first + count), "{first} {count}");
            }
        }
        let pattern = dir.path().join("[ab].bin");
        let s = TokenStream::open(&pattern, Some(TokenDType::U16)).unwrap();
        assert_eq!(s.num_tokens(), 7);
    }

    /// A token directory lists its files by the record shards' rule: an entry named like a
    /// token file that is not a regular file is refused by name, not skipped (streaming the
    /// other files alone would silently drop its tokens).
    #[test]
    fn an_entry_named_like_a_token_file_that_is_not_a_file_is_refused_by_name() {
        type Plant = fn(&Path);
        let mkfifo: Plant = |p| {
            let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        };
        let cases: [(&str, Plant, &str); 3] = [
            (
                "broken.bin",
                |p| std::os::unix::fs::symlink("missing.bin", p).unwrap(),
                "No such file",
            ),
            ("fifo.bin", mkfifo, "not a regular file"),
            (
                "sub.npy",
                |p| std::fs::create_dir(p).unwrap(),
                "a directory named like a shard",
            ),
        ];
        for (name, plant, says) in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("a.bin"), u16_bytes(0..8)).unwrap();
            plant(&dir.path().join(name));
            let e = TokenStream::open(dir.path(), Some(TokenDType::U16)).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(name) && msg.contains(says), "{name}: {msg}");
            assert!(!msg.contains('\n'), "{name}: one line: {msg}");
        }
    }

    #[test]
    fn npy_gives_its_dtype_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.npy");
        write_npy(&p, "<u4", &[1, 0, 0, 0, 2, 0, 0, 0], &[2]);
        let s = TokenStream::open(&p, None).unwrap();
        assert_eq!((s.dtype(), s.num_tokens()), (TokenDType::U32, 2));
        let e = TokenStream::open(&p, Some(TokenDType::U16)).unwrap_err();
        assert!(
            e.to_string().contains("t.npy: the .npy header says uint32"),
            "{e}"
        );

        write_npy(&p, "<u2", &u16_bytes(0..6), &[2, 3]);
        let e = TokenStream::open(&p, None).unwrap_err().to_string();
        assert!(e.contains("t.npy") && e.contains("1-D"), "{e}");
        write_npy(&p, "<f4", &[0; 8], &[2]);
        let e = TokenStream::open(&p, None).unwrap_err().to_string();
        assert!(e.contains("t.npy") && e.contains("integers"), "{e}");
    }

    #[test]
    fn bad_files_are_one_line_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("odd.bin");
        std::fs::write(&p, [0u8; 7]).unwrap();
        let e = TokenStream::open(&p, Some(TokenDType::U16))
            .unwrap_err()
            .to_string();
        assert!(e.contains("odd.bin") && e.contains("not a multiple"), "{e}");
        let e = TokenStream::open(&p, None).unwrap_err().to_string();
        assert!(e.contains("odd.bin") && e.contains("dtype"), "{e}");
        let e = TokenStream::open(dir.path().join("*.none"), Some(TokenDType::U16))
            .unwrap_err()
            .to_string();
        assert!(e.contains("*.none") && e.contains("no token files"), "{e}");
        std::fs::write(dir.path().join("empty.bin"), []).unwrap();
        let e = TokenStream::open(dir.path().join("empty.bin"), Some(TokenDType::U16))
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty.bin") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn windows_of_a_source_are_read_in_few_gathers_byte_exact() {
        let (s, gathers) = gathered_stream(60_000);
        // 2100 windows of 65 tokens: 1008 to a gather of at most 64 Ki tokens, so 3 gathers.
        let starts: Vec<u64> = (0..2100u64).map(|k| (k * 7919) % (60_000 - 65)).collect();
        let mut dst = vec![0u8; starts.len() * 130];
        s.read_windows(&starts, &mut dst).unwrap();
        for (k, got) in dst.chunks_exact(130).enumerate() {
            assert_eq!(got, u16_bytes(starts[k]..starts[k] + 65), "window {k}");
        }
        assert_eq!(gathers.load(Ordering::Relaxed), 3);
        s.read_windows(&[], &mut []).unwrap();
        let e = s.read_windows(&[0, 59_990], &mut dst[..260]).unwrap_err();
        assert!(matches!(e, SourceError::OutOfRange { .. }), "{e}");
        assert!(e.to_string().starts_with("s3://bucket/train.bin"), "{e}");
        let e = s.read_windows(&[0, 1], &mut dst[..259]).unwrap_err();
        assert!(matches!(e, SourceError::Destination { .. }), "{e}");
        // To chosen places, in as few gathers; the places not named are left alone.
        let placed: Vec<(u64, usize)> = starts.iter().copied().zip((0..).step_by(2)).collect();
        let mut spread = vec![7u8; 2 * starts.len() * 130];
        s.read_windows_at(&placed, 130, &mut spread).unwrap();
        for (k, got) in spread.chunks_exact(130).enumerate() {
            match k % 2 {
                0 => assert_eq!(got, u16_bytes(starts[k / 2]..starts[k / 2] + 65), "{k}"),
                _ => assert!(got.iter().all(|&b| b == 7), "{k}"),
            }
        }
        assert_eq!(gathers.load(Ordering::Relaxed), 6);
        let e = s
            .read_windows_at(&[(0, 1), (5, 1)], 130, &mut spread)
            .unwrap_err();
        assert!(matches!(e, SourceError::Destination { .. }), "{e}");
        let e = s
            .read_windows_at(&[(0, 2)], 130, &mut spread[..389])
            .unwrap_err();
        assert!(matches!(e, SourceError::Destination { .. }), "{e}");
    }

    #[test]
    fn the_fingerprint_is_the_tokens_not_the_files() {
        let (dir, three) = crate::tokens::testing::three_files();
        let one = dir.path().join("one.raw");
        std::fs::write(&one, u16_bytes(0..40)).unwrap();
        let one = TokenStream::open(&one, Some(TokenDType::U16)).unwrap();
        assert_eq!(three.fingerprint().unwrap(), one.fingerprint().unwrap());
        let mut other = u16_bytes(0..40);
        other[79] ^= 1; // the last token, of the same size
        let path = dir.path().join("other.raw");
        std::fs::write(&path, other).unwrap();
        let other = TokenStream::open(&path, Some(TokenDType::U16)).unwrap();
        assert_ne!(one.fingerprint().unwrap(), other.fingerprint().unwrap());
        // Larger data is sampled: 16 windows, over object storage as over files.
        let (remote, _) = gathered_stream(100_000);
        let path = dir.path().join("big.raw");
        std::fs::write(&path, u16_bytes(0..100_000)).unwrap();
        let local = TokenStream::open(&path, Some(TokenDType::U16)).unwrap();
        assert_eq!(remote.fingerprint().unwrap(), local.fingerprint().unwrap());
    }

    #[test]
    fn reads_check_their_tokens_against_the_output_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wide.bin");
        let mut tokens: Vec<u32> = (0..100).collect();
        tokens[61] = 1 << 31;
        std::fs::write(
            &path,
            tokens
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .unwrap();
        let s = TokenStream::open(&path, Some(TokenDType::U32)).unwrap();
        let mut dst = vec![0u8; 4 * 10];
        s.set_output(TokenDType::I32);
        s.read_tokens(50, &mut dst[..4 * 10]).unwrap(); // tokens 50 .. 60 fit
        let e = s.read_tokens(55, &mut dst).unwrap_err().to_string();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        assert!(e.contains("token 61 is 2147483648"), "{e}");
        assert!(e.contains("-2147483648") && e.contains("int64"), "{e}");
        let e = s.read_windows(&[0, 58], &mut [0u8; 2 * 4 * 5]).unwrap_err();
        assert!(e.to_string().contains("token 61"), "{e}");
        s.set_output(TokenDType::I64);
        s.read_tokens(55, &mut dst).unwrap();
        // The fingerprint reads the data as it is.
        s.set_output(TokenDType::I32);
        s.fingerprint().unwrap();
    }
}
