//! Tables as records: JSON lines, and what Parquet and Arrow IPC files read by ranges (files
//! written by pyarrow are tested from Python: bindings/python/tests/test_tables.py, and in
//! object storage test_store_tables.py).

use std::io::Write;

use pinfeed_source::{open_with, FormatOptions, ReadOptions};

fn options(pairs: &[(&str, &str)]) -> ReadOptions {
    let mut format = FormatOptions::new();
    for (k, v) in pairs {
        format.set(*k, *v);
    }
    ReadOptions {
        format,
        ..Default::default()
    }
}

const LINES: &str =
    "{\"x\": 1, \"v\": [0.5, 1], \"ok\": true}\n\n{\"x\": -2, \"v\": [2, 3e0], \"ok\": false}\n";

#[test]
fn json_lines_become_aligned_records_plain_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("a.jsonl");
    std::fs::write(&plain, LINES).unwrap();
    let gz = dir.path().join("a.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(LINES.as_bytes()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    for path in [&plain, &gz] {
        let s = open_with(path, None, &options(&[("columns", "ok,v,x")])).unwrap();
        assert_eq!(s.num_records(), 2);
        // ok: bool at 0; v: 2 x f8 at 8; x: i8 at 24; 32 bytes a record.
        assert_eq!(
            s.layout().dtype.descr,
            "[('ok', '|b1'), ('', '|V7'), ('v', '<f8', (2,)), ('x', '<i8')]"
        );
        let mut dst = vec![0u8; 64];
        s.read_records(0, &mut dst).unwrap();
        assert_eq!(dst[0], 1);
        assert_eq!(dst[32], 0);
        let f = |at: usize| f64::from_le_bytes(dst[at..at + 8].try_into().unwrap());
        let i = |at: usize| i64::from_le_bytes(dst[at..at + 8].try_into().unwrap());
        assert_eq!((f(8), f(16), i(24)), (0.5, 1.0, 1));
        assert_eq!((f(40), f(48), i(56)), (2.0, 3.0, -2));
    }
}

#[test]
fn malformed_lines_are_named_or_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    std::fs::write(&path, "{\"x\": 1}\n{\"x\": 2,\n{\"x\": 3}\n").unwrap();
    let e = open_with(&path, None, &options(&[("columns", "x")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("b.jsonl:2: malformed JSON"), "{e}");
    let s = open_with(
        &path,
        None,
        &options(&[("columns", "x"), ("on_error", "skip")]),
    )
    .unwrap();
    assert_eq!(s.num_records(), 2);
    assert!(s.reader_description().contains("1 malformed lines skipped"));
    let e = open_with(
        &path,
        None,
        &options(&[("columns", "y"), ("on_error", "skip")]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("b.jsonl:1: no column \"y\""), "{e}");
    std::fs::write(&path, "{\"x\": [1, 2]}\n{\"x\": [1]}\n").unwrap();
    let e = open_with(&path, None, &options(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("b.jsonl:2: column \"x\" has shape [1]"), "{e}");
}

#[test]
fn a_corrupt_parquet_footer_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.parquet");
    std::fs::write(&path, b"PAR1 not really parquet PAR1").unwrap();
    let e = open_with(&path, None, &options(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("c.parquet: not a readable Parquet file"), "{e}");
}

#[test]
fn a_token_column_is_its_lists_concatenated() {
    use arrow_array::{types::Int32Type, ListArray, RecordBatch};
    use std::sync::Arc;
    let docs: Vec<Vec<i32>> = (0..40)
        .map(|d| (0..(d % 7)).map(|t| d * 100 + t).collect())
        .collect();
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
        docs.iter().map(|d| Some(d.iter().map(|&t| Some(t)))),
    );
    let batch = RecordBatch::try_from_iter([("input_ids", Arc::new(list) as _)]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.arrow");
    let file = std::fs::File::create(&path).unwrap();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(file, &batch.schema()).unwrap();
    writer.write(&batch.slice(0, 13)).unwrap();
    writer.write(&batch.slice(13, 27)).unwrap();
    writer.finish().unwrap();
    let s = open_with(&path, None, &options(&[("tokens", "input_ids")])).unwrap();
    let want: Vec<i32> = docs.concat();
    assert_eq!(s.num_records(), want.len() as u64);
    let mut dst = vec![0u8; 4 * want.len()];
    s.read_records(0, &mut dst).unwrap();
    let got: Vec<i32> = dst
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got, want);
    let e = open_with(&path, None, &options(&[("columns", "input_ids")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("variable-size list"), "{e}");
}

#[test]
fn text_is_tokenized_with_eos_after_each_document() {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    let dir = tempfile::tempdir().unwrap();
    let vocab = [("[UNK]", 0), ("[EOS]", 1), ("a", 2), ("b", 3), ("c", 4)]
        .into_iter()
        .map(|(t, i)| (t.to_owned(), i))
        .collect();
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(Whitespace {}));
    let tok_path = dir.path().join("tokenizer.json");
    tokenizer.save(&tok_path, false).unwrap();
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, "{\"text\": \"a b\"}\n{\"text\": \"c z a\"}\n").unwrap();
    let tok = tok_path.to_str().unwrap();
    let opts = options(&[("text", "text"), ("tokenizer", tok), ("eos", "[EOS]")]);
    let s = open_with(&path, None, &opts).unwrap();
    let mut dst = vec![0u8; 4 * 7];
    s.read_records(0, &mut dst).unwrap();
    let got: Vec<u32> = dst
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got, [2, 3, 1, 4, 0, 2, 1]);
    let mut documents = opts.clone();
    documents.format.set("documents", "true");
    let s = open_with(&path, None, &documents).unwrap();
    // "a b" and "c z a", each with eos.
    assert_eq!(s.document_lengths(), Some(vec![3, 4]));

    // A template naming a second sequence ($B) loads, and panics on every document.
    let json = tokenizer.to_string(false).unwrap().replace(
        "\"post_processor\":null",
        r#""post_processor":{"type":"TemplateProcessing","single":[{"Sequence":{"id":"B","type_id":0}}],"pair":[],"special_tokens":{}}"#,
    );
    assert!(json.contains("TemplateProcessing"), "{json}");
    std::fs::write(&tok_path, json).unwrap();
    let e = open_with(&path, None, &opts).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.json: cannot load the tokenizer: its post-processor"),
        "{e}"
    );
    std::fs::write(&tok_path, "{\"model\": 3}").unwrap();
    let e = open_with(&path, None, &opts).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.json: cannot load the tokenizer"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn parquet_row_groups_decode_on_many_threads_at_once() {
    use arrow_array::{Int64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.parquet");
    let (groups, per) = (32u64, 20_000u64);
    let rows = (groups * per) as i64;
    let batch =
        RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from_iter_values(0..rows)) as _)])
            .unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(per as usize))
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let s = open_with(&path, None, &options(&[("columns", "x")])).unwrap();
    assert_eq!(s.natural_block(), Some(per));
    // Each thread reads every row group, starting at its own, so decodes overlap; a shared
    // file offset (File's ChunkReader) made them read each other's pages.
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let s = &s;
            scope.spawn(move || {
                for g in 0..groups / 8 {
                    let g = g + t * (groups / 8);
                    let mut dst = vec![0u8; 8 * per as usize];
                    s.read_records(g * per, &mut dst).unwrap();
                    let last = i64::from_le_bytes(dst[dst.len() - 8..].try_into().unwrap());
                    assert_eq!(last, ((g + 1) * per - 1) as i64);
                }
            });
        }
    });
}

#[test]
fn a_json_lines_token_column_is_its_lists_concatenated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.jsonl");
    std::fs::write(
        &path,
        "{\"ids\": [5, 6]}\n{\"ids\": []}\n{\"ids\": [7, 8, 9]}\n",
    )
    .unwrap();
    let s = open_with(&path, None, &options(&[("tokens", "ids")])).unwrap();
    assert_eq!(s.num_records(), 5);
    let mut dst = vec![0u8; 40];
    s.read_records(0, &mut dst).unwrap();
    let got: Vec<i64> = dst
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got, [5, 6, 7, 8, 9]);
    std::fs::write(&path, "{\"ids\": [5, 6.5]}\n").unwrap();
    let e = open_with(&path, None, &options(&[("tokens", "ids")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ids.jsonl:1: column \"ids\" is not a list of integers"),
        "{e}"
    );
}

/// `docs` as the `input_ids` column of an Arrow IPC stream at `path`, in record batches of
/// `rows` rows.
fn write_token_stream(path: &std::path::Path, docs: &[Vec<i32>], rows: usize) {
    use arrow_array::{types::Int32Type, ListArray, RecordBatch};
    use std::sync::Arc;
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
        docs.iter().map(|d| Some(d.iter().map(|&t| Some(t)))),
    );
    let batch = RecordBatch::try_from_iter([("input_ids", Arc::new(list) as _)]).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(file, &batch.schema()).unwrap();
    for from in (0..docs.len()).step_by(rows) {
        writer
            .write(&batch.slice(from, rows.min(docs.len() - from)))
            .unwrap();
    }
    writer.finish().unwrap();
}

#[test]
fn a_token_column_keeps_its_rows_as_documents_when_asked() {
    use pinfeed_source::tokens::{document_order, DocumentPlan, Documents, TokenStream};
    use std::sync::Arc;
    // Document d holds d % 7 tokens, each 100 * d + its position: documents 0, 7, 14, ... are
    // empty, and a token names its document.
    let docs: Vec<Vec<i32>> = (0..40)
        .map(|d| (0..(d % 7)).map(|t| d * 100 + t).collect())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("shards")).unwrap();
    write_token_stream(&dir.path().join("shards/a.arrow"), &docs[..25], 9);
    write_token_stream(&dir.path().join("shards/b.arrow"), &docs[25..], 4);
    let lengths: Vec<u64> = docs.iter().map(|d| d.len() as u64).collect();
    for path in [dir.path().join("shards"), dir.path().join("shards/a.arrow")] {
        let plain = open_with(&path, None, &options(&[("tokens", "input_ids")])).unwrap();
        assert_eq!(plain.document_lengths(), None);
        let opts = options(&[("tokens", "input_ids"), ("documents", "true")]);
        let s = open_with(&path, None, &opts).unwrap();
        let want = if path.is_dir() {
            &lengths[..]
        } else {
            &lengths[..25]
        };
        assert_eq!(s.document_lengths().as_deref(), Some(want));
    }
    let opts = options(&[("tokens", "input_ids"), ("documents", "true")]);
    let s = open_with(dir.path().join("shards"), None, &opts).unwrap();
    let stream = Arc::new(TokenStream::from_source(s, None).unwrap());
    let documents = Documents::of_stream(stream).unwrap();
    let seq_len = 5;
    let plan = DocumentPlan::new(documents.clone(), seq_len, 3, 1).unwrap();
    // The reference: the documents in document_order, empty ones left out, back to back.
    let order: Vec<u64> = document_order(3, 1, 40)
        .into_iter()
        .filter(|&d| d % 7 != 0)
        .collect();
    assert_eq!(plan.order(), order);
    let stream: Vec<i32> = order
        .iter()
        .flat_map(|&d| docs[d as usize].clone())
        .collect();
    assert_eq!(plan.num_windows(), (stream.len() as u64 - 1) / seq_len);
    for w in 0..plan.num_windows() {
        let mut dst = vec![0u8; 4 * (seq_len as usize + 1)];
        plan.read_window(w, &mut dst).unwrap();
        let got: Vec<i32> = dst
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let at = (w * seq_len) as usize;
        assert_eq!(got, stream[at..at + seq_len as usize + 1], "window {w}");
        let ids: Vec<u64> = got.iter().map(|&t| t as u64 / 100).collect();
        assert_eq!(plan.document_ids(w), ids, "window {w}");
    }
    let mut past = vec![0u8; 4 * 7];
    let e = documents.read_document(6, 0, &mut past).unwrap_err();
    assert!(e.to_string().contains("past its 6 tokens"), "{e}");
    let e = open_with(
        dir.path().join("shards"),
        None,
        &options(&[("columns", "input_ids"), ("documents", "true")]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("tokens or text column"), "{e}");
}

#[test]
fn a_table_without_columns_names_the_ones_records_can_hold() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.jsonl");
    std::fs::write(&path, "{\"x\": 1, \"s\": \"a\", \"v\": [0.5, 1]}\n").unwrap();
    let e = open_with(&path, None, &ReadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("column \"s\" holds a string"), "{e}");
    // A JSON line's keys are taken in name order.
    assert!(
        e.contains("name those to read: columns=[\"v\", \"x\"]"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    std::fs::write(&path, "{\"x\": 1, \"v\": [0.5, 1]}\n").unwrap();
    let s = open_with(&path, None, &ReadOptions::default()).unwrap();
    let names: Vec<&str> = s.columns().unwrap().iter().map(|c| &*c.name).collect();
    assert_eq!(names, ["v", "x"]);
}

/// A local file whose ranges read are kept, to see what a format asks for.
#[derive(Debug)]
struct Recorded {
    file: pinfeed_source::formats::FileRanges,
    asked: std::sync::Mutex<Vec<std::ops::Range<u64>>>,
}

impl pinfeed_source::formats::ByteRanges for Recorded {
    fn name(&self) -> &str {
        self.file.name()
    }

    fn size(&self) -> u64 {
        self.file.size()
    }

    fn read_ranges(&self, ranges: &[std::ops::Range<u64>]) -> pinfeed_source::Result<Vec<Vec<u8>>> {
        self.asked.lock().unwrap().extend(ranges.iter().cloned());
        self.file.read_ranges(ranges)
    }
}

/// Opens `path` by ranges with the format named `format`, reads every record, and returns
/// them with the ranges read.
fn by_ranges(
    path: &std::path::Path,
    format: &str,
    columns: &str,
) -> (Vec<u8>, Vec<std::ops::Range<u64>>) {
    use pinfeed_source::formats::{ByteRanges, FileRanges, OpenRanges, ALL};
    let (file, size) = pinfeed_source::open_regular(path).unwrap();
    let bytes = std::sync::Arc::new(Recorded {
        file: FileRanges::new(file, path, size),
        asked: Default::default(),
    });
    let read = options(&[("columns", columns)]);
    let format = ALL.iter().find(|f| f.name() == format).unwrap();
    let source = format
        .open_ranges(OpenRanges {
            bytes: bytes.clone(),
            options: &read,
        })
        .unwrap();
    let mut all = vec![0u8; source.num_records() as usize * source.layout().record_bytes()];
    source.read_records(0, &mut all).unwrap();
    let asked = bytes.asked.lock().unwrap().clone();
    assert!(asked.iter().all(|r| r.end <= bytes.size()));
    (all, asked)
}

/// A table of `id` (0..rows) after a wide column `pad` whose every byte is 0xA5.
fn padded(rows: usize) -> arrow_array::RecordBatch {
    use arrow_array::{FixedSizeListArray, Int64Array, UInt8Array};
    use std::sync::Arc;
    let item = Arc::new(arrow_schema::Field::new(
        "item",
        arrow_schema::DataType::UInt8,
        false,
    ));
    let pad = FixedSizeListArray::new(
        item,
        32,
        Arc::new(UInt8Array::from(vec![0xa5; rows * 32])),
        None,
    );
    arrow_array::RecordBatch::try_from_iter([
        ("pad", Arc::new(pad) as _),
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _,
        ),
    ])
    .unwrap()
}

fn ids(records: &[u8]) -> Vec<i64> {
    records
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn overlaps(a: &std::ops::Range<u64>, b: &std::ops::Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

#[test]
fn parquet_by_ranges_reads_its_footer_and_the_chunks_asked_for_only() {
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.parquet");
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(100))
        .build();
    let batch = padded(450);
    let mut w = ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let (records, asked) = by_ranges(&path, "parquet", "id");
    assert_eq!(ids(&records), (0..450).collect::<Vec<_>>());
    let file = std::fs::File::open(&path).unwrap();
    let meta = parquet::file::reader::FileReader::metadata(
        &parquet::file::serialized_reader::SerializedFileReader::new(file).unwrap(),
    )
    .clone();
    let size = std::fs::metadata(&path).unwrap().len();
    let footer_len = u32::from_le_bytes(
        std::fs::read(&path).unwrap()[size as usize - 8..][..4]
            .try_into()
            .unwrap(),
    ) as u64;
    let footer = size - 8 - footer_len..size;
    let chunk = |g: usize, c: usize| {
        let (start, len) = meta.row_group(g).column(c).byte_range();
        start..start + len
    };
    for g in 0..meta.num_row_groups() {
        let (pad, id) = (chunk(g, 0), chunk(g, 1));
        assert!(asked.contains(&id), "row group {g}: {asked:?}");
        assert!(
            !asked.iter().any(|r| overlaps(r, &pad)),
            "row group {g}: {asked:?}"
        );
    }
    let is_chunk = |r: &std::ops::Range<u64>| (0..meta.num_row_groups()).any(|g| *r == chunk(g, 1));
    assert!(asked
        .iter()
        .all(|r| is_chunk(r) || (r.start >= footer.start && r.end <= footer.end)));
}

#[test]
fn an_arrow_file_by_ranges_reads_the_buffers_asked_for_only() {
    use arrow_ipc::writer::{FileWriter, IpcWriteOptions};
    let dir = tempfile::tempdir().unwrap();
    for compression in [None, Some(arrow_ipc::CompressionType::LZ4_FRAME)] {
        let path = dir.path().join("a.arrow");
        let batch = padded(300);
        let write = IpcWriteOptions::default()
            .try_with_compression(compression)
            .unwrap();
        let file = std::fs::File::create(&path).unwrap();
        let mut w = FileWriter::try_new_with_options(file, &batch.schema(), write).unwrap();
        for start in (0..300).step_by(70) {
            w.write(&batch.slice(start, 70.min(300 - start))).unwrap();
        }
        w.finish().unwrap();
        let (records, asked) = by_ranges(&path, "arrow", "id");
        assert_eq!(ids(&records), (0..300).collect::<Vec<_>>());
        if compression.is_none() {
            // Every run of the pad column's bytes is left unread.
            let bytes = std::fs::read(&path).unwrap();
            let mut at = 0;
            while let Some(n) = bytes[at..]
                .windows(64)
                .position(|w| w.iter().all(|&b| b == 0xa5))
            {
                let start = (at + n) as u64;
                let end = start + bytes[at + n..].iter().take_while(|&&b| b == 0xa5).count() as u64;
                assert!(
                    !asked.iter().any(|r| overlaps(r, &(start..end))),
                    "{start}..{end}: {asked:?}"
                );
                at = end as usize;
            }
            assert!(at > 0, "no pad bytes found");
        }
    }
}
