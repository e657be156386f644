"""A Loader made before fork() refuses to run in the child, clearly and without hanging."""

import os
import sys
import time

import numpy as np
import pytest

import pinfeed

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def run_in_child(fn):
    """Runs fn() in a forked child; returns its exit code (0: passed), killing it after 30 s."""
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            code = fn()
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return (
                os.waitstatus_to_exitcode(status)
                if hasattr(os, "waitstatus_to_exitcode")
                else status >> 8
            )
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")


def expect_fork_error(action):
    def child():
        try:
            action()
        except pinfeed.PinfeedError as e:
            return 0 if "fork" in str(e) else 3
        return 2

    return child


def test_iterating_in_child_raises():
    data = np.arange(100_000, dtype=np.uint8).reshape(1000, 100)
    loader = pinfeed.Loader(data, 10, device="cpu", num_threads=2)
    assert run_in_child(expect_fork_error(lambda: list(loader))) == 0
    # The parent is unaffected.
    np.testing.assert_array_equal(np.concatenate(list(loader)), data)


def test_next_of_a_started_pass_in_child_raises():
    data = np.arange(100_000, dtype=np.uint8).reshape(1000, 100)
    loader = pinfeed.Loader(data, 10, device="cpu", num_threads=2)
    it = iter(loader)
    next(it)
    assert run_in_child(expect_fork_error(lambda: next(it))) == 0
    assert sum(len(b) for b in it) == 990


def test_stream_level_check_in_child():
    from pinfeed import _pinfeed

    source = _pinfeed.Source.from_array(np.zeros((100, 4), np.uint8), "'|u1'")
    options = _pinfeed.StreamOptions(
        source, 10, export_dtype=(1, 8, 1), record_shape=[4], device="cpu"
    )
    stream = _pinfeed.Stream(options)
    assert run_in_child(expect_fork_error(lambda: next(stream))) == 0
    assert len(list(stream)) == 10


def test_child_can_make_its_own_loader():
    data = np.arange(1000, dtype=np.int32)
    pinfeed.Loader(data, 10, device="cpu")

    def child():
        out = np.concatenate(list(pinfeed.Loader(data, 7, device="cpu")))
        return 0 if np.array_equal(out, data) else 4

    assert run_in_child(child) == 0


def test_prefetch_iterator_in_child_raises():
    items = [np.full(1000, i, dtype=np.int32) for i in range(50)]
    it = pinfeed.prefetch(iter(items), device="cpu", prefetch=2, pinned_budget="1MiB")
    first = next(it)
    assert run_in_child(expect_fork_error(lambda: next(it))) == 0
    # The parent's iterator carries on where it was.
    rest = list(it)
    np.testing.assert_array_equal(np.concatenate([first] + rest), np.concatenate(items))


def test_child_draws_its_own_shuffled_order_while_the_parent_draws_ahead():
    # A loader draws the next epoch's order on a thread of its own (4 Mi records: tens of ms),
    # so this fork most likely lands while it is half drawn; the child, which has no such
    # thread, must draw its own rather than wait for that one.
    data = np.zeros((4 << 20, 1), np.uint8)
    kw = dict(device="cpu", shuffle="random", seed=5, num_threads=1)
    loader = pinfeed.Loader(data, 1 << 16, **kw)
    it = iter(loader)
    next(it)

    def child():
        other = pinfeed.Loader(data, 1 << 16, **kw)
        other.set_epoch(1)
        return 0 if sum(len(b) for b in other) == len(data) else 4

    assert run_in_child(child) == 0
    assert sum(len(b) for b in it) == len(data) - (1 << 16)
