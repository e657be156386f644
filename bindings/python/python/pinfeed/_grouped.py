"""A mixture's steps carried several to a Loader batch (issue 49): one slot, one copy and one
widening for all of them, so that a TokenLoader mixture costs what one source does.

:class:`GroupedLoader` stands in for the :class:`pinfeed.Loader` of one step a batch over an
epoch's source: its positions are steps, its states that Loader's (resumed, elastically too,
by the same rules), and every step holds exactly that Loader's records, on every rank. Rust's
``StepGroups`` numbers the records so that a Loader of ``group × batch_size`` records a batch
reads the steps in groups; this module translates positions and cuts each batch into its
steps."""

from collections.abc import Iterator, Mapping
from typing import Any, Optional

from . import _pinfeed
from ._states import resumed_position
from .loader import Loader

__all__ = ["GroupedLoader"]

# A position: (epoch, steps done, records consumed before their split), as a Loader's.
_Position = tuple[int, int, int]


class GroupedLoader:
    """The Loader of one step (``batch_size`` records) a batch over ``source`` in ``epoch``,
    reading ``group`` steps a batch. Iterating yields ``(raw, start, end)`` for each step: the
    step is rows ``start .. end`` of ``raw``, the Loader batch that carries it (the same object
    for every step of a batch). ``loader_args`` are the Loader's (file order: the grouping
    reads each rank's steps in order)."""

    def __init__(
        self, source: Any, batch_size: int, group: int, epoch: int, loader_args: dict[str, Any]
    ) -> None:
        self._source, self._group, self._epoch = source, int(group), int(epoch)
        self.batch_size = int(batch_size)
        self.rank, self.world_size = int(loader_args["rank"]), int(loader_args["world_size"])
        self.drop_last = bool(loader_args.get("drop_last", False))
        self._seed = int(loader_args.get("seed", 0))
        # Every group is whole: the steps' own drop_last is the StepGroups'.
        self._args = {**loader_args, "drop_last": False}
        #: Records of the epoch's source, all ranks.
        self.num_samples = int(source.num_records)
        self._consumed = -1
        self._open(0)
        self.device: str = self._loader.device
        self._received: _Position = (self._epoch, 0, 0)
        self._next_start: Optional[_Position] = None
        self._len = self._split_steps(0)

    def _open(self, consumed: int) -> None:
        """The groups of the split after ``consumed`` records, and their Loader."""
        if consumed == self._consumed:
            return
        if self._consumed >= 0:
            self._loader.close()
        self._steps = _pinfeed.StepGroups(
            self._source,
            self.batch_size,
            self._group,
            drop_last=self.drop_last,
            seed=self._seed,
            world_size=self.world_size,
            epoch=self._epoch,
            consumed=consumed,
        )
        self._consumed = consumed
        self._loader = Loader(self._steps.source(), self._group * self.batch_size, **self._args)

    def _split_steps(self, consumed: int) -> int:
        """Steps of this rank in the epoch split after ``consumed`` records."""
        return _pinfeed.epoch_size(
            self.num_samples,
            self.batch_size,
            drop_last=self.drop_last,
            rank=self.rank,
            world_size=self.world_size,
            consumed=consumed,
        )[1]

    def __len__(self) -> int:
        return self._len

    def state_dict(self) -> dict[str, Any]:
        """The state the Loader of one step a batch would give here."""
        epoch, done, consumed = self._next_start or self._received
        return {
            **self._loader.state_dict(),
            "epoch": epoch,
            "batches_done": done,
            "consumed": consumed,
            "num_records": self.num_samples,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "fingerprint": self.fingerprint_at(self.world_size),
        }

    def fingerprint_at(self, world_size: int) -> int:
        """The order's fingerprint at ``world_size`` ranks, as the Loader of one step a batch
        has it."""
        return int(self._steps.fingerprint_at(world_size))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """As :meth:`pinfeed.Loader.load_state_dict`, in steps."""
        self._next_start = resumed_position(
            str(self._source.name),
            state,
            self.state_dict(),
            self.fingerprint_at,
            self._split_steps,
        )
        self._len = self._split_steps(self._next_start[2])

    def __iter__(self) -> Iterator[tuple[Any, int, int]]:
        epoch, done, consumed = self._next_start or (self._epoch, 0, 0)
        self._next_start = None
        self._open(consumed)
        self._received, self._len = (epoch, done, consumed), self._split_steps(consumed)
        if done >= self._steps.num_steps:
            self._received = (epoch + 1, 0, 0)
            return iter(())
        # The Loader at the batch holding step `done`.
        state = self._loader.state_dict()
        self._loader.load_state_dict({**state, "epoch": epoch, "batches_done": done // self._group})
        return self._cut(iter(self._loader), (epoch, done, consumed))

    def _cut(self, batches: Any, start: _Position) -> Iterator[tuple[Any, int, int]]:
        """Each step of ``batches`` from ``start``, counted received as it is handed over."""
        epoch, i, consumed = start
        last, b = self._steps.num_steps, self.batch_size
        short = self._steps.step_len(last - 1)  # the last step may be short
        for raw in batches:
            first = i % self._group
            for k in range(first, self._group):
                if k > first:
                    batches.check_not_cut()  # close() or a new iter() cuts the pass at once
                end = k * b + (b if i < last - 1 else short)
                i += 1
                self._received = (epoch, i, consumed) if i < last else (epoch + 1, 0, 0)
                yield raw, k * b, end
                if i == last:
                    return

    def stats(self) -> dict[str, Any]:
        """The counters of the current (or last) pass: :meth:`pinfeed.Loader.stats`."""
        return self._loader.stats()

    def close(self) -> None:
        """Stops the current pass and frees its pinned memory."""
        self._loader.close()
