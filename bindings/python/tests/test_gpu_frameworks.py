"""framework="jax" and "cupy" on CUDA (marker gpu): byte-exact batches, a jitted step, a
non-default CuPy stream, a sharded global array, and no torch on these paths. The Lightning
and torchdata tests on CUDA are test_trainers.py's, marked gpu too."""

import gc
import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

import pinfeed

pytestmark = pytest.mark.gpu

# JAX takes 75% of the GPU's memory at start-up by default; pinfeed allocates batches too.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@pytest.fixture(scope="module")
def jax():
    jax = pytest.importorskip("jax")
    try:
        jax.devices("gpu")
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")
    return jax


@pytest.fixture(scope="module")
def cupy():
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() == 0:
        pytest.skip("no CUDA device")
    return cupy


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """64 MiB of random bytes as 8 KiB records: batches large enough that a consumer reading
    before its copy finished would see stale bytes."""
    x = np.random.default_rng(11).integers(0, 256, (8192, 8192), dtype=np.uint8)
    path = tmp_path_factory.mktemp("gpu_fw") / "big.npy"
    np.save(path, x)
    return path, x


def test_jax_batches_are_byte_exact_and_feed_a_jitted_step(big, jax):
    path, x = big
    jnp = jax.numpy

    @jax.jit
    def checksum(b):
        # Position-weighted, so a reordered or stale byte changes it.
        w = jnp.arange(b.shape[1], dtype=jnp.uint32) + 1
        return jnp.sum(b.astype(jnp.uint32) * w[None, :], axis=1)

    want = (x.astype(np.uint64) * (np.arange(x.shape[1], dtype=np.uint64) + 1)).sum(1)
    want = (want % (1 << 32)).astype(np.uint32)
    gpu = jax.devices("gpu")[0]
    for shuffle in (False, True):
        loader = pinfeed.Loader(
            path, 300, device="cuda", framework="jax", shuffle=shuffle, pinned_budget="16MiB"
        )
        order = pinfeed.epoch_order(len(x), 300, shuffle=shuffle).astype(np.int64)
        held, sums = [], []
        for b in loader:
            assert isinstance(b, jax.Array) and b.devices() == {gpu}
            sums.append(checksum(b))  # queued at once, right after the hand-off
            held.append(b)
        np.testing.assert_array_equal(np.concatenate([np.asarray(s) for s in sums]), want[order])
        # Held across the whole epoch (the ring reused its slots many times): still the source.
        got = np.concatenate([np.asarray(b) for b in held])
        assert zlib.crc32(got) == zlib.crc32(x[order])


def test_jax_array_wraps_the_batch_without_a_copy(jax):
    from pinfeed import _frameworks, _pinfeed

    stager = _pinfeed.Stager("cuda:0", 1 << 24, None)
    x = np.arange(1 << 20, dtype=np.float32)
    buf = stager.upload(x, (2, 32, 1), [1 << 20])
    address = buf.address
    arr = _frameworks.jax_array(buf)
    assert arr.unsafe_buffer_pointer() == address
    np.testing.assert_array_equal(np.asarray(arr), x)


def test_jax_prefetch_to_device_and_tokens(jax, tmp_path):
    items = [
        {"a": np.full((1000, 257), i, np.float32), "b": np.arange(i + 3, dtype=np.int32)}
        for i in range(8)
    ]
    for want, got in zip(items, pinfeed.prefetch(items, device="cuda", framework="jax")):
        np.testing.assert_array_equal(np.asarray(got["a"]), want["a"])
        np.testing.assert_array_equal(np.asarray(got["b"]), want["b"])
    y = pinfeed.to_device(np.arange(12345, dtype=np.int32), device="cuda", framework="jax")
    np.testing.assert_array_equal(np.asarray(y), np.arange(12345, dtype=np.int32))
    tokens = np.random.default_rng(2).integers(0, 1 << 16, 50_000, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    kw = dict(seq_len=64, batch_size=8, token_dtype="uint16", steps=20, rank=0, world_size=1)
    ref = pinfeed.TokenLoader(tmp_path / "train.bin", device="cpu", dtype="int32", **kw)
    got = pinfeed.TokenLoader(tmp_path / "train.bin", device="cuda", framework="jax", **kw)
    for (rx, ry), (gx, gy) in zip(ref, got):
        np.testing.assert_array_equal(np.asarray(gx), rx)
        np.testing.assert_array_equal(np.asarray(gy), ry)


def test_jax_mesh_of_the_gpus(big, jax):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    path, x = big
    gpus = jax.devices("gpu")
    sharding = NamedSharding(Mesh(np.array(gpus), ("data",)), PartitionSpec("data"))
    multi = pinfeed.MultiLoader(path, 256, sharding=sharding, rank=0, world_size=1)
    n = len(gpus)
    # The loader reads in order (MultiLoader's default); epoch_order's default is shuffled.
    orders = [
        pinfeed.epoch_order(len(x), 256, shuffle=False, rank=r, world_size=n) for r in range(n)
    ]
    for i, g in enumerate(multi):
        assert g.sharding == sharding
        want = np.concatenate([x[o[i * 256 : (i + 1) * 256].astype(np.int64)] for o in orders])
        assert zlib.crc32(np.asarray(g)) == zlib.crc32(want)


def test_cupy_on_a_non_default_stream(big, cupy):
    path, x = big
    order = pinfeed.epoch_order(len(x), 300, shuffle=True, seed=3).astype(np.int64)
    stream = cupy.cuda.Stream(non_blocking=True)
    sums, held = [], []
    with stream:
        for b in pinfeed.Loader(
            path, 300, device="cuda", framework="cupy", shuffle=True, seed=3, pinned_budget="16MiB"
        ):
            assert isinstance(b, cupy.ndarray)
            # Queued on `stream` right after the hand-off: it must see the batch's bytes.
            sums.append(b.astype(cupy.uint64).sum(axis=1))
            held.append(b)
        stream.synchronize()
    np.testing.assert_array_equal(
        np.concatenate([s.get() for s in sums]), x[order].astype(np.uint64).sum(1)
    )
    assert zlib.crc32(np.concatenate([b.get() for b in held])) == zlib.crc32(x[order])
    with stream:
        y = pinfeed.to_device(x[:100], device="cuda", framework="cupy")
        tok = pinfeed.prefetch([x[:7], x[7:9]], device="cuda", framework="cupy")
        np.testing.assert_array_equal(np.concatenate([t.get() for t in tok]), x[:9])
    np.testing.assert_array_equal(y.get(), x[:100])


def test_cupy_arrays_outlive_the_stream_they_were_made_on(big, cupy):
    # The arrays' memory is released after their stream's work: CuPy destroys a stream with
    # its object, so pinfeed keeps the stream until the last array made on it is freed (a
    # release on a destroyed stream's handle crashed the process).
    path, x = big
    held = []
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for b in pinfeed.Loader(path, 300, device="cuda", framework="cupy", pinned_budget="16MiB"):
            held.append(b.astype(cupy.uint64).sum(axis=1))
            held.append(b)
    stream.synchronize()
    ptr = stream.ptr
    assert ptr in pinfeed._pinfeed.streams_with_exports()
    del stream, b
    gc.collect()
    np.testing.assert_array_equal(np.concatenate([h.get() for h in held[1::2]]), x)
    np.testing.assert_array_equal(
        np.concatenate([h.get() for h in held[::2]]), x.astype(np.uint64).sum(1)
    )
    del held
    gc.collect()
    assert ptr not in pinfeed._pinfeed.streams_with_exports()
    y = pinfeed.to_device(x[:10], device="cuda", framework="cupy")  # the next export lets go
    assert ptr not in pinfeed._frameworks._CUPY_STREAMS
    np.testing.assert_array_equal(y.get(), x[:10])


def test_no_torch_on_the_jax_and_cupy_cuda_paths(big):
    if pinfeed.cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    path, _ = big
    frameworks = [
        f
        for f in ("jax", "cupy")
        if subprocess.run([sys.executable, "-c", f"import {f}"]).returncode == 0
    ]
    if not frameworks:
        pytest.skip("neither jax nor cupy installed")
    code = f"""
        import sys
        asked = []
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    asked.append(name)
                    raise ImportError("torch refused by the test")
        sys.meta_path.insert(0, NoTorch())
        import numpy as np, pinfeed
        for fw in {frameworks!r}:
            for b in pinfeed.Loader({str(path)!r}, 500, device="cuda", framework=fw):
                pass
            list(pinfeed.prefetch([np.ones((3, 2), np.float32)], device="cuda", framework=fw))
            pinfeed.to_device(np.ones(5, np.int32), device="cuda", framework=fw)
        assert not asked and "torch" not in sys.modules, asked
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, timeout=300)
