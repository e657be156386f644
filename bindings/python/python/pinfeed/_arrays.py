"""numpy dtypes, torch tensors and DLPack: what goes in and what comes out."""

import ast
import sys
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _pinfeed
from .errors import PinfeedError, PinfeedValueError

#: DLPack's bfloat16 (kDLBfloat = 4, 16 bits), which numpy has no dtype for.
BFLOAT16 = (4, 16, 1)


def torch_module(wanted: str = "CUDA batches as torch tensors") -> Any:
    """torch, imported on first use (never at ``import pinfeed``); ``wanted`` says what needed
    it, for the error when torch is not installed."""
    try:
        import torch
    except ImportError as e:
        if wanted == "CUDA batches as torch tensors":
            advice = "install torch, or use device='cpu' for numpy arrays"
        else:
            advice = "install torch, or pick another framework"
        raise PinfeedError(f"{wanted} were asked for, but torch is not installed; {advice}") from e
    return torch


def is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def split_dtype(dt: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """A numpy dtype and the sub-array shape it carries (``'(3,4)f4'`` → ``float32, (3, 4)``)."""
    dt = np.dtype(dt)
    shape: tuple[int, ...] = ()
    while dt.subdtype is not None:
        dt, sub = dt.subdtype
        shape = shape + tuple(sub)
    return dt, shape


def descr_of(dt: np.dtype) -> str:
    """The numpy descr literal the Rust core parses."""
    return repr(np.lib.format.dtype_to_descr(dt))


def dtype_of(descr: str) -> np.dtype:
    """The numpy dtype of a descr literal from the Rust core."""
    return np.lib.format.descr_to_dtype(ast.literal_eval(descr))


class Export(NamedTuple):
    """How a buffer is exported and turned back into an array."""

    #: DLPack (code, bits, lanes) the buffer is exported as.
    dl_dtype: tuple[int, int, int]
    #: Per-record (or whole-array) shape the buffer is exported with.
    shape: tuple[int, ...]
    #: For dtypes DLPack cannot carry (structured, strings, dates): the numpy dtype and shape to
    #: view the exported bytes as. ``None`` when the export already is the array.
    view: Optional[tuple[np.dtype, tuple[int, ...]]]


def export_for(dt: np.dtype, shape: tuple[int, ...], raw: bool = False) -> Export:
    """The export of elements of ``dt`` (no sub-array) with ``shape``."""
    itemsize = dt.itemsize * int(np.prod(shape, dtype=np.int64))
    if raw:
        return Export((1, 8, 1), (itemsize,), None)
    dl = _pinfeed.dlpack_dtype(descr_of(dt)) if dt.fields is None else None
    if dl is not None:
        return Export(tuple(dl), tuple(shape), None)
    return Export((1, 8, 1), (itemsize,), (dt, tuple(shape)))


def torch_stream(torch: Any, index: int) -> int:
    """The raw handle of torch's current stream on CUDA device ``index``, as DLPack names it
    (1 for the legacy default stream, which torch calls 0)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None or not torch.cuda.is_initialized():
        # The public call, which also runs torch's lazy CUDA initialisation the first time.
        return torch.cuda.current_stream(index).cuda_stream or 1
    handle = raw(index)
    return handle or 1


def cuda_tensor(buf: "_pinfeed.DeviceBuffer") -> Any:
    """A CUDA DeviceBuffer as a torch tensor, ordered on torch's current stream: what
    ``torch.from_dlpack(buf)`` does, without its per-call device and stream objects (a few
    microseconds a batch, which small batches feel)."""
    torch = torch_module()
    _, index = buf.__dlpack_device__()
    capsule = buf.__dlpack__(stream=torch_stream(torch, index))
    return torch.utils.dlpack.from_dlpack(capsule)


def materialize(buf: "_pinfeed.DeviceBuffer", view, as_torch: bool) -> Any:
    """A DeviceBuffer as a torch tensor (CUDA, or ``as_torch``: ``framework="torch"``) or a
    numpy array."""
    cuda = buf.device.startswith("cuda")
    if cuda or as_torch:
        if view is not None:
            raise PinfeedValueError(
                f"dtype {view[0]} has no torch equivalent (torch has no structured, string or date "
                "dtypes); pass raw=True for the records' bytes as uint8, or device='cpu' for numpy"
            )
        if cuda:
            return cuda_tensor(buf)
        return torch_module("torch tensors (framework='torch')").from_dlpack(buf)
    if buf.dtype == BFLOAT16:
        # numpy has no bfloat16: hand back torch's.
        return torch_module(
            "bfloat16 batches (numpy has no bfloat16) as torch tensors"
        ).from_dlpack(buf)
    arr = np.from_dlpack(buf)
    if view is not None:
        dt, shape = view
        arr = arr.view(dt).reshape(arr.shape[:-1] + tuple(shape))
    return arr


def host_array(x: Any) -> tuple[np.ndarray, Optional[tuple[int, int, int]]]:
    """A C-contiguous numpy array with the bytes of ``x`` (numpy, torch CPU tensor, or anything
    ``numpy.asarray`` takes), and a DLPack dtype override (bfloat16 tensors travel as int16)."""
    override = None
    if is_torch_tensor(x):
        torch = sys.modules["torch"]
        if x.device.type != "cpu":
            raise PinfeedValueError(f"expected a CPU tensor, got one on {x.device}")
        x = x.detach()
        if not x.is_contiguous():
            x = x.contiguous()
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16)
            override = BFLOAT16
        x = x.numpy()
    arr = np.asarray(x)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr, override
