//! JSON lines (`*.jsonl`, `*.ndjson`, plain or compressed with gzip or zstd): one object a
//! line, whose values for the columns asked for become records. The file (or object) is read
//! whole and parsed at open; a column's type is the one every line agrees on (booleans;
//! integers; numbers, any of them with a fraction or exponent making the column float64; lists
//! of one shape of those).

use std::io::Read;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float64Array, Int64Array, ListArray, RecordBatch,
    StringArray,
};
use arrow_schema::{DataType, Field, Schema};
use serde_json::Value;

use super::columns::table_error;
use super::ipc::InMemory;
use super::{columns_option, TableSource, ON_ERROR};
use crate::formats::{ByteRanges, FileRanges, Format, OpenFile, OpenRanges};
use crate::{ReadOptions, Result, Source, SourceError};

/// JSON lines; options `columns` and `on_error` (`raise` or `skip`).
#[derive(Debug)]
pub(crate) struct Jsonl;

impl Format for Jsonl {
    fn name(&self) -> &'static str {
        "jsonl"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &[
            "jsonl",
            "ndjson",
            "jsonl.gz",
            "jsonl.zst",
            "jsonl.zstd",
            "ndjson.gz",
            "ndjson.zst",
        ]
    }

    fn option_keys(&self) -> &'static [&'static str] {
        &[
            super::COLUMNS,
            ON_ERROR,
            super::TOKENS,
            super::TEXT,
            super::TOKENIZER,
            super::BOS,
            super::EOS,
            super::DOCUMENTS,
        ]
    }

    fn open(&self, open: OpenFile<'_>) -> Result<Box<dyn Source>> {
        let bytes = FileRanges::new(open.file, open.path, open.size);
        open_jsonl(&bytes, open.options)
    }

    fn open_ranges(&self, open: OpenRanges<'_>) -> Result<Box<dyn Source>> {
        open_jsonl(&*open.bytes, open.options)
    }
}

/// Parses every line of `bytes` and opens the columns asked for as records.
fn open_jsonl(bytes: &dyn ByteRanges, options: &ReadOptions) -> Result<Box<dyn Source>> {
    let name = bytes.name().to_owned();
    let format = &options.format;
    let skip = match format.get(ON_ERROR) {
        None | Some("raise") => false,
        Some("skip") => true,
        Some(other) => {
            return Err(SourceError::Options {
                reason: format!("on_error {other:?}: expected \"raise\" or \"skip\""),
            })
        }
    };
    let text = read_text(bytes)?;
    let lines = parse_lines(&text, &name, skip)?;
    let wanted = match columns_option(format)? {
        Some(w) => w,
        None => match lines.rows.first() {
            Some((_, first)) => first.keys().cloned().collect(),
            None => return Err(SourceError::Empty { name }),
        },
    };
    let mut fields = Vec::with_capacity(wanted.len());
    let mut arrays = Vec::with_capacity(wanted.len());
    // Without the columns option every key is read; the first that records cannot hold is
    // refused once the others are known, naming them.
    let all = [super::COLUMNS, super::TOKENS, super::TEXT]
        .iter()
        .all(|k| format.get(k).is_none());
    let mut refused = None;
    for column in &wanted {
        let made = if format.get(super::TEXT).is_some() {
            text_array(&lines.rows, column, &name)
        } else if format.get(super::TOKENS).is_some() {
            token_array(&lines.rows, column, &name)
        } else {
            column_array(&lines.rows, column, &name)
        };
        match made {
            Ok((field, array)) => {
                fields.push(field);
                arrays.push(array);
            }
            Err(e) if all => refused = refused.or(Some(e)),
            Err(e) => return Err(e),
        }
    }
    if let Some(e) = refused {
        let readable: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
        return Err(super::columns::name_the_columns(e, &readable));
    }
    let field_refs: Vec<&Field> = fields.iter().collect();
    let (layout, columns) = super::layout_for(format, &name, &field_refs, bytes)?;
    let schema = Arc::new(Schema::new(fields.clone()));
    let batch =
        RecordBatch::try_new(schema, arrays).map_err(|e| table_error(&name, e.to_string()))?;
    let description = match lines.skipped {
        0 => "json lines, parsed at open".to_owned(),
        n => format!("json lines, parsed at open ({n} malformed lines skipped)"),
    };
    let chunks = InMemory::new(name.clone(), vec![batch]);
    let table = TableSource::new(name, layout, columns, Box::new(chunks), description)?;
    Ok(Box::new(table))
}

/// The whole text, decompressed when it starts with gzip's or zstd's magic.
fn read_text(bytes: &dyn ByteRanges) -> Result<String> {
    let name = bytes.name();
    let raw = bytes.read_range(0..bytes.size())?;
    let mut text = Vec::new();
    let read = if raw.starts_with(&[0x1f, 0x8b]) {
        flate2::read::MultiGzDecoder::new(&raw[..]).read_to_end(&mut text)
    } else if raw.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        zstd::stream::read::Decoder::new(&raw[..]).and_then(|mut d| d.read_to_end(&mut text))
    } else {
        text = raw;
        Ok(0)
    };
    read.map_err(|e| table_error(name, format!("cannot decompress: {e}")))?;
    String::from_utf8(text).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        table_error(&format!("{name}:{line}"), "not UTF-8 text".into())
    })
}

/// The objects of the file's lines with their line numbers, and the malformed lines skipped.
struct Lines {
    rows: Vec<(usize, serde_json::Map<String, Value>)>,
    skipped: u64,
}

fn parse_lines(text: &str, name: &str, skip: bool) -> Result<Lines> {
    let mut rows = Vec::new();
    let mut skipped = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(other) => Err(format!("expected a JSON object, found {}", kind(&other))),
            Err(e) => Err(format!("malformed JSON: {e}")),
        };
        match parsed {
            Ok(map) => rows.push((i + 1, map)),
            Err(_) if skip => skipped += 1,
            Err(why) => {
                return Err(table_error(
                    &format!("{name}:{}", i + 1),
                    format!("{why} (on_error=\"skip\" skips such lines and counts them)"),
                ))
            }
        }
    }
    Ok(Lines { rows, skipped })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Appends the scalars of `v` (a scalar or nested lists) to `out`, returning its shape.
fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) -> std::result::Result<Vec<u64>, String> {
    match v {
        Value::Array(items) => {
            let mut inner: Option<Vec<u64>> = None;
            for item in items {
                let shape = flatten(item, out)?;
                match &inner {
                    Some(s) if *s != shape => {
                        return Err("a list whose items differ in shape".into())
                    }
                    Some(_) => {}
                    None => inner = Some(shape),
                }
            }
            if items.is_empty() {
                return Err("an empty list".into());
            }
            let mut shape = vec![items.len() as u64];
            shape.extend(inner.unwrap_or_default());
            Ok(shape)
        }
        Value::Bool(_) | Value::Number(_) => {
            out.push(v);
            Ok(Vec::new())
        }
        other => Err(kind(other).to_owned()),
    }
}

/// Column `column` of every row, as an Arrow array of its one type and shape.
fn column_array(
    rows: &[(usize, serde_json::Map<String, Value>)],
    column: &str,
    name: &str,
) -> Result<(Field, ArrayRef)> {
    let mut scalars: Vec<&Value> = Vec::new();
    let mut shape: Option<Vec<u64>> = None;
    for (line, row) in rows {
        let at = || format!("{name}:{line}");
        let value = row
            .get(column)
            .ok_or_else(|| table_error(&at(), format!("no column {column:?} in this line")))?;
        let found = flatten(value, &mut scalars).map_err(|what| {
            table_error(
                &at(),
                format!(
                    "column {column:?} holds {what}; records need numbers, booleans or lists \
                     of one shape of them"
                ),
            )
        })?;
        match &shape {
            Some(s) if *s != found => {
                return Err(table_error(
                    &at(),
                    format!(
                        "column {column:?} has shape {found:?} where the first line's has \
                         {s:?}; variable-size lists cannot be records"
                    ),
                ))
            }
            Some(_) => {}
            None => shape = Some(found),
        }
    }
    let shape = shape.unwrap_or_default();
    let all_bool = scalars.iter().all(|v| v.is_boolean());
    let any_bool = scalars.iter().any(|v| v.is_boolean());
    if any_bool && !all_bool {
        return Err(table_error(
            name,
            format!("column {column:?} mixes booleans and numbers"),
        ));
    }
    let mut array: ArrayRef = if all_bool {
        Arc::new(BooleanArray::from_iter(scalars.iter().map(|v| v.as_bool())))
    } else if scalars.iter().all(|v| v.is_i64()) {
        Arc::new(Int64Array::from_iter_values(
            scalars.iter().filter_map(|v| v.as_i64()),
        ))
    } else {
        Arc::new(Float64Array::from_iter_values(
            scalars.iter().filter_map(|v| v.as_f64()),
        ))
    };
    for &dim in shape.iter().rev() {
        let item = Arc::new(Field::new("item", array.data_type().clone(), false));
        let list = FixedSizeListArray::try_new(item, dim as i32, array, None)
            .map_err(|e| table_error(name, format!("column {column:?}: {e}")))?;
        array = Arc::new(list);
    }
    let field = Field::new(column, array.data_type().clone(), false);
    let _: &DataType = field.data_type();
    Ok((field, array))
}

/// Column `column` of every row as text (each row a document to tokenize).
fn text_array(
    rows: &[(usize, serde_json::Map<String, Value>)],
    column: &str,
    name: &str,
) -> Result<(Field, ArrayRef)> {
    let mut texts = Vec::with_capacity(rows.len());
    for (line, row) in rows {
        match row.get(column) {
            Some(Value::String(t)) => texts.push(t.as_str()),
            Some(other) => {
                return Err(table_error(
                    &format!("{name}:{line}"),
                    format!("column {column:?} holds {}, not text", kind(other)),
                ))
            }
            None => {
                return Err(table_error(
                    &format!("{name}:{line}"),
                    format!("no column {column:?} in this line"),
                ))
            }
        }
    }
    let array: ArrayRef = Arc::new(StringArray::from(texts));
    Ok((Field::new(column, DataType::Utf8, false), array))
}

/// Column `column` of every row as a list of integers (a document's token ids).
fn token_array(
    rows: &[(usize, serde_json::Map<String, Value>)],
    column: &str,
    name: &str,
) -> Result<(Field, ArrayRef)> {
    let mut docs: Vec<Option<Vec<Option<i64>>>> = Vec::with_capacity(rows.len());
    for (line, row) in rows {
        let at = || format!("{name}:{line}");
        let ids = match row.get(column) {
            Some(Value::Array(items)) => items
                .iter()
                .map(Value::as_i64)
                .collect::<Option<Vec<i64>>>(),
            Some(_) => None,
            None => {
                return Err(table_error(
                    &at(),
                    format!("no column {column:?} in this line"),
                ))
            }
        };
        let Some(ids) = ids else {
            return Err(table_error(
                &at(),
                format!("column {column:?} is not a list of integers (token ids)"),
            ));
        };
        docs.push(Some(ids.into_iter().map(Some).collect()));
    }
    let list = ListArray::from_iter_primitive::<arrow_array::types::Int64Type, _, _>(docs);
    let array: ArrayRef = Arc::new(list);
    Ok((Field::new(column, array.data_type().clone(), false), array))
}
