"""Type stubs of the Rust extension module ``pinfeed._pinfeed`` (private: use ``pinfeed``)."""

from collections.abc import Iterator, Sequence
from os import PathLike
from typing import Any, TypeVar, Union, overload

import numpy as np

__version__: str
DEFAULT_PINNED_BUDGET: int
DEFAULT_STAGING_BUDGET: int

_Size = Union[int, str, None]
_DLDtype = tuple[int, int, int]
# A C-contiguous, writable array of native int64 or uint64 (epoch_order's out).
_ArrayT = TypeVar("_ArrayT", bound=np.ndarray)

class DeviceBuffer:
    """Device memory (a loader batch or an upload), exportable once through DLPack."""

    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> _DLDtype: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def exported(self) -> bool: ...
    @property
    def epoch(self) -> int | None: ...
    @property
    def index(self) -> int | None: ...
    @property
    def first_record(self) -> int | None: ...
    def wait(self) -> None: ...
    def read_back(self) -> bytes: ...
    def release(self) -> None: ...

class Source:
    """A dataset of fixed-size records."""

    @staticmethod
    def open(
        path: str | PathLike[str],
        *,
        descr: str | None = None,
        user_dtype: str | None = None,
        shape: Sequence[int] | None = None,
        reader: str = "auto",
        read_size: int | str | None = None,
        queue_depth: int | None = None,
        tensor: str | None = None,
    ) -> Source: ...
    @staticmethod
    def from_array(array: Any, descr: str) -> Source: ...
    @property
    def name(self) -> str: ...
    @property
    def num_records(self) -> int: ...
    @property
    def record_bytes(self) -> int: ...
    @property
    def record_shape(self) -> list[int]: ...
    @property
    def descr(self) -> str: ...
    @property
    def dlpack_dtype(self) -> _DLDtype | None: ...

class ToFloatSpec:
    """``x * scale`` as float32 (Rust, no GIL)."""

    scale: float
    def __init__(self, scale: float = ...) -> None: ...

class NormalizeSpec:
    """``(x * scale - mean[c]) / std[c]`` per channel as float32 (Rust, no GIL)."""

    mean: list[float]
    std: list[float]
    scale: float
    def __init__(
        self, mean: Sequence[float], std: Sequence[float], *, scale: float = 1.0
    ) -> None: ...

class Stream(Iterator[DeviceBuffer]):
    """One pass of a Rust loader; with ``devices``, one that copies each batch to every device
    and yields each step's batches one after the other, in device order."""

    def __init__(
        self,
        source: Source,
        batch_size: int,
        *,
        export_dtype: _DLDtype,
        record_shape: Sequence[int],
        drop_last: bool = False,
        epochs: int = 1,
        pinned_budget: _Size = None,
        device_budget: _Size = None,
        num_threads: int | None = None,
        device: str = "cuda",
        prefetch: int = 4,
        piece_bytes: int | None = None,
        transform: Any = None,
        transform_out_bytes: int | None = None,
        reader: str = "auto",
        shuffle: str = "none",
        block_size: int | None = None,
        block_window: int | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        start_epoch: int = 0,
        start_batches_done: int = 0,
        devices: Sequence[str] | None = None,
    ) -> None: ...
    def __iter__(self) -> Stream: ...
    def __next__(self) -> DeviceBuffer: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def num_batches(self) -> int: ...
    @property
    def batches_per_epoch(self) -> int: ...
    @property
    def record_bytes(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def devices(self) -> list[str]: ...
    @property
    def fingerprint(self) -> int: ...

class Stager:
    """Uploads through one fixed pinned arena."""

    def __init__(
        self,
        device: str = "cuda",
        pinned_budget: _Size = None,
        num_threads: int | None = None,
        method: str = "stage",
        piece_size: _Size = None,
    ) -> None: ...
    def upload(self, array: Any, dtype: _DLDtype, shape: Sequence[int]) -> DeviceBuffer: ...
    def counters(self) -> dict[str, Any]: ...
    @property
    def device(self) -> str: ...
    @property
    def pinned_bytes(self) -> int: ...
    @property
    def pinned_budget(self) -> int: ...
    @property
    def method(self) -> str: ...
    @property
    def pinned_locked(self) -> bool: ...

class PinnedRegion:
    """An array page-locked in place until ``close()``."""

    nbytes: int
    def __init__(self, array: Any, device: str = "cuda") -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...

def dlpack_dtype(descr: str) -> _DLDtype | None: ...
def parse_dtype(text: str) -> tuple[str, list[int]]: ...
def parse_size(text: str) -> int: ...
def cuda_device_count() -> int: ...
def cli_main(argv: list[str]) -> int: ...
def pinned_allocations() -> int: ...
def order_fingerprint(
    num_records: int,
    batch_size: int,
    *,
    drop_last: bool,
    shuffle: str,
    block_size: int | None = None,
    block_window: int | None = None,
    seed: int,
    world_size: int,
) -> int: ...
def epoch_size(
    num_records: int, batch_size: int, *, drop_last: bool, rank: int, world_size: int
) -> tuple[int, int]: ...
@overload
def epoch_order(
    num_records: int,
    batch_size: int,
    *,
    drop_last: bool,
    shuffle: str,
    block_size: int | None = None,
    block_window: int | None = None,
    seed: int,
    rank: int,
    world_size: int,
    epoch: int,
    out: None = None,
) -> tuple[bytes, int]: ...
@overload
def epoch_order(
    num_records: int,
    batch_size: int,
    *,
    drop_last: bool,
    shuffle: str,
    block_size: int | None = None,
    block_window: int | None = None,
    seed: int,
    rank: int,
    world_size: int,
    epoch: int,
    out: _ArrayT,
) -> tuple[_ArrayT, int]: ...
