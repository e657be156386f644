"""Old spellings still accepted: each warns once a process with
:class:`pinfeed.PinfeedDeprecationWarning`, naming the new spelling, and then works.

The renames of issue 48 (one vocabulary), as ``(where, old) -> new``, are in :data:`RENAMES`;
the entry points call :func:`renamed` for keywords and :func:`warn_once` for anything else
(an attribute, a positional argument).
"""

import functools
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

from .errors import PinfeedDeprecationWarning, PinfeedTypeError, PinfeedValueError

__all__ = [
    "RENAMES",
    "accepts_old_spellings",
    "as_torch",
    "caller_stacklevel",
    "positional_to_keywords",
    "renamed",
    "reset",
    "warn_once",
]

# Keywords that only changed their name: ``(entry point, old) -> new``.
_KEYWORDS: dict[tuple[str, str], str] = {
    ("TokenLoader", "path"): "source",
    ("ImageLoader", "path"): "source",
    ("prefetch", "iterable"): "source",
    ("prefetch", "depth"): "prefetch",
    ("Prefetcher", "iterable"): "source",
    ("Prefetcher", "depth"): "prefetch",
    ("to_device", "x"): "source",
}

#: Every old spelling still accepted, ``(entry point, old) -> new``: for the docs and the tests.
RENAMES: Mapping[tuple[str, str], str] = {
    **_KEYWORDS,
    ("TokenLoader", 'dtype="uint16" (a stored width)'): "token_dtype",
    ("TokenLoader", "int_dtype"): "dtype",
    ("Loader", "as_torch=True"): 'framework="torch"',
    ("prefetch", "device given by position"): "device=",
    ("prefetch", "depth given by position"): "prefetch=",
    ("prefetch", "pinned_budget given by position"): "pinned_budget=",
    ("Prefetcher", "device given by position"): "device=",
    ("Prefetcher", "depth given by position"): "prefetch=",
    ("Prefetcher", "pinned_budget given by position"): "pinned_budget=",
    ("to_device", "device given by position"): "device=",
    ("to_device", "pinned_budget given by position"): "pinned_budget=",
    ("Loader", "num_records"): "num_samples",
}

# The old spellings that have warned in this process.
_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def caller_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel`` for the first frame outside this package, so that a
    warning names the user's line whichever of pinfeed's entry points was called."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1  # the function that calls warnings.warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def warn_once(where: str, old: str, advice: str) -> None:
    """Warns that ``where``'s ``old`` spelling is deprecated (``advice`` names the new one), the
    first time this process uses it."""
    key = (where, old)
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(
        f"{where}: {old} is deprecated; {advice}",
        PinfeedDeprecationWarning,
        stacklevel=caller_stacklevel(),
    )


def renamed(where: str, kwargs: dict[str, Any], positional: Sequence[str] = ()) -> None:
    """Moves each old keyword of ``where`` in ``kwargs`` to its new name (warning once);
    both spellings given (the new one as a keyword or among the ``positional`` parameters
    given) is a :class:`pinfeed.PinfeedTypeError`."""
    for (entry, old), new in _KEYWORDS.items():
        if entry != where or old not in kwargs:
            continue
        if new in kwargs or new in positional:
            raise PinfeedTypeError(
                f"{where}: give {new}= only ({old}= is its deprecated spelling), not both"
            )
        warn_once(where, f"{old}=", f"use {new}= instead")
        kwargs[new] = kwargs.pop(old)


# Converts an entry point's arguments from old spellings that are more than a keyword's name
# (a value, a position): returns the positional arguments left, and edits the keywords.
Convert = Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...]]


def accepts_old_spellings(where: str, convert: Optional[Convert] = None) -> Callable[[Any], Any]:
    """Wraps an entry point (a function or ``__init__``) so that the old spellings of
    :data:`RENAMES` for ``where`` keep working, each warning once; ``convert`` handles those
    that are more than a renamed keyword. ``inspect.signature`` gives the wrapped signature:
    the new spelling only."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        names = list(inspect.signature(fn).parameters)

        @functools.wraps(fn)
        def with_old_spellings(*args: Any, **kwargs: Any) -> Any:
            if convert is not None:
                args = convert(args, kwargs)
            renamed(where, kwargs, names[: len(args)])
            return fn(*args, **kwargs)

        return with_old_spellings

    return wrap


def positional_to_keywords(
    where: str, names: tuple[str, ...], first: int, new_names: tuple[str, ...]
) -> Convert:
    """A ``convert`` moving the positional arguments after the first ``first`` to keywords:
    ``names`` are what they were called when they were positional, ``new_names`` their
    keywords now; each warns once. ``first`` counts ``self`` for a method."""

    def convert(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        extra = args[first:]
        if len(extra) > len(names):
            raise PinfeedTypeError(
                f"{where}() takes {first} positional argument(s) and keywords; got {len(args)}"
            )
        for name, new, value in zip(names, new_names, extra):
            warn_once(where, f"{name} given by position", f"pass {new}= as a keyword instead")
            if new in kwargs:
                raise PinfeedTypeError(f"{where}() got multiple values for argument {new!r}")
            kwargs[new] = value
        return args[:first]

    return convert


def as_torch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``as_torch=True``, the old spelling of ``framework="torch"`` (``False`` changes
    nothing)."""
    if "as_torch" in kwargs:
        warn_once("Loader", "as_torch=", 'use framework="torch" instead of as_torch=True')
        if kwargs.pop("as_torch"):
            framework = kwargs.get("framework")
            if framework is not None and str(framework).lower() != "torch":
                raise PinfeedValueError(
                    f"as_torch=True asks for torch tensors, framework={framework!r} for another "
                    "kind; give one of them (framework only: as_torch is deprecated)"
                )
            kwargs["framework"] = "torch"
    return args


def reset() -> None:
    """Forgets which old spellings have warned (for tests)."""
    with _lock:
        _warned.clear()
