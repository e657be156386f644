//! Columns as fixed-size records: which Arrow types a column may have, the record layout of the
//! columns asked for, and the packing of a record batch's columns into those records.
//!
//! A record holds the columns in the order asked for, each at an offset aligned to its element
//! size (numpy's `align=True` rule, padding named `''` as numpy writes it), so that a consumer
//! can view each column of a batch of records in place, as `batch[:, offset:end].view(dtype)`.

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field};

use crate::dtype::DType;
use crate::{Layout, Result, SourceError};

/// One column of a record: where its bytes are and what they are.
#[derive(Clone, Debug)]
pub struct Column {
    /// The column's name in the file.
    pub name: String,
    /// The element type, as a numpy typestring (`<f4`, `|u1`, `|b1`).
    pub typestr: &'static str,
    /// Bytes of one element.
    pub itemsize: usize,
    /// The shape of one row's value: empty for a scalar, `[n]` for a fixed-size list of `n`,
    /// `[n, m]` for a list of lists.
    pub shape: Vec<u64>,
    /// Byte offset of the column in a record.
    pub offset: usize,
    /// A token column: each row a variable-size list of integers (a document), and the
    /// records its integers, the rows' lists concatenated.
    pub tokens: bool,
    /// A text column: each row a document, tokenized with this.
    pub(crate) text: Option<std::sync::Arc<super::text::Text>>,
    /// A token or text column whose rows' token counts are kept ([`super::DOCUMENTS`]).
    pub(crate) documents: bool,
}

impl Column {
    /// Bytes of one row's value.
    pub fn bytes(&self) -> usize {
        self.itemsize * self.shape.iter().product::<u64>() as usize
    }
}

/// The numpy typestring and itemsize of a primitive Arrow type; `None` for any other.
pub(crate) fn primitive(t: &DataType) -> Option<(&'static str, usize)> {
    Some(match t {
        DataType::Boolean => ("|b1", 1),
        DataType::Int8 => ("|i1", 1),
        DataType::Int16 => ("<i2", 2),
        DataType::Int32 => ("<i4", 4),
        DataType::Int64 => ("<i8", 8),
        DataType::UInt8 => ("|u1", 1),
        DataType::UInt16 => ("<u2", 2),
        DataType::UInt32 => ("<u4", 4),
        DataType::UInt64 => ("<u8", 8),
        DataType::Float16 => ("<f2", 2),
        DataType::Float32 => ("<f4", 4),
        DataType::Float64 => ("<f8", 8),
        _ => return None,
    })
}

/// Why a type cannot be a column of records, for the one-line error.
fn refusal(t: &DataType) -> String {
    match t {
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::ListView(_)
        | DataType::LargeListView(_) => format!(
            "is a variable-size list ({t}); records need a fixed size: store it as a \
             fixed_size_list, or read a list of token ids with TokenLoader(column=...)"
        ),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => format!(
            "is text ({t}); text is read by TokenLoader(column=..., tokenizer=...), not as records"
        ),
        _ => format!(
            "has type {t}, which is not a record column (expected booleans, integers, floats, \
             or fixed-size lists of them)"
        ),
    }
}

/// The element type and row shape of a column of records of type `t`: a primitive, or
/// fixed-size lists of one, nested. An error names why not.
pub(crate) fn record_type(
    t: &DataType,
) -> std::result::Result<(&'static str, usize, Vec<u64>), String> {
    if let Some((typestr, size)) = primitive(t) {
        return Ok((typestr, size, Vec::new()));
    }
    match t {
        DataType::FixedSizeList(inner, n) if *n > 0 => {
            let (typestr, size, mut shape) =
                record_type(inner.data_type()).map_err(|_| refusal(t))?;
            shape.insert(0, *n as u64);
            Ok((typestr, size, shape))
        }
        _ => Err(refusal(t)),
    }
}

/// The record layout of `fields` (the columns asked for, in order): each at the next offset
/// aligned to its itemsize, the record padded to the largest.
pub(crate) fn layout_of(name: &str, fields: &[&Field]) -> Result<(Layout, Vec<Column>)> {
    let mut columns = Vec::with_capacity(fields.len());
    let mut offset = 0usize;
    let mut align = 1usize;
    for field in fields {
        let (typestr, itemsize, shape) = record_type(field.data_type())
            .map_err(|why| table_error(name, format!("column {:?} {why}", field.name())))?;
        offset = offset.next_multiple_of(itemsize);
        align = align.max(itemsize);
        let column = Column {
            name: field.name().clone(),
            typestr,
            itemsize,
            shape,
            offset,
            tokens: false,
            text: None,
            documents: false,
        };
        offset += column.bytes();
        columns.push(column);
    }
    let size = offset.next_multiple_of(align);
    let descr = descr_of(&columns, size);
    let dtype = DType::from_descr_literal(&descr).map_err(|e| table_error(name, e.to_string()))?;
    let layout = Layout::new(dtype, Vec::new()).map_err(|e| table_error(name, e.to_string()))?;
    Ok((layout, columns))
}

/// The layout of a token column (`field`, a list of integers): records of one integer.
pub(crate) fn token_layout(name: &str, field: &Field) -> Result<(Layout, Vec<Column>)> {
    let inner = match field.data_type() {
        DataType::List(inner) | DataType::LargeList(inner) => inner.data_type(),
        t => {
            return Err(table_error(
                name,
                format!(
                    "column {:?} has type {t}; a token column is a list of integers per row                      (a document)",
                    field.name()
                ),
            ))
        }
    };
    let (typestr, itemsize) = primitive(inner)
        .filter(|_| inner.is_integer())
        .ok_or_else(|| {
            table_error(
                name,
                format!(
                    "column {:?} holds lists of {inner}; token ids are integers",
                    field.name()
                ),
            )
        })?;
    let column = Column {
        name: field.name().clone(),
        typestr,
        itemsize,
        shape: Vec::new(),
        offset: 0,
        tokens: true,
        text: None,
        documents: false,
    };
    let dtype = DType::from_descr_literal(&format!("'{typestr}'"))
        .map_err(|e| table_error(name, e.to_string()))?;
    let layout = Layout::new(dtype, Vec::new()).map_err(|e| table_error(name, e.to_string()))?;
    Ok((layout, vec![column]))
}

/// The layout of a text column (`field`) tokenized by `text`: records of one uint32 token.
pub(crate) fn text_layout(
    name: &str,
    field: &Field,
    text: std::sync::Arc<super::text::Text>,
) -> Result<(Layout, Vec<Column>)> {
    if !super::text::Text::takes(field.data_type()) {
        return Err(table_error(
            name,
            format!(
                "column {:?} has type {}; a tokenizer reads a text column",
                field.name(),
                field.data_type()
            ),
        ));
    }
    let column = Column {
        name: field.name().clone(),
        typestr: "<u4",
        itemsize: 4,
        shape: Vec::new(),
        offset: 0,
        tokens: true,
        text: Some(text),
        documents: false,
    };
    let dtype = DType::from_descr_literal("'<u4'").map_err(|e| table_error(name, e.to_string()))?;
    let layout = Layout::new(dtype, Vec::new()).map_err(|e| table_error(name, e.to_string()))?;
    Ok((layout, vec![column]))
}

/// The numpy descr of records of `columns` (with `''` padding fields where they are apart)
/// whose size is `size`.
fn descr_of(columns: &[Column], size: usize) -> String {
    let mut descr = String::from("[");
    let mut at = 0usize;
    let pad = |descr: &mut String, n: usize| descr.push_str(&format!("('', '|V{n}'), "));
    for c in columns {
        if c.offset > at {
            pad(&mut descr, c.offset - at);
        }
        descr.push('(');
        crate::literal::repr_str(&c.name, &mut descr);
        descr.push_str(&format!(", '{}'", c.typestr));
        if !c.shape.is_empty() {
            let dims: Vec<String> = c.shape.iter().map(u64::to_string).collect();
            descr.push_str(&format!(", ({},)", dims.join(", ")));
        }
        descr.push_str("), ");
        at = c.offset + c.bytes();
    }
    if size > at {
        pad(&mut descr, size - at);
    }
    descr.push(']');
    descr
}

/// `e`, the refusal of a column of a table opened without the `columns` option (all of its
/// columns), with the columns that records can hold (`readable`): the ones to name.
pub(crate) fn name_the_columns(e: SourceError, readable: &[&str]) -> SourceError {
    let SourceError::Table { name, reason } = e else {
        return e;
    };
    let hint = match readable {
        [] => "no column of this table is one records can hold".to_owned(),
        some => {
            let quoted: Vec<String> = some.iter().map(|n| format!("{n:?}")).collect();
            format!(
                "without columns= every column is read; name those to read: columns=[{}]",
                quoted.join(", ")
            )
        }
    };
    table_error(&name, format!("{reason}; {hint}"))
}

/// The names of `fields` that records can hold.
pub(crate) fn readable<'a>(fields: &[&'a Field]) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|f| record_type(f.data_type()).is_ok())
        .map(|f| f.name().as_str())
        .collect()
}

/// A [`SourceError::Table`] about `name`.
pub(crate) fn table_error(name: &str, reason: String) -> SourceError {
    SourceError::Table {
        name: name.to_owned(),
        reason,
    }
}

/// Packs the rows of `batch` into records of `columns` (`record_bytes` each) at the end of
/// `out`. `at` names the chunk for errors ("file.parquet, row group 3"). The batch's columns
/// are found by name; a null anywhere in one is refused. For a token or text column, each
/// row's token count is pushed to `documents` when given.
pub(crate) fn pack(
    batch: &RecordBatch,
    columns: &[Column],
    record_bytes: usize,
    at: &str,
    out: &mut Vec<u8>,
    documents: Option<&mut Vec<u64>>,
) -> Result<()> {
    if let Some(column) = columns.first().filter(|c| c.tokens) {
        // The one column of a token or text table.
        let Some(array) = batch.column_by_name(&column.name) else {
            return Err(table_error(at, format!("no column {:?}", column.name)));
        };
        if let Some(text) = &column.text {
            return text.encode_into(array, &column.name, at, out, documents);
        }
        // The rows' lists, back to back.
        let tokens = token_values(array, column, at, documents)?;
        if let Values::Bytes(bytes) = flatten(&tokens, column, at)? {
            out.extend_from_slice(bytes);
        }
        return Ok(());
    }
    let rows = batch.num_rows();
    let parts = record_parts(batch, columns, rows, at)?;
    let parts: Vec<_> = parts.iter().map(|(v, c)| (v.bytes(), *c)).collect();
    if let Some(values) = whole(&parts, record_bytes) {
        out.extend_from_slice(values);
        return Ok(());
    }
    let start = out.len();
    out.resize(start + rows * record_bytes, 0);
    scatter_rows(&parts, &mut out[start..], record_bytes);
    Ok(())
}

/// Packs the rows of `batch` (of record columns) into `records`, which holds as many
/// records of `record_bytes`, zeroed: [`pack`] into a buffer made beforehand (the padding
/// between columns is left as it is). `at` names the chunk for errors.
pub(crate) fn pack_into(
    batch: &RecordBatch,
    columns: &[Column],
    record_bytes: usize,
    at: &str,
    records: &mut [u8],
) -> Result<()> {
    debug_assert_eq!(records.len(), batch.num_rows() * record_bytes);
    let parts = record_parts(batch, columns, batch.num_rows(), at)?;
    let parts: Vec<_> = parts.iter().map(|(v, c)| (v.bytes(), *c)).collect();
    match whole(&parts, record_bytes) {
        Some(values) => records.copy_from_slice(values),
        None => scatter_rows(&parts, records, record_bytes),
    }
    Ok(())
}

/// Each record column's values in `batch`, `rows` rows of them, checked free of nulls and of
/// its width.
fn record_parts<'a, 'c>(
    batch: &'a RecordBatch,
    columns: &'c [Column],
    rows: usize,
    at: &str,
) -> Result<Vec<(Values<'a>, &'c Column)>> {
    let mut parts = Vec::with_capacity(columns.len());
    for column in columns {
        let Some(array) = batch.column_by_name(&column.name) else {
            return Err(table_error(at, format!("no column {:?}", column.name)));
        };
        let values = flatten(array, column, at)?;
        let width = column.bytes();
        if values.bytes().len() != rows * width {
            return Err(table_error(
                at,
                format!(
                    "column {:?}: {} bytes for {rows} rows of {width}",
                    column.name,
                    values.bytes().len()
                ),
            ));
        }
        parts.push((values, column));
    }
    Ok(parts)
}

/// The records already, where one column fills the record (a fixed-size list, or one
/// primitive): its values, row after row.
pub(crate) fn whole<'v>(parts: &[(&'v [u8], &Column)], record_bytes: usize) -> Option<&'v [u8]> {
    match parts {
        [(values, column)] if column.offset == 0 && column.bytes() == record_bytes => Some(values),
        _ => None,
    }
}

/// Writes the rows of `parts` (each column's values, row after row) into `records`, which
/// holds as many.
pub(crate) fn scatter_rows(parts: &[(&[u8], &Column)], records: &mut [u8], record_bytes: usize) {
    // A block of records at a time, each column scattered into it while it stays in the
    // cache: column by column over the whole batch would stream every record through the
    // cache once a column.
    let block = (BLOCK_BYTES / record_bytes.max(1)).max(1);
    for (b, records) in records.chunks_mut(block * record_bytes).enumerate() {
        let first = b * block;
        let count = records.len() / record_bytes;
        for (values, column) in parts {
            let width = column.bytes();
            let from = &values[first * width..(first + count) * width];
            scatter(from, records, width, record_bytes, column.offset);
        }
    }
}

/// Bytes of records packed at a time: a block that stays in a core's L1 or L2 cache while
/// every column is written into it.
const BLOCK_BYTES: usize = 16 << 10;

/// Copies the `width`-byte values of `from`, one a record, to `offset` in each
/// `record_bytes`-byte record of `records`.
fn scatter(from: &[u8], records: &mut [u8], width: usize, record_bytes: usize, offset: usize) {
    /// The copy for a width known when compiled: a load and a store an element.
    fn fixed<const W: usize>(from: &[u8], records: &mut [u8], record_bytes: usize, offset: usize) {
        for (value, record) in from
            .chunks_exact(W)
            .zip(records.chunks_exact_mut(record_bytes))
        {
            let value: &[u8; W] = value.try_into().expect("chunks of W bytes");
            record[offset..offset + W].copy_from_slice(value);
        }
    }
    match width {
        1 => fixed::<1>(from, records, record_bytes, offset),
        2 => fixed::<2>(from, records, record_bytes, offset),
        4 => fixed::<4>(from, records, record_bytes, offset),
        8 => fixed::<8>(from, records, record_bytes, offset),
        16 => fixed::<16>(from, records, record_bytes, offset),
        _ => {
            for (value, record) in from
                .chunks_exact(width)
                .zip(records.chunks_exact_mut(record_bytes))
            {
                record[offset..offset + width].copy_from_slice(value);
            }
        }
    }
}

/// Checks that no column of `batch` holds a null, at any level.
pub(crate) fn check_nulls(batch: &RecordBatch, columns: &[Column], at: &str) -> Result<()> {
    for column in columns {
        let Some(array) = batch.column_by_name(&column.name) else {
            return Err(table_error(at, format!("no column {:?}", column.name)));
        };
        flatten(array, column, at)?;
    }
    Ok(())
}

/// The integers of a token column's lists, from the first row's start to the last row's end;
/// each row's count is pushed to `documents` when given.
fn token_values(
    array: &ArrayRef,
    column: &Column,
    at: &str,
    documents: Option<&mut Vec<u64>>,
) -> Result<ArrayRef> {
    // Offsets are non-decreasing (arrow checks it when the array is built).
    fn lengths<T: Copy + Into<i64>>(o: &[T], documents: Option<&mut Vec<u64>>) {
        if let Some(documents) = documents {
            documents.extend(o.windows(2).map(|w| (w[1].into() - w[0].into()) as u64));
        }
    }
    let (from, to, values) = match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            let o = list.value_offsets();
            lengths(o, documents);
            (o[0] as usize, o[o.len() - 1] as usize, list.values())
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            let o = list.value_offsets();
            lengths(o, documents);
            (o[0] as usize, o[o.len() - 1] as usize, list.values())
        }
        t => {
            return Err(table_error(
                at,
                format!("column {:?} changed type to {t} in this chunk", column.name),
            ))
        }
    };
    if array.null_count() > 0 {
        return Err(table_error(
            at,
            format!(
                "column {:?} holds {} null documents",
                column.name,
                array.null_count()
            ),
        ));
    }
    Ok(values.slice(from, to - from))
}

/// A column's element bytes, row after row.
enum Values<'a> {
    /// Borrowed from the array's buffer.
    Bytes(&'a [u8]),
    /// Booleans unpacked from their bits, one byte each.
    Bools(Vec<u8>),
}

impl Values<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Values::Bytes(b) => b,
            Values::Bools(b) => b,
        }
    }
}

/// The elements of `array` (a primitive column, or fixed-size lists of one), checked free of
/// nulls at every level.
fn flatten<'a>(array: &'a ArrayRef, column: &Column, at: &str) -> Result<Values<'a>> {
    let nulls = |array: &dyn Array| {
        if array.null_count() > 0 {
            Err(table_error(
                at,
                format!(
                    "column {:?} holds {} nulls; records cannot hold a missing value (fill or \
                     drop them first)",
                    column.name,
                    array.null_count()
                ),
            ))
        } else {
            Ok(())
        }
    };
    let mut array: &'a dyn Array = array.as_ref();
    nulls(array)?;
    while let DataType::FixedSizeList(_, _) = array.data_type() {
        let list = array.as_fixed_size_list();
        array = list.values().as_ref();
        nulls(array)?;
    }
    macro_rules! bytes {
        ($t:ty) => {
            Values::Bytes(array.as_primitive::<$t>().values().inner().as_slice())
        };
    }
    Ok(match array.data_type() {
        DataType::Boolean => {
            Values::Bools(array.as_boolean().values().iter().map(u8::from).collect())
        }
        DataType::Int8 => bytes!(Int8Type),
        DataType::Int16 => bytes!(Int16Type),
        DataType::Int32 => bytes!(Int32Type),
        DataType::Int64 => bytes!(Int64Type),
        DataType::UInt8 => bytes!(UInt8Type),
        DataType::UInt16 => bytes!(UInt16Type),
        DataType::UInt32 => bytes!(UInt32Type),
        DataType::UInt64 => bytes!(UInt64Type),
        DataType::Float16 => bytes!(Float16Type),
        DataType::Float32 => bytes!(Float32Type),
        DataType::Float64 => bytes!(Float64Type),
        t => {
            return Err(table_error(
                at,
                format!("column {:?} changed type to {t} in this chunk", column.name),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn layout_aligns_each_column_to_its_itemsize() {
        let a = Field::new("a", DataType::UInt8, false);
        let b = Field::new(
            "b",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 3),
            false,
        );
        let c = Field::new("c", DataType::Int64, false);
        let (layout, cols) = layout_of("t", &[&a, &b, &c]).unwrap();
        let offsets: Vec<usize> = cols.iter().map(|c| c.offset).collect();
        assert_eq!(offsets, [0, 4, 16]);
        assert_eq!(layout.record_bytes(), 24);
        assert_eq!(
            layout.dtype.descr,
            "[('a', '|u1'), ('', '|V3'), ('b', '<f4', (3,)), ('c', '<i8')]"
        );
        let s = Field::new("s", DataType::Utf8, true);
        let e = layout_of("t.parquet", &[&s]).unwrap_err().to_string();
        assert!(e.starts_with("t.parquet: column \"s\" is text"), "{e}");
        let l = Field::new(
            "l",
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
            true,
        );
        let e = layout_of("t.parquet", &[&l]).unwrap_err().to_string();
        assert!(e.contains("column \"l\" is a variable-size list"), "{e}");
    }

    /// Each record, column by column, as the layout says: the reference `pack` must equal.
    fn reference(batch: &RecordBatch, columns: &[Column], record_bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; batch.num_rows() * record_bytes];
        for c in columns {
            let array = batch.column_by_name(&c.name).unwrap();
            let values = flatten(array, c, "t").unwrap();
            let width = c.bytes();
            for row in 0..batch.num_rows() {
                let at = row * record_bytes + c.offset;
                out[at..at + width].copy_from_slice(&values.bytes()[row * width..][..width]);
            }
        }
        out
    }

    #[test]
    fn pack_equals_the_record_by_record_reference() {
        use arrow_array::{BooleanArray, FixedSizeListArray, Float32Array, Float64Array};
        let rows = 3000; // blocks of records cut mid-batch
        let f32s =
            |n: u32, k: u32| Float32Array::from_iter_values((0..n).map(|r| (r * 7 + k) as f32));
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let list = FixedSizeListArray::new(item, 3, Arc::new(f32s(3 * rows, 9)), None);
        let batch = RecordBatch::try_from_iter([
            ("a", Arc::new(f32s(rows, 1)) as ArrayRef),
            ("b", Arc::new(f32s(rows, 2))),
            (
                "flag",
                Arc::new(BooleanArray::from_iter((0..rows).map(|r| Some(r % 3 == 0)))),
            ),
            ("v", Arc::new(list)),
            (
                "d",
                Arc::new(Float64Array::from_iter_values((0..rows).map(f64::from))),
            ),
        ])
        .unwrap();
        let schema = batch.schema();
        for names in [
            &["v"][..],
            &["d"],
            &["a", "b"],
            &["a", "flag", "v", "d", "b"],
        ] {
            let fields: Vec<&Field> = names
                .iter()
                .map(|n| schema.field_with_name(n).unwrap())
                .collect();
            let (layout, columns) = layout_of("t", &fields).unwrap();
            let record_bytes = layout.record_bytes();
            let want = reference(&batch, &columns, record_bytes);
            let mut out = vec![7u8; 5]; // packed after what is there
            pack(&batch, &columns, record_bytes, "t", &mut out, None).unwrap();
            assert_eq!(out[..5], [7u8; 5]);
            assert!(out[5..] == want, "{names:?}");
            // Into a zeroed buffer of as many records.
            let mut records = vec![0u8; want.len()];
            pack_into(&batch, &columns, record_bytes, "t", &mut records).unwrap();
            assert!(records == want, "{names:?}, into a buffer");
        }
    }
}
