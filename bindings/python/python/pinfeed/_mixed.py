"""``pinfeed.Loader`` over a dict of sources: a weighted mixture of records (issue 49).

``Loader({"a": "a.npy", "b": "b.npy"}, batch_size, weights={"a": 0.7, "b": 0.3})`` makes a
:class:`MixedLoader`: each epoch's blend (:class:`pinfeed._mixture.RecordMixture`, Rust's) is
a source of its own, read in the blend's order by a fresh :class:`pinfeed.Loader`, one step
(``world_size × batch_size`` records) a batch. The sources' records agree in shape and dtype.
"""

from collections.abc import Iterator, Mapping
from typing import Any, Optional

from ._epochs import EpochLoader
from ._mixture import RecordMixture, name_of, reblended
from ._options import int_arg, shuffle_arg
from ._sources import open_source, store_args
from ._states import require_state, state_ints
from .errors import PinfeedValueError
from .loader import Loader

__all__ = ["MixedLoader"]


class MixedLoader(EpochLoader):
    """What ``Loader(source={name: source, ...}, batch_size, weights=...)`` makes: a weighted
    mixture of record sources, with :class:`pinfeed.Loader`'s iteration, ``state_dict``
    (with each source's position and the schedule of weights), elastic resume, ``stats()``
    (each source's in ``"sources"``) and :meth:`set_weights`.

    ``weights``, ``mode`` and ``on_exhausted`` mean what they mean for
    :class:`pinfeed.TokenLoader`'s mixtures; a source's pass runs out by default with
    ``"stop"`` (the epoch ends); ``steps`` sets an epoch's length instead (needed where every
    source cycles). ``shuffle=True`` orders each pass of each source anew.
    ``dtype``, ``shape``, ``reader`` and ``tensor`` apply to every source; a
    :class:`pinfeed.Source` carries object-store options of its own. ``epochs`` is 1: each
    iteration runs the next epoch.
    """

    def __init__(
        self,
        source: Mapping[str, Any],
        batch_size: int,
        *,
        shuffle: Any = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        storage_options: Optional[dict[str, Any]] = None,
        cache_dir: Any = None,
        cache_limit: Any = None,
        queue_depth: Optional[int] = None,
        epochs: int = 1,
        dtype: Any = None,
        shape: Any = None,
        reader: str = "auto",
        tensor: Optional[str] = None,
        weights: Any = None,
        mode: str = "exact",
        on_exhausted: Any = None,
        steps: Optional[int] = None,
        **options: Any,
    ) -> None:
        self.source = name_of(source)
        if epochs != 1:
            raise PinfeedValueError(
                f"{self.source}: a mixture runs one epoch an iteration (epochs=1), each a new "
                "blend; iterate again for the next"
            )
        #: ``"none"`` or ``"random"`` (each pass of each source in a new order).
        self.shuffle: str = shuffle_arg(shuffle, ("none", "random"), "Loader mixture")
        self.batch_size, self.seed = int(batch_size), int(seed)
        self._shared(rank, world_size, shuffle="none", seed=self.seed, **options)
        #: Steps an epoch, where one is set (else the epoch ends as the sources' policies say).
        self.steps = None if steps is None else int_arg(self.source, "steps", steps)
        store = store_args(storage_options, cache_dir, cache_limit, queue_depth, self.source)
        self._mixture = RecordMixture(
            source,
            self.source,
            weights,
            mode,
            on_exhausted,
            open_one=lambda one, own: open_source(one, dtype, shape, str(reader), tensor, own),
            store=store,
            shuffle=self.shuffle != "none",
            step=self.batch_size * self.world_size,
            samples_per_epoch=None
            if steps is None
            else self.steps * self.batch_size * self.world_size,
            seed=self.seed,
        )
        self._first_loader()

    def _make_loader(self, epoch: int) -> Loader:
        return Loader(self._mixture.open(epoch), self.batch_size, **self._loader_args)

    def _start_of(self, epoch: int) -> tuple[int, int]:
        return (epoch, 0)

    def _begin(self, loader: Loader, start: tuple[int, int]) -> Iterator[Any]:
        state = loader.state_dict()
        loader.load_state_dict({**state, "epoch": start[0], "batches_done": start[1]})
        return iter(loader)

    @property
    def num_samples(self) -> int:
        """Records in the current epoch's blend, all ranks."""
        return self._loader.num_samples

    def state_dict(self) -> dict[str, Any]:
        """:meth:`pinfeed.Loader.state_dict`'s dict, with the mixture's schedule and each
        source's position in ``"mixture"``."""
        state = dict(self._loader.state_dict())
        if self._next is not None:
            state["epoch"], state["batches_done"] = self._next
        state["mixture"] = self._mixture.state(state)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration resume at ``state`` (from :meth:`state_dict`), at this
        world size too; refused when it was saved by another mixture or Loader setting."""
        state = require_state(self.source, state, "Loader mixture", "mixture")
        epoch, done = state_ints(self.source, state, epoch=..., batches_done=...)
        self._mixture.adopt(state["mixture"])
        self._loader.close()
        self._loader, self._loader_epoch = self._make_loader(epoch), epoch
        rest = reblended({k: v for k, v in state.items() if k != "mixture"}, self._loader)
        self._loader.load_state_dict({**rest, "epoch": epoch, "batches_done": done})
        # The Loader's position, moved to this world size on an elastic resume.
        moved = self._loader.state_dict()
        self._next = (int(moved["epoch"]), int(moved["batches_done"]))

    def stats(self) -> dict[str, Any]:
        """:meth:`pinfeed.Loader.stats`, with each source's counters in ``"sources"``."""
        return self._mixture.stats(self._loader.stats())

    def set_weights(self, weights: Mapping[str, float], from_step: Optional[int] = None) -> None:
        """The weights from global step ``from_step`` on (default: the next step), as
        :meth:`pinfeed.TokenLoader.set_weights`."""
        self.load_state_dict(self._mixture.reweighted(self.state_dict(), weights, from_step))

    def __repr__(self) -> str:
        return (
            f"Loader({self.source!r}, batch_size={self.batch_size}, mode={self._mixture.mode!r}, "
            f"device={self.device!r}, rank={self.rank}, world_size={self.world_size})"
        )
