"""What the Loader and friends accept and refuse: defaults, ranges, misuse of a pass or a
transform, and the Rust rules the Python package calls instead of repeating them."""

import os
import sys
import threading
import warnings

import numpy as np
import pytest

import pinfeed
from pinfeed import PinfeedError, PinfeedValueError, PinfeedWarning, _pinfeed
from pinfeed import _options as options_module

NO_GPU = pytest.mark.skipif(pinfeed.cuda_device_count() > 0, reason="a CUDA device is present")


def data(n=40, width=4):
    return np.arange(n * width, dtype=np.uint8).reshape(n, width)


@NO_GPU
def test_auto_is_the_default_and_warns_once_when_it_falls_back_to_the_host(monkeypatch):
    monkeypatch.setattr(options_module, "_warned_host_fallback", False)
    with pytest.warns(PinfeedWarning, match='device="auto"') as caught:
        loader = pinfeed.Loader(data(), 10)
    assert loader.device == "cpu"
    # The warning names the caller's line, not pinfeed's.
    assert [w.filename for w in caught] == [__file__]
    np.testing.assert_array_equal(np.concatenate(list(loader)), data())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        again = pinfeed.Loader(data(), 10)
        assert list(pinfeed.prefetch([np.ones(3)]))[0].tolist() == [1.0, 1.0, 1.0]
        assert pinfeed.to_device(np.ones(2)).tolist() == [1.0, 1.0]
    assert again.device == "cpu"


@NO_GPU
def test_an_explicit_cpu_device_does_not_warn(monkeypatch):
    monkeypatch.setattr(options_module, "_warned_host_fallback", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pinfeed.Loader(data(), 10, device="cpu")


def test_framework_torch_without_torch_says_what_was_asked_and_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(PinfeedError) as e:
        pinfeed.Loader(data(), 10, device="cpu", framework="torch")
    msg = str(e.value)
    assert "torch tensors (framework='torch')" in msg and "torch is not installed" in msg
    assert "CUDA" not in msg


def test_a_dtype_or_shape_contradicting_the_npy_header_is_refused(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((10, 4), np.float32))
    with pytest.raises(PinfeedValueError) as e:
        pinfeed.Loader(path, 2, device="cpu", dtype=np.uint8)
    msg = str(e.value)
    assert str(path) in msg and "float32" in msg and "given dtype uint8" in msg, msg
    with pytest.raises(PinfeedValueError, match=r"\[4\].*\[2, 2\]"):
        pinfeed.Loader(path, 2, device="cpu", dtype="f32", shape=(2, 2))
    # What the header says may be repeated.
    same = pinfeed.Loader(path, 2, device="cpu", dtype=np.float32, shape=(4,))
    assert same.record_shape == (4,)


def test_a_pass_ended_by_close_raises_and_a_new_iteration_starts_over():
    loader = pinfeed.Loader(data(), 10, device="cpu")
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(PinfeedError, match="ended by Loader.close"):
        next(it)
    # Not an empty pass: the next iteration reads again.
    assert len(list(loader)) == 4
    loader.close()
    assert len(list(loader)) == 4


def test_a_pass_cut_off_by_another_thread_raises_in_its_own():
    loader = pinfeed.Loader(data(), 10, device="cpu")
    it = iter(loader)
    next(it)
    other = threading.Thread(target=lambda: list(loader))
    other.start()
    other.join()
    with pytest.raises(PinfeedError, match="newer iteration"):
        next(it)


def test_an_exhausted_pass_keeps_saying_stop():
    loader = pinfeed.Loader(data(), 10, device="cpu")
    it = iter(loader)
    assert len(list(it)) == 4
    iter(loader)
    assert list(it) == []


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_size=2**64),
        dict(batch_size=0),
        dict(seed=2**64),
        dict(seed=-1),
        dict(prefetch=2**64),
        dict(prefetch=0),
        dict(epochs=0),
        dict(num_threads=0),
        dict(rank=2**64, world_size=1),
        dict(pinned_budget=2**64),
    ],
)
def test_integers_out_of_range_name_the_argument_and_the_range(kw):
    args = dict(batch_size=10, device="cpu")
    args.update(kw)
    name = next(iter(kw))
    with pytest.raises(PinfeedValueError) as e:
        pinfeed.Loader(data(), args.pop("batch_size"), **args)
    msg = str(e.value)
    assert name in msg and "..=" in msg and "host buffer" in msg, msg


def test_a_non_integer_is_a_type_error():
    with pytest.raises(TypeError, match="epochs must be an int"):
        pinfeed.Loader(data(), 10, device="cpu", epochs=1.5)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        pinfeed.Loader(data(), True, device="cpu")


def test_multiloader_takes_one_device_name_as_one_device():
    multi = pinfeed.MultiLoader(data(), 10, devices="cpu")
    assert multi.devices == ["cpu"] and len(multi.loaders) == 1
    assert [len(step) for step in multi] == [1] * 4


def test_a_transform_that_returns_instead_of_filling_out_is_refused():
    loader = pinfeed.Loader(data(), 10, device="cpu", transform=lambda raw, out: raw * 2)
    with pytest.raises(PinfeedError) as e:
        list(loader)
    cause = e.value.__cause__
    assert isinstance(cause, TypeError) and "`out`" in str(cause), (e.value, cause)


def test_a_transform_may_not_close_its_own_loader():
    holder = {}
    made = threading.Event()

    def closes(raw, out):
        made.wait(30)  # the first pass starts inside Loader(): wait for it to be returned
        holder["loader"].close()

    loader = pinfeed.Loader(data(), 10, device="cpu", transform=closes, transform_dtype=np.uint8)
    holder["loader"] = loader
    made.set()
    with pytest.raises(PinfeedError) as e:
        list(loader)
    assert "inside a transform" in str(e.value.__cause__), e.value
    loader.close()  # from the consumer's thread, it works


@pytest.mark.parametrize("how", ["set_epoch", "load_state_dict"])
def test_an_epoch_too_large_is_a_value_error(how):
    loader = pinfeed.Loader(data(), 10, device="cpu")
    if how == "set_epoch":
        loader.set_epoch(2**63)
    else:
        loader.load_state_dict(dict(loader.state_dict(), epoch=2**63))
    with pytest.raises(ValueError, match="epoch"):
        list(loader)


def test_a_file_truncated_under_a_running_loader_is_an_os_error(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((100_000, 64), np.uint8))
    loader = pinfeed.Loader(
        path, 1000, device="cpu", pinned_budget="256KiB", prefetch=1, num_threads=1
    )
    it = iter(loader)
    next(it)
    os.truncate(path, 4096)
    with pytest.raises(PinfeedError) as e:
        list(it)
    assert isinstance(e.value, OSError) and not isinstance(e.value, ValueError), e.value
    assert str(path) in str(e.value)


def test_device_share_is_the_rust_rule():
    # Device 2 of 3 in rank 1 of 2: shard 1 * 3 + 2 of 6, a third of the budget.
    assert _pinfeed.device_share(1, 2, 3, 2, "3KiB") == (5, 6, 1024)
    # No budget given: the default budget, divided among the devices as any other.
    assert _pinfeed.device_share(0, 1, 2, 0) == (0, 2, _pinfeed.DEFAULT_PINNED_BUDGET // 2)
    with pytest.raises(PinfeedValueError, match="overflows"):
        _pinfeed.device_share(2**63, 1, 2, 0)


def test_bottleneck_is_the_rust_rule():
    kw = dict(elapsed=10.0, delivered=100, producer="the iterable", copier="the upload")
    kind, line = _pinfeed.bottleneck(**kw, consumer_wait=0.5, copy_starved=0, copy_blocked=5)
    assert kind == "consumer" and line.startswith("the consumer: it waited 0.500 s of 10.000 s")
    kind, line = _pinfeed.bottleneck(**kw, consumer_wait=6, copy_starved=3, copy_blocked=0)
    assert kind == "read" and line.startswith("the iterable: the upload waited 3.000 s")
    kind, line = _pinfeed.bottleneck(**kw, consumer_wait=6, copy_starved=1, copy_blocked=0)
    assert kind == "copy" and line.startswith("the upload: it waited only 1.000 s")
    kind, line = _pinfeed.bottleneck(
        elapsed=10.0, delivered=1, consumer_wait=0, copy_starved=0, copy_blocked=5
    )
    assert kind == "unknown" and line.startswith("too few items (1)")
    assert _pinfeed.bottleneck(
        elapsed=0.0, delivered=0, consumer_wait=0, copy_starved=0, copy_blocked=0
    ) == ("unknown", "nothing delivered yet")


def test_byte_sizes_are_read_by_rust():
    assert _pinfeed.byte_size("3KiB") == 3072 and _pinfeed.byte_size(7) == 7
    assert _pinfeed.byte_size(None) is None
    with pytest.raises(PinfeedValueError, match="pinned_budget"):
        _pinfeed.byte_size("3 parsecs", "pinned_budget")
    with pytest.raises(PinfeedValueError, match="pinned_budget"):
        _pinfeed.byte_size(-1, "pinned_budget")


def _tokens(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(400, dtype=np.uint16).tofile(path)
    return path


def _images(tmp_path):
    fixtures = __import__("pathlib").Path(__file__).resolve().parents[3]
    root = tmp_path / "images"
    for k, name in enumerate(("baseline.jpg", "rgb.png")):
        (root / f"c{k}").mkdir(parents=True)
        image = fixtures / "crates/source/tests/fixtures/images" / name
        (root / f"c{k}" / name).write_bytes(image.read_bytes())
    return root


def test_issue51_no_silent_coercion_of_numbers(tmp_path):
    # Issue 51 item 10: what the Loader refuses, every entry point refuses, by one rule.
    tokens = _tokens(tmp_path)
    kw = dict(token_dtype="uint16", device="cpu")
    for args, extra, name in [
        ((1.5, 2), {}, "seq_len"),
        (("8", 2), {}, "seq_len"),
        ((8, 1.0), {}, "batch_size"),
        ((8, True), {}, "batch_size"),
        ((8, 2), {"steps": 1.5}, "steps"),
        ((8, 2), {"steps": "3"}, "steps"),
    ]:
        with pytest.raises(pinfeed.PinfeedTypeError, match=f"{name} must be an int, not"):
            pinfeed.TokenLoader(tokens, *args, **kw, **extra)
    with pytest.raises(pinfeed.PinfeedTypeError, match="batch_size must be an int, not float"):
        pinfeed.ImageLoader(_images(tmp_path), 2.5, size=8, device="cpu")
    loader = pinfeed.TokenLoader(tokens, 8, 2, steps=3, **kw)
    state = loader.state_dict()
    for key, bad in [("epoch", "0"), ("batches_done", 3.7), ("batches_done", True)]:
        with pytest.raises(PinfeedValueError, match=f"state {key} must be an int"):
            loader.load_state_dict({**state, key: bad})


def test_issue51_out_of_range_numbers_name_the_argument_and_the_limit(tmp_path):
    # Issue 51 item 15: negative, 2**64 and more, None: one line naming what and the range.
    tokens = _tokens(tmp_path)
    kw = dict(token_dtype="uint16", device="cpu")
    for args, extra, name in [
        ((-1, 2), {}, "seq_len"),
        ((2**64, 2), {}, "seq_len"),
        ((8, -2), {}, "batch_size"),
        ((8, 2**64), {}, "batch_size"),
        ((8, 2), {"steps": -3}, "steps"),
        ((8, 2), {"steps": 2**64}, "steps"),
    ]:
        with pytest.raises(PinfeedValueError, match=rf"{name} must be an int in \d+ \.\.= \d+"):
            pinfeed.TokenLoader(tokens, *args, **kw, **extra)
    for args in [(None, 2), (8, None)]:
        with pytest.raises(pinfeed.PinfeedTypeError, match="must be an int, not NoneType"):
            pinfeed.TokenLoader(tokens, *args, **kw)
    loaders = [
        pinfeed.TokenLoader(tokens, 8, 2, steps=3, **kw),
        pinfeed.ImageLoader(_images(tmp_path), 2, size=8, device="cpu"),
        pinfeed.Loader(data(), 4, device="cpu"),
    ]
    for loader in loaders:
        for bad in (-1, 2**64):
            with pytest.raises(PinfeedValueError, match=r"epoch must be an int in 0 \.\.= 1844"):
                loader.set_epoch(bad)
        with pytest.raises(pinfeed.PinfeedTypeError, match="epoch must be an int, not NoneType"):
            loader.set_epoch(None)
        for bad in (-1, 2**64, None):
            with pytest.raises(PinfeedValueError, match="state epoch must be an int"):
                loader.load_state_dict({**loader.state_dict(), "epoch": bad})
    with pytest.raises(PinfeedValueError, match=r"shape\[0\] must be an int in 0 \.\.= "):
        path = tmp_path / "raw.bin"
        data().tofile(path)
        pinfeed.Loader(path, 4, dtype="u1", shape=(-2, -3), device="cpu")
