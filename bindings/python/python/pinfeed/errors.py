"""The exceptions pinfeed raises.

Every error is a :class:`PinfeedError`; each kind also subclasses the matching builtin, so
``except ValueError`` or ``except OSError`` keep working. The message is the Rust core's, which
names the file (or "host buffer"). ``err.kind`` is the Rust variant (``"Open"``,
``"BudgetTooSmall"``, ``"NoDriver"``, ...) where the error came from the core.
"""

from typing import Optional

__all__ = [
    "PinfeedError",
    "PinfeedValueError",
    "PinfeedTypeError",
    "PinfeedOSError",
    "PinfeedMemoryError",
    "CudaError",
    "PinfeedWarning",
    "PinfeedDeprecationWarning",
]


class PinfeedError(Exception):
    """Base class of every pinfeed error."""

    kind: Optional[str] = None


class PinfeedValueError(PinfeedError, ValueError):
    """A bad option, dtype, shape, layout or file header."""


class PinfeedTypeError(PinfeedError, TypeError):
    """An argument of the wrong type: a float or a string where an int is expected, a
    non-list where a list of states is."""


class PinfeedOSError(PinfeedError, OSError):
    """A file could not be opened or read, or ended early."""


class PinfeedMemoryError(PinfeedError, MemoryError):
    """A pinned or device memory budget is too small or exceeded, or host memory ran out."""


class CudaError(PinfeedError, RuntimeError):
    """The CUDA driver failed, or there is no driver or no such device."""


class PinfeedWarning(UserWarning):
    """Something pinfeed chose for you that you may want to know: ``device="auto"`` falling
    back to the host backend."""


class PinfeedDeprecationWarning(PinfeedWarning, DeprecationWarning):
    """An old spelling of an argument or attribute, still accepted for now: the message names
    the new one. Each old spelling warns once a process."""
