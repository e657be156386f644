"""pinfeed: feed fixed-size records from disk or host memory to NVIDIA GPUs through a bounded
ring of pinned memory.

>>> import pinfeed
>>> loader = pinfeed.Loader("data.npy", batch_size=4096)     # doctest: +SKIP
>>> for x in loader:                                          # doctest: +SKIP
...     step(x)                                               # a torch.Tensor on cuda:0

- :class:`Loader`: batches of a ``.npy``/raw file, numpy array or memmap, on the GPU; shuffled,
  sharded across ranks and resumable (``state_dict``).
- :class:`MultiLoader`: one process feeding several devices: a ring per device, each on its
  shard, or (``replicate=True``) the same batches to every device, read once.
- :class:`TokenLoader`: token windows for language models, as ``(x, y)`` batches.
- :class:`ImageLoader`: JPEG/PNG datasets (ImageFolder or WebDataset tars) decoded and
  cropped on the reader threads, as ``(images, labels)`` batches.
- :func:`epoch_order`: the records each batch of a shuffled, sharded epoch holds.
- :func:`merge_states`: one resume state from several ranks' (the one that got least far).
- :func:`prefetch`: any iterable of (nested) arrays moved to the GPU, a few batches ahead.
- :func:`to_device`: one array to the GPU without pinning it; :func:`pinned`: pin in place.
- :mod:`pinfeed.transforms`: preprocessing on the reader threads.
- :mod:`pinfeed.errors`: :class:`PinfeedError` and its subclasses.

torch is imported only when a CUDA batch (or ``framework="torch"``) needs it. ``framework="jax"``,
``"cupy"`` or ``"numpy"`` on every entry point delivers those arrays instead, without torch.
"""

from . import transforms
from ._pinfeed import DEFAULT_PINNED_BUDGET, DeviceBuffer, __version__, cuda_device_count
from .errors import (
    CudaError,
    PinfeedDeprecationWarning,
    PinfeedError,
    PinfeedMemoryError,
    PinfeedOSError,
    PinfeedTypeError,
    PinfeedValueError,
    PinfeedWarning,
)
from .images import ImageLoader
from .loader import Loader, merge_states
from .multi import MultiLoader
from .order import epoch_order
from .sources import Source
from .staging import Prefetcher, free_staging_memory, pinned, prefetch, to_device
from .tokens import TokenLoader
from .transforms import Transform

# Sorted (uppercase first, as sorted() orders them); a test checks it against the names above.
__all__ = [
    "CudaError",
    "DEFAULT_PINNED_BUDGET",
    "DeviceBuffer",
    "ImageLoader",
    "Loader",
    "MultiLoader",
    "PinfeedDeprecationWarning",
    "PinfeedError",
    "PinfeedMemoryError",
    "PinfeedOSError",
    "PinfeedTypeError",
    "PinfeedValueError",
    "PinfeedWarning",
    "Prefetcher",
    "Source",
    "TokenLoader",
    "Transform",
    "__version__",
    "cuda_device_count",
    "epoch_order",
    "free_staging_memory",
    "merge_states",
    "pinned",
    "prefetch",
    "to_device",
    "transforms",
]
