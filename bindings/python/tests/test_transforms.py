"""Transforms: Python callables and the Rust built-ins, against numpy."""

import numpy as np
import pytest

import pinfeed
from pinfeed import PinfeedError, PinfeedValueError
from pinfeed.transforms import Normalize, ToFloat, Transform


@pytest.fixture
def images():
    return np.random.default_rng(0).integers(0, 256, size=(203, 3, 8, 9), dtype=np.uint8)


def test_to_float(images):
    out = np.concatenate(list(pinfeed.Loader(images, 50, device="cpu", transform=ToFloat())))
    assert out.dtype == np.float32 and out.shape == images.shape
    np.testing.assert_array_equal(out, images.astype(np.float32) * np.float32(1 / 255))
    out = np.concatenate(
        list(pinfeed.Loader(images, 64, device="cpu", transform=ToFloat(scale=2.0)))
    )
    np.testing.assert_array_equal(out, images.astype(np.float32) * 2)


def test_normalize(images):
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    t = Normalize(mean, std, scale=1 / 255)
    out = np.concatenate(list(pinfeed.Loader(images, 64, device="cpu", transform=t)))
    m = np.array(mean, np.float32)[:, None, None]
    s = np.array(std, np.float32)[:, None, None]
    ref = (images.astype(np.float32) * np.float32(1 / 255) - m) / s
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_normalize_float_input_and_broadcast():
    data = np.random.default_rng(1).random((40, 2, 5)).astype(np.float32)
    out = np.concatenate(
        list(pinfeed.Loader(data, 16, device="cpu", transform=Normalize([0.5], [2.0])))
    )
    np.testing.assert_allclose(out, (data - np.float32(0.5)) / np.float32(2.0), rtol=1e-6)


def test_normalize_errors(images):
    with pytest.raises(PinfeedValueError, match="channel"):
        pinfeed.Loader(images, 8, device="cpu", transform=Normalize([0.1, 0.2], [1, 1]))
    with pytest.raises(PinfeedValueError, match="non-zero"):
        pinfeed.Loader(images, 8, device="cpu", transform=Normalize([0.1], [0.0]))
    with pytest.raises(PinfeedValueError, match="int16"):
        pinfeed.Loader(images.astype(np.int16), 8, device="cpu", transform=ToFloat())


def test_python_callable_same_shape(images):
    def invert(raw, out):
        assert raw.dtype == np.uint8 and raw.shape[1:] == (3, 8, 9)
        assert not raw.flags.writeable
        out[:] = 255 - raw

    out = np.concatenate(list(pinfeed.Loader(images, 50, device="cpu", transform=invert)))
    np.testing.assert_array_equal(out, 255 - images)


def test_python_callable_new_dtype_and_shape(images):
    def channel_means(raw, out):
        out[:] = raw.reshape(len(raw), 3, -1).mean(axis=2)

    loader = pinfeed.Loader(
        images,
        32,
        device="cpu",
        transform=channel_means,
        transform_dtype=np.float64,
        transform_shape=(3,),
    )
    out = np.concatenate(list(loader))
    assert out.shape == (203, 3) and out.dtype == np.float64
    np.testing.assert_allclose(out, images.reshape(203, 3, -1).mean(axis=2))


def test_transform_object(images):
    class Flatten(Transform):
        out_dtype = np.int32
        out_shape = (3 * 8 * 9,)

        def __call__(self, raw, out):
            out[:] = raw.reshape(len(raw), -1).astype(np.int32) - 100

    out = np.concatenate(list(pinfeed.Loader(images, 70, device="cpu", transform=Flatten())))
    np.testing.assert_array_equal(out, images.reshape(203, -1).astype(np.int32) - 100)
    wrapped = Transform(lambda raw, out: np.copyto(out, raw[:, 0]), out_shape=(8, 9))
    out = np.concatenate(list(pinfeed.Loader(images, 70, device="cpu", transform=wrapped)))
    np.testing.assert_array_equal(out, images[:, 0])


def test_transform_structured_input(tmp_path):
    dt = np.dtype([("x", "<f4"), ("y", "<i2")])
    data = np.zeros(30, dtype=dt)
    data["x"] = np.arange(30)
    data["y"] = -np.arange(30)
    path = tmp_path / "s.npy"
    np.save(path, data)

    def xy(raw, out):
        out[:, 0] = raw["x"]
        out[:, 1] = raw["y"]

    loader = pinfeed.Loader(
        path, 8, device="cpu", transform=xy, transform_dtype=np.float32, transform_shape=(2,)
    )
    out = np.concatenate(list(loader))
    np.testing.assert_array_equal(out, np.stack([data["x"], data["y"]], axis=1).astype(np.float32))


def test_transform_error_names_batch_and_chains(images):
    calls = []

    def fails(raw, out):
        calls.append(len(raw))
        if len(calls) == 3:
            raise KeyError("boom")
        out[:] = raw

    loader = pinfeed.Loader(images[:200], 10, device="cpu", transform=fails, num_threads=1)
    with pytest.raises(PinfeedError) as e:
        list(loader)
    assert "transform failed on batch" in str(e.value) and "boom" in str(e.value)
    assert isinstance(e.value.__cause__, KeyError)


def test_transform_keeping_its_arrays_is_an_error(images):
    kept = []

    def leaks(raw, out):
        out[:] = raw
        kept.append(out)

    with pytest.raises(PinfeedError, match="kept a reference"):
        list(pinfeed.Loader(images, 50, device="cpu", transform=leaks, num_threads=1))


def test_transform_errors_at_construction(images):
    with pytest.raises(TypeError):
        pinfeed.Loader(images, 8, device="cpu", transform=42)
    with pytest.raises(PinfeedValueError):
        pinfeed.Loader(images, 8, device="cpu", transform_dtype=np.float32)
