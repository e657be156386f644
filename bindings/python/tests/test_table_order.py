"""Row-group-aware shuffles of a table's token column (issue 50): with a chunk cache of a few
row groups, a shuffled epoch takes its row groups a few at a time (as many as decode to half
the cache), every window or document once, each row group decoded about once; the order is a
pure function of ``(seed, epoch)`` and resumes exactly, elastically too."""

import itertools

import numpy as np
import pytest
from resume_helpers import elastic_resume

import pinfeed
from pinfeed import _pinfeed

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from test_tables import chunk_rows, documents_reference, row_group_order, token_docs  # noqa: E402

# Bytes of decoded row groups the cache keeps in these tests: about 7 of the tables' row groups.
LIMIT = 6000


@pytest.fixture
def budget():
    """A small chunk cache for the test; the bytes a row-group-aware order takes at a time."""
    old = _pinfeed.table_cache_limit(LIMIT)
    yield LIMIT // 2
    _pinfeed.table_cache_limit(old)


def write_table(tmp_path, n=400, seed=11):
    """``n`` documents (some empty) as a Parquet token column of 10 rows a row group; the path,
    the documents and where each row group's tokens start (the total last)."""
    docs = token_docs(n, seed)
    docs[7] = docs[n // 2] = []
    path = tmp_path / "big.parquet"
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})
    pq.write_table(table, path, row_group_size=10)
    ends = np.cumsum(chunk_rows(path))
    starts = np.cumsum([0] + [sum(len(d) for d in docs[e - 10 : e]) for e in ends])
    return path, docs, starts


def loader(path, seq_len=8, batch_size=4, **kw):
    return pinfeed.TokenLoader(
        path, seq_len, batch_size, column="input_ids", device="cpu", num_threads=2, **kw
    )


def check_row_groups(chunks, nbytes, budget):
    """``chunks`` (the row group each delivered item lies in, in delivery order) come in runs
    of row groups: the spans of positions of row groups that interleave hold at most
    ``budget`` decoded bytes together (or one row group); and there are several such runs."""
    spans = {}
    for at, c in enumerate(chunks):
        first, _ = spans.get(c, (at, at))
        spans[c] = (first, at)
    runs, end = [], -1
    for c, (first, last) in sorted(spans.items(), key=lambda kv: kv[1]):
        if first > end:
            runs.append([])
        runs[-1].append(c)
        end = max(end, last)
    for run in runs:
        assert len(run) == 1 or sum(nbytes[c] for c in run) <= budget, run
    assert len(runs) > 3, runs


def sequential_reference(starts, seq_len, seed, epoch, budget):
    """The windows of the column in their row-group-aware order, and each one's row group."""
    n = (int(starts[-1]) - 1) // seq_len
    chunk = np.searchsorted(starts, np.arange(n) * seq_len, "right") - 1
    counts = np.bincount(chunk, minlength=len(starts) - 1).tolist()
    nbytes = (4 * np.diff(starts)).tolist()
    order = _pinfeed.chunk_order(seed, epoch, counts, nbytes, budget)
    return np.asarray(order), chunk[order], nbytes


def test_sequential_windows_come_row_group_by_row_group(tmp_path, budget):
    path, docs, starts = write_table(tmp_path)
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
    shuffled = loader(path, sample="sequential", shuffle=True, seed=3)
    assert shuffled.shuffle == "block"
    epochs = []
    for epoch in (0, 1):  # each iteration runs the next epoch, in its own order
        order, chunks, nbytes = sequential_reference(starts, 8, 3, epoch, budget)
        assert sorted(order) == list(range((len(flat) - 1) // 8))  # every window once
        check_row_groups(chunks, nbytes, budget)
        x = np.concatenate([step[0] for step in shuffled])
        want = flat[order[:, None] * 8 + np.arange(8)]
        np.testing.assert_array_equal(x, want)
        epochs.append(order)
    assert not np.array_equal(epochs[0], epochs[1])
    # The fully random order, asked for by name: the Loader's permutation of the windows.
    random = loader(path, sample="sequential", shuffle="random", seed=3)
    assert random.shuffle == "random"
    x = np.concatenate([step[0] for step in random])
    assert sorted(map(tuple, x.tolist())) == sorted(map(tuple, want.tolist()))


@pytest.mark.parametrize("shuffle", [False, True])
def test_documents_come_row_group_by_row_group(tmp_path, budget, shuffle):
    path, docs, starts = write_table(tmp_path)
    rows = chunk_rows(path)
    row_chunk = np.repeat(np.arange(len(rows)), rows)
    nbytes = (4 * np.diff(starts)).tolist()
    documents = loader(path, sample="documents", shuffle=shuffle, seed=5)
    assert documents.shuffle == ("block" if shuffle else "none")
    for epoch in (0, 1):
        order = row_group_order(docs, rows, 5, epoch)
        assert sorted(order) == list(range(len(docs)))
        check_row_groups(row_chunk[order], nbytes, budget)
        kept, x, _, segment_ids = documents_reference(docs, order, 8)
        steps = list(documents)
        got = [np.concatenate([step[k] for step in steps]) for k in (0, 2)]
        if not shuffle:
            np.testing.assert_array_equal(got[0], x)
            np.testing.assert_array_equal(got[1], segment_ids)
            continue
        # shuffle=True: the same windows, those of each run of row groups shuffled among
        # themselves; each window found by its tokens and segment ids.
        where = {tuple(w): i for i, w in enumerate(np.concatenate([x, segment_ids], 1).tolist())}
        assert len(where) == len(x)
        found = [where[tuple(w)] for w in np.concatenate(got, 1).tolist()]
        assert sorted(found) == list(range(len(x))) and found != sorted(found)
        # The row group of each window's first token: its document's.
        first_doc = np.repeat(kept, [len(docs[d]) for d in kept])[np.arange(len(x)) * 8]
        check_row_groups(row_chunk[first_doc][found], nbytes, budget)


@pytest.mark.parametrize(
    "sample,shuffle,most",
    [("sequential", True, 2.0), ("documents", False, 1.25), ("documents", True, 1.25)],
)
def test_a_shuffled_epoch_decodes_each_row_group_about_once(
    tmp_path, budget, sample, shuffle, most
):
    path, _, starts = write_table(tmp_path)
    chunks = len(starts) - 1
    aware = loader(path, sample=sample, shuffle=shuffle, seed=1)
    for _ in range(2):
        assert sum(1 for _ in aware) > 0
        decodes = aware.stats()["chunk_decodes"]
        assert decodes <= most * chunks, (decodes, chunks)
    # The global permutation decodes a row group for nearly every batch.
    random = loader(path, sample=sample, shuffle="random", seed=1)
    steps = sum(1 for _ in random)
    assert random.stats()["chunk_decodes"] > max(4 * chunks, steps // 2)


def run(make, steps=None):
    """Each step's windows (tokens, and segment ids for documents) of one pass, as lists."""
    out = []
    for step in itertools.islice(make, steps):
        ids = step[2].tolist() if len(step) > 2 else [[]] * len(step[0])
        out.append([(*x, *s) for x, s in zip(step[0].tolist(), ids)])
    return out


@pytest.mark.parametrize("sample,shuffle", [("sequential", True), ("documents", True)])
def test_resume_after_any_step_equals_the_uninterrupted_run(tmp_path, budget, sample, shuffle):
    path, _, _ = write_table(tmp_path, n=150)

    def make():
        return loader(path, 16, 8, sample=sample, shuffle=shuffle, seed=4)

    whole = make()
    full = run(whole) + run(whole)  # two epochs
    per_epoch = len(full) // 2
    for k in range(per_epoch):
        first = make()
        got = run(first, k)
        state = first.state_dict()
        assert state["tokens"]["order_fingerprint"] is not None
        resumed = make()
        resumed.load_state_dict(state)
        got += run(resumed) + run(resumed)  # the next epoch follows
        assert got == full, k


@pytest.mark.parametrize("sample", ["sequential", "documents"])
@pytest.mark.parametrize("w_from,w_to", [(1, 2), (2, 3), (3, 1)])
def test_elastic_resume_delivers_the_rest_of_the_epoch(tmp_path, budget, sample, w_from, w_to):
    path, docs, _ = write_table(tmp_path, n=200)

    def ranks(world):
        return [
            loader(path, 4, 3, sample=sample, shuffle=True, seed=1, rank=r, world_size=world)
            for r in range(world)
        ]

    head, tail, whole = elastic_resume(ranks, lambda step: run([step])[0], w_from, w_to)
    n = (sum(map(len, docs)) - 1) // 4 - len(head)  # windows before the last step's pad
    assert head + tail[:n] == whole[: len(head) + n]


def test_a_state_is_resumed_only_under_its_rule(tmp_path, budget):
    path, _, _ = write_table(tmp_path, n=100)
    block = loader(path, sample="sequential", shuffle=True)
    next(iter(block))
    state = block.state_dict()
    for other in ("random", False):
        with pytest.raises(pinfeed.PinfeedValueError, match="cannot resume from this state"):
            loader(path, sample="sequential", shuffle=other).load_state_dict(state)
    # Another cache takes other row groups together: another order.
    _pinfeed.table_cache_limit(2 * LIMIT)
    with pytest.raises(pinfeed.PinfeedValueError, match="order_fingerprint"):
        loader(path, sample="sequential", shuffle=True).load_state_dict(state)
    _pinfeed.table_cache_limit(LIMIT)
    again = loader(path, sample="sequential", shuffle=True)
    again.load_state_dict(state)
    # Token files have no row groups: "block" is refused, naming the modes they take.
    tokens = tmp_path / "t.bin"
    np.arange(500, dtype=np.uint16).tofile(tokens)
    kw = dict(token_dtype="uint16", sample="sequential", device="cpu")
    with pytest.raises(pinfeed.PinfeedValueError, match="'random' or 'none', not 'block'"):
        pinfeed.TokenLoader(tokens, 8, 2, shuffle="block", **kw)
    assert pinfeed.TokenLoader(tokens, 8, 2, shuffle=True, **kw).shuffle == "random"
