"""Resume states: :func:`merge_states`, and the checks every ``load_state_dict`` makes of a
state before trusting it (a dict, the keys it needs, integers where integers belong, and the
parameters it was saved with)."""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import _pinfeed
from ._options import SHUFFLE_MODES, ints, shuffle_arg
from .errors import PinfeedTypeError, PinfeedValueError
from .order import order_kind

__all__ = [
    "check_saved_with",
    "merge_states",
    "params_differ",
    "require_state",
    "resumed_position",
    "state_ints",
]


def state_ints(what: str, state: Mapping[str, Any], **defaults: Any) -> list[int]:
    """The integers ``state[key]`` (``defaults[key]`` where missing and a default is not
    ``...``), checked by the shared rules; a malformed value is a
    :class:`pinfeed.PinfeedValueError` naming the key: the state, not the argument, is wrong."""
    values = {}
    for key, default in defaults.items():
        if key not in state and default is ...:
            raise PinfeedValueError(f"{what}: the state has no {key!r}")
        values[f"state {key}"] = state.get(key, default)
    try:
        return ints(what, **values)
    except PinfeedTypeError as e:
        raise PinfeedValueError(str(e)) from None


def require_state(what: str, state: Any, kind: str, key: str) -> Mapping[str, Any]:
    """``state`` when it is a dict holding ``key``, the mark of a ``kind`` state."""
    if not isinstance(state, Mapping) or key not in state:
        raise PinfeedValueError(
            f"{what}: not a pinfeed {kind} state (expected the dict of {kind}.state_dict(), with "
            f"{key!r}); got {type(state).__name__}"
        )
    return state


def params_differ(what: str, theirs: Any, mine: Mapping[str, Any], key: str) -> list[str]:
    """The parameters of ``mine`` that the state's ``key`` entry (``theirs``) gives otherwise,
    as ``"name theirs (this loader: mine)"``; a malformed entry is refused."""
    if not isinstance(theirs, Mapping):
        raise PinfeedValueError(
            f"{what}: the state's {key!r} entry must be a dict of {', '.join(mine)}, not "
            f"{type(theirs).__name__}"
        )
    return [
        f"{k} {theirs.get(k)!r} (this loader: {v!r})" for k, v in mine.items() if theirs.get(k) != v
    ]


def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One state for an elastic (or any) resume from the :meth:`Loader.state_dict` of several
    ranks of one job: the one that got least far, by ``epoch``, then records of the epoch's
    global order consumed (``consumed + batches_done × world_size × batch_size``). Resuming
    from it repeats the records faster ranks read past it, and loses none. When every rank
    saved at the same step, any one state is the same position. Raises
    :class:`pinfeed.PinfeedValueError` for no state, something that is not a state (each
    must be a :meth:`Loader.state_dict` dict, with its ``fingerprint``), or states of
    different jobs (another ``fingerprint``, ``world_size`` or ``batch_size``)."""
    if isinstance(states, (str, bytes, Mapping)) or not isinstance(states, Iterable):
        raise PinfeedValueError(
            "merge_states: expected a list of Loader.state_dict() dicts (one per rank), not "
            f"{type(states).__name__}"
        )
    states = list(states)
    if not states:
        raise PinfeedValueError("merge_states: no state given")
    positions = []
    for i, state in enumerate(states):
        what = f"merge_states: state {i}"
        if not isinstance(state, Mapping):
            raise PinfeedValueError(
                f"{what} is a {type(state).__name__}, not a Loader.state_dict() dict"
            )
        if "fingerprint" not in state:
            raise PinfeedValueError(
                f"{what} has no 'fingerprint': not a Loader.state_dict() (whose fingerprint "
                "tells which job it belongs to)"
            )
        epoch, done, consumed, world, batch = state_ints(
            what, state, epoch=..., batches_done=..., consumed=0, world_size=..., batch_size=...
        )
        positions.append((epoch, consumed + done * world * batch))
    for key in ("fingerprint", "world_size", "batch_size", "data_fingerprint"):
        seen = {repr(s.get(key)) for s in states}
        if len(seen) > 1:
            raise PinfeedValueError(
                f"merge_states: the states come from different jobs: {key} differs "
                f"({', '.join(sorted(seen))})"
            )
    least = min(range(len(states)), key=positions.__getitem__)
    return dict(states[least])


def check_saved_with(
    what: str, state: Mapping[str, Any], mine: Mapping[str, Any], fingerprint: int
) -> None:
    """Refuses a Loader state saved under another dataset, batch size, drop_last, seed or
    shuffle than ``mine`` (this loader's state): its parameters, then the order's
    ``fingerprint`` (this loader's at the state's world size)."""
    differs = []
    for key in ("num_records", "batch_size", "drop_last", "seed"):
        if key in state and state[key] != mine[key]:
            differs.append(f"{key} {state[key]!r} (this loader: {mine[key]!r})")
    if "shuffle" in state:
        try:
            theirs = order_kind(shuffle_arg(state["shuffle"], SHUFFLE_MODES, "state"))
        except PinfeedValueError:
            theirs = repr(state["shuffle"])
        if theirs != order_kind(mine["shuffle"]):
            differs.append(f"shuffle {state['shuffle']!r} (this loader: {mine['shuffle']!r})")
        elif theirs == "block":
            for key in ("block_size", "block_window"):
                if key in state and state[key] != mine[key]:
                    differs.append(f"{key} {state[key]!r} (this loader: {mine[key]!r})")
    theirs, ours = state.get("data_fingerprint"), mine.get("data_fingerprint")
    if theirs is not None and ours is not None and theirs != ours:
        differs.append(f"other data (data fingerprint {theirs!r}, this loader's: {ours!r})")
    if not differs and "fingerprint" in state and state["fingerprint"] != fingerprint:
        differs.append(
            f"order fingerprint {state['fingerprint']!r} (this loader at world size "
            f"{state.get('world_size', mine['world_size'])}: {fingerprint!r})"
        )
    if differs:
        raise PinfeedValueError(
            f"{what}: cannot resume from this state: it was saved with "
            + ", ".join(differs)
            + "; a position means nothing under another dataset, batch size, drop_last, "
            "seed or shuffle"
        )


def resumed_position(
    what: str,
    state: Any,
    mine: Mapping[str, Any],
    fingerprint_at: Callable[[int], int],
    split_batches: Callable[[int], int],
) -> tuple[int, int, int]:
    """Where a Loader whose own state is ``mine`` resumes from ``state`` (a
    :meth:`Loader.state_dict` dict): ``(epoch, batches_done, consumed)``, checked against
    ``mine`` and the order's fingerprint at the state's world size (``fingerprint_at``), carried
    to ``mine``'s world size by the Rust rules, and the next epoch's start where that leaves no
    batch of its split (``split_batches(consumed)`` batches)."""
    if not isinstance(state, Mapping) or "num_records" in state:
        state = require_state(what, state, "Loader", "num_records")
    else:
        state = require_state(what, state, "Loader", "fingerprint")
    epoch, done, consumed, saved_world = state_ints(
        what,
        state,
        epoch=...,
        batches_done=...,
        consumed=0,
        world_size=state.get("world_size", mine["world_size"]),
    )
    check_saved_with(what, state, mine, fingerprint_at(saved_world))
    try:
        # The Rust rules check the position against its split and carry it to this world
        # size (unchanged when it is the same).
        epoch, done, consumed = _pinfeed.reshard_position(
            mine["num_records"],
            mine["batch_size"],
            drop_last=mine["drop_last"],
            epoch=epoch,
            batches_done=done,
            consumed=consumed,
            from_world_size=saved_world,
            to_world_size=mine["world_size"],
        )
    except PinfeedValueError as e:
        raise PinfeedValueError(f"{what}: {e}") from None
    if done == split_batches(consumed):
        return epoch + 1, 0, 0
    return epoch, done, consumed
