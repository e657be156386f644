"""``pinfeed.ImageLoader``: JPEG and PNG datasets as ``(images, labels)`` batches.

The training loop of torchvision's ImageNet recipe, without DataLoader workers::

    loader = pinfeed.ImageLoader("train/", batch_size=256, size=224, shuffle=True)
    for images, labels in loader:  # uint8 (256, 3, 224, 224) and int64 (256,) CUDA tensors
        ...
"""

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional, Union

import numpy as np

from . import _pinfeed
from ._deprecation import accepts_old_spellings
from ._epochs import EpochLoader
from ._frameworks import framework_arg
from ._image_batches import ImageBatches
from ._mixture import image_mixture_of, name_of, reblended
from ._options import device_name, int_arg, ints, shuffle_arg
from ._sources import local_only, source_path, store_args
from .errors import PinfeedValueError
from .loader import Loader

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
    if len(pair) != 2 or not all(
        isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in pair
    ):
        raise PinfeedValueError(f"{name}: size must be an int or (height, width), not {size!r}")
    return int(pair[0]), int(pair[1])


def _channel_triple(values: Any, what: str, name: str) -> tuple[float, float, float]:
    return _pinfeed.channel_triple([float(v) for v in np.atleast_1d(values)], what, name)


class ImageLoader(EpochLoader):
    """Batches of decoded, cropped images and their labels, streamed through pinfeed's ring.

    ``source`` is a local ImageFolder tree (``source/<class>/.../<image>``; labels are the indices of
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
    having no bfloat16). ``framework`` (``"torch"``, ``"jax"``, ``"cupy"`` or ``"numpy"``, as
    for :class:`pinfeed.Loader`) picks the kind of array instead: JAX splits and normalizes
    in one jitted function (labels int32 without ``jax_enable_x64``), CuPy on its current
    stream (no bfloat16).

    Images are read from local files: a URL is refused, and so are ``storage_options``,
    ``cache_dir``, ``cache_limit`` and ``queue_depth`` (object storage), as for a local path
    elsewhere.

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
    ``pinned_budget``, ``prefetch``, ``drop_last``, ``num_threads`` and ``device`` are the
    Loader's too. ``shuffle`` is ``False``/``"none"`` or ``True``/``"random"``.

    ``source`` may be a dict of name to dataset with ``weights={name: share}``: a mixture, as
    :class:`pinfeed.TokenLoader`'s (``mode``, ``on_exhausted``, :meth:`set_weights`,
    ``stats()["sources"]``, each source's position in the state), decoded on the CPU. Each
    sample keeps its own dataset's label and crops; ``shuffle=True`` orders each pass anew.
    """

    @accepts_old_spellings("ImageLoader")
    def __init__(
        self,
        source: Union[str, "os.PathLike[str]", Mapping[str, Any]],
        batch_size: int,
        size: Union[int, Sequence[int]] = 224,
        *,
        device: Any = "auto",
        framework: Optional[str] = None,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        pinned_budget: Any = None,
        num_threads: Optional[int] = None,
        prefetch: int = 4,
        storage_options: Optional[dict[str, Any]] = None,
        cache_dir: Any = None,
        cache_limit: Any = None,
        queue_depth: Optional[int] = None,
        dtype: str = "float32",
        decode: str = "cpu",
        crop: str = "random",
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        resize: Optional[int] = None,
        flip: Optional[bool] = None,
        layout: str = "NCHW",
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        on_error: str = "raise",
        max_pixels: Optional[int] = None,
        weights: Any = None,
        mode: str = "exact",
        on_exhausted: Any = None,
    ) -> None:
        mixed = isinstance(source, Mapping)
        self.source = name_of(source) if mixed else source_path(source, "ImageLoader")
        store = store_args(storage_options, cache_dir, cache_limit, queue_depth, self.source)
        local_only(self.source, store, "ImageLoader")
        framework = framework_arg(framework)
        self._check_options(decode, size, layout, mean, std, dtype, framework)
        self.batch_size, self.seed = ints(self.source, batch_size=batch_size, seed=seed)
        #: ``"none"`` or ``"random"``.
        self.shuffle: str = shuffle_arg(shuffle, ("none", "random"), "ImageLoader")
        if num_threads is not None:
            num_threads = int_arg(self.source, "num_threads", num_threads)
        elif hasattr(os, "sched_getaffinity"):
            num_threads = len(os.sched_getaffinity(0))
        self._shared(
            rank,
            world_size,
            device=device,
            framework=framework,
            drop_last=drop_last,
            shuffle=self.shuffle,
            seed=self.seed,
            pinned_budget=pinned_budget,
            num_threads=num_threads,
            prefetch=prefetch,
            raw=True,
        )
        look = dict(crop=crop, scale=scale, ratio=ratio, resize=resize, flip=flip)
        opened = functools.partial(
            self._open_dataset, **look, on_error=on_error, max_pixels=max_pixels
        )
        self._mixture = image_mixture_of(source, self, weights, mode, on_exhausted, opened, decode)
        if self._mixture is not None:  # each epoch's blend is in its order already
            self._loader_args["shuffle"] = "none"
        self._dataset = self._mixture.datasets[0] if mixed else opened(self.source)
        self._set_decoder(decode, device, num_threads, pinned_budget)
        # The crops depend on the epoch, so each epoch has its own source (and Loader).
        self._first_loader()
        #: What images and labels are: ``"torch"``, ``"jax"``, ``"cupy"`` or ``"numpy"``.
        self.framework: str = framework or ("torch" if self.device.startswith("cuda") else "numpy")

    def _check_options(
        self,
        decode: str,
        size: Any,
        layout: str,
        mean: Any,
        std: Any,
        dtype: str,
        framework: Optional[str],
    ) -> None:
        _check_decoder(decode, self.source)
        self.height, self.width = _size_pair(size, self.source)
        if layout not in ("NCHW", "NHWC"):
            raise PinfeedValueError(
                f"{self.source}: layout must be 'NCHW' or 'NHWC', not {layout!r}"
            )
        if (mean is None) != (std is None):
            raise PinfeedValueError(f"{self.source}: give mean and std together, or neither")
        if dtype not in _DTYPES:
            raise PinfeedValueError(
                f"{self.source}: dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}"
            )
        if framework == "cupy" and dtype == "bfloat16" and mean is not None:
            raise PinfeedValueError(
                f"{self.source}: CuPy has no bfloat16; use dtype='float16' or 'float32', or "
                "framework='torch' or 'jax'"
            )
        self.layout = layout
        #: ``(mean, std)`` of normalizing, or None (uint8 images).
        self.normalize: Optional[tuple[tuple[float, ...], tuple[float, ...]]] = (
            None
            if mean is None
            else (
                _channel_triple(mean, "mean", self.source),
                _channel_triple(std, "std", self.source),
            )
        )
        #: What normalized images are: ``"float32"``, ``"float16"`` or ``"bfloat16"``.
        self.dtype = dtype

    def _set_decoder(self, decode: str, device: Any, num_threads: Any, pinned_budget: Any) -> None:
        #: The decoder in use, ``"cpu"`` or ``"gpu"``, and why (``decode="auto"`` times both).
        self.decode, self.decode_reason = _pinfeed.image_decoder(
            decode, device_name(device), self._dataset, self.batch_size, num_threads, pinned_budget
        )
        self._images = ImageBatches(
            self.height,
            self.width,
            self.layout,
            self.normalize,
            self.dtype,
            self._dataset.record_parts(),
            planar=self.decode == "gpu",
        )

    def _open_dataset(
        self,
        path: str,
        crop: str,
        scale: Sequence[float],
        ratio: Sequence[float],
        resize: Any,
        flip: Any,
        on_error: str,
        max_pixels: Any,
    ) -> "_pinfeed.ImageDataset":
        if resize is not None:
            resize = int_arg(self.source, "resize", resize)
        if max_pixels is not None:
            max_pixels = int_arg(self.source, "max_pixels", max_pixels)
        return _pinfeed.ImageDataset(
            path,
            height=self.height,
            width=self.width,
            crop=crop,
            scale=tuple(float(s) for s in scale),
            ratio=tuple(float(r) for r in ratio),
            resize=resize,
            flip=(crop == "random") if flip is None else bool(flip),
            layout=self.layout,
            on_error=on_error,
            max_pixels=max_pixels,
            seed=self.seed,
        )

    def _make_loader(self, epoch: int) -> Loader:
        if self._mixture is not None:
            return Loader(self._mixture.open(epoch), self.batch_size, **self._loader_args)
        source = self._dataset.source(epoch, gpu=self.decode == "gpu")
        return Loader(source, self.batch_size, **self._loader_args)

    def _start_of(self, epoch: int) -> dict[str, Any]:
        return {**self._loader.state_dict(), "epoch": epoch, "batches_done": 0, "consumed": 0}

    def _epoch_of(self, start: Any) -> int:
        return int(start["epoch"])

    def _begin(self, loader: Loader, start: Any) -> Iterator[tuple[Any, Any]]:
        # The Loader of this epoch's crops, positioned (its order follows the epoch too).
        loader.load_state_dict(start)
        return self._batches(iter(loader))

    @property
    def classes(self) -> list[str]:
        """The sorted class names of an ImageFolder tree (label ``k`` is ``classes[k]``);
        empty for tar shards. A mixture's labels are each source's own: these are its first
        source's classes."""
        return list(self._dataset.classes)

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (all ranks); for a mixture, in the current epoch's blend."""
        return len(self._dataset) if self._mixture is None else self._loader.num_samples

    def labels(self) -> np.ndarray:
        """Every sample's label in dataset order, int64 (a mixture's: its sources' in turn)."""
        every = [self._dataset] if self._mixture is None else self._mixture.datasets
        return np.concatenate([np.asarray(d.labels(), dtype=np.int64) for d in every])

    def _batches(self, batches: Iterator[Any]) -> Iterator[tuple[Any, Any]]:
        for raw in batches:
            yield self._images.split(raw, self.framework)

    def _image_params(self) -> dict[str, Any]:
        every = [self._dataset] if self._mixture is None else self._mixture.datasets
        samples = sum(len(d) for d in every)
        return {"height": self.height, "width": self.width, "num_samples": samples}

    def state_dict(self) -> dict[str, Any]:
        """:meth:`pinfeed.Loader.state_dict`'s dict (``epoch``, ``batches_done``, ...) under the
        image parameters it depends on, in ``"images"``. After :meth:`set_epoch` or
        :meth:`load_state_dict`, the position the next iteration starts at."""
        state = dict(self._next) if self._next is not None else self._loader.state_dict()
        state["images"] = self._image_params()
        if self._mixture is not None:
            state["mixture"] = self._mixture.state(state)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration resume at ``state`` (from :meth:`state_dict`): exactly
        the batches the interrupted run had not received. Raises
        :class:`pinfeed.PinfeedValueError` for a state of another dataset, image size or
        Loader setting, or one that is not an ImageLoader state."""
        rest, epoch, _done = self._checked_state(
            state, "ImageLoader", "images", self._image_params()
        )
        if self._mixture is not None:
            # The saved schedule, then the blend of the saved epoch.
            self._mixture.adopt(rest.pop("mixture", None))
            self._loader.close()
            self._loader, self._loader_epoch = self._make_loader(epoch), epoch
            rest = reblended(rest, self._loader)
        # The Loader checks the order's parameters and the position (moved to this world size).
        self._loader.load_state_dict(rest)
        self._next = self._loader.state_dict()

    def stats(self) -> dict[str, Any]:
        """The counters of the current (or last) pass (:meth:`pinfeed.Loader.stats`),
        ``skipped``: samples skipped since the loader was made (``on_error="skip"``), and
        ``decode`` / ``decode_reason``: the decoder in use and why (``decode="auto"``'s rates)."""
        every = [self._dataset] if self._mixture is None else self._mixture.datasets
        stats = {
            **self._loader.stats(),
            "skipped": sum(int(d.skipped()) for d in every),
            "decode": self.decode,
            "decode_reason": self.decode_reason,
        }
        return stats if self._mixture is None else self._mixture.stats(stats)

    def set_weights(self, weights: Mapping[str, float], from_step: Optional[int] = None) -> None:
        """A mixture's weights from global step ``from_step`` on, as
        :meth:`pinfeed.TokenLoader.set_weights`."""
        if self._mixture is None:
            raise PinfeedValueError(f"{self.source}: set_weights applies to a mixture")
        self.load_state_dict(self._mixture.reweighted(self.state_dict(), weights, from_step))

    def __repr__(self) -> str:
        return (
            f"ImageLoader({self.source!r}, batch_size={self.batch_size}, "
            f"size=({self.height}, {self.width}), samples={self.num_samples}, "
            f"layout={self.layout!r}, decode={self.decode!r}, device={self.device!r}, "
            f"rank={self.rank}, world_size={self.world_size})"
        )
