"""Every error path: the right subclass, and a message naming the file."""

import numpy as np
import pytest

import pinfeed
from pinfeed import (
    CudaError,
    PinfeedError,
    PinfeedMemoryError,
    PinfeedOSError,
    PinfeedValueError,
)


def test_hierarchy():
    assert issubclass(PinfeedValueError, (PinfeedError, ValueError))
    assert issubclass(PinfeedOSError, OSError) and issubclass(PinfeedOSError, PinfeedError)
    assert issubclass(PinfeedMemoryError, MemoryError) and issubclass(
        PinfeedMemoryError, PinfeedError
    )
    assert issubclass(CudaError, RuntimeError) and issubclass(CudaError, PinfeedError)


def test_missing_file(tmp_path):
    path = tmp_path / "missing.npy"
    with pytest.raises(PinfeedOSError) as e:
        pinfeed.Loader(path, 4, device="cpu")
    assert str(path) in str(e.value) and e.value.kind == "Open" and e.value.errno == 2
    assert isinstance(e.value, OSError)


def test_empty_directory(tmp_path):
    # A directory is a dataset of shards; one holding none is refused, naming it.
    with pytest.raises(PinfeedValueError, match=str(tmp_path)) as e:
        pinfeed.Loader(tmp_path, 4, device="cpu")
    assert (
        "no .npy, .safetensors, .pftxt, .parquet, .arrow or .jsonl files" in str(e.value)
        and e.value.kind == "NoShards"
    )


def test_bad_header(tmp_path):
    path = tmp_path / "bad.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': 'nonsense")
    with pytest.raises(PinfeedValueError) as e:
        pinfeed.Loader(path, 4, device="cpu")
    assert str(path) in str(e.value) and e.value.kind == "Header"


def test_not_npy_without_dtype(tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(100))
    with pytest.raises(PinfeedValueError, match="not a .npy file") as e:
        pinfeed.Loader(path, 4, device="cpu")
    assert str(path) in str(e.value)


def test_truncated_npy(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.zeros((100, 10), dtype=np.float32))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(PinfeedOSError, match="truncated") as e:
        pinfeed.Loader(path, 4, device="cpu")
    assert str(path) in str(e.value)


def test_bad_dtype(tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(100))
    with pytest.raises(PinfeedValueError) as e:
        pinfeed.Loader(path, 4, device="cpu", dtype="complex256-ish")
    assert str(path) in str(e.value) and e.value.kind == "DType"
    with pytest.raises(PinfeedValueError, match="big-endian") as e:
        pinfeed.Loader(path, 4, device="cpu", dtype=np.dtype(">f4"))
    assert str(path) in str(e.value)


def test_big_endian_npy(tmp_path):
    path = tmp_path / "be.npy"
    np.save(path, np.zeros(10, dtype=">f4"))
    with pytest.raises(PinfeedValueError, match="big-endian") as e:
        pinfeed.Loader(path, 4, device="cpu")
    assert str(path) in str(e.value)


def test_object_array():
    with pytest.raises(PinfeedValueError, match="object"):
        pinfeed.Loader(np.array([object()] * 4), 2, device="cpu")


def test_raw_file_not_whole_records(tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(101))
    with pytest.raises(PinfeedValueError, match="not a multiple") as e:
        pinfeed.Loader(path, 4, device="cpu", dtype="u8", shape=(10,))
    assert str(path) in str(e.value)


@pytest.mark.parametrize("batch_size", [0, -3])
def test_bad_batch_size(tmp_path, batch_size):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(10))
    with pytest.raises(PinfeedValueError) as e:
        pinfeed.Loader(path, batch_size, device="cpu")
    assert str(path) in str(e.value)


def test_batch_size_type():
    with pytest.raises(TypeError):
        pinfeed.Loader(np.zeros(10), 2.5, device="cpu")


def test_drop_last_leaves_nothing(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(10))
    with pytest.raises(PinfeedValueError, match="drop_last") as e:
        pinfeed.Loader(path, 11, device="cpu", drop_last=True)
    assert str(path) in str(e.value)


def test_budget_too_small(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1000, 1000), dtype=np.uint8))
    with pytest.raises(PinfeedMemoryError) as e:
        pinfeed.Loader(path, 512, device="cpu", pinned_budget="600KiB")
    assert str(path) in str(e.value) and e.value.kind == "BudgetTooSmall"
    assert isinstance(e.value, MemoryError)


def test_bad_budget_string():
    with pytest.raises(PinfeedValueError, match="unit"):
        pinfeed.Loader(np.zeros(10), 2, device="cpu", pinned_budget="12 parsecs")


def test_unknown_device():
    with pytest.raises(PinfeedValueError, match="unknown device"):
        pinfeed.Loader(np.zeros(10), 2, device="tpu")


@pytest.mark.skipif(pinfeed.cuda_device_count() > 0, reason="a CUDA driver is present")
def test_cuda_without_driver(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(10))
    with pytest.raises(CudaError) as e:
        pinfeed.Loader(path, 4, device="cuda")  # strict, unlike the default "auto"
    msg = str(e.value)
    assert e.value.kind == "NoDriver" and 'device="cpu"' in msg and str(path) in msg
    assert isinstance(e.value, RuntimeError)
    # One short line; the library names tried are the exception's, each once.
    assert "\n" not in msg and msg.count("libcuda") == 1, msg
    assert e.value.tried and len(set(e.value.tried)) == len(e.value.tried), e.value.tried
    with pytest.raises(CudaError, match='device="cpu"'):
        pinfeed.to_device(np.zeros(4), device="cuda")
    with pytest.raises(CudaError):
        pinfeed.prefetch([np.zeros(4)], device="cuda")


def test_empty_array():
    with pytest.raises(PinfeedValueError, match="empty"):
        pinfeed.Loader(np.zeros((0, 3)), 2, device="cpu")


def test_non_contiguous_array():
    with pytest.raises(PinfeedValueError, match="C-contiguous"):
        pinfeed.Loader(np.zeros((10, 10))[:, ::2], 2, device="cpu")


def test_unsupported_source_type():
    with pytest.raises(TypeError, match="source must be"):
        pinfeed.Loader(42, 2, device="cpu")


def test_read_error_midway_names_file(tmp_path):
    # The file shrinks after it was opened: the read fails on a reader thread and the error
    # reaches the consumer.
    path = tmp_path / "shrinks.npy"
    np.save(path, np.zeros((10000, 100), dtype=np.uint8))
    loader = pinfeed.Loader(
        path, 100, device="cpu", pinned_budget=64 << 10, prefetch=1, num_threads=1
    )
    it = iter(loader)
    next(it)
    with open(path, "r+b") as f:
        f.truncate(2000)
    with pytest.raises(PinfeedOSError) as e:
        for _ in it:
            pass
    assert str(path) in str(e.value)


def test_ctrl_c_interrupts_a_wait_for_a_slow_source(tmp_path):
    """KeyboardInterrupt reaches the consumer while it waits for a batch, instead of waiting
    until the next batch arrives; the loader then shuts down cleanly."""
    import _thread
    import signal
    import threading
    import time

    import numpy as np

    import pinfeed

    path = tmp_path / "slow.npy"
    np.save(path, np.arange(64 * 8, dtype=np.uint8).reshape(64, 8))
    release = threading.Event()

    def slow(raw, out):
        release.wait(10)  # a reader stuck in a slow read
        out[...] = raw

    loader = pinfeed.Loader(
        str(path),
        8,
        device="cpu",
        num_threads=1,
        transform=slow,
        transform_dtype=np.uint8,
        transform_shape=(8,),
    )
    # Python's own Ctrl-C handler, also where the test runner was started with SIGINT ignored
    # (a shell's background job): interrupt_main does nothing then.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iter(loader))
        assert time.monotonic() - started < 5, "Ctrl-C waited for the slow reader"
    finally:
        release.set()
        timer.cancel()
        loader.close()
        signal.signal(signal.SIGINT, previous)


def test_a_fifo_is_refused_not_opened(tmp_path):
    # Opening a FIFO for reading blocks until a writer comes: a child process, so that a hang
    # fails the test instead of stopping the suite.
    import os
    import subprocess
    import sys

    fifo = tmp_path / "data.npy"
    os.mkfifo(fifo)
    code = f"import pinfeed; pinfeed.Loader({str(fifo)!r}, 4, device='cpu')"
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode != 0 and "data.npy" in run.stderr and "not a regular file" in run.stderr
