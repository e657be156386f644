"""The one place a delivered buffer becomes a framework's array: ``framework="torch" | "jax" |
"cupy" | "numpy"`` on every entry point (Loader, MultiLoader, TokenLoader, prefetch,
to_device) is read by :func:`framework_arg` and applied by :func:`deliver`.

Each framework is imported on first use only; the jax, cupy and numpy paths never import
torch. How each hand-off is ordered against the copy that filled the buffer:

- torch: the capsule is exported on torch's current stream (``_arrays.cuda_tensor``).
- cupy: ``cupy.from_dlpack`` passes its current stream to ``__dlpack__``, which makes that
  stream wait for the copy; the memory is freed after the work queued on it. CuPy destroys a
  stream when its Python object goes, which may be before the arrays made on it: the stream
  is kept alive here until no array exported on it remains (:func:`cupy_array`).
- jax: ``jax.dlpack.from_dlpack`` passes the device's stream for external ready events
  (``Device.get_stream_for_external_ready_events()``) and orders its own work after an event
  it records there, so ``__dlpack__`` making that stream wait for the copy is enough (no host
  synchronisation). Where the JAX backend has no such stream it passes ``None`` and treats the
  buffer as ready at once: :class:`_JaxHandoff` then waits for the copy on the host first.
  PJRT calls the capsule's deleter once it is done with the buffer, which returns the memory
  to pinfeed's device cache.
- numpy: host arrays, on the host backend only.
"""

import threading
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from . import _pinfeed
from ._arrays import BFLOAT16, materialize, torch_module
from .errors import PinfeedError, PinfeedValueError

if TYPE_CHECKING:
    from .loader import Loader

__all__ = [
    "FRAMEWORKS",
    "framework_arg",
    "check_delivery",
    "check_device",
    "check_dtype",
    "deliver",
    "module",
]

#: The values ``framework=`` takes.
FRAMEWORKS = ("torch", "jax", "cupy", "numpy")


def framework_arg(framework: Optional[str]) -> Optional[str]:
    """``framework`` checked: one of :data:`FRAMEWORKS`, or None for the default (torch tensors
    on CUDA, numpy arrays on the host backend)."""
    if framework is None:
        return None
    if not isinstance(framework, str) or framework.lower() not in FRAMEWORKS:
        raise PinfeedValueError(
            f"framework must be one of {', '.join(repr(f) for f in FRAMEWORKS)} (or None for "
            f"torch on CUDA and numpy on the host), not {framework!r}"
        )
    framework = framework.lower()
    module(framework)  # a missing package is reported now, not at the first batch
    return framework


def module(framework: str) -> Any:
    """The framework's package, imported now; a clear error when it is not installed."""
    if framework == "torch":
        return torch_module(f"torch tensors (framework={framework!r})")
    if framework == "numpy":
        return np
    name = {"jax": "jax", "cupy": "cupy"}[framework]
    try:
        return __import__(name)
    except ImportError as e:
        raise PinfeedError(
            f"{framework} arrays (framework={framework!r}) were asked for, but {name} is not "
            f"installed; install it, or pick another framework"
        ) from e


def check_device(framework: Optional[str], device: str, what: str) -> None:
    """Refuses a framework that cannot hold arrays on ``device`` (``"cpu"`` or ``"cuda:N"``)."""
    cuda = device.startswith("cuda")
    if framework == "numpy" and cuda:
        raise PinfeedValueError(
            f"{what}: framework='numpy' gives host arrays, but the batches are on {device}; "
            "use device='cpu' for numpy arrays, or framework='torch', 'jax' or 'cupy' on the GPU"
        )
    if framework == "cupy" and not cuda:
        raise PinfeedValueError(
            f"{what}: framework='cupy' gives CUDA arrays, but the batches are on the host "
            f"backend ({device}); use a CUDA device, or framework='numpy' on the host"
        )


def check_dtype(framework: Optional[str], dtype: Any, what: str) -> None:
    """Refuses a dtype the framework would change on the way in: JAX without
    ``jax_enable_x64`` narrows 64-bit values to 32 bits (a silent truncation)."""
    if framework != "jax" or dtype is None:
        return
    jax = module("jax")
    dt = np.dtype(dtype)
    canonical = np.dtype(jax.dtypes.canonicalize_dtype(dt))
    if canonical != dt:
        raise PinfeedValueError(
            f"{what}: JAX would turn the {dt} batches into {canonical} (jax_enable_x64 is off); "
            "enable it (jax.config.update('jax_enable_x64', True)), or deliver a 32-bit dtype "
            "(a transform, or raw=True for the bytes)"
        )


class _JaxHandoff:
    """A buffer as ``jax.dlpack.from_dlpack`` sees it: whatever stream JAX passes, the array it
    builds is not read before the copy that fills it has finished (see the module's doc)."""

    __slots__ = ("buf", "cuda")

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.cuda = buf.device.startswith("cuda")

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.buf.__dlpack_device__()

    def __dlpack__(self, *, stream: Optional[int] = None, **kwargs: Any) -> Any:
        if not self.cuda:
            return self.buf.__dlpack__(stream=stream, **kwargs)
        if stream is None:
            # No stream to order on: JAX takes the memory as ready now, so it must be.
            self.buf.wait()
            return self.buf.__dlpack__(stream=-1, **kwargs)
        # A raw CUstream handle; 0 is the legacy default stream, DLPack's 1.
        return self.buf.__dlpack__(stream=int(stream) or 1, **kwargs)


def check_delivery(loader: "Loader", out_bytes: Any) -> None:
    """Refuses batches ``loader``'s framework cannot hold on the device its pass runs on."""
    name, framework = loader.source_name, loader.framework
    if loader._export.view is not None and (
        loader.device.startswith("cuda") or framework in ("jax", "cupy")
    ):
        kind = framework or "torch"
        record = loader._source.record_bytes if loader._transform is None else out_bytes
        raise PinfeedValueError(
            f"{name}: dtype {loader.dtype} has no {kind} equivalent ({kind} has no structured, "
            f"string or date dtypes); pass raw=True for the records' bytes as uint8 "
            f"(records, {record}), or device='cpu' for numpy arrays"
        )
    check_device(framework, loader.device, name)
    if loader._columns is not None and framework in ("jax", "cupy"):
        raise PinfeedValueError(
            f"{name}: columns= delivers torch tensors or numpy arrays so far, not "
            f"framework={framework!r}"
        )
    # Raw batches and a table's (cut into columns after delivery) are bytes.
    raw = loader.raw or bool(loader._columns)
    check_dtype(framework, np.uint8 if raw else loader.dtype, name)
    if loader.resident and framework in ("jax", "cupy"):
        raise PinfeedValueError(
            f'{name}: shuffle="gpu" gathers its batches with torch (numpy on the host); '
            f"framework={framework!r} streams them instead: use shuffle=True or "
            '"block"'
        )


def jax_array(buf: Any) -> Any:
    """A buffer as a ``jax.Array`` on its device, without a copy."""
    jax = module("jax")
    return jax.dlpack.from_dlpack(_JaxHandoff(buf))


#: CuPy streams that arrays handed out on may still be released after, by handle.
_CUPY_STREAMS: dict = {}
#: Held from a stream's entry to its export being counted, so that a hand-off on another
#: thread never lets go of a stream whose first export is on its way.
_CUPY_STREAMS_LOCK = threading.Lock()


def cupy_array(buf: Any) -> Any:
    """A buffer as a ``cupy.ndarray`` on CuPy's current stream, without a copy. The buffer's
    memory is released after the work queued on that stream when the array is freed, so the
    stream object is kept while exports on it remain (``streams_with_exports``; let go at the
    next hand-off after the last is freed): a stream destroyed first would leave the release a
    dangling handle."""
    cupy = module("cupy")
    stream = cupy.cuda.get_current_stream()
    with _CUPY_STREAMS_LOCK:
        _CUPY_STREAMS[stream.ptr] = stream
        array = cupy.from_dlpack(buf)
        live = set(_pinfeed.streams_with_exports())
        for ptr in [p for p in _CUPY_STREAMS if p not in live]:
            del _CUPY_STREAMS[ptr]
    return array


def _no_structured(view: Any, framework: str) -> None:
    if view is not None:
        raise PinfeedValueError(
            f"dtype {view[0]} has no {framework} equivalent ({framework} has no structured, "
            "string or date dtypes); pass raw=True for the records' bytes as uint8, or "
            "framework='numpy' on the host"
        )


def deliver(buf: Any, view: Any, framework: Optional[str]) -> Any:
    """A delivered buffer as ``framework``'s array (None: torch on CUDA, numpy on the host).
    ``view`` is the numpy dtype and shape to view the bytes as, for dtypes DLPack cannot carry
    (``_arrays.Export.view``)."""
    if framework is None or framework == "torch":
        return materialize(buf, view, framework == "torch")
    if framework == "jax":
        _no_structured(view, "jax")
        return jax_array(buf)
    if framework == "cupy":
        _no_structured(view, "cupy")
        return cupy_array(buf)
    if buf.dtype == BFLOAT16:
        raise PinfeedValueError(
            "numpy has no bfloat16: pass framework='torch' or 'jax' for bfloat16 batches"
        )
    return materialize(buf, view, False)
