"""TokenLoader over object storage: token objects uploaded with boto3 to a real S3-compatible
server on 127.0.0.1 (moto and SeaweedFS, each started and stopped here), read back as windows
byte-exact against numpy slicing at the same offsets, in order, across ranks, with resume, through
faults and the local cache; and the errors of what object storage does not serve.

The same tokens are also written to local disk: a TokenLoader on a URL must deliver exactly what
one on the local copy does, batch for batch.
"""

import io
from pathlib import Path

import numpy as np
import pytest
from s3_server import SECRET, SERVERS, FaultProxy, options, s3_client, start_server

import pinfeed

BUCKET = "pinfeed-tokens"
RNG = np.random.default_rng(20)
# nanoGPT's train.bin: uint16 tokens over the full range (the high bit included).
DATA = RNG.integers(0, 1 << 16, 20_000, dtype=np.uint16)
# A 1-D .npy of uint32 tokens above 2^16: its dtype comes from the header.
WIDE = RNG.integers(1 << 16, 1 << 32, 9_000, dtype=np.uint32)
# DATA in uneven shards: windows cross from one object into the next.
CUTS = [0, 6_001, 6_050, 13_500, 20_000]
MEGATRON = Path(__file__).resolve().parents[3] / "crates/source/tests/fixtures/megatron"

# name: (URL, dtype to give, the tokens it holds)
SOURCES = {
    "raw object": (f"s3://{BUCKET}/tok/train.bin", "uint16", DATA),
    "npy object": (f"s3://{BUCKET}/tok/wide.npy", None, WIDE),
    "glob of raw objects": (f"s3://{BUCKET}/shards/shard_*.bin", "uint16", DATA),
    "prefix of npy objects": (f"s3://{BUCKET}/npy/", None, DATA),
}

pytestmark = pytest.mark.usefixtures("no_launcher_env")


def npy_bytes(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def upload(s3):
    s3.create_bucket(Bucket=BUCKET)
    put = lambda key, body: s3.put_object(Bucket=BUCKET, Key=key, Body=body)  # noqa: E731
    put("tok/train.bin", DATA.tobytes())
    put("tok/wide.npy", npy_bytes(WIDE))
    put("tok/tiny.bin", DATA[:40].tobytes())
    for i, (a, b) in enumerate(zip(CUTS, CUTS[1:])):
        put(f"shards/shard_{i:03d}.bin", DATA[a:b].tobytes())
        put(f"npy/part-{i:03d}.npy", npy_bytes(DATA[a:b]))
    put("npy/readme.txt", b"not tokens")
    for ext in ("bin", "idx"):
        put(f"mega/uint16.{ext}", (MEGATRON / f"uint16.{ext}").read_bytes())


@pytest.fixture(scope="module", params=SERVERS)
def server(request):
    """Each test that takes it runs against both servers (:func:`s3_server.start_server`)."""
    up = start_server(request.param)
    upload(s3_client(up.endpoint, secret=SECRET))
    yield up
    up.stop()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """DATA on local disk, as the same shards."""
    d = tmp_path_factory.mktemp("tokens")
    for i, (a, b) in enumerate(zip(CUTS, CUTS[1:])):
        DATA[a:b].tofile(d / f"shard_{i:03d}.bin")
    return d


def token_loader(url, endpoint, seq_len, batch_size, store=None, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    kw.setdefault("num_threads", 2)
    store = options(endpoint, **(store or {}))
    return pinfeed.TokenLoader(url, seq_len, batch_size, storage_options=store, **kw)


def local_loader(path, seq_len, batch_size, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    kw.setdefault("token_dtype", "uint16")
    return pinfeed.TokenLoader(path, seq_len, batch_size, **kw)


def check_random_steps(loader, tokens, seq_len, epoch=0):
    """Every window of every step is ``tokens`` sliced at its offset; returns the steps."""
    steps = 0
    for step, (x, y) in enumerate(loader):
        assert x.shape == y.shape == (loader.batch_size, seq_len) and x.dtype == np.int64
        for k, o in enumerate(loader.offsets(step, epoch)):
            window = tokens[o : o + seq_len + 1].astype(np.int64)
            np.testing.assert_array_equal(x[k], window[:-1])
            np.testing.assert_array_equal(y[k], window[1:])
        steps += 1
    return steps


@pytest.mark.parametrize("kind", list(SOURCES))
def test_random_windows_match_numpy_slicing_at_their_offsets(server, kind):
    url, dtype, tokens = SOURCES[kind]
    loader = token_loader(url, server.endpoint, 64, 8, token_dtype=dtype, seed=3, steps=12)
    assert loader.num_tokens == len(tokens) and loader.token_dtype == tokens.dtype
    assert check_random_steps(loader, tokens, 64) == 12
    net = loader.stats()["network"]
    # The windows of a batch are fetched together, neighbours coalesced: at least a window's
    # bytes, in far fewer requests than windows (the objects are smaller than the coalescing
    # gap), none retried.
    assert 0 < net["requests"] < 12 * 8 and net["retries"] == 0, net
    assert net["bytes_fetched"] >= 65 * tokens.itemsize, net
    description = loader.stats()["reader_description"]
    assert description == "object store (ranged GETs of a batch's windows in flight together)"
    # The next epoch draws other windows, from the data opened once.
    assert check_random_steps(loader, tokens, 64, epoch=1) == 12


@pytest.mark.parametrize("kind", ["raw object", "glob of raw objects", "prefix of npy objects"])
def test_sequential_windows_in_order_equal_the_local_copy(server, local, kind):
    url, dtype, _ = SOURCES[kind]
    seq_len, b = 100, 7
    n = (len(DATA) - 1) // seq_len  # every window, each one token into the next
    loader = token_loader(url, server.endpoint, seq_len, b, token_dtype=dtype, sample="sequential")
    assert len(loader) == -(-n // b)
    got = [(x.copy(), y.copy()) for x, y in loader]
    x = np.concatenate([g[0] for g in got])
    y = np.concatenate([g[1] for g in got])
    # The last batch is padded from the start: the first n rows are every window, in order.
    for w in range(n):
        np.testing.assert_array_equal(x[w], DATA[w * seq_len : (w + 1) * seq_len])
        np.testing.assert_array_equal(y[w], DATA[w * seq_len + 1 : (w + 1) * seq_len + 1])
    here = local_loader(local, seq_len, b, sample="sequential")
    for (gx, gy), (wx, wy) in zip(got, here, strict=True):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


def test_shuffled_sequential_epochs_equal_the_local_copy(server, local):
    url, dtype, _ = SOURCES["glob of raw objects"]
    kw = dict(sample="sequential", shuffle=True, seed=11)
    remote = token_loader(url, server.endpoint, 50, 16, token_dtype=dtype, queue_depth=4, **kw)
    here = local_loader(local, 50, 16, **kw)
    for epoch in range(2):
        remote.set_epoch(epoch)
        here.set_epoch(epoch)
        for (gx, gy), (wx, wy) in zip(remote, here, strict=True):
            np.testing.assert_array_equal(gx, wx)
            np.testing.assert_array_equal(gy, wy)


def test_two_ranks_read_their_own_windows(server, local):
    url, dtype, _ = SOURCES["glob of raw objects"]
    seen = {}
    starts = []
    for rank in range(2):
        kw = dict(token_dtype=dtype, rank=rank, world_size=2)
        rnd = token_loader(url, server.endpoint, 32, 4, seed=7, steps=10, **kw)
        assert check_random_steps(rnd, DATA, 32) == 10
        for step in range(10):
            first = (step * 2 + rank) * 4
            assert not any(v in seen for v in range(first, first + 4))
            seen.update((v, rank) for v in range(first, first + 4))
        seq = token_loader(url, server.endpoint, 32, 4, sample="sequential", drop_last=True, **kw)
        here = local_loader(local, 32, 4, sample="sequential", drop_last=True, **kw)
        for (gx, _), (wx, _) in zip(seq, here, strict=True):
            np.testing.assert_array_equal(gx, wx)
            starts.extend(int(row[0]) << 16 | int(row[1]) for row in gx)
    assert sorted(seen) == list(range(10 * 2 * 4))
    # Sequential windows: each once over the ranks (drop_last leaves less than a step out).
    n = (len(DATA) - 1) // 32
    every = {int(DATA[w * 32]) << 16 | int(DATA[w * 32 + 1]) for w in range(n)}
    assert len(starts) == len(set(starts)) and set(starts) <= every
    assert len(every) - len(starts) < 2 * 4


@pytest.mark.parametrize("sample", ["random", "sequential"])
def test_resume_from_state_dict_equals_the_uninterrupted_run(server, sample):
    url, dtype, _ = SOURCES["raw object"]
    kw = dict(token_dtype=dtype, sample=sample, seed=4, queue_depth=2)
    if sample == "random":
        kw["steps"] = 12
    else:
        kw["shuffle"] = True
    whole = token_loader(url, server.endpoint, 40, 3, **kw)
    full = [x.copy() for _ in range(2) for x, _ in whole]  # two epochs
    first = token_loader(url, server.endpoint, 40, 3, **kw)
    it = iter(first)
    got = [next(it)[0].copy() for _ in range(5)]
    state = first.state_dict()
    first.close()
    assert (state["epoch"], state["batches_done"]) == (0, 5)
    assert SECRET not in repr(state) + repr(first) + repr(first.stats())
    second = token_loader(url, server.endpoint, 40, 3, **kw)
    second.load_state_dict(state)
    got += [x.copy() for x, _ in second]
    got += [x.copy() for x, _ in second]  # the next epoch follows
    assert len(got) == len(full)
    for a, b in zip(got, full):
        np.testing.assert_array_equal(a, b)


def test_the_listing_is_read_once_per_loader(server):
    # A shard added after the loader was made is not in its stream: every epoch cuts its
    # windows from the objects listed (and the headers read) when it was made.
    s3 = s3_client(server.endpoint, secret=SECRET)
    url = f"s3://{BUCKET}/grow/part-*.npy"
    s3.put_object(Bucket=BUCKET, Key="grow/part-0.npy", Body=npy_bytes(DATA[:5000]))
    loader = token_loader(url, server.endpoint, 16, 4, steps=3)
    try:
        s3.put_object(Bucket=BUCKET, Key="grow/part-1.npy", Body=npy_bytes(DATA[5000:]))
        for epoch in range(3):
            assert check_random_steps(loader, DATA[:5000], 16, epoch) == 3
            assert loader.num_tokens == 5000
        assert token_loader(url, server.endpoint, 16, 4, steps=3).num_tokens == len(DATA)
    finally:
        for key in ("grow/part-0.npy", "grow/part-1.npy"):
            s3.delete_object(Bucket=BUCKET, Key=key)


def test_the_cache_serves_later_epochs(server, tmp_path):
    url, dtype, tokens = SOURCES["raw object"]
    cache = tmp_path / "cache"
    kw = dict(token_dtype=dtype, steps=6, cache_dir=cache, cache_limit="1MiB")
    loader = token_loader(url, server.endpoint, 64, 8, **kw)
    assert check_random_steps(loader, tokens, 64) == 6
    # The object is one 8 MiB block or less: fetched once, then every window is a hit.
    assert check_random_steps(loader, tokens, 64, epoch=1) == 6
    net = loader.stats()["network"]
    assert net["cache_hits"] > 0 and net["cache_misses"] == 0, net
    assert net["requests"] == 0 and net["bytes_fetched"] == 0, net
    assert sum(p.stat().st_size for p in cache.iterdir()) <= 1 << 20


def test_503_slowdown_and_cut_bodies_are_retried_and_windows_delivered_once(server):
    proxy = FaultProxy(server.port)
    try:
        url, dtype, tokens = SOURCES["glob of raw objects"]
        loader = token_loader(url, proxy.endpoint, 64, 8, token_dtype=dtype, steps=4, seed=2)
        proxy.inject("503", "cut", "503", "cut")
        assert check_random_steps(loader, tokens, 64) == 4
        assert proxy.injected == 4
        assert loader.stats()["network"]["retries"] == 4
    finally:
        proxy.close()


def refused(match, *args, cls=pinfeed.PinfeedValueError, **kw):
    """The message of the one-line error ``token_loader(*args, **kw)`` raises."""
    with pytest.raises(cls) as e:
        token_loader(*args, **kw)
    msg = str(e.value)
    assert match in msg and "\n" not in msg and SECRET not in msg, msg
    return msg


def test_bad_token_data_is_a_one_line_error_naming_the_url(server):
    end = server.endpoint
    raw = f"s3://{BUCKET}/tok/train.bin"
    assert "needs its token dtype" in refused(raw, raw, end, 64, 8, steps=2)
    tiny = f"s3://{BUCKET}/tok/tiny.bin"  # 40 tokens
    msg = refused(tiny, tiny, end, 64, 8, token_dtype="uint16", steps=2)
    assert "longer than the 40 tokens" in msg, msg
    msg = refused(tiny, tiny, end, 64, 8, token_dtype="uint16", sample="sequential")
    assert "longer than the 40 tokens" in msg, msg
    wide = f"s3://{BUCKET}/tok/wide.npy"
    assert "uint32" in refused(wide, wide, end, 64, 8, token_dtype="uint16", steps=2)
    absent = f"s3://{BUCKET}/tok/absent.bin"
    refused(absent, absent, end, 64, 8, token_dtype="uint16", steps=2, cls=OSError)


def test_megatron_bin_reads_as_raw_tokens_and_its_index_is_refused(server):
    end = server.endpoint
    tokens = np.load(MEGATRON / "uint16_tokens.npy")
    bin_url = f"s3://{BUCKET}/mega/uint16.bin"
    seq = token_loader(
        bin_url, end, 8, 2, token_dtype="uint16", sample="sequential", drop_last=True
    )
    xs = np.concatenate([x for x, _ in seq])
    assert len(xs) == (len(tokens) - 1) // 8 // 2 * 2
    for w, row in enumerate(xs):
        np.testing.assert_array_equal(row, tokens[w * 8 : w * 8 + 8])
    msg = refused(bin_url, bin_url, end, 8, 2, token_dtype="uint16", sample="documents")
    assert "documents sampling needs a Megatron .bin/.idx pair on local disk" in msg, msg
    idx = f"s3://{BUCKET}/mega/uint16.idx"
    msg = refused(idx, idx, end, 8, 2, steps=2)
    assert "a Megatron index is read from local disk only" in msg, msg


def test_store_options_for_a_local_path_are_refused(tmp_path):
    path = tmp_path / "train.bin"
    DATA[:1000].tofile(path)
    refused = {
        "storage_options": {"region": "x"},
        "cache_dir": tmp_path / "cache",
        "cache_limit": "1GiB",
    }
    for key, value in refused.items():
        with pytest.raises(pinfeed.PinfeedValueError, match="apply to object-storage URLs"):
            local_loader(path, 16, 4, steps=1, **{key: value})
    with pytest.raises(pinfeed.PinfeedValueError, match="queue_depth applies to token data"):
        local_loader(path, 16, 4, steps=1, queue_depth=8)
    loader = local_loader(path, 16, 4, steps=1)
    list(loader)
    assert loader.stats()["network"] is None
