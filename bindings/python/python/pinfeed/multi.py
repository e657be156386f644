"""One process feeding several devices: a :class:`Loader` (a ring, a pinned pool, a copy stream)
per device, stepped together."""

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .loader import Loader
from .order import distributed_defaults


class MultiLoader:
    """Batches for several devices at once: iterating yields a tuple with one batch per device.

    Device ``i`` of this process (rank ``r`` of ``world_size``) streams shard ``r * n + i`` of
    ``world_size * n``, so devices and processes split each epoch by the same rules as ranks do
    (every record once, apart from the documented padding; the same number of batches
    everywhere). The pinned budget is divided evenly among the devices. Other keyword arguments
    go to each :class:`Loader`.

    >>> multi = pinfeed.MultiLoader("train.npy", 4096, devices=["cuda:0", "cuda:1"])  # doctest: +SKIP
    >>> for x0, x1 in multi: ...                                                      # doctest: +SKIP
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        devices: Sequence[Any],
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        pinned_budget: Any = None,
        **options: Any,
    ) -> None:
        devices = list(devices)
        if not devices:
            raise ValueError("MultiLoader needs at least one device")
        rank, world_size = distributed_defaults(rank, world_size)
        n = len(devices)
        budget = None
        if pinned_budget is not None:
            from ._pinfeed import parse_size

            total = pinned_budget if isinstance(pinned_budget, int) else parse_size(str(pinned_budget))
            budget = total // n
        self.devices = devices
        self.loaders: List[Loader] = [
            Loader(
                source,
                batch_size,
                device=device,
                rank=rank * n + i,
                world_size=world_size * n,
                pinned_budget=budget,
                **options,
            )
            for i, device in enumerate(devices)
        ]

    def __len__(self) -> int:
        return len(self.loaders[0])

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        return zip(*(iter(loader) for loader in self.loaders))

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next pass on every device."""
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def state_dict(self) -> List[Dict[str, Any]]:
        """Every device's loader state, in device order."""
        return [loader.state_dict() for loader in self.loaders]

    def load_state_dict(self, states: Sequence[Dict[str, Any]]) -> None:
        """Restores what :meth:`state_dict` returned."""
        if len(states) != len(self.loaders):
            raise ValueError(f"{len(states)} states for {len(self.loaders)} devices")
        for loader, state in zip(self.loaders, states):
            loader.load_state_dict(state)

    def close(self) -> None:
        """Stops every device's pass."""
        for loader in self.loaders:
            loader.close()
