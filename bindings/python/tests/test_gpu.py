"""GPU tests: need torch and a CUDA device. Deselected unless pytest is given --gpu."""

import numpy as np
import pytest

import pinfeed

pytestmark = pytest.mark.gpu


@pytest.fixture
def records(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, size=(20_000, 3, 31, 31), dtype=np.uint8)
    path = tmp_path / "r.npy"
    np.save(path, data)
    return path, data


def test_values_equal_the_source(torch, records):
    path, data = records
    loader = pinfeed.Loader(path, 4096, device="cuda")
    out = [t for t in loader]
    assert all(t.is_cuda and t.dtype == torch.uint8 for t in out)
    assert tuple(out[0].shape) == (4096, 3, 31, 31)
    np.testing.assert_array_equal(torch.cat(out).cpu().numpy(), data)


def test_dtypes_on_cuda(torch):
    for dtype, tdtype in [
        (np.float32, torch.float32),
        (np.int64, torch.int64),
        (np.bool_, torch.bool),
        (np.float16, torch.float16),
    ]:
        data = (np.arange(1000) % 3).astype(dtype).reshape(100, 10)
        out = torch.cat(list(pinfeed.Loader(data, 33, device="cuda")))
        assert out.dtype == tdtype
        np.testing.assert_array_equal(out.cpu().numpy(), data)


def test_structured_needs_raw_on_cuda(torch, tmp_path):
    s = np.zeros(10, dtype=[("a", "<f4"), ("b", "u1")])
    with pytest.raises(pinfeed.PinfeedValueError, match="raw=True"):
        pinfeed.Loader(s, 4, device="cuda")
    out = torch.cat(list(pinfeed.Loader(s, 4, device="cuda", raw=True)))
    assert out.dtype == torch.uint8 and bytes(out.cpu().numpy()) == s.tobytes()


def test_consumer_on_a_side_stream_reads_finished_copies(torch):
    # Big batches so that a consumer not ordered after the copy would read unfinished memory.
    n, rec = 64, 4 << 20
    data = np.random.default_rng(1).integers(0, 256, size=(n, rec), dtype=np.uint8)
    want = data.reshape(n // 4, 4, rec).astype(np.int64).sum(axis=(1, 2))
    s = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(s):
        for t in pinfeed.Loader(data, 4, device="cuda", pinned_budget="256MiB"):
            sums.append(t.to(torch.int64).sum())  # queued on s, right after the wait on our event
    torch.cuda.synchronize()
    np.testing.assert_array_equal(np.array([x.item() for x in sums]), want)


def test_memory_let_go_on_the_default_stream_waits_for_its_work(torch):
    # Batches let go on the legacy default stream (torch's current stream here) get no event of
    # their own; the copy thread records one later for several. A batch's memory must still not
    # be refilled before the work queued on it: each batch is read only after a GPU sleep, so a
    # refill that did not wait for the default stream would change what is read.
    assert torch.cuda.current_stream().cuda_stream == 0
    data = np.random.default_rng(3).integers(0, 256, size=(4096, 1024), dtype=np.uint8)
    epochs = 3
    copies = []
    for x in pinfeed.Loader(data, 64, device="cuda", epochs=epochs):
        torch.cuda._sleep(200_000)  # about 0.1 ms of GPU time on the default stream
        copies.append(x.clone())
        del x
    np.testing.assert_array_equal(torch.cat(copies).cpu().numpy(), np.concatenate([data] * epochs))


def test_kept_tensors_stay_intact(torch):
    data = np.arange(200 * 1024, dtype=np.int32).reshape(200, 1024)
    loader = pinfeed.Loader(data, 2, device="cuda", pinned_budget="1MiB")
    kept = list(loader)  # 100 batches through a ring of a few slots
    torch.cuda.synchronize()
    np.testing.assert_array_equal(torch.cat(kept).cpu().numpy(), data)


def test_dropping_tensors_returns_device_memory(torch):
    data = np.zeros((64, 1 << 20), dtype=np.uint8)
    loader = pinfeed.Loader(data, 4, device="cuda")
    it = iter(loader)
    kept = [next(it) for _ in range(8)]
    batch = 4 << 20
    held = loader.stats()["device_bytes_held"]
    assert held >= 8 * batch
    del kept
    after = loader.stats()["device_bytes_held"]
    # What is left is the batches queued ahead (prefetch=4, plus one being handed over).
    assert after < held and after <= 5 * batch
    for _ in it:
        pass


def test_to_device_and_prefetch_equal_the_source(torch):
    x = np.random.default_rng(2).random((1000, 333)).astype(np.float32)
    t = pinfeed.to_device(x, pinned_budget="1MiB")
    assert t.is_cuda and t.dtype == torch.float32
    np.testing.assert_array_equal(t.cpu().numpy(), x)
    t = pinfeed.to_device(torch.from_numpy(x).to(torch.bfloat16))
    assert t.dtype == torch.bfloat16 and t.is_cuda
    assert torch.equal(t.cpu(), torch.from_numpy(x).to(torch.bfloat16))

    items = [{"x": x[: i * 10 + 1], "y": (torch.arange(i), "tag")} for i in range(20)]
    got = list(pinfeed.prefetch(iter(items), prefetch=3, pinned_budget="256KiB"))
    for g, w in zip(got, items):
        assert g["x"].is_cuda and g["y"][0].is_cuda and g["y"][1] == "tag"
        np.testing.assert_array_equal(g["x"].cpu().numpy(), w["x"])
        assert torch.equal(g["y"][0].cpu(), w["y"][0])


@pytest.mark.parametrize("method", ["both", "stage", "register"])
def test_to_device_methods_equal_the_source(torch, method):
    from pinfeed import _pinfeed

    x = torch.rand(300, 1 << 16)  # 75 MiB
    stager = _pinfeed.Stager("cuda", "64MiB", None, method)
    for t in [x, x[1:], x[:, 1:].contiguous()]:
        got = torch.from_dlpack(stager.upload(t.numpy(), (2, 32, 1), list(t.shape)))
        assert got.is_cuda and torch.equal(got.cpu(), t)
    c = stager.counters()
    assert c["register_error"] is None, c
    assert (c["registered_bytes"] > 0) == (method != "stage"), c
    # Already page-locked: copied straight from.
    p = x.pin_memory()
    before = stager.counters()["direct_bytes"]
    got = torch.from_dlpack(stager.upload(p.numpy(), (2, 32, 1), list(p.shape)))
    assert torch.equal(got.cpu(), x)
    assert stager.counters()["direct_bytes"] - before == x.numel() * 4


def test_pinned_in_place(torch):
    x = torch.arange(1 << 20, dtype=torch.float32)
    with pinfeed.pinned(x):
        y = x.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
    assert torch.equal(y.cpu(), x)


def test_dlpack_stream_argument(torch):
    from pinfeed import _pinfeed

    stager = _pinfeed.Stager("cuda", 1 << 20)
    a = np.arange(100, dtype=np.float32)
    buf = stager.upload(a, (2, 32, 1), [100])
    assert buf.__dlpack_device__() == (2, 0)
    with pytest.raises(ValueError):
        buf.__dlpack__(stream=0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.from_dlpack(buf)
        total = t.sum()
    torch.cuda.synchronize()
    assert total.item() == a.sum()
    with pytest.raises(BufferError):
        buf.__dlpack__(stream=1)


def test_transform_on_cuda(torch, records):
    path, data = records
    loader = pinfeed.Loader(path, 1000, device="cuda", transform=pinfeed.transforms.ToFloat())
    out = torch.cat(list(loader))
    assert out.dtype == torch.float32
    np.testing.assert_array_equal(out.cpu().numpy(), data.astype(np.float32) * np.float32(1 / 255))


def test_batches_before_torch_touched_cuda():
    # A fresh interpreter where the first CUDA work torch sees is a pinfeed batch: the hand-over
    # must run torch's lazy CUDA initialisation, and the tensor must hold the source's values.
    import subprocess
    import sys

    code = (
        "import numpy as np, pinfeed\n"
        "data = np.arange(4096, dtype=np.int32).reshape(64, 64)\n"
        "x = next(iter(pinfeed.Loader(data, 16, device='cuda')))\n"
        "import torch\n"
        "assert torch.cuda.is_initialized() and x.is_cuda\n"
        "assert torch.equal(x.cpu(), torch.from_numpy(data[:16]))\n"
        "y = next(iter(pinfeed.Loader(data, 16, device='cuda')))\n"
        "assert torch.equal(y.cpu(), torch.from_numpy(data[:16]))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
