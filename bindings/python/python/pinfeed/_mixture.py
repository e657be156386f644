"""TokenLoader's mixtures: several token sources blended by weight (issue 49).

Rust owns the blend (``_pinfeed.Blend``: which source each sample of an epoch comes from, and
its place there) and reads each sample from its own source into the one pinned slot
(``_pinfeed.Mixture``, a loader source like any other). This module opens the sources, keeps
the schedule of weights (the curriculum) and puts it, with each source's position, in the
loader's state."""

from collections.abc import Callable, Mapping
from typing import Any, Optional

from . import _pinfeed
from ._sources import local_only, source_path, store_args
from .errors import PinfeedTypeError, PinfeedValueError
from .sources import Source

__all__ = [
    "ImageMixture",
    "Mixture",
    "RecordMixture",
    "TokenMixture",
    "image_mixture_of",
    "mixture_of",
    "name_of",
    "reblended",
]

_MODES = ("exact", "sampled")
# The options of a pinfeed.Source that are object-store settings (the rest: its token width).
_STORE_OPTIONS = ("storage_options", "cache_dir", "cache_limit", "queue_depth")
# Random windows without a set number of steps: an endless stream of this many samples.
_ENDLESS = 1 << 40


def mixture_of(source: Any, loader: Any, weights: Any, mode: str, on_exhausted: Any) -> Any:
    """The :class:`TokenMixture` of a dict of sources, for ``loader`` (a TokenLoader whose
    options are set); ``None`` for one source, where the mixture options are refused."""
    if not isinstance(source, Mapping):
        given = [n for n, v in (("weights", weights), ("on_exhausted", on_exhausted)) if v]
        if given or mode != "exact":
            raise PinfeedValueError(
                f"{loader.source}: {', '.join(given) or 'mode'} applies to a mixture: give "
                "source as a dict of name to source"
            )
        return None
    return TokenMixture(source, loader, weights, mode, on_exhausted)


def _consumed(loader_state: Mapping[str, Any]) -> int:
    """Samples of its epoch the job had consumed at a loader state (every rank there)."""
    done = int(loader_state["batches_done"]) * int(loader_state["world_size"])
    return int(loader_state.get("consumed", 0)) + done * int(loader_state["batch_size"])


def reblended(
    loader_state: Mapping[str, Any],
    loader: Any,
    fingerprint_at: Optional[Callable[[int], int]] = None,
) -> dict[str, Any]:
    """A saved Loader state of a mixture's epoch, for ``loader`` (that epoch's Loader, of the
    adopted schedule; ``fingerprint_at`` gives its order's fingerprint at a world size, the
    Loader's own by default): its size and order fingerprint are the blend's now. A new
    schedule (set_weights) may end the epoch elsewhere, but leaves the steps before its own as
    they were, so the saved position still holds; the mixture checked its sources and
    policies."""
    world = int(loader_state.get("world_size", loader.world_size))
    fingerprint = (fingerprint_at or loader._options.fingerprint_at)(world)
    return {**loader_state, "num_records": loader.num_samples, "fingerprint": fingerprint}


def name_of(sources: Mapping) -> str:
    """What errors and ``repr`` call a mixture."""
    return f"mixture({', '.join(str(n) for n in sources)})"


def _curriculum(names: list[str], weights: Any, what: str) -> list[tuple[int, list[float]]]:
    """``weights`` (``{name: share}``, or ``[(from_step, {name: share}), ...]``) as Rust takes
    them: one weight a source, in the order of ``names``; a source not named weighs 0."""
    if weights is None:
        raise PinfeedValueError(f"{what}: a mixture needs weights={{name: share}}")
    entries = [(0, weights)] if isinstance(weights, Mapping) else list(weights)
    out = []
    for entry in entries:
        try:
            step, shares = entry
        except (TypeError, ValueError):
            raise PinfeedValueError(
                f"{what}: weights is a dict of name to share, or a list of (from_step, dict) "
                f"pairs; not {entry!r}"
            ) from None
        if not isinstance(shares, Mapping):
            raise PinfeedValueError(f"{what}: the weights from step {step} are not a dict")
        unknown = sorted(set(map(str, shares)) - set(names))
        if unknown:
            raise PinfeedValueError(
                f"{what}: weights name {', '.join(map(repr, unknown))}, not a source of the "
                f"mixture ({', '.join(map(repr, names))})"
            )
        out.append((int(step), [float(shares.get(n, 0.0)) for n in names]))
    return out


class Mixture:
    """The sources of a mixture, their blend and its schedule of weights: what every loader's
    mixture shares. A subclass opens the sources and gives each epoch's to :meth:`_blended`."""

    # Tokens a sample holds (a token window's), for the per-source stats; None for records.
    _seq_len: Optional[int] = None

    def __init__(
        self, sources: Mapping, what: str, weights: Any, mode: str, on_exhausted: Any, **blend: Any
    ) -> None:
        if not sources:
            raise PinfeedValueError(f"{what}: a mixture needs at least one source")
        if mode not in _MODES:
            raise PinfeedValueError(
                f"{what}: unknown mode {mode!r}: expected one of {', '.join(_MODES)}"
            )
        self.names = [str(n) for n in sources]
        self._what, self.mode = what, mode
        self._entries = [
            (v.path, dict(v.options)) if isinstance(v, Source) else (v, {})
            for v in sources.values()
        ]
        self.curriculum = _curriculum(self.names, weights, what)
        self.on_exhausted = self._policies(on_exhausted, blend.pop("default"))
        # The blend is laid out in steps of one global batch of the world size it starts at; a
        # resume keeps the saved step (see adopt), so the global sequence survives a new one.
        self.step: int = blend.pop("step")
        self.samples_per_epoch: Optional[int] = blend.pop("samples_per_epoch")
        self._seed: int = blend.pop("seed")
        self._blend: Optional[_pinfeed.Blend] = None
        #: The current epoch's mixture (its per-source counters).
        self.current: Optional[_pinfeed.Mixture] = None

    def _blended(self, sources: list[Any], epoch: int, shuffle: bool) -> Any:
        """Epoch ``epoch`` of the blend of ``sources`` (opened, one layout) as a loader
        source; ``shuffle`` orders each pass of a source anew."""
        if self._blend is None:
            self._blend = _pinfeed.Blend(
                self.names,
                [int(s.num_records) for s in sources],
                weights=self.curriculum,
                exhausted=self.on_exhausted,
                step=self.step,
                mode=self.mode,
                seed=self._seed,
                samples_per_epoch=self.samples_per_epoch,
            )
        self.current = self._blend.mixture(sources, int(epoch), shuffle)
        return self.current.source()

    def _policies(self, on_exhausted: Any, default: str) -> list[Any]:
        if on_exhausted is None or isinstance(on_exhausted, str):
            return [on_exhausted or default] * len(self.names)
        if not isinstance(on_exhausted, Mapping):
            raise PinfeedValueError(
                f"{self._what}: on_exhausted is a policy or a dict of name to policy"
            )
        unknown = sorted(set(map(str, on_exhausted)) - set(self.names))
        if unknown:
            raise PinfeedValueError(
                f"{self._what}: on_exhausted names {', '.join(map(repr, unknown))}, not a "
                "source of the mixture"
            )
        return [on_exhausted.get(n, default) for n in self.names]

    def state(self, loader_state: Mapping[str, Any]) -> dict[str, Any]:
        """The blend's part of the loader's state: its schedule and where each source is."""
        state: dict[str, Any] = {
            "sources": list(self.names),
            "mode": self.mode,
            "on_exhausted": list(self.on_exhausted),
            "weights": [[s, dict(zip(self.names, w))] for s, w in self.curriculum],
            "step": self.step,
            "samples_per_epoch": self.samples_per_epoch,
        }
        if self._blend is not None:
            given = self._blend.given_before(int(loader_state["epoch"]), _consumed(loader_state))
            state["positions"] = {n: int(k) for n, k in zip(self.names, given)}
        return state

    def adopt(self, saved: Any) -> None:
        """Takes the schedule of a saved state (its weights, its step and epoch length);
        refuses one saved with other sources, mode or policies."""
        if not isinstance(saved, Mapping):
            raise PinfeedValueError(
                f"{self._what}: cannot resume from this state: it has no 'mixture' (it was "
                "saved by a loader of one source)"
            )
        differs = []
        for key, mine in (
            ("sources", self.names),
            ("mode", self.mode),
            ("on_exhausted", self.on_exhausted),
        ):
            theirs = saved.get(key)
            if (list(theirs) if isinstance(theirs, (list, tuple)) else theirs) != mine:
                differs.append(f"{key} {theirs!r} (this loader: {mine!r})")
        if differs:
            raise PinfeedValueError(
                f"{self._what}: cannot resume from this state: it was saved with "
                + ", ".join(differs)
            )
        self.curriculum = _curriculum(self.names, saved["weights"], self._what)
        self.step = int(saved["step"])
        spe = saved.get("samples_per_epoch")
        self.samples_per_epoch = None if spe is None else int(spe)
        self._blend = None

    def reweighted(
        self, loader_state: dict[str, Any], weights: Mapping, from_step: Optional[int]
    ) -> dict[str, Any]:
        """``loader_state`` with weights from global step ``from_step`` on (default: the step
        the loader's next sample starts), replacing the schedule from there. A step already
        begun is refused: its samples were drawn by the old weights."""
        if self._blend is None:
            raise PinfeedValueError(f"{self._what}: the mixture was not opened yet")
        _, first = self._blend.epoch_size(int(loader_state["epoch"]))
        next_step = int(first) + -(-_consumed(loader_state) // self.step)
        step = next_step if from_step is None else int(from_step)
        if step < next_step:
            raise PinfeedValueError(
                f"{self._what}: cannot change the weights from step {step}: the loader is at "
                f"step {next_step} (steps of {self.step} samples, counted across epochs)"
            )
        (entry,) = _curriculum(self.names, [(step, weights)], self._what)
        self.curriculum = [e for e in self.curriculum if e[0] < step] + [entry]
        self._blend = None
        return {**loader_state, "mixture": self.state(loader_state)}

    def stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        """``stats`` with each source's counters in ``"sources"``, and the source that holds a
        read- or network-bound mixture back named in the explanation."""
        if self.current is None:
            return stats
        sources = {}
        for each in self.current.source_stats():
            name = each.pop("name")
            if self._seq_len is not None:
                each["tokens"] = each["samples"] * self._seq_len
            sources[name] = each
        stats = {**stats, "sources": sources}
        held = self.current.holding_back()
        if held and stats.get("bottleneck") in ("read-bound", "network-bound"):
            stats["explanation"] = f"{stats['explanation']}; {held}"
        return stats


class TokenMixture(Mixture):
    """A TokenLoader's mixture: token windows of each source, at one stored width."""

    def __init__(
        self, sources: Mapping, loader: Any, weights: Any, mode: str, on_exhausted: Any
    ) -> None:
        what = loader.source
        if loader.sample == "documents":
            raise PinfeedValueError(
                f"{what}: sample='documents' is not blended yet; mix 'random' or 'sequential'"
            )
        step = loader.batch_size * loader.world_size
        if loader.steps is not None:
            samples_per_epoch: Optional[int] = int(loader.steps) * step
        elif loader.sample == "random":
            samples_per_epoch = _ENDLESS // step * step
        else:
            samples_per_epoch = None
        super().__init__(
            sources,
            what,
            weights,
            mode,
            on_exhausted,
            # Random windows never run out (2^40 a source); sequential ones end the epoch.
            default="cycle" if loader.sample == "random" else "stop",
            step=step,
            samples_per_epoch=samples_per_epoch,
            seed=loader.seed,
        )
        self.sample = loader.sample
        self._seq_len, self._shuffle = loader.seq_len, loader.shuffle != "none"
        self._token_dtype, self._store = loader._token_dtype, loader._store
        self._opened: list[Any] = [None] * len(self.names)  # object-store streams
        self._kept: dict[int, Any] = {}  # sequential windows, the same every epoch

    def _open_one(self, k: int, epoch: int) -> tuple[Any, str, int, int]:
        if k in self._kept:
            return self._kept[k]
        path, options = self._entries[k]
        path = source_path(path, self._what)
        own = {key: options.get(key) for key in _STORE_OPTIONS}
        store = {**self._store, **store_args(**own, what=path)}
        token_dtype = options.get("token_dtype", self._token_dtype)
        source, typestr, num_tokens, self._opened[k], fingerprint, _ = _pinfeed.open_tokens(
            path,
            seq_len=self._seq_len,
            batch_size=1,
            dtype=None if token_dtype is None else str(token_dtype),
            sample=self.sample,
            seed=_pinfeed.mixture_seed(self._seed, self.names[k]),
            epoch=epoch,
            opened=self._opened[k],
            **store,
        )
        opened = (source, typestr, num_tokens, fingerprint)
        if self.sample == "sequential":
            self._kept[k] = opened
        return opened

    def open(self, epoch: int) -> tuple[Any, str, int, list[int]]:
        """Epoch ``epoch`` of the mixture as a loader source, with the token dtype, the
        tokens of all the sources and each source's data hash."""
        each = [self._open_one(k, epoch) for k in range(len(self.names))]
        opened = [(s, t, n) for s, t, n, _ in each]
        typestr = _pinfeed.common_token_dtype([t for _, t, _ in opened])
        # Sources stored narrower are widened in the slot, so every window has one layout.
        opened = [
            (s if t == typestr else _pinfeed.widen_tokens(s, t, typestr), t, n)
            for s, t, n in opened
        ]
        shuffle = self._shuffle and self.sample == "sequential"
        source = self._blended([s for s, _, _ in opened], epoch, shuffle)
        tokens = sum(n for _, _, n in opened)
        return source, typestr, tokens, [int(f) for *_, f in each]


def _layout(source: Any) -> str:
    return f"{source.descr} records of shape {tuple(int(d) for d in source.record_shape)}"


class RecordMixture(Mixture):
    """A Loader's mixture: the records of each source, which agree in shape and dtype."""

    def __init__(
        self,
        sources: Mapping,
        what: str,
        weights: Any,
        mode: str,
        on_exhausted: Any,
        *,
        open_one: Callable[[Any, dict[str, Any]], Any],
        store: dict[str, Any],
        shuffle: bool,
        **blend: Any,
    ) -> None:
        # A pass of records ends the epoch unless a source's policy says otherwise.
        super().__init__(sources, what, weights, mode, on_exhausted, default="stop", **blend)
        self._shuffle = shuffle
        self._sources = []
        for name, (source, options) in zip(self.names, self._entries):
            if "token_dtype" in options:
                raise PinfeedTypeError(
                    f"{what}: source {name!r}: token_dtype applies to a TokenLoader's sources"
                )
            own = {key: options.get(key) for key in _STORE_OPTIONS}
            self._sources.append(open_one(source, {**store, **store_args(**own, what=name)}))
        first = self._sources[0]
        for name, other in zip(self.names[1:], self._sources[1:]):
            if (other.descr, list(other.record_shape)) != (first.descr, list(first.record_shape)):
                raise PinfeedValueError(
                    f"{what}: sources {self.names[0]!r} ({_layout(first)}) and {name!r} "
                    f"({_layout(other)}) differ; a mixture's records agree in shape and dtype"
                )

    def open(self, epoch: int) -> Any:
        """Epoch ``epoch`` of the mixture as a loader source."""
        return self._blended(self._sources, epoch, self._shuffle)


def image_mixture_of(
    source: Any,
    loader: Any,
    weights: Any,
    mode: str,
    on_exhausted: Any,
    open_one: Callable[[str], Any],
    decode: str,
) -> Optional["ImageMixture"]:
    """The :class:`ImageMixture` of a dict of sources, for ``loader`` (an ImageLoader whose
    options are set); ``None`` for one source, where the mixture options are refused."""
    if not isinstance(source, Mapping):
        mixture_of(source, loader, weights, mode, on_exhausted)
        return None
    if decode != "cpu":
        raise PinfeedValueError(
            f"{loader.source}: a mixture of image datasets decodes on the CPU (decode='cpu'), "
            f"not decode={decode!r}"
        )
    return ImageMixture(source, loader, weights, mode, on_exhausted, open_one)


class ImageMixture(Mixture):
    """An ImageLoader's mixture: the decoded crops of each image dataset, one layout (the
    loader's size), each source's crops its own of ``(seed, epoch, sample)``."""

    def __init__(
        self,
        sources: Mapping,
        loader: Any,
        weights: Any,
        mode: str,
        on_exhausted: Any,
        open_one: Callable[[str], Any],
    ) -> None:
        what = loader.source
        super().__init__(
            sources,
            what,
            weights,
            mode,
            on_exhausted,
            default="stop",
            step=loader.batch_size * loader.world_size,
            samples_per_epoch=None,
            seed=loader.seed,
        )
        self._shuffle = loader.shuffle != "none"
        for name, (_, options) in zip(self.names, self._entries):
            if options:
                raise PinfeedTypeError(
                    f"{what}: source {name!r}: {', '.join(sorted(options))} do not apply to "
                    "image datasets (local files, one layout)"
                )
        #: Each source's dataset, in the order of :attr:`names`.
        paths = [source_path(path, what) for path, _ in self._entries]
        for path in paths:
            local_only(path, {}, "ImageLoader")
        self.datasets = [open_one(path) for path in paths]

    def open(self, epoch: int) -> Any:
        """Epoch ``epoch`` of the mixture (each dataset's crops of that epoch) as a source."""
        sources = [d.source(epoch, gpu=False) for d in self.datasets]
        return self._blended(sources, epoch, self._shuffle)
