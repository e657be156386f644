"""Type stubs of the Rust extension module ``pinfeed._pinfeed`` (private: use ``pinfeed``)."""

from collections.abc import Iterator, Sequence
from os import PathLike
from typing import Any, TypeVar, Union, final, overload

import numpy as np
from typing_extensions import Self

__all__ = [
    "Blend",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_PINNED_BUDGET",
    "DEFAULT_STAGING_BUDGET",
    "DeviceBuffer",
    "ImageDataset",
    "Mixture",
    "NormalizeSpec",
    "PinnedRegion",
    "Source",
    "Stager",
    "StepGroups",
    "Stream",
    "StreamOptions",
    "ToFloatSpec",
    "TokenStream",
    "__version__",
    "bottleneck",
    "byte_size",
    "channel_triple",
    "check_ints",
    "chunk_order",
    "crop_params",
    "cli_main",
    "combined_stats",
    "common_token_dtype",
    "cuda_device_count",
    "device_share",
    "dlpack_dtype",
    "document_order",
    "epoch_order",
    "epoch_size",
    "image_decoder",
    "is_url",
    "mixture_seed",
    "natural_block",
    "open_table",
    "open_text_column",
    "open_token_column",
    "open_tokens",
    "parse_dtype",
    "pinned_allocations",
    "reshard_position",
    "streams_with_exports",
    "table_cache_limit",
    "token_offsets",
    "tokenized_rows",
    "widen_tokens",
]
__version__: str
DEFAULT_MAX_PIXELS: int
DEFAULT_PINNED_BUDGET: int
DEFAULT_STAGING_BUDGET: int

_Size = Union[int, str, None]
_DLDtype = tuple[int, int, int]
# A C-contiguous, writable array of native int64 or uint64 (epoch_order's out).
_ArrayT = TypeVar("_ArrayT", bound=np.ndarray)

@final
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
    @property
    def documents(self) -> int | None: ...
    def wait(self) -> None: ...
    def read_back(self) -> bytes: ...
    def release(self) -> None: ...

@final
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
        storage_options: dict[str, str] | None = None,
        cache_dir: str | PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> Source: ...
    @staticmethod
    def from_array(array: Any, descr: str) -> Source: ...
    def data_fingerprint(self) -> int: ...
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
    def columns(self) -> list[str] | None: ...
    @property
    def dlpack_dtype(self) -> _DLDtype | None: ...

@final
class ToFloatSpec:
    """``x * scale`` as float32 (Rust, no GIL)."""

    scale: float
    def __new__(cls, scale: float = ...) -> Self: ...

@final
class NormalizeSpec:
    """``(x * scale - mean[c]) / std[c]`` per channel as float32 (Rust, no GIL)."""

    mean: list[float]
    std: list[float]
    scale: float
    def __new__(
        cls, mean: Sequence[float], std: Sequence[float], *, scale: float = 1.0
    ) -> Self: ...

@final
class StreamOptions:
    """The checked options of a loader's passes (every range, size and name is read here)."""

    def __new__(
        cls,
        source: Source,
        batch_size: int,
        *,
        export_dtype: _DLDtype,
        record_shape: Sequence[int],
        **options: Any,
    ) -> Self: ...
    def upload(self, batch_size: int) -> StreamOptions: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def epochs(self) -> int: ...
    @property
    def drop_last(self) -> bool: ...
    @property
    def seed(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def pinned_budget(self) -> int: ...
    @property
    def device_budget(self) -> int | None: ...
    @property
    def device(self) -> str: ...
    @property
    def fingerprint(self) -> int: ...
    def fingerprint_at(self, world_size: int) -> int: ...
    def check_iter(self) -> None: ...

@final
class Stream(Iterator[DeviceBuffer]):
    """One pass of a Rust loader; with ``devices``, one that copies each batch to every device
    and yields each step's batches one after the other, in device order."""

    def __new__(
        cls,
        options: StreamOptions,
        *,
        start_epoch: int | None = None,
        start_batches_done: int | None = None,
        start_consumed: int | None = None,
    ) -> Self: ...
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

@final
class Stager:
    """Uploads through one fixed pinned arena."""

    def __new__(
        cls,
        device: str = "cuda",
        pinned_budget: _Size = None,
        num_threads: int | None = None,
        method: str = "stage",
        piece_size: _Size = None,
    ) -> Self: ...
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

@final
class PinnedRegion:
    """An array page-locked in place until ``close()``."""

    nbytes: int
    def __new__(cls, array: Any, device: str = "cuda") -> Self: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...

def dlpack_dtype(descr: str) -> _DLDtype | None: ...
def parse_dtype(text: str) -> tuple[str, list[int]]: ...
def cuda_device_count() -> int: ...
def cli_main(argv: list[str]) -> int: ...
def pinned_allocations() -> int: ...
def streams_with_exports() -> dict[int, int]: ...
def device_share(
    rank: int, world_size: int, devices: int, index: int, pinned_budget: _Size = None
) -> tuple[int, int, int]: ...
def byte_size(value: _Size, what: str = "size") -> int | None: ...
def check_ints(what: str, **values: object) -> list[int]: ...
def is_url(path: str) -> bool: ...
def bottleneck(
    *,
    elapsed: float,
    delivered: int,
    consumer_wait: float,
    copy_starved: float,
    copy_blocked: float,
    producer: str = "the producer",
    copier: str = "the copy stage",
) -> tuple[str, str]: ...
def epoch_size(
    num_records: int,
    batch_size: int,
    *,
    drop_last: bool,
    rank: int,
    world_size: int,
    consumed: int = 0,
) -> tuple[int, int]: ...
def combined_stats(
    streams: list[Stream | None],
) -> tuple[dict[str, Any], list[dict[str, Any]]]: ...
def open_table(
    path: str | PathLike[str],
    columns: list[str] | None = None,
    *,
    on_error: str = "raise",
    reader: str = "auto",
    storage_options: dict[str, str] | None = None,
    cache_dir: str | PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    queue_depth: int | None = None,
) -> Source: ...
def natural_block(source: Source) -> int | None: ...
def open_text_column(
    path: str | PathLike[str],
    column: str,
    tokenizer: str,
    *,
    bos: str | int | None = None,
    eos: str | int | None = None,
    documents: bool = False,
    storage_options: dict[str, str] | None = None,
    cache_dir: str | PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    queue_depth: int | None = None,
) -> tuple[TokenStream, int | None, int | None]: ...
def open_token_column(
    path: str | PathLike[str],
    column: str,
    *,
    dtype: str | None = None,
    documents: bool = False,
    storage_options: dict[str, str] | None = None,
    cache_dir: str | PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    queue_depth: int | None = None,
) -> TokenStream: ...
def tokenized_rows() -> int: ...
def reshard_position(
    num_records: int,
    batch_size: int,
    *,
    drop_last: bool,
    epoch: int,
    batches_done: int,
    consumed: int,
    from_world_size: int,
    to_world_size: int,
) -> tuple[int, int, int]: ...

@final
class StepGroups:
    """A source's records renumbered so that each loader batch carries several steps of one
    epoch's order."""

    def __new__(
        cls,
        source: Source,
        batch_size: int,
        steps: int,
        *,
        drop_last: bool,
        seed: int,
        world_size: int,
        epoch: int,
        consumed: int = 0,
    ) -> Self: ...
    def source(self) -> Source: ...
    @property
    def num_steps(self) -> int: ...
    def step_len(self, i: int) -> int: ...
    def fingerprint_at(self, world_size: int) -> int: ...

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
    consumed: int = 0,
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
    consumed: int = 0,
) -> tuple[_ArrayT, int]: ...

@final
class TokenStream:
    """Token data in object storage as open_tokens opened it (listed, headers read)."""

    @property
    def chunk_decodes(self) -> int | None: ...

def open_tokens(
    path: Union[str, PathLike[str]],
    *,
    seq_len: int,
    batch_size: int,
    dtype: str | None = None,
    sample: str = "random",
    seed: int = 0,
    steps: int | None = None,
    world_size: int = 1,
    epoch: int = 0,
    steps_per_batch: int = 1,
    storage_options: dict[str, str] | None = None,
    cache_dir: str | PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    queue_depth: int | None = None,
    opened: TokenStream | None = None,
    output: str | None = None,
    shuffle: str = "none",
) -> tuple[Source, str, int, TokenStream | None, int, int | None]: ...
def token_offsets(seed: int, epoch: int, num_offsets: int, first: int, count: int) -> list[int]: ...
def document_order(seed: int, epoch: int, num_documents: int) -> list[int]: ...
def chunk_order(
    seed: int, epoch: int, counts: list[int], bytes: list[int], budget: int
) -> list[int]: ...
def table_cache_limit(limit: int | None = None) -> int: ...

# Data mixtures (pinfeed.TokenLoader's mixtures' Rust half).
@final
class Blend:
    """The schedule of a mixture: each sample's source and ordinal, by epoch and index."""

    def __new__(
        cls,
        names: Sequence[str],
        pass_len: Sequence[int],
        *,
        weights: Sequence[tuple[int, Sequence[float]]],
        exhausted: Sequence[Union[str, dict[str, int]]],
        step: int,
        mode: str = "exact",
        seed: int = 0,
        samples_per_epoch: int | None = None,
    ) -> Self: ...
    def mixture(self, sources: Sequence[Source], epoch: int, shuffle: bool) -> Mixture: ...
    def given_before(self, epoch: int, i: int) -> list[int]: ...
    def epoch_size(self, epoch: int) -> tuple[int, int]: ...

@final
class Mixture:
    """One epoch of a mixture as a loader source, with what each source gave."""

    def source(self) -> Source: ...
    @property
    def num_samples(self) -> int: ...
    def locate(self, first: int, count: int) -> list[tuple[int, int]]: ...
    def record_of(self, s: int, k: int) -> int: ...
    def source_stats(self) -> list[dict[str, Any]]: ...
    def holding_back(self) -> str | None: ...

def mixture_seed(seed: int, name: str) -> int: ...
def common_token_dtype(typestrs: Sequence[str]) -> str: ...
def widen_tokens(source: Source, from_dtype: str, to_dtype: str) -> Source: ...

# Image datasets (pinfeed.ImageLoader's Rust half).
@final
class ImageDataset:
    """An image dataset (ImageFolder tree or WebDataset shards), indexed once."""

    def __new__(
        cls,
        path: Union[str, PathLike[str]],
        *,
        height: int,
        width: int,
        crop: str = "random",
        scale: tuple[float, float] = ...,
        ratio: tuple[float, float] = ...,
        resize: int | None = None,
        flip: bool = True,
        layout: str = "NCHW",
        on_error: str = "raise",
        max_pixels: int | None = None,
        seed: int = 0,
    ) -> ImageDataset: ...
    def source(self, epoch: int, gpu: bool = False) -> Source: ...
    def __len__(self) -> int: ...
    @property
    def classes(self) -> list[str]: ...
    def labels(self) -> list[int]: ...
    def sample_name(self, i: int) -> str: ...
    def skipped(self) -> int: ...
    def skipped_at_open(self) -> list[str]: ...
    def record_parts(self) -> tuple[int, int]: ...
    def crop_of(
        self, sample: int, epoch: int, width: int, height: int
    ) -> tuple[float, float, float, float, bool]: ...

def channel_triple(values: list[float], what: str, name: str) -> tuple[float, float, float]: ...
def crop_params(
    width: int,
    height: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draws: list[float],
) -> tuple[int, int, int, int]: ...
def image_decoder(
    decode: str,
    device: str,
    dataset: ImageDataset,
    batch_size: int,
    num_threads: int | None = None,
    pinned_budget: _Size = None,
) -> tuple[str, str]: ...
