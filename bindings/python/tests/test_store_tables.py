"""Tables in object storage (issue 50): Parquet, Arrow IPC and JSON lines uploaded with boto3 to a
real S3-compatible server on 127.0.0.1 (moto and SeaweedFS, each started and stopped here) read
as records of columns, as a token column and as a text column tokenized, batch for batch as
from the same files on local disk; the byte ranges the server received (counted by a proxy in
front of it) are the footer and the chunks of the columns asked for, and nothing else.
"""

import gzip
import io
import json
import re

import numpy as np
import pytest
from s3_server import SECRET, SERVERS, FaultProxy, options, s3_client, start_server
from test_tables import NAMES, make_table, make_texts, token_docs, train_tokenizer

import pinfeed

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

BUCKET = "pinfeed-tables"
PAD = 0xA5  # every byte of the IPC file's column not asked for

pytestmark = pytest.mark.usefixtures("no_launcher_env")


def parquet_bytes(table, **kw):
    buf = io.BytesIO()
    pq.write_table(table, buf, **kw)
    return buf.getvalue()


def ipc_bytes(table, kind, chunk):
    buf = io.BytesIO()
    new = pa.ipc.new_file if kind == "file" else pa.ipc.new_stream
    with new(buf, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=chunk):
            writer.write_batch(batch)
    return buf.getvalue()


def padded_table(rows=300):
    """``id`` beside a wide column ``pad`` of :data:`PAD` bytes, which no read may fetch."""
    pad = np.full((rows, 32), PAD, dtype=np.uint8)
    flat = pa.array(pad.reshape(-1), type=pa.uint8())
    return pa.table(
        {
            "pad": pa.FixedSizeListArray.from_arrays(flat, 32),
            "id": np.arange(rows, dtype=np.int64),
        }
    )


def objects():
    """Object key -> bytes: what is uploaded, and written to local disk too."""
    table, _ = make_table()
    texts = make_texts()
    docs = token_docs()
    tokens = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32())), "n": range(60)})
    jsonl = "".join(
        json.dumps({"id": i, "x": [i, -i], "text": t}) + "\n" for i, t in enumerate(texts)
    )
    good = parquet_bytes(table, row_group_size=9)
    return {
        "tables/part-0.parquet": parquet_bytes(table.slice(0, 20), row_group_size=9),
        "tables/part-1.parquet": parquet_bytes(table.slice(20), row_group_size=9),
        "tables/readme.txt": b"not a table",
        "one/t.parquet": good,
        "ipc/data.arrow": ipc_bytes(table, "file", 11),
        "ipc/data.arrows": ipc_bytes(table, "stream", 11),
        "ipc/padded.arrow": ipc_bytes(padded_table(), "file", 70),
        "json/rows.jsonl.gz": gzip.compress(jsonl.encode()),
        "tok/tok.parquet": parquet_bytes(tokens, row_group_size=13),
        "text/text.parquet": parquet_bytes(pa.table({"text": texts}), row_group_size=9),
        "bad/bad.parquet": good[:-12] + b"\0\0\0\0\0\0\0\0PAR1",
    }


OBJECTS = objects()


@pytest.fixture(scope="module", params=SERVERS)
def server(request):
    """Each test that takes it runs against both servers (:func:`s3_server.start_server`)."""
    up = start_server(request.param)
    s3 = s3_client(up.endpoint, secret=SECRET)
    s3.create_bucket(Bucket=BUCKET)
    for key, body in OBJECTS.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The same objects as files, under the same names."""
    root = tmp_path_factory.mktemp("tables")
    for key, body in OBJECTS.items():
        (root / key).parent.mkdir(exist_ok=True)
        (root / key).write_bytes(body)
    return root


@pytest.fixture
def proxy(server):
    """A proxy in front of the server that sees every request."""
    up = FaultProxy(server.port)
    yield up
    up.close()


def records(source, endpoint=None, **kw):
    """Every batch of ``Loader(source, columns=...)``, each a dict of arrays."""
    if endpoint is not None:
        kw["storage_options"] = options(endpoint)
    kw.setdefault("columns", NAMES)
    return [dict(b) for b in pinfeed.Loader(source, 8, device="cpu", num_threads=2, **kw)]


def assert_same_batches(got, want):
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert list(g) == list(w)
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=name)


@pytest.mark.parametrize(
    "where, kw",
    [
        ("tables/", {}),
        ("tables/part-*.parquet", {"shuffle": "block", "seed": 3}),
        ("one/t.parquet", {"shuffle": True, "seed": 4}),
        ("ipc/data.arrow", {}),
        ("ipc/data.arrows", {}),
        ("json/rows.jsonl.gz", {"columns": ["x", "id"]}),
        ("ipc/padded.arrow", {"columns": None}),
    ],
)
def test_records_equal_the_same_tables_on_local_disk(server, local, where, kw):
    got = records(f"s3://{BUCKET}/{where}", server.endpoint, **kw)
    assert_same_batches(got, records(str(local / where), **kw))


def fetched(proxy, key):
    """The byte ranges of ``key`` the server was asked for by ranged GETs, merged."""
    return merged(r for kind, path, r in proxy.seen if kind == "GET" and path.endswith("/" + key))


def merged(ranges):
    out = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def parquet_ranges(body, wanted):
    """From pyarrow's metadata of the Parquet file ``body``: its footer (the metadata, its
    length and the magic), the byte ranges of the column chunks of ``wanted`` in every row
    group, and those of the other columns."""
    meta = pq.ParquetFile(io.BytesIO(body)).metadata
    footer = (len(body) - meta.serialized_size - 8, len(body))
    asked, others = [], []
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            chunk = meta.row_group(g).column(c)
            start = chunk.dictionary_page_offset or chunk.data_page_offset
            span = (start, start + chunk.total_compressed_size)
            (asked if chunk.path_in_schema.split(".")[0] in wanted else others).append(span)
    return footer, asked, others


def assert_fetched_only(proxy, key, wanted):
    """The server was asked for the footer of ``key`` and its chunks of ``wanted``, all of
    them, and for nothing of any other column."""
    footer, asked, others = parquet_ranges(OBJECTS[key], wanted)
    got = fetched(proxy, key)
    assert got == merged([footer, *asked])
    for start, end in others:
        for a, b in got:
            assert b <= start or a >= end, f"{key}: fetched {a}..{b} of a column not asked for"


def test_only_the_footer_and_the_chunks_of_the_columns_asked_for_are_fetched(server, proxy):
    key = "one/t.parquet"
    got = records(f"s3://{BUCKET}/{key}", proxy.endpoint, columns=["i16", "vec"])
    assert np.concatenate([b["vec"] for b in got]).shape == (50, 3)
    assert_fetched_only(proxy, key, ["i16", "vec"])


def test_an_arrow_file_fetches_only_the_buffers_of_the_columns_asked_for(server, proxy):
    key = "ipc/padded.arrow"
    got = records(f"s3://{BUCKET}/{key}", proxy.endpoint, columns=["id"])
    assert np.concatenate([b["id"] for b in got]).tolist() == list(range(300))
    body = OBJECTS[key]
    pads = [m.span() for m in re.finditer(rb"\xa5{64,}", body)]
    assert len(pads) == 5  # the column not asked for, in each record batch
    ranges = fetched(proxy, key)
    assert ranges[-1][1] == len(body)  # the footer
    for start, end in pads:
        for a, b in ranges:
            assert b <= start or a >= end, f"fetched {a}..{b} of the column not asked for"


@pytest.mark.parametrize("sample", ["sequential", "documents"])
def test_a_token_column_equals_local_disk_and_fetches_only_its_chunks(server, proxy, local, sample):
    key = "tok/tok.parquet"

    def windows(source, **kw):
        loader = pinfeed.TokenLoader(
            source, 16, 3, column="input_ids", sample=sample, seed=2, device="cpu", **kw
        )
        return [np.asarray(step[0]) for step in loader]

    got = windows(f"s3://{BUCKET}/{key}", storage_options=options(proxy.endpoint))
    want = windows(str(local / key))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert_fetched_only(proxy, key, ["input_ids"])


@pytest.mark.parametrize("key", ["text/text.parquet", "json/rows.jsonl.gz"])
def test_a_text_column_tokenized_equals_local_disk(server, local, tmp_path, key):
    _, tok_path = train_tokenizer(tmp_path / "tokenizer.json")

    def steps(source, **kw):
        loader = pinfeed.TokenLoader(
            source,
            16,
            3,
            column="text",
            tokenizer=tok_path,
            eos_token="<|endoftext|>",
            sample="sequential",
            device="cpu",
            **kw,
        )
        return [tuple(np.asarray(a) for a in step) for step in loader]

    got = steps(f"s3://{BUCKET}/{key}", storage_options=options(server.endpoint))
    want = steps(str(local / key))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "key, columns, says",
    [
        ("bad/bad.parquet", ["id"], "not a readable Parquet file"),
        ("one/t.parquet", ["id", "nope"], 'no column "nope"; the columns are "id"'),
        ("ipc/data.arrow", ["nope"], 'no column "nope"; the columns are "id"'),
    ],
)
def test_a_corrupt_footer_or_a_missing_column_names_the_object(server, key, columns, says):
    with pytest.raises(pinfeed.PinfeedValueError) as e:
        records(f"s3://{BUCKET}/{key}", server.endpoint, columns=columns)
    message = str(e.value)
    assert message.startswith(f"s3://{BUCKET}/{key}: {says}"), message
    assert "\n" not in message and SECRET not in message


def test_faults_are_retried_and_the_cache_serves_the_next_loader(server, proxy, local, tmp_path):
    want = records(str(local / "tables"))
    proxy.inject("503", "cut", "503")
    url = f"s3://{BUCKET}/tables/"
    assert_same_batches(records(url, proxy.endpoint, cache_dir=tmp_path), want)
    assert proxy.injected == 3
    gets = sum(kind == "GET" for kind, *_ in proxy.seen)
    assert_same_batches(records(url, proxy.endpoint, cache_dir=tmp_path), want)
    assert sum(kind == "GET" for kind, *_ in proxy.seen) == gets  # every range from the cache
