"""What a raw image batch becomes: ``(images, labels)`` in the framework asked for.

A batch arrives as the records' bytes, uint8 ``(B, record_bytes)``: each record the pixels then
the int64 label (CPU decoding), or, GPU-decoded, the images back to back then the labels from
``B × label offset`` (``GpuImageDecode``'s planar layout). Normalizing runs where the batch is:
torch on its device and torch's current stream, CuPy on its current stream, JAX in one jitted
function, numpy on the host.
"""

import functools
from typing import Any, Optional

import numpy as np

from ._arrays import torch_module
from ._frameworks import module

__all__ = ["ImageBatches"]


class ImageBatches:
    """Splits raw batches of ``height × width`` RGB records laid out as ``layout``, normalized
    by ``normalize`` (``(mean, std)`` on the 0-1 scale, or None: uint8) into ``dtype``."""

    def __init__(
        self,
        height: int,
        width: int,
        layout: str,
        normalize: Optional[tuple[tuple[float, ...], tuple[float, ...]]],
        dtype: str,
        parts: tuple[int, int],
        planar: bool,
    ) -> None:
        self.height, self.width, self.layout = height, width, layout
        self.normalize, self.dtype, self.planar = normalize, dtype, planar
        # Bytes of pixels at the start of each record, and where its int64 label starts.
        self.pixel_bytes, self.label_at = parts
        self._scale_shift: Any = None

    def shape(self, b: int) -> tuple[int, ...]:
        """The shape of ``b`` images."""
        if self.layout == "NCHW":
            return (b, 3, self.height, self.width)
        return (b, self.height, self.width, 3)

    def split(self, raw: Any, framework: str) -> tuple[Any, Any]:
        """``(images, labels)`` of a ``(B, record_bytes)`` uint8 batch of ``framework``."""
        if framework == "numpy":
            return self._numpy(raw)
        if framework == "jax":
            at = (int(raw.shape[0]), self.label_at, self.pixel_bytes)
            scale, shift = self.host_scale_shift() if self.normalize else (None, None)
            dtype = self.dtype if self.normalize else None
            f = _jax_split(self.shape(1)[1:], at[1:], self.planar, dtype)
            return f(raw, scale, shift)
        if framework == "cupy":
            return self._cupy(raw)
        return self._torch(raw)

    def _numpy(self, raw: Any) -> tuple[Any, Any]:
        b = int(raw.shape[0])
        labels = np.ascontiguousarray(raw[:, self.label_at : self.label_at + 8]).view("<i8")
        pixels = raw[:, : self.pixel_bytes].reshape(self.shape(b))
        if self.normalize is None:
            return np.ascontiguousarray(pixels), labels.reshape(b)
        scale, shift = self.host_scale_shift()
        out = pixels.astype(np.float32) * scale - shift
        # numpy has no bfloat16: float32 there.
        return out.astype(np.float32 if self.dtype == "bfloat16" else self.dtype), labels.reshape(b)

    def _cupy(self, raw: Any) -> tuple[Any, Any]:
        cp = module("cupy")
        b = int(raw.shape[0])
        raw = cp.ascontiguousarray(raw)
        if self.planar:
            flat = raw.reshape(-1)
            at = b * self.label_at
            labels = flat[at : at + 8 * b].view(cp.int64)
            pixels = flat[: b * self.pixel_bytes].reshape(self.shape(b))
        else:
            labels = cp.ascontiguousarray(raw[:, self.label_at : self.label_at + 8])
            labels = labels.view(cp.int64).reshape(b)
            pixels = cp.ascontiguousarray(raw[:, : self.pixel_bytes]).reshape(self.shape(b))
        if self.normalize is None:
            return pixels, labels
        scale, shift = (cp.asarray(v) for v in self.host_scale_shift())
        return (pixels.astype(cp.float32) * scale - shift).astype(self.dtype), labels

    def _torch(self, raw: Any) -> tuple[Any, Any]:
        torch = torch_module()
        b = int(raw.shape[0])
        shape = self.shape(b)
        if self.planar:
            flat = raw.reshape(-1)
            at = b * self.label_at
            labels = flat[at : at + 8 * b].view(torch.int64)
            pixels = flat[: b * self.pixel_bytes].view(shape)
        else:
            labels = raw[:, self.label_at : self.label_at + 8].contiguous().view(torch.int64)
            labels = labels.reshape(b)
            # A strided view of the pixels: rows are records, with the label after each.
            pixels = raw.as_strided(shape, _strides(shape, raw.stride(0)), raw.storage_offset())
        if self.normalize is None:
            return (pixels if self.planar else pixels.contiguous()), labels
        scale, shift = self._torch_scale_shift(raw.device)
        out = torch.empty(shape, dtype=getattr(torch, self.dtype), device=raw.device)
        # One pass: out = x * (1 / (255 std)) - mean / std, in float32, stored as dtype.
        torch.sub(pixels.to(torch.float32).mul_(scale), shift, out=out)
        return out, labels

    def _channel_shape(self) -> tuple[int, ...]:
        return (1, 3, 1, 1) if self.layout == "NCHW" else (1, 1, 1, 3)

    def host_scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``1 / (255 std)`` and ``mean / std``, shaped to broadcast over channels."""
        mean, std = (np.asarray(v, dtype=np.float64) for v in self.normalize)  # type: ignore[union-attr]
        shape = self._channel_shape()
        scale = (1.0 / (255.0 * std)).astype(np.float32).reshape(shape)
        return scale, (mean / std).astype(np.float32).reshape(shape)

    def _torch_scale_shift(self, device: Any) -> tuple[Any, Any]:
        if self._scale_shift is None or self._scale_shift[0].device != device:
            torch = torch_module()
            scale, shift = self.host_scale_shift()
            self._scale_shift = (
                torch.from_numpy(scale).to(device),
                torch.from_numpy(shift).to(device),
            )
        return self._scale_shift


def _strides(shape: tuple[int, ...], row: int) -> tuple[int, ...]:
    """Strides of a batch of images ``shape`` whose records are ``row`` bytes apart."""
    strides = [row] + [1] * (len(shape) - 1)
    for i in range(len(shape) - 2, 0, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


@functools.cache
def _jax_split(
    image: tuple[int, ...], parts: tuple[int, int], planar: bool, dtype: Optional[str]
) -> Any:
    """A jitted function from a uint8 ``jax.Array`` batch (and the scale and shift of
    normalizing, or None) to ``(images, labels)``; labels int64 with ``jax_enable_x64``, else
    int32 (JAX has no int64 then; a label is far below 2^31)."""
    jax = module("jax")
    jnp = jax.numpy
    label_at, pixel_bytes = parts
    wide = bool(jax.config.jax_enable_x64)
    label_type, label_bytes = (jnp.int64, 8) if wide else (jnp.int32, 4)

    def split(raw: Any, scale: Any, shift: Any) -> tuple[Any, Any]:
        b = raw.shape[0]
        if planar:
            flat = raw.reshape(-1)
            words = flat[b * label_at : b * label_at + 8 * b].reshape(b, 8)
            pixels = flat[: b * pixel_bytes].reshape((b,) + image)
        else:
            words = raw[:, label_at : label_at + 8]
            pixels = raw[:, :pixel_bytes].reshape((b,) + image)
        # Little-endian: the low bytes of the int64 label are the label.
        labels = jax.lax.bitcast_convert_type(words[:, :label_bytes], label_type)
        if dtype is None:
            return pixels, labels
        out = pixels.astype(jnp.float32) * scale - shift
        return out.astype(dtype), labels

    return jax.jit(split)
