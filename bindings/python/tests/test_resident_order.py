"""GPU-resident shuffling's epoch orders, computed ahead on worker threads: the same order as
``shuffle=True`` whatever the jumps, the same results without the workers, and no thread left
behind. Run on the host backend (``device="cpu"``), as in CI."""

import gc
import os
import threading

import numpy as np
import pytest
from test_fork import run_in_child

import pinfeed
import pinfeed._resident as resident_module
from pinfeed import _pinfeed
from pinfeed._resident import OrdersAhead

N = 211
SMALL = dict(device="cpu", pinned_budget="256KiB", num_threads=2)

pytestmark = pytest.mark.usefixtures("no_launcher_env")


def ids(n=N):
    return np.arange(n, dtype=np.int64)


def order_threads():
    return {t for t in threading.enumerate() if t.name == "pinfeed-order-ahead"}


def run(make, script):
    """Runs ``script`` (a list of ("iter",), ("set_epoch", e), ("partial", k) or
    ("resume", state-of-step-i)) on ``make()``'s loader; returns each step's batches."""
    loader = make()
    out, states = [], []
    for step in script:
        if step[0] == "set_epoch":
            loader.set_epoch(step[1])
        elif step[0] == "resume":
            loader.load_state_dict(states[step[1]])
        it = iter(loader)
        k = step[1] if step[0] == "partial" else None
        batches = [
            np.asarray(b).copy() for _, b in zip(range(k) if k is not None else iter(int, 1), it)
        ]
        out.append(batches)
        states.append(loader.state_dict())
    loader.close()
    return out, states


SCRIPT = [
    ("iter",),
    ("iter",),
    ("iter",),
    ("set_epoch", 9),
    ("iter",),
    ("iter",),
    ("set_epoch", 2),
    ("partial", 3),
    ("set_epoch", 0),
    ("iter",),
    ("resume", 7),  # the rest of epoch 2, after the 3 batches of the partial step
    ("partial", 1),
    ("iter",),
]


@pytest.mark.parametrize("world,rank", [(1, 0), (3, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("epochs", [1, 2])
def test_resident_order_is_random_order_across_jumps_and_resumes(world, rank, drop_last, epochs):
    kw = dict(seed=11, rank=rank, world_size=world, drop_last=drop_last, epochs=epochs, **SMALL)
    data = ids()
    resident, resident_states = run(lambda: pinfeed.Loader(data, 8, shuffle="gpu", **kw), SCRIPT)
    random, random_states = run(lambda: pinfeed.Loader(data, 8, shuffle=True, **kw), SCRIPT)
    assert [len(s) for s in resident] == [len(s) for s in random]
    for got, want in zip(resident, random):
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x, y)
    assert [(s["epoch"], s["batches_done"]) for s in resident_states] == [
        (s["epoch"], s["batches_done"]) for s in random_states
    ]
    # And the order is pinfeed.epoch_order's: the first step is epochs 0 .. epochs.
    want = np.concatenate(
        [
            pinfeed.epoch_order(
                N, 8, seed=11, epoch=e, rank=rank, world_size=world, drop_last=drop_last
            )
            for e in range(epochs)
        ]
    )
    np.testing.assert_array_equal(np.concatenate(resident[0]), want)


def test_a_state_from_a_streamed_loader_resumes_the_resident_one():
    kw = dict(seed=5, **SMALL)
    streamed = pinfeed.Loader(ids(), 8, shuffle=True, **kw)
    streamed.set_epoch(4)
    it = iter(streamed)
    for _ in range(5):
        next(it)
    resident = pinfeed.Loader(ids(), 8, shuffle="gpu", **kw)
    list(resident)  # epoch 0; epochs 1 and 2 are then computed ahead, and must not be used
    resident.load_state_dict(streamed.state_dict())
    rest = np.concatenate([np.asarray(b) for b in resident])
    np.testing.assert_array_equal(rest, pinfeed.epoch_order(N, 8, seed=5, epoch=4)[5 * 8 :])
    resident.close()


def test_orders_computed_ahead_give_the_same_results(monkeypatch):
    kw = dict(seed=3, rank=1, world_size=2, **SMALL)
    make = lambda: pinfeed.Loader(ids(), 8, shuffle="gpu", **kw)  # noqa: E731
    ahead, ahead_states = run(make, SCRIPT)
    before = order_threads()
    monkeypatch.setattr(resident_module, "ORDERS_AHEAD", 0)
    loader = make()
    list(loader)
    list(loader)
    assert order_threads() - before == set(), "no worker without orders ahead"
    loader.close()
    inline, inline_states = run(make, SCRIPT)
    assert inline_states == ahead_states
    for got, want in zip(ahead, inline):
        assert len(got) == len(want)
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x, y)


def test_the_next_epochs_are_ready_before_they_start():
    loader = pinfeed.Loader(ids(), 8, shuffle="gpu", seed=1, **SMALL)
    list(loader)  # epoch 0
    orders = loader._resident._orders
    with orders._cond:  # the workers compute epochs 1 and 2
        assert orders._cond.wait_for(lambda: len(orders._ready) == 2, timeout=30)
        assert sorted(k[3] for k in orders._ready) == [1, 2]
    filled = []
    fill, orders._fill = orders._fill, lambda key: filled.append(key) or fill(key)
    list(loader)  # epoch 1: found ready; epoch 3 asked of the workers
    assert all(key[3] != 1 for key in filled)
    loader.close()


def test_no_order_thread_outlives_close_or_collection():
    before = order_threads()
    loader = pinfeed.Loader(ids(), 8, shuffle="gpu", seed=2, **SMALL)
    list(loader)
    assert order_threads() - before, "the workers compute the next epochs"
    loader.close()
    assert order_threads() - before == set()
    # Iterating after close() starts them again; the collector stops them.
    np.testing.assert_array_equal(
        np.concatenate(list(loader)), pinfeed.epoch_order(N, 8, seed=2, epoch=1)
    )
    assert order_threads() - before
    del loader
    gc.collect()
    assert order_threads() - before == set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_has_no_order_thread_and_does_not_hang():
    loader = pinfeed.Loader(ids(), 8, shuffle="gpu", seed=2, **SMALL)
    list(loader)
    mine = order_threads()
    assert mine

    def child():
        if order_threads():
            return 4
        try:
            list(loader)
        except pinfeed.PinfeedError as e:
            if "fork" not in str(e):
                return 3
        else:
            return 2
        loader.close()  # neither joins the parent's threads nor waits on their lock
        return 0

    assert run_in_child(child) == 0
    np.testing.assert_array_equal(
        np.concatenate(list(loader)), pinfeed.epoch_order(N, 8, seed=2, epoch=1)
    )
    loader.close()
    assert not (mine & order_threads())


def test_a_failing_order_raises_in_the_consumer_not_the_worker():
    calls = []

    def fill(key):
        calls.append(threading.current_thread().name)
        if key == "bad":
            raise pinfeed.PinfeedValueError("no such order")
        return key

    orders = OrdersAhead(fill, 2)
    orders.want(["bad", "good"])
    with orders._cond:  # both tried by the workers
        assert orders._cond.wait_for(lambda: len(calls) == 2 and not orders._running, timeout=30)
    assert calls == ["pinfeed-order-ahead"] * 2
    assert orders.get("good") == "good"
    with pytest.raises(pinfeed.PinfeedValueError, match="no such order"):
        orders.get("bad")
    assert calls[2:] == [threading.current_thread().name]  # tried again here, where it raises
    workers = list(orders._threads)
    orders.close()
    assert workers and not any(t.is_alive() for t in workers)


def test_epoch_order_into_an_int64_array():
    kw = dict(drop_last=False, shuffle="random", seed=7, rank=1, world_size=3, epoch=2)
    data, batches = _pinfeed.epoch_order(N, 8, **kw)
    want = np.frombuffer(data, dtype=np.uint64)
    out = np.full(len(want), -1, dtype=np.int64)
    got, got_batches = _pinfeed.epoch_order(N, 8, out=out, **kw)
    assert got is out and got_batches == batches
    np.testing.assert_array_equal(out, want.astype(np.int64))
    with pytest.raises(pinfeed.PinfeedValueError, match="holds 70 records, but rank 1 has 71"):
        _pinfeed.epoch_order(N, 8, out=np.empty(70, np.int64), **kw)
    with pytest.raises(pinfeed.PinfeedValueError, match="int64"):
        _pinfeed.epoch_order(N, 8, out=np.empty(71, np.int32), **kw)
    frozen = np.empty(71, np.int64)
    frozen.flags.writeable = False
    with pytest.raises(pinfeed.PinfeedValueError, match="read-only"):
        _pinfeed.epoch_order(N, 8, out=frozen, **kw)
    with pytest.raises(pinfeed.PinfeedValueError, match="C-contiguous"):
        _pinfeed.epoch_order(N, 8, out=np.empty(142, np.int64)[::2], **kw)
    # The order is checked before the buffer: a bad rank says so.
    with pytest.raises(pinfeed.PinfeedValueError, match="rank 3"):
        _pinfeed.epoch_order(N, 8, out=out, **dict(kw, rank=3))


def test_epoch_size_is_the_size_of_epoch_order_without_drawing_it():
    for kw in (
        dict(drop_last=False, rank=1, world_size=3),
        dict(drop_last=True, rank=1, world_size=2),
        dict(drop_last=False, rank=0, world_size=1),
    ):
        data, batches = _pinfeed.epoch_order(N, 8, shuffle="random", seed=3, epoch=5, **kw)
        assert _pinfeed.epoch_size(N, 8, **kw) == (len(data) // 8, batches)
    with pytest.raises(pinfeed.PinfeedValueError, match="rank 3"):
        _pinfeed.epoch_size(N, 8, drop_last=False, rank=3, world_size=3)
    with pytest.raises(pinfeed.PinfeedValueError, match="drop_last"):
        _pinfeed.epoch_size(N, 200, drop_last=True, rank=0, world_size=2)
    # The resident loader checks its arguments with it when it is made.
    with pytest.raises(pinfeed.PinfeedValueError, match="rank 3"):
        pinfeed.Loader(ids(), 8, shuffle="gpu", rank=3, world_size=3, **SMALL)
