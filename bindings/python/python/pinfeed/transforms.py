"""Preprocessing run by the loader's reader threads, between the read and the pinned slot.

Built-ins run in Rust without the GIL:

- :class:`ToFloat` ``(scale=1/255)``: uint8, uint16 or float32 records → float32 ``x * scale``.
- :class:`Normalize` ``(mean, std, *, scale=1.0)``: → float32 ``(x * scale - mean[c]) / std[c]``
  per channel ``c``, the first dimension of the record shape.

Any Python callable ``f(raw, out)`` works too (with ``transform_dtype``/``transform_shape`` on the
Loader, or as a :class:`Transform` with ``out_dtype``/``out_shape``): ``raw`` is a read-only numpy
view of the batch's records with the source dtype and shape ``(records, *record_shape)``, ``out``
a numpy view of the pinned slot with shape ``(records, *out_shape)``, to be filled in place. It
runs on a reader thread holding the GIL, and must not keep ``raw`` or ``out`` after returning.
"""

import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np

from . import _pinfeed
from ._arrays import split_dtype
from .errors import PinfeedTypeError, PinfeedValueError

__all__ = ["ToFloat", "Normalize", "Transform"]

#: ``ToFloat(scale=1/255)``: records as float32 ``x * scale`` (Rust, no GIL).
ToFloat = _pinfeed.ToFloatSpec
#: ``Normalize(mean, std, *, scale=1.0)``: float32 ``(x * scale - mean[c]) / std[c]`` (Rust, no GIL).
Normalize = _pinfeed.NormalizeSpec


class Transform:
    """A Python transform with its output dtype and per-record shape.

    Subclass and override :meth:`__call__`, or wrap a function:
    ``Transform(f, out_dtype=np.float32, out_shape=(3, 32, 32))``. ``out_dtype``/``out_shape``
    left ``None`` mean the source's.
    """

    out_dtype: Any = None
    out_shape: Optional[Sequence[int]] = None

    def __init__(
        self,
        func: Optional[Callable[[np.ndarray, np.ndarray], None]] = None,
        out_dtype: Any = None,
        out_shape: Optional[Sequence[int]] = None,
    ) -> None:
        self.func = func
        if out_dtype is not None:
            self.out_dtype = out_dtype
        if out_shape is not None:
            self.out_shape = out_shape

    def __call__(self, raw: np.ndarray, out: np.ndarray) -> None:
        if self.func is None:
            raise NotImplementedError("subclass Transform and implement __call__(raw, out)")
        self.func(raw, out)


def make_caller(
    func: Callable[[np.ndarray, np.ndarray], None],
    in_dtype: np.dtype,
    in_shape: tuple[int, ...],
    out_dtype: np.dtype,
    out_shape: tuple[int, ...],
) -> Callable[[memoryview, memoryview, int], None]:
    """What the Rust side calls for each batch: wraps the slot's memoryviews in numpy arrays,
    calls ``func`` and releases the views, so that nothing refers to the slot afterwards."""

    def call(raw_view: memoryview, out_view: memoryview, records: int) -> None:
        try:
            raw = np.frombuffer(raw_view, dtype=in_dtype).reshape((records,) + in_shape)
            out = np.frombuffer(out_view, dtype=out_dtype).reshape((records,) + out_shape)
            # numpy points every array made from these (views, slices, reshapes) at one
            # memoryview of its own; counting references to it tells whether any outlives the call.
            bases = (raw.base, out.base)
            returned = func(raw, out)
            del raw, out
            if returned is not None:
                raise PinfeedTypeError(
                    f"the transform returned a {type(returned).__name__} instead of None: it "
                    "must write the batch into its `out` argument (out[...] = ...); what it "
                    "returns is not used"
                )
            del returned
            if any(sys.getrefcount(b) > 3 for b in bases):  # `bases`, the loop, the argument
                raise BufferError(
                    "the transform kept a reference to its raw or out array (or a view of it) "
                    "after returning; copy what you need to keep (the memory is reused for the "
                    "next batch)"
                )
        finally:
            raw_view.release()
            out_view.release()

    return call


def transform_layout(
    name: str,
    transform: Any,
    transform_dtype: Any,
    transform_shape: Any,
    src_dtype: np.dtype,
    src_shape: tuple[int, ...],
) -> tuple[Any, Optional[int], np.dtype, tuple[int, ...]]:
    """What a Loader's ``transform`` runs as (a built-in spec, or the caller of a Python
    callable), its output bytes a record (None but for a Python callable), and the dtype and
    per-record shape of its output (the source's without a transform)."""
    if transform is None:
        if transform_dtype is not None or transform_shape is not None:
            raise PinfeedValueError(
                f"{name}: transform_dtype/transform_shape given without a transform"
            )
        return None, None, src_dtype, src_shape
    if isinstance(transform, (ToFloat, Normalize)):
        return transform, None, np.dtype(np.float32), src_shape
    if not callable(transform):
        raise PinfeedTypeError(f"transform must be callable, not {type(transform).__name__}")
    out_dtype = (
        transform_dtype if transform_dtype is not None else getattr(transform, "out_dtype", None)
    )
    out_shape = (
        transform_shape if transform_shape is not None else getattr(transform, "out_shape", None)
    )
    if out_dtype is None:
        base, sub = src_dtype, ()
    else:
        base, sub = split_dtype(out_dtype)
    shape = src_shape if out_shape is None else tuple(int(d) for d in np.atleast_1d(out_shape))
    shape = tuple(shape) + tuple(sub)
    out_bytes = base.itemsize * int(np.prod(shape, dtype=np.int64))
    if out_bytes <= 0:
        raise PinfeedValueError(
            f"{name}: the transform's output records (dtype {base}, shape {shape}) are empty"
        )
    caller = make_caller(transform, src_dtype, src_shape, base, shape)
    return caller, out_bytes, base, shape
