"""One process feeding several devices: a :class:`Loader` (a ring, a pinned pool, a copy stream)
per device, each on its shard, stepped together; or, with ``replicate=True``, one ring whose
every batch is read once and copied to each device."""

from collections.abc import Iterator, Sequence
from typing import Any, Optional, Union

from . import _pinfeed
from ._frameworks import module
from ._options import SHUFFLE_MODES, device_name, shuffle_arg
from .errors import PinfeedTypeError, PinfeedValueError
from .loader import Loader
from .order import distributed_defaults


class MultiLoader:
    """Batches for several devices at once: iterating yields a tuple with one batch per device,
    in the order of ``devices``.

    By default (``replicate=False``) the devices split each epoch: device ``i`` of this process
    (rank ``r`` of ``world_size``) streams shard ``r * n + i`` of ``world_size * n``, so devices
    and processes split each epoch by the same rules as ranks do (every record once, apart from
    the documented padding; the same number of batches everywhere). Each device has its own
    :class:`Loader`, and the pinned budget is divided evenly among them.

    With ``replicate=True`` every device gets the same batches (a tensor- or pipeline-parallel
    group, evaluation on every GPU, an ensemble): each batch is read once, into one slot of one
    pinned pool (the whole ``pinned_budget``), and copied from there to every device, each copy
    on that device's own stream; the slot is reused only once every device's copy has finished.
    The batches of a step hold the same records, in the same order, as a single-device
    :class:`Loader` with the same options would deliver (this rank's, of ``world_size``). A
    device may be named twice. ``shuffle="gpu"`` and ``reader="register"`` are refused.
    ``device_budget`` and ``prefetch`` hold for each device.

    ``devices`` is a sequence of device names (or ``torch.device``); a single string is one
    device. Other keyword arguments go to each :class:`Loader` (``framework="jax"`` among them:
    a tuple of ``jax.Array``, one per device).

    **A JAX mesh.** With ``sharding`` (a ``jax.sharding.Sharding`` over this process's devices,
    such as ``NamedSharding(mesh, PartitionSpec("data"))``), each step is one globally sharded
    ``jax.Array`` instead of a tuple, assembled without a copy by
    ``jax.make_array_from_single_device_arrays``: the devices (and their order) are the
    sharding's, not ``devices``. Split, the sharding must cut the batch axis into one block
    per device of every process and no other axis (blocks ``rank × n .. rank × n + n - 1`` are
    this process's, ``n`` its devices): block ``k`` holds shard ``k``'s batch, and the global
    batch has ``world_size × n`` times the rows of one device's. ``rank`` and ``world_size``
    default to ``jax.process_index()`` and ``jax.process_count()``. Replicated, the sharding
    must be fully replicated, and the global array is the one batch on every device.

    >>> multi = pinfeed.MultiLoader("train.npy", 4096, devices=["cuda:0", "cuda:1"])  # doctest: +SKIP
    >>> for x0, x1 in multi: ...                                                      # doctest: +SKIP
    >>> same = pinfeed.MultiLoader("eval.npy", 4096, devices=["cuda:0", "cuda:1"], replicate=True)  # doctest: +SKIP
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        *,
        devices: Union[str, Sequence[Any], None] = None,
        replicate: bool = False,
        sharding: Any = None,
        framework: Optional[str] = None,
        shuffle: Union[bool, str] = False,
        seed: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: bool = False,
        pinned_budget: Any = None,
        num_threads: Optional[int] = None,
        prefetch: int = 4,
        storage_options: Optional[dict[str, Any]] = None,
        cache_dir: Any = None,
        cache_limit: Any = None,
        queue_depth: Optional[int] = None,
        epochs: int = 1,
        **options: Any,
    ) -> None:
        if "device" in options:
            raise PinfeedTypeError("MultiLoader takes devices=[...], not device=")
        shared = dict(shuffle=shuffle, seed=seed, drop_last=drop_last, num_threads=num_threads)
        store = dict(storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        more = dict(prefetch=prefetch, queue_depth=queue_depth, epochs=epochs)
        options = {**shared, **store, **more, **options, "framework": framework}
        #: The ``jax.sharding.Sharding`` each step's global array has, or None (a tuple a step).
        self.sharding = sharding
        #: Whether every device gets the same batches.
        self.replicate = bool(replicate)
        if sharding is not None:
            if devices is not None:
                raise PinfeedValueError(
                    "MultiLoader: give devices or sharding (whose devices it uses)"
                )
            if options["framework"] is None:
                options["framework"] = "jax"
            if options["framework"] != "jax":
                raise PinfeedValueError(
                    f"MultiLoader(sharding=...) assembles jax.Arrays; framework="
                    f"{options['framework']!r} cannot be sharded by JAX"
                )
            jax = module("jax")
            rank = jax.process_index() if rank is None else rank
            world_size = jax.process_count() if world_size is None else world_size
            self._jax_devices = _mesh_devices(sharding, self.replicate, rank, world_size)
            devices = [_pinfeed_device(d) for d in self._jax_devices]
        elif devices is None:
            raise PinfeedValueError("MultiLoader needs devices=[...] (or a JAX sharding=)")
        # One name is one device, not a sequence of one-letter names.
        devices = [devices] if isinstance(devices, str) else list(devices)
        if not devices:
            raise PinfeedValueError("MultiLoader needs at least one device")
        rank, world_size = distributed_defaults(rank, world_size)
        self.devices = devices
        self._shards = world_size * len(devices)
        if self.replicate and shuffle_arg(shuffle, SHUFFLE_MODES, "MultiLoader") == "gpu":
            raise PinfeedValueError(
                "MultiLoader(replicate=True) streams every batch through one pinned ring; "
                'shuffle="gpu" keeps a resident copy per device instead: use '
                'shuffle=True (or "block"), or a Loader(shuffle="gpu") per device'
            )
        #: The loaders: one per device, or the one that feeds every device when replicating.
        self.loaders: list[Loader] = self._make_loaders(
            source, batch_size, rank, world_size, pinned_budget, options
        )

    def _make_loaders(
        self,
        source: Any,
        batch_size: int,
        rank: int,
        world_size: int,
        pinned_budget: Any,
        options: dict[str, Any],
    ) -> list[Loader]:
        if self.replicate:
            shared = dict(rank=rank, world_size=world_size, pinned_budget=pinned_budget)
            return [
                _ReplicatedLoader(source, batch_size, devices=self.devices, **shared, **options)
            ]
        # Each device's shard and part of the budget: pinfeed::DeviceShare's rule.
        loaders = []
        n = len(self.devices)
        for i, device in enumerate(self.devices):
            r, w, budget = _pinfeed.device_share(rank, world_size, n, i, pinned_budget)
            share = dict(device=device, rank=r, world_size=w, pinned_budget=budget)
            loaders.append(Loader(source, batch_size, **share, **options))
        return loaders

    def __len__(self) -> int:
        return len(self.loaders[0])

    @property
    def num_samples(self) -> int:
        """Records in the dataset (all ranks and devices, one epoch)."""
        return self.loaders[0].num_samples

    def __iter__(self) -> Iterator[Any]:
        if self.replicate:
            # The one pass yields each step's batches one after the other, in device order.
            batches = iter(self.loaders[0])
            steps = zip(*[batches] * len(self.devices))
        else:
            steps = zip(*(iter(loader) for loader in self.loaders))
        if self.sharding is None:
            return steps
        return (self._global_array(step) for step in steps)

    def _global_array(self, step: tuple[Any, ...]) -> Any:
        """One step's batches (one per device, in the sharding's block order) as one
        ``jax.Array`` of ``self.sharding``."""
        jax = module("jax")
        arrays = []
        for arr, device in zip(step, self._jax_devices):
            if arr.devices() != {device}:
                # The host backend's batches all come out on the first CPU device.
                arr = jax.device_put(arr, device)
            arrays.append(arr)
        first = arrays[0]
        rows = first.shape[0] if self.replicate else first.shape[0] * self._shards
        return jax.make_array_from_single_device_arrays(
            (rows,) + tuple(first.shape[1:]), self.sharding, arrays
        )

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next pass on every device."""
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def state_dict(self) -> list[dict[str, Any]]:
        """Every loader's state, in device order (one state when replicating: every device is at
        the same place)."""
        return [loader.state_dict() for loader in self.loaders]

    def load_state_dict(self, states: Sequence[dict[str, Any]]) -> None:
        """Restores what :meth:`state_dict` returned."""
        if len(states) != len(self.loaders):
            what = "replicated loader" if self.replicate else f"{len(self.loaders)} devices"
            raise PinfeedValueError(f"MultiLoader: {len(states)} states for {what}")
        for loader, state in zip(self.loaders, states):
            loader.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """Counters of the current (or last) pass, over all devices: ``devices`` lists what each
        device received (``device``, ``batches``, ``records``, ``bytes``,
        ``device_bytes_peak``); ``bytes`` is their sum and ``read_bytes`` what was read from the
        source, so a replicated pass reads each byte once (``bytes == len(devices) *
        read_bytes``) where split devices read each their own share. ``gbps`` is the aggregate
        rate. The other keys are those of :meth:`Loader.stats`: split, the devices' counters
        combined (counts, bytes, times and pinned memory summed, the longest ``elapsed`` and
        ``startup``, the bottleneck judged from the summed waits), with ``loaders``, each
        device's :meth:`Loader.stats`; ``replicated`` says which."""
        if self.replicate:
            stats = dict(self.loaders[0].stats())
            stats["replicated"] = True
            return stats
        combined, each = _pinfeed.combined_stats([ld._stats_stream() for ld in self.loaders])
        stats = dict(combined)
        stats["replicated"] = False
        stats["loaders"] = [dict(d) for d in each]
        return stats

    def close(self) -> None:
        """Stops every device's pass."""
        for loader in self.loaders:
            loader.close()


class _ReplicatedLoader(Loader):
    """A :class:`Loader` whose passes read each batch once and copy it to every one of
    ``devices``: iterating it yields each step's batches one after the other, in device order
    (:class:`MultiLoader` groups them). Order, sharding, resume and transforms are the Loader's."""

    def __init__(
        self, source: Any, batch_size: int, *, devices: Sequence[Any], **options: Any
    ) -> None:
        self._replicas = [device_name(d) for d in devices]
        super().__init__(source, batch_size, device=self._replicas[0], **options)


def _pinfeed_device(device: Any) -> str:
    """pinfeed's name of a JAX device: ``cuda:N`` by its local hardware id, ``cpu`` for a CPU
    device (the host backend)."""
    if device.platform == "cpu":
        return "cpu"
    if device.platform in ("gpu", "cuda"):
        return f"cuda:{device.local_hardware_id}"
    raise PinfeedValueError(f"MultiLoader(sharding=...): pinfeed feeds CUDA devices, not {device}")


def _mesh_devices(sharding: Any, replicate: bool, rank: int, world_size: int) -> list[Any]:
    """This process's devices of ``sharding``, in the order of the batch blocks they hold
    (split), or in the sharding's order (replicated); refuses a sharding of another layout."""
    devices = list(sharding.addressable_devices)
    n = len(devices)
    if not 0 <= rank < world_size:
        raise PinfeedValueError(f"MultiLoader: rank {rank} is not below world_size {world_size}")
    if replicate:
        if not sharding.is_fully_replicated:
            raise PinfeedValueError(
                "MultiLoader(replicate=True, sharding=...): every device holds the whole batch, "
                f"so the sharding must be fully replicated (e.g. PartitionSpec()); got {sharding}"
            )
        return sorted(devices, key=lambda d: d.id)
    shards = world_size * n
    # A probe of one row a block: where each device's rows start says which block it holds.
    ndim = max(1, len(getattr(sharding, "spec", ()) or ()))
    probe = (shards,) + (1,) * (ndim - 1)
    try:
        index = sharding.addressable_devices_indices_map(probe)
    except Exception as e:  # JAX's own error for a shape the sharding does not divide
        raise PinfeedValueError(
            f"MultiLoader(sharding=...): {sharding} must cut the batch axis into {shards} blocks "
            f"({world_size} processes × {n} devices) and no other axis: {e}"
        ) from None
    blocks = {}
    for device, idx in index.items():
        rows = idx[0]
        start, stop, _ = rows.indices(shards)
        others_whole = all(i == slice(None) for i in idx[1:])
        if stop - start != 1 or not others_whole or start in blocks:
            raise PinfeedValueError(
                f"MultiLoader(sharding=...): {sharding} must give each device its own block of "
                f"the batch axis (one of {shards}) and the whole of every other axis; device "
                f"{device} holds {idx}"
            )
        blocks[start] = device
    mine = list(range(rank * n, rank * n + n))
    if sorted(blocks) != mine:
        raise PinfeedValueError(
            f"MultiLoader(sharding=...): process {rank} of {world_size} must hold blocks "
            f"{mine[0]}..{mine[-1]} of the batch axis (its shards), but its devices hold "
            f"{sorted(blocks)}"
        )
    return [blocks[k] for k in mine]
