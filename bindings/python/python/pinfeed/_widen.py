"""Token batches widened on their device: a ``(B, (seq_len + 1) × width)`` uint8 batch of
stored tokens becomes ``x`` and ``y`` of the integer type the user asked for, and Megatron-style
segment ids their int32 array, each in the batch's framework (one widening copy, no host
round trip)."""

import functools
from typing import Any

import numpy as np

from ._arrays import torch_module
from ._frameworks import module

__all__ = ["segment_ids", "widen_xy"]


def widen_xy(
    raw: Any, token_dtype: np.dtype, dtype: str, seq_len: int, kind: str
) -> tuple[Any, Any]:
    """``x`` and ``y`` of a ``(B, (seq_len + 1) × width)`` uint8 batch of ``token_dtype``
    tokens, widened to ``dtype`` as ``kind`` (numpy, jax, cupy, torch) arrays."""
    b, t = int(raw.shape[0]), seq_len
    if kind == "numpy":
        tok = np.ascontiguousarray(raw).view(token_dtype)
        return tok[:, :-1].astype(dtype), tok[:, 1:].astype(dtype)
    if kind == "jax":
        return _jax_widen(token_dtype.str, dtype, t)(raw)
    if kind == "cupy":
        # Ordered on CuPy's current stream, as the batch was handed over.
        tok = module("cupy").ascontiguousarray(raw).view(token_dtype.newbyteorder("="))
        return tok[:, :-1].astype(dtype), tok[:, 1:].astype(dtype)
    torch = torch_module()
    dt = token_dtype
    out = getattr(torch, dtype)
    raw = _dense(raw)
    native = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"} if dt.kind == "u" else {}
    native_dtype = getattr(torch, native.get(dt.itemsize, ""), None)
    if native_dtype is not None or dt.kind == "i":
        # torch reads its unsigned types (uint16, uint32) since 2.3.
        signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        tok = raw.view(native_dtype if dt.kind == "u" else signed[dt.itemsize])
        # x and y in one widening copy: a (2, B, T) view whose [k, b, t] is token t + k of
        # row b, copied into one contiguous tensor, of which x and y are the two halves.
        # Every torch call costs the consumer's thread microseconds: one copy, not two.
        pair = tok.as_strided((2, b, t), (1, t + 1, 1))
        xy = pair.to(dtype=out, memory_format=torch.contiguous_format)
        return xy[0], xy[1]
    # An older torch without uint16/uint32: the signed type of the width, widened, and
    # unsigned values masked back.
    signed = {2: torch.int16, 4: torch.int32}[dt.itemsize]
    tok = raw.view(signed)
    mask = (1 << (8 * dt.itemsize)) - 1 if (dt.itemsize == 2 or out == torch.int64) else None
    pair = []
    for part in (tok[:, :-1], tok[:, 1:]):
        wide = torch.empty((b, t), dtype=out, device=raw.device)
        wide.copy_(part)
        if mask is not None:
            wide.bitwise_and_(mask)
        pair.append(wide)
    return pair[0], pair[1]


def segment_ids(raw: Any, seq_len: int, kind: str) -> Any:
    """The int32 ``(B, seq_len)`` segment ids of the inputs, from their uint16 bytes."""
    if kind == "numpy":
        return np.ascontiguousarray(raw).view("<u2")[:, :-1].astype(np.int32)
    if kind == "jax":
        return _jax_widen("<u2", "int32", seq_len)(raw)[0]
    if kind == "cupy":
        ids = module("cupy").ascontiguousarray(raw).view(np.uint16)
        return ids[:, :-1].astype(np.int32)
    torch = torch_module()
    ids = _dense(raw).view(torch.int16)[:, :-1]
    out = torch.empty(ids.shape, dtype=torch.int32, device=raw.device)
    out.copy_(ids)
    return out.bitwise_and_(0xFFFF)


def _dense(raw: Any) -> Any:
    """A ``(B, N)`` torch tensor's rows back to back, as a view of another dtype needs them:
    the token or segment part of a wider record is copied, and a one-row batch (which torch
    calls contiguous whatever its row stride) is viewed afresh."""
    if int(raw.shape[0]) == 1:
        return raw[0].unsqueeze(0)
    return raw if raw.is_contiguous() else raw.contiguous()


@functools.cache
def _jax_widen(token_typestr: str, int_dtype: str, seq_len: int) -> Any:
    """A jitted function from a ``(B, (seq_len + 1) × width)`` uint8 ``jax.Array`` of
    little-endian tokens to ``x`` and ``y``, ``(B, seq_len)`` of ``int_dtype``."""
    jax = module("jax")
    width = np.dtype(token_typestr).itemsize
    token = np.dtype(token_typestr).newbyteorder("=")

    def widen(raw: Any) -> tuple[Any, Any]:
        b = raw.shape[0]
        if width == 1:
            tok = jax.lax.bitcast_convert_type(raw.reshape(b, seq_len + 1), token)
        else:
            # The last axis of `width` bytes becomes one token (XLA reads them little-endian).
            tok = jax.lax.bitcast_convert_type(raw.reshape(b, seq_len + 1, width), token)
        return tok[:, :-1].astype(int_dtype), tok[:, 1:].astype(int_dtype)

    return jax.jit(widen)
