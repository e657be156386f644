"""Tables as records (issue 50): Parquet and Arrow IPC files written by pyarrow, and JSON lines,
read by ``Loader(source, columns=[...])`` (or without ``columns``: all of them) into dicts of
batches, one array per column; token and text columns read by ``TokenLoader(column=...)``, their
rows as documents with ``sample="documents"``."""

import gzip
import json

import numpy as np
import pytest
from resume_helpers import elastic_resume

import pinfeed
from pinfeed import _pinfeed

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = 50


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    """Text tokens are kept in each test's folder, not the user's cache."""
    monkeypatch.setenv("PINFEED_CACHE_DIR", str(tmp_path / "cache"))


# Every column type records take: (name, arrow type, numpy dtype, row shape).
TAKEN = [
    ("id", pa.int64(), np.int64, ()),
    ("i8", pa.int8(), np.int8, ()),
    ("i16", pa.int16(), np.int16, ()),
    ("i32", pa.int32(), np.int32, ()),
    ("u8", pa.uint8(), np.uint8, ()),
    ("u16", pa.uint16(), np.uint16, ()),
    ("u32", pa.uint32(), np.uint32, ()),
    ("u64", pa.uint64(), np.uint64, ()),
    ("f16", pa.float16(), np.float16, ()),
    ("f32", pa.float32(), np.float32, ()),
    ("f64", pa.float64(), np.float64, ()),
    ("flag", pa.bool_(), np.bool_, ()),
    ("vec", pa.list_(pa.float32(), 3), np.float32, (3,)),
    ("img", pa.list_(pa.list_(pa.uint8(), 2), 3), np.uint8, (3, 2)),
]


def column_values(rng, dtype, shape, rows):
    size = (rows, *shape)
    if dtype is np.bool_:
        return rng.random(size) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
    return rng.standard_normal(size).astype(dtype)


def arrow_column(values, arrow_type):
    if values.ndim == 1:
        return pa.array(values, type=arrow_type)
    flat = pa.array(values.reshape(-1), type=_leaf(arrow_type))
    for n in reversed(values.shape[1:]):
        flat = pa.FixedSizeListArray.from_arrays(flat, n)
    return flat.cast(arrow_type)


def _leaf(t):
    while pa.types.is_fixed_size_list(t):
        t = t.value_type
    return t


def make_table(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    arrays, expected = {}, {}
    for name, arrow_type, dtype, shape in TAKEN:
        values = (
            np.arange(rows, dtype=np.int64)
            if name == "id"
            else column_values(rng, dtype, shape, rows)
        )
        arrays[name] = arrow_column(values, arrow_type)
        expected[name] = values
    arrays["text"] = pa.array([f"row {i}" for i in range(rows)])
    arrays["ragged"] = pa.array(
        [list(range(i % 4)) for i in range(rows)], type=pa.list_(pa.int32())
    )
    return pa.table(arrays), expected


def pyarrow_read(table, name, dtype, shape):
    """pyarrow's own read of a column, as an array of the row shape."""
    column = table.column(name).combine_chunks()
    while pa.types.is_fixed_size_list(column.type):
        column = column.flatten()
    values = column.to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=dtype).reshape((len(table), *shape))


def read_all(loader):
    batches = list(loader)
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


NAMES = [name for name, *_ in TAKEN]


def check_equal(got, table):
    for name, _, dtype, shape in TAKEN:
        want = pyarrow_read(table, name, dtype, shape)
        assert got[name].dtype == np.dtype(dtype), name
        assert got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)


@pytest.fixture
def parquet_file(tmp_path):
    table, _ = make_table()
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=7, compression="snappy")
    return path, table


def test_parquet_columns_in_order_equal_pyarrows_read(parquet_file):
    path, table = parquet_file
    loader = pinfeed.Loader(path, 8, device="cpu", columns=NAMES)
    assert loader.num_samples == ROWS
    batches = list(loader)
    assert [len(b["id"]) for b in batches] == [8] * 6 + [2]
    assert list(batches[0]) == NAMES
    check_equal(read_all(pinfeed.Loader(path, 8, device="cpu", columns=NAMES)), table)


@pytest.mark.parametrize("names", [["vec"], ["f64"], ["img"], ["f32", "u8", "vec", "f64"]])
def test_parquet_one_column_and_blocks_of_many_equal_pyarrows_read(tmp_path, names):
    # One column filling the record is copied whole; several are packed a block of records
    # at a time: row groups of several decoded batches, and blocks cut mid-group.
    rows = 70_000
    table, _ = make_table(rows, seed=4)
    path = tmp_path / "big.parquet"
    pq.write_table(table.select(names), path, row_group_size=50_000)
    loader = pinfeed.Loader(path, 4096, device="cpu", columns=names, num_threads=3)
    got = read_all(loader)
    for name, _, dtype, shape in (t for t in TAKEN if t[0] in names):
        want = pyarrow_read(table, name, dtype, shape)
        np.testing.assert_array_equal(got[name], want, err_msg=name)


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_parquet_shuffled_gives_every_row_once(parquet_file, shuffle):
    path, table = parquet_file
    got = read_all(pinfeed.Loader(path, 8, device="cpu", columns=NAMES, shuffle=shuffle, seed=5))
    assert sorted(got["id"].tolist()) == list(range(ROWS))
    assert got["id"].tolist() != list(range(ROWS))
    order = np.argsort(got["id"])
    check_equal({k: v[order] for k, v in got.items()}, table)


def test_block_shuffle_blocks_are_row_groups(parquet_file):
    path, _ = parquet_file
    loader = pinfeed.Loader(path, 8, device="cpu", columns=["id"], shuffle="block")
    assert loader.block_size == 7


@pytest.mark.parametrize("codec", ["zstd", "gzip", "lz4", "none"])
def test_parquet_codecs_and_a_directory_of_files(tmp_path, codec):
    table, _ = make_table()
    for i, part in enumerate([table.slice(0, 20), table.slice(20)]):
        pq.write_table(part, tmp_path / f"part-{i}.parquet", row_group_size=9, compression=codec)
    check_equal(read_all(pinfeed.Loader(tmp_path, 16, device="cpu", columns=NAMES)), table)
    glob = read_all(pinfeed.Loader(tmp_path / "part-*.parquet", 16, device="cpu", columns=["id"]))
    assert glob["id"].tolist() == list(range(ROWS))


@pytest.mark.parametrize("kind", ["file", "stream"])
def test_arrow_ipc_file_and_stream(tmp_path, kind):
    table, _ = make_table()
    path = tmp_path / "data-00000-of-00001.arrow"
    new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with new(path, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=11):
            writer.write_batch(batch)
    check_equal(read_all(pinfeed.Loader(path, 8, device="cpu", columns=NAMES)), table)
    got = read_all(pinfeed.Loader(path, 8, device="cpu", columns=["id"], shuffle=True))
    assert sorted(got["id"].tolist()) == list(range(ROWS))


@pytest.mark.parametrize(
    "column, says",
    [
        ("text", 'column "text" is text'),
        ("ragged", 'column "ragged" is a variable-size list'),
        ("nope", 'no column "nope"; the columns are "id"'),
    ],
)
def test_refused_columns_are_named(parquet_file, column, says):
    path, _ = parquet_file
    with pytest.raises(pinfeed.PinfeedValueError, match=str(path)) as e:
        pinfeed.Loader(path, 8, device="cpu", columns=["id", column])
    assert says in str(e.value)
    assert "\n" not in str(e.value)


def test_nulls_are_refused_naming_column_and_row_group(tmp_path):
    path = tmp_path / "n.parquet"
    values = [float(i) for i in range(20)]
    values[15] = None
    pq.write_table(pa.table({"x": values}), path, row_group_size=7)
    with pytest.raises(pinfeed.PinfeedValueError) as e:
        pinfeed.Loader(path, 4, device="cpu", columns=["x"])
    assert f'{path}, row group 2: column "x" holds 1 nulls' in str(e.value)


def test_corrupt_parquet_is_named(tmp_path, parquet_file):
    path, _ = parquet_file
    data = bytearray(path.read_bytes())
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data[:-12]) + b"\0\0\0\0\0\0\0\0PAR1")
    with pytest.raises(pinfeed.PinfeedValueError, match="bad.parquet: not a readable Parquet file"):
        pinfeed.Loader(bad, 4, device="cpu", columns=["id"])
    # A page whose bytes are garbled: named with its row group when it is read.
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(1).column(0)
    start = chunk.data_page_offset
    data[start + 20 : start + 40] = b"\xff" * 20
    bad.write_bytes(bytes(data))
    with pytest.raises(pinfeed.PinfeedError, match="bad.parquet, row group 1"):
        list(pinfeed.Loader(bad, 4, device="cpu", columns=["id"]))


def test_json_lines_equal_json_loads(tmp_path):
    rng = np.random.default_rng(1)
    rows = [
        {
            "id": i,
            "score": float(rng.standard_normal()),
            "emb": rng.integers(-5, 5, 4).tolist(),
            "ok": bool(i % 2),
        }
        for i in range(30)
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    plain = tmp_path / "a.jsonl"
    plain.write_text(text)
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        got = read_all(pinfeed.Loader(path, 7, device="cpu", columns=["emb", "id", "score", "ok"]))
        want = [json.loads(line) for line in text.splitlines()]
        assert got["id"].dtype == np.int64 and got["score"].dtype == np.float64
        assert got["emb"].shape == (30, 4) and got["ok"].dtype == np.bool_
        assert got["id"].tolist() == [w["id"] for w in want]
        assert got["score"].tolist() == [w["score"] for w in want]
        assert got["emb"].tolist() == [w["emb"] for w in want]
        assert got["ok"].tolist() == [w["ok"] for w in want]


def test_malformed_json_line_named_or_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"x": 1}\n{"x": 2\n{"x": 3}\n')
    with pytest.raises(pinfeed.PinfeedValueError, match=r"m\.jsonl:2: malformed JSON"):
        pinfeed.Loader(path, 2, device="cpu", columns=["x"])
    loader = pinfeed.Loader(path, 2, device="cpu", columns=["x"], on_error="skip")
    assert read_all(loader)["x"].tolist() == [1, 3]
    assert "1 malformed lines skipped" in loader.stats()["reader_description"]


def token_docs(n=60, seed=2):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50000, int(rng.integers(1, 40))).tolist() for _ in range(n)]


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_token_column_is_a_document_stream(tmp_path, kind):
    docs = token_docs()
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32())), "n": list(range(60))})
    if kind == "parquet":
        path = tmp_path / "tok.parquet"
        pq.write_table(table, path, row_group_size=13)
    else:
        path = tmp_path / "tok.arrow"
        with pa.ipc.new_stream(path, table.schema) as w:
            for b in table.to_batches(max_chunksize=17):
                w.write_batch(b)
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
    seq_len = 16
    loader = pinfeed.TokenLoader(
        path, seq_len, 3, column="input_ids", sample="sequential", device="cpu"
    )
    assert loader.num_tokens == len(flat)
    windows = (len(flat) - 1) // seq_len
    got = [np.asarray(x) for x, _ in loader]
    xs = np.concatenate(got)
    assert xs.shape == (windows, seq_len)
    for w in range(windows):
        np.testing.assert_array_equal(xs[w], flat[w * seq_len : (w + 1) * seq_len])
    # Random windows: every window's tokens are a run of the concatenation.
    rand = pinfeed.TokenLoader(path, seq_len, 4, column="input_ids", steps=5, device="cpu", seed=1)
    for step, (x, _) in enumerate(rand):
        for row, start in zip(np.asarray(x), rand.offsets(step, epoch=0)):
            np.testing.assert_array_equal(row, flat[start : start + seq_len])


def test_token_column_must_be_lists_of_integers(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0], "s": [[1.5], [2.0]]}), path)
    with pytest.raises(pinfeed.PinfeedValueError, match='column "x" has type Float64; a token'):
        pinfeed.TokenLoader(path, 4, 1, column="x", device="cpu")
    with pytest.raises(pinfeed.PinfeedValueError, match='column "s" holds lists of Float64'):
        pinfeed.TokenLoader(path, 4, 1, column="s", device="cpu")


WORDS = "the a cat dog sat on mat über naïve café 東京 data loader token window pinned".split()


def make_texts(n=70, seed=3):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(1, 25)))) for _ in range(n)]


@pytest.fixture(scope="module")
def trained_tokenizer(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def train_tokenizer(path):
    """A byte-level BPE trained here by the Python tokenizers package, saved as JSON at
    ``path``; returns it and ``path``."""
    tk = pytest.importorskip("tokenizers")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(make_texts(200, seed=9), trainer)
    tok.save(str(path))
    return tok, path


def text_loader(path, tokenizer, **kw):
    args = dict(column="text", tokenizer=tokenizer, eos_token="<|endoftext|>", device="cpu")
    return pinfeed.TokenLoader(path, 16, 3, **{**args, **kw})


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_text_windows_equal_encode_batch_with_eos(tmp_path, trained_tokenizer, kind):
    tok, tok_path = trained_tokenizer
    texts = make_texts()
    if kind == "parquet":
        path = tmp_path / "text.parquet"
        pq.write_table(
            pa.table({"text": texts, "n": list(range(len(texts)))}), path, row_group_size=9
        )
    else:
        path = tmp_path / "text.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    eos = tok.token_to_id("<|endoftext|>")
    flat = np.concatenate([e.ids + [eos] for e in tok.encode_batch(texts)]).astype(np.int64)
    # The end-of-text token by name, or (JSON lines) by its id.
    special = "<|endoftext|>" if kind == "parquet" else eos
    loader = text_loader(path, tok_path, sample="sequential", eos_token=special)
    assert loader.num_tokens == len(flat)
    steps = list(loader)
    x = np.concatenate([s[0] for s in steps])
    y = np.concatenate([s[1] for s in steps])
    windows = (len(flat) - 1) // 16
    assert x.shape == (windows, 16)
    for w in range(windows):
        np.testing.assert_array_equal(x[w], flat[w * 16 : w * 16 + 16])
        np.testing.assert_array_equal(y[w], flat[w * 16 + 1 : w * 16 + 17])
    for x, _, seg, pos, cu in steps:
        for row in range(x.shape[0]):
            # A new document after each eos: segment ids count them, positions restart.
            after_eos = np.concatenate([[False], x[row, :-1] == eos])
            np.testing.assert_array_equal(np.diff(seg[row]), after_eos[1:].astype(np.int32))
            assert seg[row, 0] == 0
            starts = np.flatnonzero(np.concatenate([[True], after_eos[1:]]))
            want_pos = np.arange(16) - starts[np.searchsorted(starts, np.arange(16), "right") - 1]
            np.testing.assert_array_equal(pos[row], want_pos)
        flat_pos = pos.reshape(-1)
        np.testing.assert_array_equal(cu, np.append(np.flatnonzero(flat_pos == 0), flat_pos.size))
        assert cu.dtype == np.int32


@pytest.mark.gpu
@pytest.mark.parametrize("sample", ["sequential", "documents"])
def test_text_steps_on_cuda_equal_the_host_steps(tmp_path, trained_tokenizer, torch, sample):
    # Packed on a stream of pinfeed's, which the consumer's stream waits for: each step's
    # tensors equal the host's, read on the consumer's stream after more work is queued there.
    _, tok_path = trained_tokenizer
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": make_texts(60)}), path, row_group_size=7)
    host = list(text_loader(path, tok_path, sample=sample))
    busy = torch.randn(2048, 2048, device="cuda")
    for want, got in zip(host, text_loader(path, tok_path, sample=sample, device="cuda")):
        busy = busy @ busy / 2048  # work on the consumer's stream between steps
        assert [t.device.type for t in got] == ["cuda"] * 5
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g.cpu().numpy(), w)
    assert len(host) == len(list(text_loader(path, tok_path, sample=sample, device="cuda")))


def test_text_resume_is_exact(tmp_path, trained_tokenizer):
    _, tok_path = trained_tokenizer
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": make_texts(120)}), path, row_group_size=10)
    whole = [s[0] for s in text_loader(path, tok_path, sample="sequential", shuffle=True, seed=4)]
    first = text_loader(path, tok_path, sample="sequential", shuffle=True, seed=4)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    resumed = text_loader(path, tok_path, sample="sequential", shuffle=True, seed=4)
    resumed.load_state_dict(state)
    rest = [s[0] for s in resumed]
    assert len(rest) == len(whole) - 5
    for a, b in zip(rest, whole[5:]):
        np.testing.assert_array_equal(a, b)


def test_a_tokenizer_that_does_not_load_is_named(tmp_path, parquet_file):
    path, _ = parquet_file
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": 3}')
    with pytest.raises(pinfeed.PinfeedValueError) as e:
        pinfeed.TokenLoader(path, 8, 1, column="text", tokenizer=bad, device="cpu")
    assert f"{bad}: cannot load the tokenizer" in str(e.value)
    assert "\n" not in str(e.value)


def test_text_elastic_resume_from_two_ranks_to_one(tmp_path, trained_tokenizer):
    """Two ranks stop after three steps; one rank resumes from their merged state and
    delivers exactly the windows neither had received."""
    _, tok_path = trained_tokenizer
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": make_texts(150)}), path, row_group_size=10)

    def make(rank, world):
        return text_loader(
            path, tok_path, sample="sequential", shuffle=True, seed=2, rank=rank, world_size=world
        )

    whole = np.concatenate([s[0] for s in make(0, 1)])
    seen, states = [], []
    for rank in (0, 1):
        loader = make(rank, 2)
        it = iter(loader)
        seen += [next(it)[0] for _ in range(3)]
        states.append(loader.state_dict())
    resumed = make(0, 1)
    resumed.load_state_dict(pinfeed.merge_states(states))
    rest = [s[0] for s in resumed]
    got = np.concatenate(seen + rest)
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, whole.tolist()))


def test_columns_as_torch_tensors_view_the_batch(parquet_file):
    torch = pytest.importorskip("torch")
    path, table = parquet_file
    loader = pinfeed.Loader(path, 8, device="cpu", framework="torch", columns=NAMES)
    batches = list(loader)
    assert isinstance(batches[0]["vec"], torch.Tensor)
    assert batches[0]["img"].shape == (8, 3, 2) and batches[0]["u16"].dtype == torch.uint16
    got = {k: np.concatenate([b[k].numpy() for b in batches]) for k in NAMES}
    check_equal(got, table)


@pytest.mark.parametrize("column", ["input_ids", "text"])
def test_one_window_torch_batches_of_documents_equal_numpys(tmp_path, trained_tokenizer, column):
    # A documents record is its tokens then its segment ids (65 × 8 + 65 × 2 = 650 bytes for
    # int64 ids): the last batch holds one window, which torch calls contiguous whatever its
    # row stride, and viewing its bytes as int64 must still work.
    pytest.importorskip("torch")
    tok, tok_path = trained_tokenizer
    texts = make_texts(40)
    ids = [e.ids for e in tok.encode_batch(texts)]
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": texts, "input_ids": ids}), path, row_group_size=9)
    kw = dict(column=column, sample="documents", device="cpu")
    if column == "text":
        kw.update(tokenizer=tok_path, eos_token="<|endoftext|>")
    windows = sum(len(x) for x, *_ in pinfeed.TokenLoader(path, 64, 4, **kw))
    assert windows >= 3
    want = list(pinfeed.TokenLoader(path, 64, windows - 1, **kw))
    got = list(pinfeed.TokenLoader(path, 64, windows - 1, framework="torch", **kw))
    assert [len(w[0]) for w in want] == [windows - 1, 1]
    assert len(got) == len(want)
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_array_equal(b.numpy(), a)


@pytest.mark.gpu
def test_columns_on_cuda_equal_pyarrows_read(parquet_file, torch):
    path, table = parquet_file
    for shuffle in (False, "block"):
        batches = list(pinfeed.Loader(path, 8, device="cuda", columns=NAMES, shuffle=shuffle))
        assert batches[0]["vec"].is_cuda
        got = {k: np.concatenate([b[k].cpu().numpy() for b in batches]) for k in NAMES}
        order = np.argsort(got["id"])
        check_equal({k: v[order] for k, v in got.items()}, table)


def test_token_column_takes_token_dtype_and_its_old_spelling(tmp_path):
    path = tmp_path / "tok.parquet"
    docs = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10, 11]]
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.uint16()))}), path)
    flat = np.concatenate([np.asarray(d) for d in docs])
    # The stored width, when given, must be the column's.
    with pytest.raises(pinfeed.PinfeedValueError, match="holds uint16 tokens but uint32"):
        pinfeed.TokenLoader(path, 4, 1, column="input_ids", token_dtype="uint32", device="cpu")

    def windows(**kw):
        loader = pinfeed.TokenLoader(
            path, 4, 1, column="input_ids", sample="sequential", device="cpu", **kw
        )
        return loader, np.concatenate([x for x, _ in loader])

    loader, xs = windows(token_dtype="uint16")
    assert loader.token_dtype == np.uint16 and loader.dtype == "int64"
    np.testing.assert_array_equal(xs.ravel(), flat[: xs.size])
    with pytest.warns(pinfeed.PinfeedDeprecationWarning, match="token_dtype"):
        old, old_xs = windows(dtype="uint16")
    assert old.token_dtype == np.uint16
    np.testing.assert_array_equal(old_xs, xs)


def test_table_arguments_of_the_wrong_type_or_place_are_refused(parquet_file, tmp_path):
    path, _ = parquet_file
    with pytest.raises(pinfeed.PinfeedTypeError, match="columns must be a list of column names"):
        pinfeed.Loader(path, 8, device="cpu", columns=[3])
    with pytest.raises(pinfeed.PinfeedTypeError, match="column must name a table's column"):
        pinfeed.TokenLoader(path, 8, 1, column=3, device="cpu")
    with pytest.raises(pinfeed.PinfeedTypeError, match="give column= too"):
        pinfeed.TokenLoader(path, 8, 1, tokenizer=tmp_path / "t.json", device="cpu")
    with pytest.raises(pinfeed.PinfeedTypeError, match="tokenizer must be the path"):
        pinfeed.TokenLoader(path, 8, 1, column="text", tokenizer=5, device="cpu")
    with pytest.raises(pinfeed.PinfeedValueError, match="on_error option .* parquet files"):
        pinfeed.Loader(path, 8, device="cpu", on_error="skip")
    with pytest.raises(pinfeed.PinfeedValueError, match="dtype and shape do not apply"):
        pinfeed.Loader(path, 8, device="cpu", columns=["id"], dtype="f32")
    with pytest.raises(pinfeed.PinfeedValueError, match="a transform does not apply"):
        pinfeed.Loader(
            path, 8, device="cpu", columns=["id"], transform=pinfeed.transforms.ToFloat()
        )
    with pytest.raises(pinfeed.PinfeedValueError, match="cache_dir given for a local path"):
        pinfeed.Loader(path, 8, device="cpu", columns=["id"], cache_dir=tmp_path)
    with pytest.raises(pinfeed.PinfeedValueError, match="cache_dir given for a local path"):
        pinfeed.TokenLoader(path, 8, 1, column="id", cache_dir=tmp_path, device="cpu")
    with pytest.raises(pinfeed.PinfeedValueError, match="bos_token and eos_token apply"):
        pinfeed.TokenLoader(path, 8, 1, column="id", eos_token=0, device="cpu")
    with pytest.raises(pinfeed.PinfeedValueError, match='on_error=.oops.: expected "raise"'):
        pinfeed.Loader(path, 8, device="cpu", columns=["id"], on_error="oops")


def test_gpu_resident_shuffle_of_columns_gives_dicts_every_row_once(parquet_file):
    path, table = parquet_file
    loader = pinfeed.Loader(path, 8, device="cpu", columns=["id", "vec"], shuffle="gpu", seed=4)
    batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == sorted(table.column("id").to_pylist())
    vec = pyarrow_read(table, "vec", np.float32, (3,))
    by_id = dict(zip(table.column("id").to_pylist(), vec))
    for b in batches:
        for i, v in zip(b["id"], b["vec"]):
            np.testing.assert_array_equal(v, by_id[int(i)])


def test_a_column_of_a_mixture_is_refused(parquet_file):
    path, _ = parquet_file
    with pytest.raises(pinfeed.PinfeedValueError, match="read one table"):
        pinfeed.TokenLoader({"a": path, "b": path}, 8, 1, column="id", device="cpu")


def test_a_table_without_columns_reads_every_column(tmp_path, parquet_file):
    table, _ = make_table()
    numeric = table.select(NAMES)
    path = tmp_path / "numeric.parquet"
    pq.write_table(numeric, path, row_group_size=9)
    arrow = tmp_path / "numeric.arrow"
    with pa.ipc.new_file(arrow, numeric.schema) as w:
        w.write_table(numeric)
    for source in (path, arrow):
        batches = list(pinfeed.Loader(source, 8, device="cpu"))
        assert list(batches[0]) == NAMES  # the file's columns, in its order
        check_equal({k: np.concatenate([b[k] for b in batches]) for k in NAMES}, numeric)
    lines = tmp_path / "rows.jsonl"
    lines.write_text('{"x": 1, "y": [0.5, 2]}\nnot json\n{"x": 3, "y": [1, 4]}\n')
    got = read_all(pinfeed.Loader(lines, 2, device="cpu", on_error="skip"))
    assert got["x"].tolist() == [1, 3] and got["y"].tolist() == [[0.5, 2.0], [1.0, 4.0]]
    # A column records cannot hold is named, with the columns that can be read.
    with pytest.raises(pinfeed.PinfeedValueError) as e:
        pinfeed.Loader(parquet_file[0], 8, device="cpu")
    message = str(e.value)
    assert 't.parquet: column "text" is text' in message and "\n" not in message, message
    assert "columns=[" + ", ".join(f'"{n}"' for n in NAMES) + "]" in message, message
    with pytest.raises(pinfeed.PinfeedValueError, match="a transform does not apply"):
        pinfeed.Loader(path, 8, device="cpu", transform=pinfeed.transforms.ToFloat())


def write_token_table(tmp_path, docs, kind):
    """``docs`` as the ``input_ids`` column of a Parquet file, an Arrow IPC stream, or a
    directory of two Parquet files; returns the path and pyarrow's read of the column."""
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})
    if kind == "arrow":
        path = tmp_path / "tok.arrow"
        with pa.ipc.new_stream(path, table.schema) as w:
            for b in table.to_batches(max_chunksize=17):
                w.write_batch(b)
        read = pa.ipc.open_stream(path).read_all()
    elif kind == "parquet":
        path = tmp_path / "tok.parquet"
        pq.write_table(table, path, row_group_size=13)
        read = pq.read_table(path)
    else:
        path = tmp_path / "tok"
        path.mkdir()
        half = len(docs) // 2
        pq.write_table(table.slice(0, half), path / "part-0.parquet", row_group_size=11)
        pq.write_table(table.slice(half), path / "part-1.parquet", row_group_size=11)
        read = pa.concat_tables([pq.read_table(f) for f in sorted(path.iterdir())])
    return path, read.column("input_ids").to_pylist()


def chunk_rows(path):
    """Rows in each chunk of a table as pinfeed cuts it: Parquet row groups and Arrow record
    batches, the files of a directory in name order."""
    rows = []
    for f in sorted(path.iterdir()) if path.is_dir() else [path]:
        if f.suffix == ".parquet":
            meta = pq.ParquetFile(f).metadata
            rows += [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        else:
            rows += [b.num_rows for b in pa.ipc.open_stream(f)]
    return rows


def row_group_order(docs, rows, seed, epoch, width=4):
    """The rows (documents) of chunks of ``rows`` rows in their row-group-aware order of
    ``(seed, epoch)``: groups of shuffled chunks within half the chunk cache, decoded at
    ``width`` bytes a token (Rust's rule, ``_pinfeed.chunk_order``)."""
    ends = np.cumsum(rows)
    tokens = [sum(len(d) for d in docs[e - n : e]) for n, e in zip(rows, ends)]
    budget = _pinfeed.table_cache_limit() // 2
    return _pinfeed.chunk_order(seed, epoch, rows, [t * width for t in tokens], budget)


def documents_reference(docs, order, seq_len):
    """``sample="documents"`` built from the documents as read: those with tokens in ``order``,
    back to back, cut every ``seq_len`` tokens; each window's ``x``, ``y`` and the segment ids
    of its inputs (the ordinal of their document in the window)."""
    order = [d for d in order if docs[d]]
    stream = np.concatenate([np.asarray(docs[d], dtype=np.int64) for d in order])
    owner = np.concatenate([np.full(len(docs[d]), d) for d in order])
    n = (len(stream) - 1) // seq_len
    starts = np.arange(n)[:, None] * seq_len + np.arange(seq_len)[None, :]
    x, y, own = stream[starts], stream[starts + 1], owner[starts]
    changes = (own[:, 1:] != own[:, :-1]).cumsum(axis=1)
    segment_ids = np.concatenate([np.zeros((n, 1), np.int64), changes], axis=1)
    return order, x, y, segment_ids


@pytest.mark.parametrize("kind", ["parquet", "arrow", "directory"])
def test_token_column_documents_equal_the_reference_concatenation(tmp_path, kind):
    docs = token_docs(80, seed=5)
    docs[3] = docs[41] = []  # empty documents are left out
    path, read = write_token_table(tmp_path, docs, kind)
    assert read == docs
    seq_len = 16
    for seed in (0, 7):
        loader = pinfeed.TokenLoader(
            path, seq_len, 4, column="input_ids", sample="documents", seed=seed, device="cpu"
        )
        for epoch in (0, 1):  # each iteration runs the next epoch, in its own order
            rows = row_group_order(read, chunk_rows(path), seed, epoch)
            order, x, y, segment_ids = documents_reference(read, rows, seq_len)
            assert sorted(order) == [d for d in range(len(read)) if read[d]]
            steps = list(loader)
            assert all(len(step) == 3 for step in steps)
            assert loader.num_samples == len(x)
            got = [np.concatenate([step[k] for step in steps]) for k in range(3)]
            assert got[0].dtype == np.int64 and got[2].dtype == np.int32
            for have, want in zip(got, (x, y, segment_ids)):
                np.testing.assert_array_equal(have, want)
    with pytest.raises(pinfeed.PinfeedValueError, match="longer than the .* tokens") as e:
        pinfeed.TokenLoader(path, 5000, 1, column="input_ids", sample="documents", device="cpu")
    assert path.name in str(e.value)


def test_token_column_documents_resume_exactly_after_any_step(tmp_path):
    path, _ = write_token_table(tmp_path, token_docs(50, seed=6), "parquet")

    def make():
        return pinfeed.TokenLoader(
            path,
            8,
            3,
            column="input_ids",
            sample="documents",
            shuffle=True,
            seed=3,
            device="cpu",
            num_threads=2,
        )

    whole = make()
    full = list(whole) + list(whole)  # two epochs
    per_epoch = len(full) // 2
    for k in range(per_epoch):
        first = make()
        it = iter(first)
        got = [next(it) for _ in range(k)]
        state = first.state_dict()
        assert (state["epoch"], state["batches_done"]) == (0, k)
        resumed = make()
        resumed.load_state_dict(state)
        got += list(resumed)
        got += list(resumed)  # the next epoch follows
        assert len(got) == len(full), k
        for a, b in zip(got, full):
            for have, want in zip(a, b):
                np.testing.assert_array_equal(have, want)


@pytest.mark.parametrize("w_from,w_to", [(1, 2), (2, 3), (3, 2), (3, 1)])
def test_token_column_documents_resume_elastically(tmp_path, w_from, w_to):
    path, read = write_token_table(tmp_path, token_docs(90, seed=8), "arrow")
    opts = dict(column="input_ids", sample="documents", shuffle=True, seed=1, device="cpu")

    def ranks(world):
        return [
            pinfeed.TokenLoader(path, 4, 3, rank=r, world_size=world, num_threads=2, **opts)
            for r in range(world)
        ]

    def windows(b):
        return [(*x, *s) for x, s in zip(b[0].tolist(), b[2].tolist())]

    head, tail, whole = elastic_resume(ranks, windows, w_from, w_to)
    n = (sum(map(len, read)) - 1) // 4 - len(head)  # windows before the last step's pad
    assert head + tail[:n] == whole[: len(head) + n]


def test_text_column_documents_follow_the_rows(tmp_path, trained_tokenizer):
    tok, tok_path = trained_tokenizer
    texts = make_texts(60, seed=4)
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=7)
    eos = tok.token_to_id("<|endoftext|>")
    encoded = [e.ids + [eos] for e in tok.encode_batch(pq.read_table(path)["text"].to_pylist())]
    loader = text_loader(path, tok_path, sample="documents", seed=5)
    steps = list(loader)
    order = row_group_order(encoded, chunk_rows(path), 5, 0)
    _, x, y, segment_ids = documents_reference(encoded, order, 16)
    got = [np.concatenate([step[k] for step in steps]) for k in range(3)]
    for have, want in zip(got, (x, y, segment_ids)):
        np.testing.assert_array_equal(have, want)
    for _, _, seg, pos, cu in steps:
        # Positions restart at each document of the window (and at its start).
        first = np.maximum.accumulate(np.where(np.diff(seg, prepend=-1) != 0, np.arange(16), 0), 1)
        np.testing.assert_array_equal(pos, np.arange(16) - first)
        flat = pos.reshape(-1)
        np.testing.assert_array_equal(cu, np.append(np.flatnonzero(flat == 0), flat.size))


@pytest.fixture
def token_cache(tmp_path, monkeypatch):
    """A chunk cache that keeps no chunk but the one being read: every read after the count
    comes from the text tokens kept on disk (the folder returned) or a new tokenization."""
    monkeypatch.setenv("PINFEED_CHUNK_CACHE_BYTES", "1")
    return tmp_path / "cache" / "text-tokens"


def text_reference(tok, texts):
    eos = tok.token_to_id("<|endoftext|>")
    return np.concatenate([e.ids + [eos] for e in tok.encode_batch(texts)]).astype(np.int64)


def assert_windows(loader, flat):
    x = np.concatenate([s[0] for s in loader])
    want = np.lib.stride_tricks.sliding_window_view(flat[:-1], 16)[::16][: len(x)]
    assert len(x) == (len(flat) - 1) // 16
    np.testing.assert_array_equal(x, want)


def test_text_larger_than_the_chunk_cache_is_tokenized_once(
    tmp_path, trained_tokenizer, token_cache
):
    tok, tok_path = trained_tokenizer
    texts = make_texts(300, seed=11)
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=20)
    flat = text_reference(tok, texts)
    before = _pinfeed.tokenized_rows()
    loader = text_loader(path, tok_path, sample="sequential", shuffle=True, seed=1)
    want = sorted(map(tuple, np.lib.stride_tricks.sliding_window_view(flat[:-1], 16)[::16]))
    for _ in range(2):  # two epochs, each in its own order
        x = np.concatenate([s[0] for s in loader])
        assert sorted(map(tuple, x)) == want
    assert loader.stats()["tokenized_rows"] - before == len(texts)
    # A later loader of the unchanged file reads every token from disk.
    assert_windows(text_loader(path, tok_path, sample="sequential"), flat)
    assert _pinfeed.tokenized_rows() - before == len(texts)
    assert len(list(token_cache.iterdir())) == 1


def test_a_changed_text_file_is_tokenized_again(tmp_path, trained_tokenizer, token_cache):
    tok, tok_path = trained_tokenizer
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": make_texts(100, seed=1)}), path, row_group_size=30)
    assert_windows(
        text_loader(path, tok_path, sample="sequential"),
        text_reference(tok, make_texts(100, seed=1)),
    )
    texts = make_texts(90, seed=2)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=30)
    before = _pinfeed.tokenized_rows()
    assert_windows(text_loader(path, tok_path, sample="sequential"), text_reference(tok, texts))
    assert _pinfeed.tokenized_rows() - before == len(texts)


def test_text_without_the_token_cache_is_tokenized_again_alike(
    tmp_path, trained_tokenizer, token_cache, monkeypatch
):
    monkeypatch.setenv("PINFEED_TEXT_CACHE_BYTES", "0")
    tok, tok_path = trained_tokenizer
    texts = make_texts(200, seed=5)
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=25)
    before = _pinfeed.tokenized_rows()
    assert_windows(text_loader(path, tok_path, sample="sequential"), text_reference(tok, texts))
    # The count, then a row group again each time a read finds the one-chunk cache without it.
    assert _pinfeed.tokenized_rows() - before > len(texts)
    assert not token_cache.exists()


def test_a_large_row_group_split_among_threads_equals_encode_batch(
    tmp_path, trained_tokenizer, token_cache
):
    """A row group of more text than one thread tokenizes (256 KiB) is split by rows."""
    tok, tok_path = trained_tokenizer
    texts = make_texts(8000, seed=6)
    assert sum(len(t.encode()) for t in texts) > 256 << 10
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=len(texts))
    assert_windows(text_loader(path, tok_path, sample="sequential"), text_reference(tok, texts))
