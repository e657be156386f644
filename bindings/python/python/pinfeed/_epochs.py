"""The per-epoch wrapping that :class:`pinfeed.TokenLoader` and :class:`pinfeed.ImageLoader`
share: a fresh :class:`pinfeed.Loader` for each epoch whose records are drawn anew (random
windows, random crops), each iteration running the next epoch, ``set_epoch``, and the checks
of a state before the Loader resumes from it."""

from collections.abc import Iterator, Mapping
from typing import Any, Optional

from ._deprecation import warn_once
from ._options import int_arg
from ._states import params_differ, require_state, state_ints
from .errors import PinfeedValueError
from .loader import Loader
from .order import distributed_defaults

__all__ = ["EpochLoader"]


class EpochLoader:
    """A loader whose epochs each have their own source, hence their own :class:`Loader`.

    A subclass sets :attr:`source` (the path, for messages), ``_loader_args`` (the Loader's
    keywords) and implements :meth:`_make_loader`, :meth:`_start_of` and :meth:`_begin`, then
    calls :meth:`_first_loader`. Positions are the subclass's (a TokenLoader counts steps, an
    ImageLoader keeps a Loader state); this class only keeps which comes next.
    """

    #: The path or URL of the data.
    source: str
    #: This process's rank and the number of ranks.
    rank: int
    world_size: int
    #: Whether each epoch needs its own Loader (False: one Loader runs every epoch).
    _per_epoch = True
    _loader: Loader
    _loader_epoch: int
    _loader_args: dict[str, Any]

    def _shared(self, rank: Any, world_size: Any, **loader_args: Any) -> None:
        """Keeps the Loader keywords every epoch's Loader gets, with the rank and world size
        resolved (torch.distributed, else the environment)."""
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        self._loader_args = dict(rank=self.rank, world_size=self.world_size, **loader_args)

    def _first_loader(self) -> None:
        """Makes epoch 0's Loader; the next iteration runs epoch 0."""
        self._loader, self._loader_epoch = self._make_loader(0), 0
        #: The device the batches are on: ``"cpu"`` or ``"cuda:N"``.
        self.device: str = self._loader.device
        # Where the next iteration starts, when set_epoch or load_state_dict chose it;
        # otherwise the epoch after the last pass's.
        self._next: Optional[Any] = None
        self._pass_epoch: Optional[int] = None

    def _make_loader(self, epoch: int) -> Loader:
        """The Loader of ``epoch``."""
        raise NotImplementedError

    def _start_of(self, epoch: int) -> Any:
        """The position at the start of ``epoch``."""
        raise NotImplementedError

    def _epoch_of(self, start: Any) -> int:
        """The epoch of a position."""
        return int(start[0])

    def _begin(self, loader: Loader, start: Any) -> Iterator[Any]:
        """A pass of ``loader`` (the Loader of ``start``'s epoch) from ``start``."""
        raise NotImplementedError

    def _loader_for(self, epoch: int) -> Loader:
        if self._per_epoch and epoch != self._loader_epoch:
            self._loader.close()
            self._loader, self._loader_epoch = self._make_loader(epoch), epoch
        return self._loader

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        if self._next is not None:
            start = self._next
        else:
            start = self._start_of(0 if self._pass_epoch is None else self._pass_epoch + 1)
        self._next = None
        self._pass_epoch = self._epoch_of(start)
        return self._begin(self._loader_for(self._pass_epoch), start)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration run ``epoch`` from its start."""
        self._next = self._start_of(int_arg(self.source, "epoch", epoch))

    def _checked_state(
        self, state: Any, kind: str, key: str, params: Mapping[str, Any]
    ) -> tuple[dict[str, Any], int, int]:
        """``state`` (a ``kind`` state, marked by its ``key`` entry of ``params``) without that
        entry, and its epoch and batches done, checked: refused when malformed or saved with
        other ``params``."""
        state = require_state(self.source, state, kind, key)
        differs = params_differ(self.source, state[key], params, key)
        if differs:
            raise PinfeedValueError(
                f"{self.source}: cannot resume from this state: it was saved with "
                + ", ".join(differs)
            )
        epoch, done = state_ints(self.source, state, epoch=..., batches_done=...)
        return {k: v for k, v in state.items() if k != key}, epoch, done

    def stats(self) -> dict[str, Any]:
        """The counters of the current (or last) pass: :meth:`pinfeed.Loader.stats`."""
        return self._loader.stats()

    def close(self) -> None:
        """Stops the current pass and frees its pinned memory."""
        self._loader.close()

    @property
    def path(self) -> str:
        """Deprecated: :attr:`source`."""
        warn_once(type(self).__name__, "path", "use source instead")
        return self.source
