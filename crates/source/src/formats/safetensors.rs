//! `.safetensors` files: one named tensor whose first dimension counts the records.
//!
//! A `.safetensors` file is an 8-byte little-endian header length N, N bytes of JSON
//! (`{"name": {"dtype": "F32", "shape": [100, 3], "data_offsets": [begin, end]}, ...,
//! "__metadata__": {...}}`), then the tensors' bytes, little-endian and C order; a tensor's bytes
//! lie at `8 + N + begin .. 8 + N + end`.
//!
//! Dtypes map to numpy descrs: `U8` `|u1`, `I8` `|i1`, `U16` `<u2`, `I16` `<i2`, `U32` `<u4`,
//! `I32` `<i4`, `U64` `<u8`, `I64` `<i8`, `F16` `<f2`, `F32` `<f4`, `F64` `<f8`, `BOOL` `|b1`,
//! `C64` `<c8`. numpy has no bfloat16 or 8-bit floats, so `BF16` becomes `|V2` and `F8_E4M3`,
//! `F8_E5M2` become `|V1`: opaque elements of the right size, streamed byte for byte, which the
//! consumer reinterprets (for torch, `tensor.view(torch.bfloat16)`). Refusing them would make the
//! most common format of model weights and embeddings unusable.

use std::fs::File;
use std::path::Path;

use crate::dtype::DType;
use crate::read::{open_regular, read_exact_at};
use crate::records::{delegate_source_to_records, FileRecords};
use crate::ReadOptions;
use crate::{Layout, Result, SourceError};

/// Headers longer than this are refused before anything is allocated for them (the
/// `safetensors` library's own limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The numpy descr for a safetensors dtype name.
fn descr(dtype: &str) -> Option<&'static str> {
    Some(match dtype {
        "BOOL" => "'|b1'",
        "U8" => "'|u1'",
        "I8" => "'|i1'",
        "U16" => "'<u2'",
        "I16" => "'<i2'",
        "U32" => "'<u4'",
        "I32" => "'<i4'",
        "U64" => "'<u8'",
        "I64" => "'<i8'",
        "F16" => "'<f2'",
        "BF16" => "'|V2'",
        "F8_E4M3" | "F8_E5M2" => "'|V1'",
        "F32" => "'<f4'",
        "F64" => "'<f8'",
        "C64" => "'<c8'",
        _ => return None,
    })
}

/// The bits in one element of every dtype the `safetensors` library knows, readable here or not:
/// a header naming any other dtype is refused, as the library refuses it.
fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" | "F8_E4M3FNUZ"
        | "F8_E5M2FNUZ" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "C64" | "F64" | "I64" | "U64" => 64,
        _ => return None,
    })
}

/// The key holding the file's free-form string metadata rather than a tensor.
const METADATA: &str = "__metadata__";

/// A malformed-header error at `offset` of `path`.
fn bad(path: &Path, offset: u64, reason: String) -> SourceError {
    SourceError::Safetensors {
        path: path.to_path_buf(),
        offset,
        reason,
    }
}

/// One tensor's entry in a header.
#[derive(Debug)]
struct Entry {
    name: String,
    /// A dtype name the `safetensors` library knows (`"BF16"`), not necessarily one read here.
    dtype: String,
    shape: Vec<u64>,
    /// Byte range of the tensor in the data after the header: `begin <= end`.
    begin: u64,
    end: u64,
}

/// A header checked as the `safetensors` library checks it before it reads any tensor: known
/// dtypes, string metadata, and tensors that tile the data exactly (the first starts at 0, each
/// starts where the one before ends, sizes match shapes, the last ends at the end of the file).
/// A file the library refuses is refused here too, so that what pinfeed streams is what every
/// other reader of the file would see.
#[derive(Debug)]
struct Header {
    /// Bytes of JSON after the 8-byte length.
    len: u64,
    /// In data order.
    tensors: Vec<Entry>,
}

impl Header {
    fn read(file: &File, path: &Path, size: u64) -> Result<Header> {
        let (len, entries) = read_json(file, path, size)?;
        let mut tensors = Vec::with_capacity(entries.len());
        for (name, value) in entries {
            if name == METADATA {
                check_metadata(path, &value)?;
            } else {
                tensors.push(Entry::parse(path, name, &value)?);
            }
        }
        tensors.sort_by_key(|t| (t.begin, t.end));
        check_tiling(path, &tensors)?;
        let covered = tensors.last().map_or(0, |t| t.end);
        let data_offset = 8 + len;
        let found = size - data_offset;
        if covered != found {
            return Err(SourceError::DataSize {
                path: path.to_path_buf(),
                data_offset,
                expected: covered,
                found,
            });
        }
        Ok(Header { len, tensors })
    }

    /// The tensor named `wanted`, or the only one when `None`.
    fn select(&self, path: &Path, wanted: Option<&str>) -> Result<&Entry> {
        let found = match wanted {
            Some(w) => self.tensors.iter().find(|t| t.name == w),
            None if self.tensors.len() == 1 => self.tensors.first(),
            None => None,
        };
        found.ok_or_else(|| {
            let mut available: Vec<String> = self.tensors.iter().map(|t| t.name.clone()).collect();
            available.sort();
            SourceError::Tensor {
                path: path.to_path_buf(),
                wanted: wanted.map(str::to_owned),
                available,
            }
        })
    }
}

/// Reads the length and the JSON object after it.
fn read_json(
    file: &File,
    path: &Path,
    size: u64,
) -> Result<(u64, serde_json::Map<String, serde_json::Value>)> {
    if size < 8 {
        return Err(bad(
            path,
            0,
            format!("expected an 8-byte header length, found a file of {size} bytes"),
        ));
    }
    let mut len = [0u8; 8];
    read_exact_at(file, path, 0, &mut len)?;
    let header_len = u64::from_le_bytes(len);
    if header_len > MAX_HEADER_LEN {
        return Err(bad(
            path,
            0,
            format!(
                "expected a header length of at most {MAX_HEADER_LEN} bytes, found {header_len}"
            ),
        ));
    }
    if 8 + header_len > size {
        return Err(bad(
            path,
            0,
            format!("the header length {header_len} runs past the end of the file ({size} bytes)"),
        ));
    }
    let mut text = vec![0u8; header_len as usize];
    read_exact_at(file, path, 8, &mut text)?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        bad(
            path,
            8,
            format!(
                "expected JSON, found an error at line {} column {}: {e}",
                e.line(),
                e.column()
            ),
        )
    })?;
    let serde_json::Value::Object(entries) = json else {
        return Err(bad(path, 8, "expected a JSON object".into()));
    };
    Ok((header_len, entries))
}

/// `__metadata__` is absent, `null`, or maps strings to strings.
fn check_metadata(path: &Path, value: &serde_json::Value) -> Result<()> {
    let reason = match value {
        serde_json::Value::Null => return Ok(()),
        serde_json::Value::Object(map) => match map.iter().find(|(_, v)| !v.is_string()) {
            None => return Ok(()),
            Some((k, v)) => format!("the value of {k:?} is {v}, not a string"),
        },
        other => format!("found {other}"),
    };
    Err(bad(
        path,
        8,
        format!("expected {METADATA} to map strings to strings: {reason}"),
    ))
}

impl Entry {
    fn parse(path: &Path, name: String, value: &serde_json::Value) -> Result<Entry> {
        let fail = |what: String| bad(path, 8, format!("tensor {name:?}: {what}"));
        if !value.is_object() {
            return Err(fail(format!(
                "expected an object with dtype, shape and data_offsets, found {value}"
            )));
        }
        let field = |key: &str| {
            value
                .get(key)
                .ok_or_else(|| fail(format!("expected the key {key:?}, found {value}")))
        };
        let dtype = field("dtype")?
            .as_str()
            .ok_or_else(|| fail("expected a dtype string".into()))?
            .to_owned();
        if dtype_bits(&dtype).is_none() {
            return Err(SourceError::DType {
                path: Some(path.to_path_buf()),
                descr: dtype,
                reason: format!("tensor {name:?}: not a dtype of the safetensors format"),
            });
        }
        let numbers = |key: &str| -> Result<Vec<u64>> {
            let list = field(key)?.as_array();
            let list = list.ok_or_else(|| fail(format!("expected {key} to be a list")))?;
            list.iter()
                .map(|v| match (v.as_u64(), v.as_i64()) {
                    (Some(n), _) => Ok(n),
                    (None, Some(n)) if key == "shape" => Err(fail(format!(
                        "negative dimension {n} in shape {}",
                        field(key)?
                    ))),
                    _ => Err(fail(format!(
                        "expected {key} to be a list of non-negative integers, found {v}"
                    ))),
                })
                .collect()
        };
        let shape = numbers("shape")?;
        let offsets = numbers("data_offsets")?;
        let &[begin, end] = offsets.as_slice() else {
            return Err(fail(format!(
                "expected data_offsets [begin, end], found {offsets:?}"
            )));
        };
        Ok(Entry {
            name,
            dtype,
            shape,
            begin,
            end,
        })
    }

    /// Bytes that the shape and dtype call for; `None` when the count overflows 64 bits or
    /// sub-byte elements do not fill whole bytes.
    fn expected_bytes(&self) -> Option<u64> {
        let elements = self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        let bits = elements.checked_mul(dtype_bits(&self.dtype)?)?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

/// Tensors sorted by offsets tile the data from byte 0 without gaps or overlaps, each as long
/// as its shape and dtype say.
fn check_tiling(path: &Path, tensors: &[Entry]) -> Result<()> {
    let mut start = 0;
    for t in tensors {
        let (name, begin, end) = (&t.name, t.begin, t.end);
        let wrong = if end < begin {
            Some(format!(
                "data_offsets [{begin}, {end}] end before they begin"
            ))
        } else if begin > start && start == 0 {
            Some(format!(
                "the first tensor's data must start at offset 0, found data_offsets [{begin}, {end}]"
            ))
        } else if begin > start {
            Some(format!(
                "data_offsets [{begin}, {end}] leave a gap of {} bytes after the previous tensor, \
                 which ends at {start}",
                begin - start
            ))
        } else if begin < start {
            Some(format!(
                "data_offsets [{begin}, {end}] overlap the previous tensor, which ends at {start}"
            ))
        } else {
            None
        };
        if let Some(wrong) = wrong {
            return Err(bad(path, 8, format!("tensor {name:?}: {wrong}")));
        }
        if t.expected_bytes() != Some(end - begin) {
            let expected = t.expected_bytes().map_or_else(
                || "a whole number of bytes that fits in 64 bits".to_owned(),
                |n| format!("{n} bytes"),
            );
            return Err(bad(
                path,
                8,
                format!(
                    "tensor {name:?} of dtype {} and shape {:?}: expected data_offsets {expected} \
                     apart, found [{begin}, {end}]",
                    t.dtype, t.shape
                ),
            ));
        }
        start = end;
    }
    Ok(())
}

/// One tensor of a `.safetensors` file read as records.
#[derive(Debug)]
pub struct SafetensorsFile {
    /// The tensor's first dimension (not zero) of records, from `8 + header length + begin`
    /// (the data is inside the file, checked at open).
    records: FileRecords,
    tensor: String,
    /// The safetensors dtype name (`"BF16"`).
    dtype_name: String,
}

impl SafetensorsFile {
    /// Opens `path` and finds the tensor named by the format option `tensor` (or the only one), to be read as
    /// `options` ask.
    pub fn open(path: impl AsRef<Path>, options: &ReadOptions) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        let (file, size) = open_regular(path)?;
        SafetensorsFile::from_file(file, path, size, options)
    }

    pub(crate) fn from_file(
        file: File,
        path: &Path,
        size: u64,
        options: &ReadOptions,
    ) -> Result<SafetensorsFile> {
        options.check()?;
        let header = Header::read(&file, path, size)?;
        let entry = header.select(path, options.format.get(TENSOR))?;
        let Some(descr) = descr(&entry.dtype) else {
            return Err(SourceError::DType {
                path: Some(path.to_path_buf()),
                descr: entry.dtype.clone(),
                reason: "not a safetensors dtype this reader knows: expected BOOL, U8, I8, U16, \
                         I16, U32, I32, U64, I64, F16, BF16, F8_E4M3, F8_E5M2, F32, F64 or C64"
                    .into(),
            });
        };
        let dtype = DType::from_descr_literal(descr).map_err(|e| e.with_path(path))?;
        let Some((&records, record_shape)) = entry.shape.split_first() else {
            return Err(SourceError::Shape {
                path: path.to_path_buf(),
                shape: entry.shape.clone(),
                descr: entry.dtype.clone(),
                reason:
                    "a 0-d (scalar) tensor holds no records; its first dimension must count them",
            });
        };
        let layout = Layout::new(dtype, record_shape.to_vec()).map_err(|e| e.with_path(path))?;
        if records == 0 {
            return Err(SourceError::Empty {
                name: crate::escape_path(path),
            });
        }
        // The header check proved that the tensor's bytes lie inside the file.
        let data_offset = 8 + header.len + entry.begin;
        let mut records = FileRecords::new(file, path, layout, records, data_offset);
        records.set_reader(options)?;
        Ok(SafetensorsFile {
            records,
            tensor: entry.name.clone(),
            dtype_name: entry.dtype.clone(),
        })
    }

    /// The tensor read as records.
    pub fn tensor(&self) -> &str {
        &self.tensor
    }

    /// Its safetensors dtype name (`"BF16"`), which the layout's numpy descr may not say.
    pub fn safetensors_dtype(&self) -> &str {
        &self.dtype_name
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.records.path
    }
}

delegate_source_to_records!(SafetensorsFile);

/// The format option naming the tensor whose first dimension counts the records.
pub const TENSOR: &str = "tensor";

/// The `.safetensors` format, by extension; option `tensor=NAME` picks the tensor (`None`
/// takes the file's only tensor; an error lists the names when there are several).
#[derive(Debug)]
pub struct Safetensors;

impl super::Format for Safetensors {
    fn name(&self) -> &'static str {
        "safetensors"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["safetensors"]
    }

    fn option_keys(&self) -> &'static [&'static str] {
        &[TENSOR]
    }

    fn open(&self, open: super::OpenFile<'_>) -> Result<Box<dyn crate::Source>> {
        let file = SafetensorsFile::from_file(open.file, open.path, open.size, open.options)?;
        Ok(Box::new(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Source;

    /// A safetensors file as the library writes it: header padded with spaces to 8 bytes.
    fn file_with(header: &str, data: &[u8]) -> Vec<u8> {
        let mut h = header.as_bytes().to_vec();
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out
    }

    fn open(bytes: &[u8], tensor: Option<&str>) -> Result<SafetensorsFile> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.safetensors");
        std::fs::write(&p, bytes).unwrap();
        let options = ReadOptions {
            format: tensor
                .map(|t| crate::FormatOptions::new().with("tensor", t))
                .unwrap_or_default(),
            ..ReadOptions::default()
        };
        SafetensorsFile::open(&p, &options)
    }

    #[test]
    fn reads_one_tensor_of_several() {
        let data: Vec<u8> = (0..64).collect();
        let bytes = file_with(
            r#"{"__metadata__":{"a":"b"},"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"y":{"dtype":"BF16","shape":[5,3,2],"data_offsets":[4,64]}}"#,
            &data,
        );
        let y = open(&bytes, Some("y")).unwrap();
        assert_eq!((y.num_records(), y.layout().record_bytes()), (5, 12));
        assert_eq!(y.layout().dtype.descr, "'|V2'");
        assert_eq!((y.tensor(), y.safetensors_dtype()), ("y", "BF16"));
        let mut two = [0u8; 24];
        y.read_records(3, &mut two).unwrap();
        assert_eq!(two.to_vec(), (40..64).collect::<Vec<u8>>());
        let e = open(&bytes, None).unwrap_err().to_string();
        assert!(
            e.contains("several tensors") && e.contains("\"x\", \"y\""),
            "{e}"
        );
        let e = open(&bytes, Some("z")).unwrap_err().to_string();
        assert!(
            e.contains("no tensor named \"z\"") && e.contains("\"x\", \"y\""),
            "{e}"
        );
    }

    #[test]
    fn malformed_headers() {
        let err = |b: &[u8]| open(b, None).unwrap_err().to_string();
        assert!(err(b"abc").contains("8-byte header length"));
        assert!(err(&u64::MAX.to_le_bytes()).contains("at most"));
        assert!(err(&file_with("{\"x\"", b"")).contains("expected JSON"));
        // (header, data bytes, what the message names)
        let cases: [(&str, usize, &str); 7] = [
            (
                r#"{"x":{"dtype":"F32","shape":[3,2],"data_offsets":[0,20]}}"#,
                24,
                "24 bytes apart, found [0, 20]",
            ),
            (
                r#"{"x":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}}"#,
                20,
                "truncated",
            ),
            (
                r#"{"x":{"dtype":"F4","shape":[3],"data_offsets":[0,3]}}"#,
                3,
                "dtype F4",
            ),
            (
                r#"{"x":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}"#,
                1,
                "0-d",
            ),
            (
                r#"{"x":{"dtype":"U8","shape":[0, 4],"data_offsets":[0,0]}}"#,
                0,
                "empty",
            ),
            (r#"{"x":{"dtype":"U8","shape":[2]}}"#, 2, "\"data_offsets\""),
            (r#"{"__metadata__":{}}"#, 0, "no tensors"),
        ];
        for (header, len, wanted) in cases {
            let e = err(&file_with(header, &vec![0; len]));
            assert!(e.contains(wanted), "{header}: {e}");
        }
    }

    /// Files that `safetensors.safe_open` (0.8) refuses, each with the reason it gives in a
    /// comment; pinfeed refuses them too, naming the file and the fault.
    #[test]
    fn refuses_what_the_safetensors_library_refuses() {
        let err = |header: &str, data: &[u8]| {
            let e = open(&file_with(header, data), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("t.safetensors"), "{e}");
            assert!(!e.contains('\n'), "{e}");
            e
        };
        let x = r#""x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}"#;
        // "invalid offset for tensor `y`"
        let e = err(
            &format!(r#"{{{x},"y":{{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}}}"#),
            &[0; 6],
        );
        assert!(
            e.contains(
                "tensor \"y\": data_offsets [2, 6] overlap the previous tensor, which ends at 4"
            ),
            "{e}"
        );
        // "invalid offset for tensor `x`"
        let e = err(
            r#"{"x":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
            &[0; 6],
        );
        assert!(
            e.contains("first tensor's data must start at offset 0"),
            "{e}"
        );
        // "invalid offset for tensor `y`"
        let e = err(
            &format!(r#"{{{x},"y":{{"dtype":"U8","shape":[2],"data_offsets":[6,8]}}}}"#),
            &[0; 8],
        );
        assert!(
            e.contains("gap of 2 bytes after the previous tensor"),
            "{e}"
        );
        // "incomplete metadata, file not fully covered"
        let e = err(&format!("{{{x}}}"), &[0; 5]);
        assert!(
            e.contains("promises 4 bytes") && e.contains("extra bytes"),
            "{e}"
        );
        // "invalid type: integer `1`, expected a string"
        let e = err(
            &format!(r#"{{"__metadata__":{{"a":"b","n":1}},{x}}}"#),
            &[0; 4],
        );
        assert!(
            e.contains("__metadata__ to map strings to strings: the value of \"n\" is 1"),
            "{e}"
        );
        // "invalid type: string \"a\", expected a map"
        let e = err(&format!(r#"{{"__metadata__":"a",{x}}}"#), &[0; 4]);
        assert!(e.contains("__metadata__ to map strings to strings"), "{e}");
        // "unknown variant `Q9`", even for a tensor not read
        let e = err(
            &format!(r#"{{{x},"y":{{"dtype":"Q9","shape":[0],"data_offsets":[4,4]}}}}"#),
            &[0; 4],
        );
        assert!(
            e.contains("dtype Q9") && e.contains("not a dtype of the safetensors"),
            "{e}"
        );
        // "invalid shape, data type, or offset for tensor", even for a tensor not read
        let e = err(
            &format!(r#"{{{x},"y":{{"dtype":"U8","shape":[3],"data_offsets":[4,6]}}}}"#),
            &[0; 6],
        );
        assert!(
            e.contains("expected data_offsets 3 bytes apart, found [4, 6]"),
            "{e}"
        );
        // "The slice is slicing for subbytes dtypes ..."
        let e = err(
            r#"{"x":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
            &[0; 2],
        );
        assert!(e.contains("a whole number of bytes"), "{e}");
        // "invalid type: integer `5`, expected struct TensorInfo"
        let e = err(r#"{"x":5}"#, &[]);
        assert!(e.contains("tensor \"x\": expected an object"), "{e}");
        // "invalid value: integer `-4`, expected usize"
        let e = err(
            r#"{"x":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}}"#,
            &[0; 4],
        );
        assert!(e.contains("negative dimension -4"), "{e}");
        // "invalid length 3, expected 2 elements in sequence"
        let e = err(
            r#"{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4,4]}}"#,
            &[0; 4],
        );
        assert!(e.contains("data_offsets [begin, end]"), "{e}");
        // What the library accepts still opens: null metadata, zero-sized tensors sharing an
        // offset, and tensors of dtypes this reader cannot stream beside the one it reads.
        let ok = file_with(
            &format!(
                r#"{{"__metadata__":null,{x},"y":{{"dtype":"F4","shape":[4],"data_offsets":[4,6]}},"z":{{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}}}"#
            ),
            &[0; 6],
        );
        assert_eq!(open(&ok, Some("x")).unwrap().num_records(), 4);
        let e = open(&ok, Some("y")).unwrap_err().to_string();
        assert!(
            e.contains("dtype F4") && e.contains("this reader knows"),
            "{e}"
        );
    }
}
