"""Record order: shuffle modes, the distributed rank and world size, and one epoch's order.

The order itself is computed in Rust (``pinfeed::EpochOrder``): the same function the loader's
reader threads use, so :func:`epoch_order` says exactly which records each batch of a
:class:`pinfeed.Loader` holds.
"""

import os
import sys
from typing import Any, Optional

import numpy as np

from . import _pinfeed
from ._options import SHUFFLE_MODES, ints, shuffle_arg
from .errors import PinfeedValueError

__all__ = ["epoch_order"]

#: Records in a block of ``shuffle="block"`` by default: those of about 1 MiB.
DEFAULT_BLOCK_BYTES = 1 << 20
#: Blocks whose records are shuffled together by default.
DEFAULT_BLOCK_WINDOW = 16


def order_kind(mode: str) -> str:
    """The Rust ``Shuffle`` behind a mode: GPU-resident shuffling draws ``Shuffle::Random``'s order."""
    return "random" if mode == "gpu" else mode


def block_args(
    mode: str, record_bytes: int, block_size: Optional[int], block_window: Optional[int]
) -> tuple[Optional[int], Optional[int]]:
    """``(block, window)`` for ``shuffle="block"`` with the defaults filled in; ``(None, None)``
    otherwise (where giving either is an error)."""
    if mode != "block":
        if block_size is not None or block_window is not None:
            raise PinfeedValueError(
                f'block_size and block_window apply to shuffle="block", not shuffle={mode!r}'
            )
        return None, None
    block = (
        max(1, DEFAULT_BLOCK_BYTES // max(1, record_bytes))
        if block_size is None
        else ints("", block_size=block_size)[0]
    )
    window = (
        DEFAULT_BLOCK_WINDOW if block_window is None else ints("", block_window=block_window)[0]
    )
    if block < 1 or window < 1:
        raise PinfeedValueError(
            f"block shuffle needs block_size >= 1 and block_window >= 1, got {block} and {window}"
        )
    return block, window


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise PinfeedValueError(
            f"environment variable {name}={text!r} is not an integer (torchrun sets RANK and "
            "WORLD_SIZE; pass rank= and world_size= to the Loader to override)"
        ) from None
    if value < 0:
        raise PinfeedValueError(f"environment variable {name}={text!r} is negative")
    return value


def distributed_defaults(rank: Optional[int], world_size: Optional[int]) -> tuple[int, int]:
    """This process's ``(rank, world_size)``: the arguments where given (as given: the Loader
    checks them); otherwise
    ``torch.distributed``'s when it is initialised; otherwise ``$RANK``/``$WORLD_SIZE``
    (torchrun sets them); otherwise 0 and 1.

    torch is never imported for this: a process group can only be initialised once torch has
    been imported, so looking at ``sys.modules`` misses nothing.
    """
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = sys.modules.get("torch.distributed")
    found: Optional[tuple[int, int]] = None
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                found = int(dist.get_rank()), int(dist.get_world_size())
        except (
            Exception
        ):  # pragma: no cover - a half-initialised torch: fall back to the environment
            found = None
    if found is None:
        found = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    return (found[0] if rank is None else rank), (found[1] if world_size is None else world_size)


def epoch_order(
    num_records: int,
    batch_size: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: Any = "random",
    drop_last: bool = False,
    rank: int = 0,
    world_size: int = 1,
    block_size: Optional[int] = None,
    block_window: Optional[int] = None,
    record_bytes: int = 1,
) -> np.ndarray:
    """The records rank ``rank`` reads in ``epoch``, in batch order, as a read-only ``uint64``
    array.

    Batch ``i`` is ``order[i * batch_size : (i + 1) * batch_size]``. This is the order a
    :class:`pinfeed.Loader` with the same arguments delivers (``shuffle="gpu"`` gives
    ``"random"``'s). ``record_bytes`` only sets the default ``block_size`` of
    ``shuffle="block"`` (the records in about 1 MiB).
    """
    mode = order_kind(shuffle_arg(shuffle, SHUFFLE_MODES, "epoch_order"))
    block, window = block_args(mode, record_bytes, block_size, block_window)
    # num_samples: num_records's rule (any count of records, 0 included).
    n, batch, seed, rank, world, epoch = ints(
        "epoch_order",
        num_samples=num_records,
        batch_size=batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        epoch=epoch,
    )
    data, _ = _pinfeed.epoch_order(
        n,
        batch,
        drop_last=bool(drop_last),
        shuffle=mode,
        block_size=block,
        block_window=window,
        seed=seed,
        rank=rank,
        world_size=world,
        epoch=epoch,
    )
    return np.frombuffer(data, dtype=np.uint64)
