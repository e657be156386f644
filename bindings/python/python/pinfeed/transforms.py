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
                raise TypeError(
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
