"""The options every entry point shares, read one way: device names, the ``device="auto"``
fallback warning, shuffle modes a loader can do, and integer arguments.

The rules on numbers live in Rust (``_pinfeed.check_ints`` and ``StreamOptions``, one table of
ranges): ``seq_len=1.5``, ``batch_size=True`` or ``epoch=-1`` get one message wherever they
are given. This module only translates (a ``torch.device`` to a name, ``True`` to
``"random"``).
"""

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _pinfeed
from ._deprecation import caller_stacklevel
from .errors import PinfeedValueError, PinfeedWarning

__all__ = ["device_name", "warn_if_host_fallback", "ints", "int_arg", "shuffle_arg"]


def device_name(device: Any) -> str:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` from a string, an int or a
    ``torch.device``."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return f"cuda:{int(device)}"
    return str(device)


_warned_host_fallback = False


def warn_if_host_fallback(asked: str, got: str) -> None:
    """Warns, once a process, that ``device="auto"`` found no usable GPU and runs on the host
    backend (``device="cuda"`` raises instead)."""
    global _warned_host_fallback
    if asked.strip().lower() == "auto" and got == "cpu" and not _warned_host_fallback:
        _warned_host_fallback = True
        warnings.warn(
            'device="auto" found no usable CUDA driver and device: running on the host backend '
            '(batches in host memory); pass device="cpu" to ask for it, or device="cuda" to '
            "require a GPU",
            PinfeedWarning,
            stacklevel=caller_stacklevel(),
        )


def ints(what: str, **values: Any) -> list[int]:
    """The integer arguments ``values`` checked by the shared rules (Rust's table of ranges), in
    the order given; a :class:`pinfeed.PinfeedTypeError` for a bool, float, string or None, a
    :class:`pinfeed.PinfeedValueError` naming the argument and its range otherwise. ``what``
    (the source's name) starts each message."""
    return [int(v) for v in _pinfeed.check_ints(what, **values)]


def int_arg(what: str, name: str, value: Any) -> int:
    """One integer argument, as :func:`ints` checks it."""
    return ints(what, **{name: value})[0]


#: Every shuffle mode, in the order messages list them.
SHUFFLE_MODES = ("none", "random", "block", "gpu")


def shuffle_arg(shuffle: Any, can: Sequence[str], what: str) -> str:
    """The mode of ``shuffle`` (``False``/``"none"``, ``True``/``"random"``, ``"block"``,
    ``"gpu"``), refused where the loader ``what`` cannot do it (``can``: the modes it can)."""
    if shuffle is None or isinstance(shuffle, (bool, np.bool_)):
        mode = "random" if shuffle else "none"
    elif isinstance(shuffle, str) and shuffle.strip().lower() in SHUFFLE_MODES:
        mode = shuffle.strip().lower()
    else:
        mode = None
    if mode is None or mode not in can:
        accepted = ", ".join(
            ["False", "True"] + [repr(m) for m in SHUFFLE_MODES if m in can and m != "none"]
        )
        refusal = "" if mode is None else f" ({what} cannot shuffle {mode!r})"
        raise PinfeedValueError(
            f"{what}: shuffle must be {accepted} or 'none', not {shuffle!r}{refusal}"
        )
    return mode
