//! Text records (`*.pftxt`): one record per line, its elements as whitespace-separated decimal
//! numbers. The dtype and record shape come from the format options `dtype` and `shape`, or
//! from a first line `# dtype=<u2 shape=2,3` (options win). Blank lines are skipped. The file
//! is parsed whole at open into memory: the format is for small fixtures and hand-made data.

use std::io::Read;

use crate::dtype::{parse_user_dtype, ScalarKind};
use crate::host::HostBuffer;
use crate::{escape_path, DType, Layout, Result, Source, SourceError};

/// The text records format; options `dtype` (pinfeed's dtype syntax) and `shape` (`2,3`).
#[derive(Debug)]
pub(crate) struct Text;

impl super::Format for Text {
    fn name(&self) -> &'static str {
        "text"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["pftxt"]
    }

    fn option_keys(&self) -> &'static [&'static str] {
        &["dtype", "shape"]
    }

    fn open(&self, open: super::OpenFile<'_>) -> Result<Box<dyn Source>> {
        let name = escape_path(open.path);
        let bad = |line: usize, what: String| SourceError::Options {
            reason: format!("{name}:{line}: {what}"),
        };
        let mut text = String::new();
        (&open.file)
            .read_to_string(&mut text)
            .map_err(|e| bad(0, format!("not UTF-8 text or unreadable: {e}")))?;
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).peekable();
        let header = |key: &str| open.options.format.get(key).map(str::to_owned);
        let (mut dtype, mut shape) = (header("dtype"), header("shape"));
        if let Some((_, first)) = lines.next_if(|(_, l)| l.starts_with('#')) {
            for word in first.trim_start_matches('#').split_whitespace() {
                match word.split_once('=') {
                    Some(("dtype", v)) => _ = dtype.get_or_insert(v.to_owned()),
                    Some(("shape", v)) => _ = shape.get_or_insert(v.to_owned()),
                    _ => {
                        return Err(bad(
                            1,
                            format!("header word {word:?}: expected dtype=D or shape=N,M"),
                        ))
                    }
                }
            }
        }
        let layout =
            layout(dtype.as_deref(), shape.as_deref(), open.layout).map_err(|why| bad(1, why))?;
        let per_record: usize = layout.shape.iter().product::<u64>() as usize;
        let mut data = Vec::new();
        for (n, line) in lines.filter(|(_, l)| !l.trim().is_empty()) {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() != per_record {
                let found = words.len();
                return Err(bad(
                    n,
                    format!("expected {per_record} numbers, found {found}"),
                ));
            }
            for word in words {
                encode(&layout.dtype, word, &mut data).map_err(|why| bad(n, why))?;
            }
        }
        if data.is_empty() {
            return Err(SourceError::Empty { name });
        }
        Ok(Box::new(TextRecords {
            name,
            records: HostBuffer::from_vec(data, layout)?,
        }))
    }
}

/// The layout from the dtype and shape given, else the user's layout.
fn layout(
    dtype: Option<&str>,
    shape: Option<&str>,
    given: Option<&Layout>,
) -> std::result::Result<Layout, String> {
    let Some(dtype) = dtype else {
        return given
            .cloned()
            .ok_or_else(|| "no dtype: give dtype= in the header line or the options".to_owned());
    };
    let (dtype, sub) = parse_user_dtype(dtype).map_err(|e| e.to_string())?;
    let mut dims: Vec<u64> = match shape {
        None | Some("") => Vec::new(),
        Some(s) => s
            .split(',')
            .map(|d| {
                d.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("shape {s:?}: expected N,M,..."))
            })
            .collect::<std::result::Result<_, _>>()?,
    };
    dims.extend(sub);
    if !dtype.is_simple() {
        return Err(format!("dtype {dtype}: expected a number type"));
    }
    Layout::new(dtype, dims).map_err(|e| e.to_string())
}

/// Appends `word` as one element of `dtype`, in the dtype's byte order.
fn encode(dtype: &DType, word: &str, out: &mut Vec<u8>) -> std::result::Result<(), String> {
    let size = dtype.itemsize;
    let big = dtype.descr.starts_with('>');
    let wrong = || format!("{word:?} is not a {} number", dtype.descr);
    let mut bytes: Vec<u8> = match dtype.scalar_kind() {
        Some(ScalarKind::Int) => {
            let v: i64 = word.parse().map_err(|_| wrong())?;
            let fits =
                size == 8 || (v >= -(1i64 << (size * 8 - 1)) && v < (1i64 << (size * 8 - 1)));
            if !fits {
                return Err(format!("{v} does not fit in {}", dtype.descr));
            }
            v.to_le_bytes()[..size].to_vec()
        }
        Some(ScalarKind::UInt | ScalarKind::Bool) => {
            let v: u64 = word.parse().map_err(|_| wrong())?;
            if size < 8 && v >> (size * 8) != 0 {
                return Err(format!("{v} does not fit in {}", dtype.descr));
            }
            v.to_le_bytes()[..size].to_vec()
        }
        Some(ScalarKind::Float) if size == 4 => {
            let v: f32 = word.parse().map_err(|_| wrong())?;
            v.to_le_bytes().to_vec()
        }
        Some(ScalarKind::Float) if size == 8 => {
            let v: f64 = word.parse().map_err(|_| wrong())?;
            v.to_le_bytes().to_vec()
        }
        _ => {
            return Err(format!(
                "dtype {}: expected an integer, f4 or f8",
                dtype.descr
            ))
        }
    };
    if big {
        bytes.reverse();
    }
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Parsed records in memory, named by their file.
#[derive(Debug)]
struct TextRecords {
    name: String,
    records: HostBuffer,
}

impl Source for TextRecords {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> &Layout {
        self.records.layout()
    }

    fn num_records(&self) -> u64 {
        self.records.num_records()
    }

    fn read_records(&self, first: u64, dst: &mut [u8]) -> Result<()> {
        self.records.read_records(first, dst)
    }

    fn gather(&self, indices: &[u64], dst: &mut [u8]) -> Result<()> {
        self.records.gather(indices, dst)
    }
}
