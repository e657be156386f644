"""Text steps' ``cu_seqlens`` cut without reading anything back from the device: the reader
threads count each batch's documents (``DeviceBuffer.documents``), and the packing sizes
``cu_seqlens`` by that count. On the host the count is checked against the starts found in the
step, so every host step of a text loader tests it."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_tables import make_texts, train_tokenizer

import pinfeed
from pinfeed import _tables

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.parquet"
    pq.write_table(pa.table({"text": make_texts(80, seed=11)}), path, row_group_size=9)
    return path


@pytest.fixture
def cuts(monkeypatch):
    """The counts each step's ``cu_seqlens`` was cut by without ``nonzero``."""
    seen = []
    cut = _tables._cut_at_starts

    def spy(xp, flat, count):
        seen.append(count)
        return cut(xp, flat, count)

    monkeypatch.setattr(_tables, "_cut_at_starts", spy)
    return seen


SAMPLES = [
    ("sequential", {"eos_token": "<|endoftext|>"}),
    ("sequential", {"bos_token": "<|endoftext|>"}),
    ("sequential", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}),
    ("documents", {"eos_token": "<|endoftext|>"}),
    ("random", {"eos_token": "<|endoftext|>"}),
]


@pytest.mark.parametrize("sample, bounds", SAMPLES)
def test_torch_steps_cut_cu_seqlens_by_the_readers_count(table, tokenizer, cuts, sample, bounds):
    _, tok_path = tokenizer
    args = dict(column="text", tokenizer=tok_path, device="cpu", sample=sample, seed=3, **bounds)
    if sample == "random":
        args["steps"] = 7
    host = list(pinfeed.TokenLoader(table, 16, 3, **args))
    steps = list(pinfeed.TokenLoader(table, 16, 3, framework="torch", **args))
    assert len(steps) == len(host) > 1
    # Every torch step was cut by a count, and the count was the step's documents.
    assert cuts == [len(want[4]) - 1 for want in host]
    for want, got in zip(host, steps):
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g.numpy(), w)
        assert got[4].dtype == torch.int32


def test_cutting_by_a_count_equals_nonzero_on_any_starts():
    rng = np.random.default_rng(0)
    for n, p in [(1, 0.5), (50, 0.0), (50, 1.0), (4096, 0.02), (4096, 0.6)]:
        flat = torch.from_numpy(rng.random(n) < p)
        flat[0] = True
        want = torch.cat([torch.nonzero(flat).reshape(-1), torch.tensor([n])]).int()
        assert torch.equal(_tables._cut_at_starts(torch, flat, int(flat.sum())), want)


def test_a_count_that_disagrees_with_the_starts_is_a_loud_bug():
    x = np.array([[5, 9, 7, 1]], dtype=np.int64)
    step = (x, x)
    assert len(_tables.packing(step, None, 9, documents=2)[4]) == 3
    with pytest.raises(pinfeed.PinfeedError, match="counted as 3 on the reader threads"):
        _tables.packing(step, None, 9, documents=3)
    with pytest.raises(pinfeed.PinfeedError, match="a step of 2 documents was counted as 1"):
        _tables.packing((torch.from_numpy(x), torch.from_numpy(x)), None, 9, documents=1)
    with pytest.raises(pinfeed.PinfeedError, match="without the reader threads' count"):
        _tables.packing(step, None, 9, documents=None)


@pytest.mark.gpu
@pytest.mark.parametrize("sample", ["sequential", "documents"])
def test_cuda_text_steps_never_make_the_host_wait(table, tokenizer, sample):
    # torch raises on any operation that waits for the device (nonzero, item, a copy to the
    # host): past the first step (streams and caches made), packing a step waits for nothing.
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _, tok_path = tokenizer
    args = dict(column="text", tokenizer=tok_path, eos_token="<|endoftext|>", sample=sample)
    host = list(pinfeed.TokenLoader(table, 16, 3, device="cpu", **args))
    steps = iter(pinfeed.TokenLoader(table, 16, 3, device="cuda", **args))
    got = [next(steps)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        got.extend(steps)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(got) == len(host)
    for want, step in zip(host, got):
        for w, g in zip(want, step):
            np.testing.assert_array_equal(g.cpu().numpy(), w)
