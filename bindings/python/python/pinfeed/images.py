"""``pinfeed.ImageLoader``: JPEG and PNG datasets as ``(images, labels)`` batches.

The training loop of torchvision's ImageNet recipe, without DataLoader workers::

    loader = pinfeed.ImageLoader("train/", batch_size=256, size=224, shuffle=True)
    for images, labels in loader:  # uint8 (256, 3, 224, 224) and int64 (256,) CUDA tensors
        ...
"""

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np

from . import _pinfeed
from ._arrays import torch_module
from .errors import PinfeedValueError
from .loader import Loader
from .order import distributed_defaults

__all__ = ["ImageLoader", "DECODERS"]

#: The values of ``decode``: :func:`_pinfeed.image_decoder` resolves them (Rust owns the rule).
DECODERS = ("cpu", "gpu", "auto")
_DTYPES = ("float32", "float16", "bfloat16")


def _check_decoder(decode: str, name: str) -> None:
    if decode not in DECODERS:
        raise PinfeedValueError(
            f"{name}: unknown decode {decode!r}: expected one of {', '.join(DECODERS)}"
        )


def _size_pair(size: Union[int, Sequence[int]], name: str) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, (int, np.integer)) and s > 0 for s in pair):
        raise PinfeedValueError(f"{name}: size must be an int or (height, width), not {size!r}")
    return int(pair[0]), int(pair[1])


def _channel_triple(values: Any, what: str, name: str) -> tuple[float, float, float]:
    return _pinfeed.channel_triple([float(v) for v in np.atleast_1d(values)], what, name)


class ImageLoader:
    """Batches of decoded, cropped images and their labels, streamed through pinfeed's ring.

    ``path`` is an ImageFolder tree (``path/<class>/.../<image>``; labels are the indices of
    the sorted class names, and the images those torchvision's ``ImageFolder`` finds), or
    WebDataset shards: a ``.tar`` file, a glob of them or a directory of them, each sample an
    image member (``KEY.jpg``, ``.jpeg`` or ``.png``) beside its label (``KEY.cls``: a decimal
    integer, or ``KEY.json``: an integer or an object with an integer ``"label"``).

    The reader threads (Rust, without the GIL; ``num_threads``, by default one per core this
    process may use) read each sample's compressed bytes once, decode it (JPEG baseline and
    progressive, PNG; grayscale and CMYK converted to RGB as Pillow's ``convert("RGB")`` does),
    crop it, resize it with Pillow's bilinear filter and write it straight into a pinned slot,
    with its label beside it:

    - ``crop="random"``: torchvision's ``RandomResizedCrop(size, scale, ratio)`` then, with
      ``flip`` (default), ``RandomHorizontalFlip()``. The draws are a pure function of
      ``(seed, epoch, sample)``: the same pixels whatever the sharding, batching or resume.
    - ``crop="center"``: ``Resize(resize)`` (default ``size / 0.875``: 256 for 224) then
      ``CenterCrop(size)``: evaluation; not flipped unless ``flip=True``.

    Iterating yields ``(images, labels)``: ``labels`` int64 ``(batch,)``; ``images`` uint8
    ``(batch, 3, H, W)`` for ``layout="NCHW"`` or ``(batch, H, W, 3)`` for ``"NHWC"``, or, with
    ``mean`` and ``std`` (on the 0-1 scale, as torchvision's ``Normalize`` after
    ``ToTensor``), ``dtype`` (float32, float16 or bfloat16) ``(x / 255 - mean) / std``,
    computed on the GPU on torch's current stream. CUDA tensors, or numpy arrays on the host
    backend (``device="cpu"``, or ``"auto"`` without a GPU; bfloat16 is float32 there, numpy
    having no bfloat16).

    ``on_error="raise"`` stops at a sample that cannot be decoded (truncated, not an image, over
    ``max_pixels``, default Pillow's 89,478,485, refused from its header; a file over 256 MiB)
    with :class:`pinfeed.PinfeedValueError` naming the file; an empty class folder or an unlabelled tar sample is refused when opening.
    ``on_error="skip"`` counts such a sample in ``stats()["skipped"]`` and fills its place with
    the next sample of the dataset that decodes (batches keep their size); an empty class keeps
    its label number.

    ``decode="cpu"`` decodes on the reader threads. ``decode="gpu"`` has the reader threads
    read each JPEG's bytes (once) with its crop, flip and label, drawn as the CPU path draws
    them, into the pinned slot, and the copy thread decode the batch with nvJPEG on the GPU
    (the hardware JPEG engines where the GPU has them) and crop, resize and flip it there; PNG,
    CMYK and JPEGs nvJPEG declines are decoded on the CPU as with ``"cpu"`` (the same
    ``on_error``). It needs a CUDA device and nvJPEG (``libnvjpeg``, e.g. from the
    ``nvidia-nvjpeg`` wheel); on the host backend it is refused. ``decode="auto"`` times both
    on a CUDA device where nvJPEG loads (the dataset's first batches, once per boot: a cache
    file keeps the rates, ``pinfeed doctor`` lists them) and takes the GPU where it is at least
    1.1 times faster, else the CPU; :attr:`decode` says which and :attr:`decode_reason` why.

    Shuffling, sharding (``rank``, ``world_size``), ``set_epoch``, ``state_dict`` and
    ``load_state_dict`` are :class:`pinfeed.Loader`'s, with the same exact resume.
    ``pinned_budget``, ``prefetch``, ``drop_last`` and ``device`` are the Loader's too.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        batch_size: int,
        size: Union[int, Sequence[int]] = 224,
        *,
        decode: str = "cpu",
        crop: str = "random",
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        resize: Optional[int] = None,
        flip: Optional[bool] = None,
        layout: str = "NCHW",
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        dtype: str = "float32",
        shuffle: bool = False,
        seed: int = 0,
        on_error: str = "raise",
        max_pixels: Optional[int] = None,
        device: Any = "auto",
        pinned_budget: Any = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        num_threads: Optional[int] = None,
        prefetch: int = 4,
    ) -> None:
        self.path = os.fsdecode(os.fspath(path))
        _check_decoder(decode, self.path)
        self.height, self.width = _size_pair(size, self.path)
        if layout not in ("NCHW", "NHWC"):
            raise PinfeedValueError(f"{self.path}: layout must be 'NCHW' or 'NHWC', not {layout!r}")
        if (mean is None) != (std is None):
            raise PinfeedValueError(f"{self.path}: give mean and std together, or neither")
        if dtype not in _DTYPES:
            raise PinfeedValueError(
                f"{self.path}: dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}"
            )
        self.layout = layout
        self.normalize: Optional[tuple[tuple[float, ...], tuple[float, ...]]] = (
            None
            if mean is None
            else (_channel_triple(mean, "mean", self.path), _channel_triple(std, "std", self.path))
        )
        self.dtype = dtype
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._dataset = _pinfeed.ImageDataset(
            self.path,
            height=self.height,
            width=self.width,
            crop=crop,
            scale=tuple(float(s) for s in scale),
            ratio=tuple(float(r) for r in ratio),
            resize=resize,
            flip=(crop == "random") if flip is None else bool(flip),
            layout=layout,
            on_error=on_error,
            max_pixels=max_pixels,
            seed=self.seed,
        )
        self._pixel_bytes, self._label_at = self._dataset.record_parts()
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        if num_threads is None:
            num_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        #: The decoder in use, ``"cpu"`` or ``"gpu"``, and why (``decode="auto"`` times both).
        self.decode, self.decode_reason = _pinfeed.image_decoder(
            decode, str(device), self._dataset, self.batch_size, num_threads, pinned_budget
        )
        self._loader_args = dict(
            device=device,
            drop_last=drop_last,
            shuffle=self.shuffle,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
            pinned_budget=pinned_budget,
            num_threads=num_threads,
            prefetch=prefetch,
            raw=True,
        )
        # The crops depend on the epoch, so each epoch has its own source (and Loader).
        self._loader, self._loader_epoch = self._make_loader(0), 0
        self.device: str = self._loader.device
        # The Loader state the next iteration starts at, when set_epoch or load_state_dict
        # chose it; otherwise the epoch after the last pass's.
        self._next: Optional[dict[str, Any]] = None
        self._pass_epoch: Optional[int] = None
        self._scale_shift: Any = None

    def _make_loader(self, epoch: int) -> Loader:
        source = self._dataset.source(epoch, gpu=self.decode == "gpu")
        return Loader(source, self.batch_size, **self._loader_args)

    def _loader_for(self, epoch: int) -> Loader:
        if epoch != self._loader_epoch:
            self._loader.close()
            self._loader, self._loader_epoch = self._make_loader(epoch), epoch
        return self._loader

    def _start_of(self, epoch: int) -> dict[str, Any]:
        return {**self._loader.state_dict(), "epoch": epoch, "batches_done": 0, "consumed": 0}

    @property
    def classes(self) -> list[str]:
        """The sorted class names of an ImageFolder tree (label ``k`` is ``classes[k]``);
        empty for tar shards."""
        return list(self._dataset.classes)

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (all ranks)."""
        return len(self._dataset)

    def labels(self) -> np.ndarray:
        """Every sample's label in dataset order, int64."""
        return np.asarray(self._dataset.labels(), dtype=np.int64)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        if self._next is not None:
            start = self._next
        else:
            start = self._start_of(0 if self._pass_epoch is None else self._pass_epoch + 1)
        self._next = None
        self._pass_epoch = int(start["epoch"])
        # The Loader of this epoch's crops, positioned (its order follows the epoch too).
        loader = self._loader_for(self._pass_epoch)
        loader.load_state_dict(start)
        return self._batches(iter(loader))

    def _batches(self, batches: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
        for raw in batches:
            yield self._split(raw)

    def _split(self, raw: Any) -> tuple[Any, Any]:
        """``(images, labels)`` of a ``(B, record_bytes)`` uint8 batch."""
        b = int(raw.shape[0])
        shape = (
            (b, 3, self.height, self.width)
            if self.layout == "NCHW"
            else (b, self.height, self.width, 3)
        )
        if self.decode == "gpu":
            return self._split_planar(raw, shape)
        label_bytes = raw[:, self._label_at : self._label_at + 8]
        if not self.device.startswith("cuda"):
            labels = np.ascontiguousarray(label_bytes).view("<i8").reshape(b)
            pixels = raw[:, : self._pixel_bytes].reshape(shape)
            if self.normalize is None:
                return np.ascontiguousarray(pixels), labels
            scale, shift = self._host_scale_shift()
            out = pixels.astype(np.float32) * scale - shift
            return out.astype(np.float32 if self.dtype == "bfloat16" else self.dtype), labels
        torch = torch_module()
        labels = label_bytes.contiguous().view(torch.int64).reshape(b)
        # A strided view of the pixels: rows are records, with the label after each.
        pixels = raw.as_strided(shape, _strides(shape, raw.stride(0)), raw.storage_offset())
        if self.normalize is None:
            return pixels.contiguous(), labels
        scale, shift = self._cuda_scale_shift(raw.device)
        out = torch.empty(shape, dtype=getattr(torch, self.dtype), device=raw.device)
        # One pass: out = x * (1 / (255 std)) - mean / std, in float32, stored as dtype.
        torch.sub(pixels.to(torch.float32).mul_(scale), shift, out=out)
        return out, labels

    def _split_planar(self, raw: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """``(images, labels)`` of a GPU-decoded batch: the images back to back, then the
        labels from ``batch * label offset`` (``GpuImageDecode``'s layout)."""
        torch = torch_module()
        b = int(raw.shape[0])
        flat = raw.reshape(-1)
        at = b * self._label_at
        labels = flat[at : at + 8 * b].view(torch.int64)
        pixels = flat[: b * self._pixel_bytes].view(shape)
        if self.normalize is None:
            return pixels, labels
        scale, shift = self._cuda_scale_shift(raw.device)
        out = torch.empty(shape, dtype=getattr(torch, self.dtype), device=raw.device)
        torch.sub(pixels.to(torch.float32).mul_(scale), shift, out=out)
        return out, labels

    def _channel_shape(self) -> tuple[int, ...]:
        return (1, 3, 1, 1) if self.layout == "NCHW" else (1, 1, 1, 3)

    def _host_scale_shift(self) -> tuple[np.ndarray, np.ndarray]:
        mean, std = (np.asarray(v, dtype=np.float64) for v in self.normalize)  # type: ignore[union-attr]
        shape = self._channel_shape()
        scale = (1.0 / (255.0 * std)).astype(np.float32).reshape(shape)
        return scale, (mean / std).astype(np.float32).reshape(shape)

    def _cuda_scale_shift(self, device: Any) -> tuple[Any, Any]:
        if self._scale_shift is None or self._scale_shift[0].device != device:
            torch = torch_module()
            scale, shift = self._host_scale_shift()
            self._scale_shift = (
                torch.from_numpy(scale).to(device),
                torch.from_numpy(shift).to(device),
            )
        return self._scale_shift

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration run ``epoch`` from its start."""
        if int(epoch) < 0:
            raise PinfeedValueError(f"{self.path}: epoch must be at least 0, not {epoch}")
        self._next = self._start_of(int(epoch))

    def _image_params(self) -> dict[str, Any]:
        return {"height": self.height, "width": self.width, "num_samples": self.num_samples}

    def state_dict(self) -> dict[str, Any]:
        """:meth:`pinfeed.Loader.state_dict`'s dict (``epoch``, ``batches_done``, ...) under the
        image parameters it depends on, in ``"images"``. After :meth:`set_epoch` or
        :meth:`load_state_dict`, the position the next iteration starts at."""
        state = dict(self._next) if self._next is not None else self._loader.state_dict()
        state["images"] = self._image_params()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration resume at ``state`` (from :meth:`state_dict`): exactly
        the batches the interrupted run had not received. Raises
        :class:`pinfeed.PinfeedValueError` for a state of another dataset, image size or
        Loader setting."""
        if not isinstance(state, Mapping) or "images" not in state:
            raise PinfeedValueError(
                f"{self.path}: not an ImageLoader state (expected the dict of "
                "ImageLoader.state_dict(), with 'images')"
            )
        mine, theirs = self._image_params(), state["images"]
        differs = [
            f"{k} {theirs.get(k)!r} (this loader: {v!r})"
            for k, v in mine.items()
            if not isinstance(theirs, Mapping) or theirs.get(k) != v
        ]
        if differs:
            raise PinfeedValueError(
                f"{self.path}: cannot resume from this state: it was saved with "
                + ", ".join(differs)
            )
        rest = {k: v for k, v in state.items() if k != "images"}
        # The Loader checks the order's parameters and the position.
        self._loader.load_state_dict(rest)
        self._next = self._loader.state_dict()

    def stats(self) -> dict[str, Any]:
        """The counters of the current (or last) pass (:meth:`pinfeed.Loader.stats`),
        ``skipped``: samples skipped since the loader was made (``on_error="skip"``), and
        ``decode`` / ``decode_reason``: the decoder in use and why (``decode="auto"``'s rates)."""
        return {
            **self._loader.stats(),
            "skipped": int(self._dataset.skipped()),
            "decode": self.decode,
            "decode_reason": self.decode_reason,
        }

    def close(self) -> None:
        """Stops the current pass and frees its pinned memory."""
        self._loader.close()

    def __repr__(self) -> str:
        return (
            f"ImageLoader({self.path!r}, batch_size={self.batch_size}, "
            f"size=({self.height}, {self.width}), samples={self.num_samples}, "
            f"layout={self.layout!r}, decode={self.decode!r}, device={self.device!r}, "
            f"rank={self.rank}, world_size={self.world_size})"
        )


def _strides(shape: tuple[int, ...], row: int) -> tuple[int, ...]:
    """Strides of a batch of images ``shape`` whose records are ``row`` bytes apart."""
    strides = [row] + [1] * (len(shape) - 1)
    for i in range(len(shape) - 2, 0, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)
