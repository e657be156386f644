"""A pass of a :class:`pinfeed.Loader`: its batches as they are handed out, and its cut-off
rules (one pass at a time: a newer iteration or ``close()`` ends the one under way, and asking
that pass for more raises rather than ending quietly). Passes still running are closed at exit.
"""

import atexit
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

from . import _pinfeed
from ._frameworks import deliver
from ._resident import live_orders
from ._tables import split
from .errors import PinfeedError

if TYPE_CHECKING:
    from .loader import Loader

__all__ = ["_Pass", "_stream_batches", "track"]

# Passes still running, closed at exit so that no reader thread is left inside the interpreter
# while it shuts down; then the order workers of GPU-resident loaders (`live_orders`), joined.
_live_streams: "weakref.WeakSet[_pinfeed.Stream]" = weakref.WeakSet()


def track(stream: "_pinfeed.Stream") -> "_pinfeed.Stream":
    """``stream``, closed at exit if it is still running then."""
    _live_streams.add(stream)
    return stream


@atexit.register
def _close_live_streams() -> None:
    for closable in [*_live_streams, *live_orders]:
        try:
            closable.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass


def _stream_batches(
    loader: "Loader", stream: "_pinfeed.Stream"
) -> Iterator[tuple[int, int, Any, Optional[int]]]:
    view, framework = loader._export.view, loader.framework
    for buf in stream:
        epoch, index, documents = buf.epoch, buf.index, buf.documents
        yield epoch, index, deliver(buf, view, framework), documents


class _Pass(Iterator[Any]):
    """One pass of a Loader: yields its batches and tells the loader which it has handed out."""

    def __init__(
        self,
        loader: "Loader",
        pass_id: int,
        batches: Iterator[tuple[int, int, Any, Optional[int]]],
        stream: Optional["_pinfeed.Stream"],
    ) -> None:
        self._loader = loader
        self._id = pass_id
        self._batches = batches
        self._stream = stream
        self._finished = False
        #: The documents the last batch handed out packs, counted on the reader threads
        #: (``Batch::documents`` in Rust); None for batches of other records.
        self.documents: Optional[int] = None

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        loader = self._loader
        loader._check_fork()
        if self._finished:
            raise StopIteration
        self.check_not_cut()
        try:
            epoch, index, batch, self.documents = next(self._batches)
        except StopIteration:
            self._finished = True
            if self._id == loader._pass_id:
                # The next pass is a whole one (or where set_epoch/load_state_dict put it).
                loader._len = loader._pass_len(loader._next_start or (0, 0, 0))
            raise
        loader._received_batch(self._id, epoch, index)
        # A table's batch: its bytes as one array a column.
        return batch if loader._columns is None else split(batch, loader._columns)

    def __len__(self) -> int:
        return self._loader._len

    def check_not_cut(self) -> None:
        """Raises :class:`pinfeed.PinfeedError` when a newer iteration or ``close()`` ended
        this pass (for consumers that hand out one batch in several steps)."""
        loader = self._loader
        if self._id != loader._pass_id:
            raise PinfeedError(
                f"{loader.source_name}: this pass was ended by a newer iteration of the same "
                "Loader (iter() again, in this thread or another); a Loader runs one pass at a "
                "time: finish or close() a pass before starting the next"
            )
        if self._id == loader._closed_pass:
            raise PinfeedError(f"{loader.source_name}: this pass was ended by Loader.close()")

    def close(self) -> None:
        """Stops the pass now."""
        if self._stream is not None:
            self._stream.close()
        self._batches = iter(())
