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
        let bad = |offset: u64, reason: String| SourceError::Safetensors {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        if size < 8 {
            return Err(bad(
                0,
                format!("expected an 8-byte header length, found a file of {size} bytes"),
            ));
        }
        let mut len = [0u8; 8];
        read_exact_at(&file, path, 0, &mut len)?;
        let header_len = u64::from_le_bytes(len);
        if header_len > MAX_HEADER_LEN {
            return Err(bad(
                0,
                format!("expected a header length of at most {MAX_HEADER_LEN} bytes, found {header_len}"),
            ));
        }
        if 8 + header_len > size {
            return Err(bad(
                0,
                format!(
                    "the header length {header_len} runs past the end of the file ({size} bytes)"
                ),
            ));
        }
        let mut text = vec![0u8; header_len as usize];
        read_exact_at(&file, path, 8, &mut text)?;
        let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            bad(
                8,
                format!(
                    "expected JSON, found an error at line {} column {}: {e}",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        let serde_json::Value::Object(entries) = json else {
            return Err(bad(8, "expected a JSON object".into()));
        };
        let mut available: Vec<String> = entries
            .keys()
            .filter(|k| *k != "__metadata__")
            .cloned()
            .collect();
        available.sort();
        let wanted = options.format.get(TENSOR).map(str::to_owned);
        let tensor = match &wanted {
            Some(wanted) if available.contains(wanted) => wanted.clone(),
            None if available.len() == 1 => available[0].clone(),
            wanted => {
                return Err(SourceError::Tensor {
                    path: path.to_path_buf(),
                    wanted: wanted.clone(),
                    available,
                })
            }
        };
        let entry = &entries[&tensor];
        let field = |key: &str| {
            entry.get(key).ok_or_else(|| {
                bad(
                    8,
                    format!("tensor {tensor:?}: expected the key {key:?}, found {entry}"),
                )
            })
        };
        let dtype_name = field("dtype")?
            .as_str()
            .ok_or_else(|| bad(8, format!("tensor {tensor:?}: expected a dtype string")))?
            .to_owned();
        let Some(descr) = descr(&dtype_name) else {
            return Err(SourceError::DType {
                path: Some(path.to_path_buf()),
                descr: dtype_name,
                reason: "not a safetensors dtype this reader knows: expected BOOL, U8, I8, U16, \
                         I16, U32, I32, U64, I64, F16, BF16, F8_E4M3, F8_E5M2, F32, F64 or C64"
                    .into(),
            });
        };
        let numbers = |key: &str| -> Result<Vec<u64>> {
            field(key)?
                .as_array()
                .and_then(|a| a.iter().map(|v| v.as_u64()).collect::<Option<Vec<u64>>>())
                .ok_or_else(|| {
                    bad(
                        8,
                        format!("tensor {tensor:?}: expected {key} to be a list of integers"),
                    )
                })
        };
        let shape = numbers("shape")?;
        let offsets = numbers("data_offsets")?;
        let dtype = DType::from_descr_literal(descr).map_err(|e| e.with_path(path))?;
        let Some((&records, record_shape)) = shape.split_first() else {
            return Err(SourceError::Shape {
                path: path.to_path_buf(),
                shape,
                descr: dtype_name,
                reason:
                    "a 0-d (scalar) tensor holds no records; its first dimension must count them",
            });
        };
        let layout = Layout::new(dtype, record_shape.to_vec()).map_err(|e| e.with_path(path))?;
        let &[begin, end] = offsets.as_slice() else {
            return Err(bad(
                8,
                format!("tensor {tensor:?}: expected data_offsets [begin, end], found {offsets:?}"),
            ));
        };
        let expected = records.checked_mul(layout.record_bytes() as u64);
        if begin > end || expected != Some(end - begin) {
            return Err(bad(
                8,
                format!(
                    "tensor {tensor:?} of dtype {dtype_name} and shape {shape:?}: expected data_offsets \
                     {} bytes apart, found [{begin}, {end}]",
                    expected.map_or("a size that fits in 64 bits".to_owned(), |n| n.to_string())
                ),
            ));
        }
        let name = crate::escape_path(path);
        if records == 0 {
            return Err(SourceError::Empty { name });
        }
        let data_start = 8 + header_len;
        let data_offset = data_start + begin;
        if data_start.saturating_add(end) > size {
            return Err(SourceError::DataSize {
                path: path.to_path_buf(),
                data_offset,
                expected: end - begin,
                found: size.saturating_sub(data_offset),
            });
        }
        let mut records = FileRecords::new(file, path, layout, records, data_offset);
        records.set_reader(options)?;
        Ok(SafetensorsFile {
            records,
            tensor,
            dtype_name,
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
        let e = err(&file_with(
            r#"{"x":{"dtype":"F32","shape":[3,2],"data_offsets":[0,20]}}"#,
            &[0; 24],
        ));
        assert!(e.contains("24 bytes apart, found [0, 20]"), "{e}");
        let e = err(&file_with(
            r#"{"x":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]}}"#,
            &[0; 20],
        ));
        assert!(e.contains("truncated"), "{e}");
        let e = err(&file_with(
            r#"{"x":{"dtype":"F4","shape":[3],"data_offsets":[0,3]}}"#,
            &[0; 3],
        ));
        assert!(e.contains("dtype F4"), "{e}");
        let e = err(&file_with(
            r#"{"x":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}"#,
            &[0; 1],
        ));
        assert!(e.contains("0-d"), "{e}");
        let e = err(&file_with(
            r#"{"x":{"dtype":"U8","shape":[0, 4],"data_offsets":[0,0]}}"#,
            &[],
        ));
        assert!(e.contains("empty"), "{e}");
        let e = err(&file_with(r#"{"x":{"dtype":"U8","shape":[2]}}"#, &[0; 2]));
        assert!(e.contains("\"data_offsets\""), "{e}");
        let e = err(&file_with(r#"{"__metadata__":{}}"#, &[]));
        assert!(e.contains("no tensors"), "{e}");
    }
}
