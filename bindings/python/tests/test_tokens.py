"""pinfeed.TokenLoader: token windows against numpy slicing, determinism, sharding, resume,
Megatron fixtures written by megatron-core's own builder, document segment ids, bad input."""

from pathlib import Path

import numpy as np
import pytest

import pinfeed
from pinfeed import TokenLoader, _pinfeed

MEGATRON = Path(__file__).resolve().parents[3] / "crates/source/tests/fixtures/megatron"


def cpu_loader(path, seq_len, batch_size, **kw):
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return TokenLoader(path, seq_len, batch_size, device="cpu", **kw)


@pytest.fixture
def train_bin(tmp_path):
    """nanoGPT's train.bin: 5000 random uint16 tokens (the full range, high bit included)."""
    data = np.random.default_rng(1).integers(0, 1 << 16, 5000, dtype=np.uint16)
    path = tmp_path / "train.bin"
    data.tofile(path)
    return path, data


def test_random_windows_match_numpy_slicing_at_their_offsets(train_bin):
    path, data = train_bin
    loader = cpu_loader(path, 64, 8, token_dtype="uint16", seed=3, steps=40)
    assert len(loader) == 40 and loader.num_tokens == 5000
    offsets = []
    for step, (x, y) in enumerate(loader):
        assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype == np.int64
        off = loader.offsets(step)
        offsets.extend(off)
        for k, o in enumerate(off):
            window = data[o : o + 65].astype(np.int64)
            np.testing.assert_array_equal(x[k], window[:-1])
            np.testing.assert_array_equal(y[k], window[1:])
    assert step == 39
    offsets = np.array(offsets)
    # In range, and roughly uniform: 320 draws over 4936 offsets, each quarter near 80.
    assert offsets.min() >= 0 and offsets.max() <= 5000 - 64 - 1
    counts = np.histogram(offsets, bins=4, range=(0, 5000 - 64))[0]
    assert all(40 < c < 120 for c in counts), counts


@pytest.mark.parametrize("world", [2, 3])
def test_random_steps_on_every_rank_read_their_own_windows(train_bin, world):
    # Several steps share a pinned slot (the source numbers the loader's records for it): each
    # rank's step must still hold exactly the windows of its offsets, with 10 steps not a
    # multiple of the steps a slot carries, and the ranks' windows of a step never the same.
    path, data = train_bin
    seen = {}
    for rank in range(world):
        loader = cpu_loader(
            path, 32, 4, token_dtype="uint16", seed=7, steps=10, rank=rank, world_size=world
        )
        assert loader._group > 1 and 10 % loader._group != 0
        steps = list(loader)
        assert len(steps) == len(loader) == 10
        for step, (x, _) in enumerate(steps):
            off = loader.offsets(step)
            for k, o in enumerate(off):
                np.testing.assert_array_equal(x[k], data[o : o + 32].astype(np.int64))
            first = (step * world + rank) * 4
            assert not any(v in seen for v in range(first, first + 4))
            seen.update((v, rank) for v in range(first, first + 4))
    assert sorted(seen) == list(range(10 * world * 4))


def test_random_offsets_follow_the_documented_rule(train_bin):
    path, _ = train_bin
    loader = cpu_loader(path, 16, 4, token_dtype="uint16", seed=9, steps=3)
    # Step i on rank r of world w reads windows (i*w + r)*B .. of token_offsets.
    got = _pinfeed.token_offsets(9, 0, 5000 - 16, 8, 4)
    np.testing.assert_array_equal(loader.offsets(2), got)
    two = [
        cpu_loader(path, 16, 2, token_dtype="uint16", seed=9, rank=r, world_size=2) for r in (0, 1)
    ]
    np.testing.assert_array_equal(np.concatenate([t.offsets(2) for t in two]), got)


def test_random_is_deterministic_in_seed_and_endless_without_steps(train_bin):
    path, _ = train_bin

    def first(seed, n=5, **kw):
        it = iter(cpu_loader(path, 32, 4, token_dtype="uint16", seed=seed, **kw))
        return np.stack([next(it)[0] for _ in range(n)])

    np.testing.assert_array_equal(first(1), first(1))
    assert not np.array_equal(first(1), first(2))
    endless = cpu_loader(path, 32, 4, token_dtype="uint16")
    with pytest.raises(TypeError, match="endless"):
        len(endless)
    # The stream with steps is the endless one cut short.
    np.testing.assert_array_equal(first(1), first(1, steps=5))


def test_random_epochs_differ_and_set_epoch_repeats_one(train_bin):
    path, _ = train_bin
    loader = cpu_loader(path, 16, 4, token_dtype="uint16", steps=3)
    e0 = [x for x, _ in loader]
    e1 = [x for x, _ in loader]
    assert not np.array_equal(np.stack(e0), np.stack(e1))
    loader.set_epoch(0)
    np.testing.assert_array_equal(np.stack([x for x, _ in loader]), np.stack(e0))


def test_windows_cross_file_boundaries_in_a_directory(tmp_path):
    data = np.arange(300, dtype=np.uint32) * 70001  # values above 2^16
    for i, (a, b) in enumerate([(0, 37), (37, 38), (38, 200), (200, 300)]):
        data[a:b].tofile(tmp_path / f"shard_{i}.bin")
    loader = cpu_loader(tmp_path, 20, 16, token_dtype="uint32", steps=20, seed=5)
    for step, (x, y) in enumerate(loader):
        for k, o in enumerate(loader.offsets(step)):
            np.testing.assert_array_equal(x[k], data[o : o + 20])
            np.testing.assert_array_equal(y[k], data[o + 1 : o + 21])
    seq = cpu_loader(tmp_path, 20, 5, token_dtype="uint32", sample="sequential", drop_last=True)
    xs = np.concatenate([x for x, _ in seq])
    want = np.stack([data[w * 20 : w * 20 + 20] for w in range(len(xs))])
    np.testing.assert_array_equal(xs, want)


def test_sequential_windows_and_int32(train_bin):
    path, data = train_bin
    loader = cpu_loader(path, 100, 7, token_dtype="uint16", sample="sequential", dtype="int32")
    n = (5000 - 101) // 100 + 1
    assert len(loader) == -(-n // 7)
    rows = [(x, y) for x, y in loader]
    x = np.concatenate([r[0] for r in rows])
    y = np.concatenate([r[1] for r in rows])
    assert x.dtype == np.int32 and x.shape[1] == 100
    # drop_last=False pads the last batch from the start: the first n rows are every window.
    for w in range(n):
        np.testing.assert_array_equal(x[w], data[w * 100 : w * 100 + 100])
        np.testing.assert_array_equal(y[w], data[w * 100 + 1 : w * 100 + 101])


@pytest.mark.parametrize("world", [2, 3])
def test_sequential_shards_cover_every_window_once(train_bin, world):
    path, data = train_bin
    n = (5000 - 33) // 32 + 1
    per_rank = []
    for shuffle in (False, True):
        seen = []
        for r in range(world):
            loader = cpu_loader(
                path,
                32,
                4,
                token_dtype="uint16",
                sample="sequential",
                shuffle=shuffle,
                rank=r,
                world_size=world,
                drop_last=True,
            )
            rows = np.concatenate([x for x, _ in loader])
            per_rank.append(len(rows))
            seen.extend(int(row[0]) * 65536 + int(row[1]) for row in rows)
        starts = {int(data[w * 32]) * 65536 + int(data[w * 32 + 1]) for w in range(n)}
        assert len(seen) == len(set(seen)) and set(seen) <= starts
        assert len(starts) - len(seen) < world * 4  # drop_last leaves less than one step out
    assert len(set(per_rank)) == 1


def take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("sample", ["random", "sequential"])
def test_resume_equals_the_uninterrupted_run(train_bin, sample):
    path, _ = train_bin
    kw = dict(token_dtype="uint16", sample=sample, seed=4)
    if sample == "random":
        kw["steps"] = 12
    whole = cpu_loader(path, 40, 3, **kw)
    full = [x for _ in range(2) for x, _ in whole]  # two epochs
    first = cpu_loader(path, 40, 3, **kw)
    it = iter(first)
    got = [x for x, _ in take(it, 5)]
    state = first.state_dict()
    assert (state["epoch"], state["batches_done"]) == (0, 5)
    assert state["tokens"]["sample"] == sample
    second = cpu_loader(path, 40, 3, **kw)
    second.load_state_dict(state)
    got += [x for x, _ in second]
    got += [x for x, _ in second]  # the next epoch follows
    assert len(got) == len(full)
    for a, b in zip(got, full):
        np.testing.assert_array_equal(a, b)
    other = cpu_loader(path, 41, 3, **kw)
    with pytest.raises(pinfeed.PinfeedValueError, match="seq_len 40"):
        other.load_state_dict(state)


def test_megatron_fixtures_sequential_and_random():
    for name in ("uint16", "int32"):
        tokens = np.load(MEGATRON / f"{name}_tokens.npy")
        loader = cpu_loader(MEGATRON / f"{name}.bin", 8, 2, sample="sequential", drop_last=True)
        assert loader.token_dtype == np.dtype(name) and loader.num_tokens == len(tokens)
        xs = np.concatenate([x for x, _ in loader])
        for w, row in enumerate(xs):
            np.testing.assert_array_equal(row, tokens[w * 8 : w * 8 + 8])
        rnd = cpu_loader(MEGATRON / f"{name}.idx", 8, 2, steps=3)
        for step, (x, y) in enumerate(rnd):
            for k, o in enumerate(rnd.offsets(step)):
                np.testing.assert_array_equal(x[k], tokens[o : o + 8])
                np.testing.assert_array_equal(y[k], tokens[o + 1 : o + 9])


def whole(stream, docs, seq_len, a, b):
    """Whether stream[a:b] is whole documents; a change at a window's first token is not in
    the inputs' ids, so a piece may hold several, split at such a token."""
    if tuple(stream[a:b]) in docs:
        return True
    return any(
        tuple(stream[a:p]) in docs and whole(stream, docs, seq_len, p, b)
        for p in range(a + 1, b)
        if p % seq_len == 0
    )


def test_megatron_documents_segment_ids_follow_the_documents():
    for name in ("uint16", "int32"):
        tokens = np.load(MEGATRON / f"{name}_tokens.npy")
        lengths = np.load(MEGATRON / f"{name}_document_lengths.npy")
        ends = np.cumsum(lengths)
        docs = [tuple(tokens[e - n : e]) for n, e in zip(lengths, ends)]
        seq_len = 5
        loader = cpu_loader(MEGATRON / name, seq_len, 2, sample="documents", seed=1)
        batches = list(loader)
        assert all(len(b) == 3 for b in batches)
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
        ids = np.concatenate([b[2] for b in batches])
        assert ids.dtype == np.int32 and ids.shape == x.shape
        n = (int(lengths.sum()) - 1) // seq_len
        x, y, ids = x[:n], y[:n], ids[:n]  # past n: padding from the start
        # The windows' stream (consecutive windows share a token), and where its documents
        # change inside each window's inputs, from the segment ids.
        np.testing.assert_array_equal(y[:-1, -1], x[1:, 0])
        stream = np.concatenate([x.reshape(-1), y[-1, -1:]])
        cuts = [0]
        for w in range(n):
            steps = np.diff(ids[w])
            assert ids[w, 0] == 0 and set(steps.tolist()) <= {0, 1}
            cuts += [w * seq_len + int(i) + 1 for i in np.flatnonzero(steps)]
        cuts.append(len(stream))

        pieces = list(zip(cuts, cuts[1:]))
        for a, b in pieces[:-1]:
            assert whole(stream, docs, seq_len, a, b), (a, b, stream[a:b])
        # The last piece is cut by the end of the windows: the start of documents.
        a, b = pieces[-1]
        assert any(
            all(stream[a + i] == t for i, t in enumerate(d[: b - a])) for d in docs
        ) or whole(stream, docs, seq_len, a, b)
        # Shuffled: seed 1 does not keep the stored order.
        assert not np.array_equal(stream, tokens[: len(stream)])
        other = cpu_loader(MEGATRON / name, seq_len, 2, sample="documents", seed=1)
        np.testing.assert_array_equal(np.concatenate([b[0] for b in other])[:n], x)
        next_epoch = np.concatenate([b[0] for b in other])[:n]
        assert not np.array_equal(next_epoch, x)


def test_bad_input_is_one_line_naming_the_file(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 7)
    cases = [
        (odd, dict(token_dtype="uint16"), "odd.bin", "multiple"),
        (odd, {}, "odd.bin", "dtype"),
        (odd, dict(token_dtype="float32"), "odd.bin", "integers"),
    ]
    short = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(short)
    cases.append((short, dict(token_dtype="uint16"), "short.bin", "longer than the 10 tokens"))
    cases.append((short, dict(token_dtype="uint16", sample="documents"), "short.bin", "Megatron"))
    idx = (MEGATRON / "uint16.idx").read_bytes()
    bin_ = (MEGATRON / "uint16.bin").read_bytes()
    for label, data, b, what in [
        ("magic", b"XXIDIDX\0\0" + idx[9:], bin_, "magic"),
        ("version", idx[:9] + (2).to_bytes(8, "little") + idx[17:], bin_, "version"),
        ("dtype", idx[:17] + b"\x06" + idx[18:], bin_, "dtype"),
        ("truncated", idx, bin_[:-4], "runs past"),
    ]:
        prefix = tmp_path / label
        prefix.with_suffix(".idx").write_bytes(data)
        prefix.with_suffix(".bin").write_bytes(b)
        cases.append((prefix.with_suffix(".bin"), {}, f"{label}.idx", what))
    for path, kw, names, what in cases:
        with pytest.raises(pinfeed.PinfeedError) as e:
            cpu_loader(path, 16, 2, **kw)
        message = str(e.value)
        assert names in message and "\n" not in message, message
        if what is not None:
            assert what in message, message
    # One document of 70 002 uint16 tokens, in megatron-core's .idx layout.
    long = tmp_path / "long"
    np.zeros(70_002, dtype=np.uint16).tofile(long.with_suffix(".bin"))
    header = b"MMIDIDX\0\0" + (1).to_bytes(8, "little") + bytes([8])
    counts = (1).to_bytes(8, "little") + (2).to_bytes(8, "little")
    index = np.array([70_002], "<i4").tobytes() + np.array([0], "<i8").tobytes()
    long.with_suffix(".idx").write_bytes(
        header + counts + index + np.array([0, 1], "<i8").tobytes()
    )
    cpu_loader(long, 65_534, 1, sample="documents")
    with pytest.raises(pinfeed.PinfeedValueError, match="long.idx.*at most 65535"):
        cpu_loader(long, 65_535, 1, sample="documents")
    with pytest.raises(pinfeed.PinfeedValueError, match="unknown sample"):
        cpu_loader(short, 4, 1, token_dtype="uint16", sample="shuffled")


@pytest.mark.gpu
def test_cuda_x_y_are_int64_and_match_numpy_on_any_stream(torch, train_bin):
    path, data = train_bin
    loader = TokenLoader(path, 128, 6, token_dtype="uint16", steps=4, device="cuda")
    side = torch.cuda.Stream()
    for step, (x, y) in enumerate(loader):
        assert x.is_cuda and x.dtype == torch.int64 and x.shape == (6, 128) and x.is_contiguous()
        assert y.dtype == torch.int64 and y.shape == (6, 128) and y.is_contiguous()
        off = loader.offsets(step)
        want = np.stack([data[o : o + 129] for o in off]).astype(np.int64)
        np.testing.assert_array_equal(x.cpu().numpy(), want[:, :-1])
        np.testing.assert_array_equal(y.cpu().numpy(), want[:, 1:])
    with torch.cuda.stream(side):
        loader.set_epoch(0)
        for step, (x, y) in enumerate(loader):
            want = np.stack([data[o : o + 129] for o in loader.offsets(step)]).astype(np.int64)
            side.synchronize()
            np.testing.assert_array_equal(x.cpu().numpy(), want[:, :-1])
            np.testing.assert_array_equal(y.cpu().numpy(), want[:, 1:])
    for name in ("uint16", "int32"):
        docs = TokenLoader(MEGATRON / name, 5, 2, sample="documents", device="cuda", dtype="int32")
        host = TokenLoader(MEGATRON / name, 5, 2, sample="documents", device="cpu")
        for (x, y, s), (hx, hy, hs) in zip(docs, host):
            assert x.dtype == torch.int32 and s.dtype == torch.int32
            np.testing.assert_array_equal(x.cpu().numpy(), hx)
            np.testing.assert_array_equal(y.cpu().numpy(), hy)
            np.testing.assert_array_equal(s.cpu().numpy(), hs)


@pytest.mark.skipif(pinfeed.cuda_device_count() > 0, reason="a CUDA device is present")
def test_the_host_fallback_warning_names_the_callers_line(train_bin, monkeypatch):
    from pinfeed import _options as options_module

    monkeypatch.setattr(options_module, "_warned_host_fallback", False)
    with pytest.warns(pinfeed.PinfeedWarning, match='device="auto"') as caught:
        TokenLoader(train_bin[0], 16, 2, token_dtype="uint16", steps=2)
    assert [w.filename for w in caught] == [__file__]


@pytest.mark.parametrize("sample", ["random", "sequential"])
def test_a_state_of_other_tokens_of_the_same_size_is_refused(tmp_path, sample):
    kw = dict(token_dtype="uint16", sample=sample, **({"steps": 6} if sample == "random" else {}))
    tokens = np.random.default_rng(5).integers(0, 1 << 16, 5000, dtype=np.uint16)
    (tmp_path / "a").mkdir()
    tokens.tofile(tmp_path / "a" / "train.bin")
    (tokens[::-1]).tofile(tmp_path / "b.bin")  # the same size, other tokens
    tokens[:1234].tofile(tmp_path / "a" / "part-0.bin")  # the same tokens in two files
    tokens[1234:].tofile(tmp_path / "a" / "part-1.bin")
    saved = cpu_loader(tmp_path / "a" / "train.bin", 16, 2, **kw)
    it = iter(saved)
    take(it, 3)
    state = saved.state_dict()
    other = cpu_loader(tmp_path / "b.bin", 16, 2, **kw)
    with pytest.raises(pinfeed.PinfeedValueError, match="source_fingerprint"):
        other.load_state_dict(state)
    # The same tokens under another name, or cut into other files, are the same data.
    following = next(it)[0]
    for same in (str(tmp_path / "a" / "part-*.bin"), tmp_path / "a" / "train.bin"):
        again = cpu_loader(same, 16, 2, **kw)
        again.load_state_dict(state)
        np.testing.assert_array_equal(next(iter(again))[0], following)


@pytest.mark.parametrize(
    "stored, big, out",
    [("uint32", 2**31, "int32"), ("uint32", 2**32 - 1, "int32"), ("uint64", 2**63, "int64")],
)
def test_tokens_the_output_type_cannot_hold_are_an_error_naming_them(tmp_path, stored, big, out):
    data = np.arange(3000, dtype=stored)
    data[1777] = big
    path = tmp_path / "tokens.bin"
    data.tofile(path)
    for sample in ("sequential", "random"):
        steps = {"steps": 200} if sample == "random" else {}
        loader = cpu_loader(path, 16, 4, token_dtype=stored, dtype=out, sample=sample, **steps)
        with pytest.raises(pinfeed.PinfeedValueError) as e:
            for _ in loader:
                pass
        message = str(e.value)
        assert str(path) in message and "token 1777" in message and str(big) in message, message
        assert "\n" not in message
        if out == "int32":
            assert 'dtype="int64"' in message, message
    # A type that holds them: the values come through.
    if out == "int32":
        x, _ = next(iter(cpu_loader(path, 2999, 1, token_dtype=stored, sample="sequential")))
        assert x.dtype == np.int64 and x[0, 1777] == big
    # Small tokens of a wide type stream as the narrow one, unchecked by any Python code.
    small = np.arange(3000, dtype=stored)
    small.tofile(path)
    x, y = next(iter(cpu_loader(path, 16, 2, token_dtype=stored, dtype=out, sample="sequential")))
    np.testing.assert_array_equal(x[0], np.arange(16))


def test_a_batch_larger_than_memory_is_refused_before_anything_is_allocated(tmp_path):
    # Random windows are not bounded by the data: 10**13 of them aborted the process
    # allocating 180 TB. The loader's rule refuses it, naming the bytes.
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(1000, dtype=np.uint16))
    with pytest.raises(pinfeed.PinfeedMemoryError, match="180000000000000 bytes"):
        next(iter(cpu_loader(path, 8, 10**13)))
