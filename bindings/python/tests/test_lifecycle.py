"""A pass's life from unusual places: its own transform, another thread, Ctrl-C. A cut pass
raises at once; stopping never waits for ever on user code; nothing panics."""

import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import pinfeed
from pinfeed import PinfeedError


def data(n=40, width=4):
    return np.arange(n * width, dtype=np.uint8).reshape(n, width)


def run_script(code, timeout=60):
    """Runs ``code`` in a fresh interpreter (a deadlock must not hang the suite)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_transform_may_not_iterate_its_own_loader(when):
    # "before": the transform asks first, for the pass it runs in (it deadlocked, or panicked
    # joining its own thread: "Resource deadlock avoided"); "during": the consumer iterates
    # (the consumer's pass was taken over and its transform's error lost).
    done = run_script(
        f"""
        import os, threading
        import numpy as np
        import pinfeed

        holder, made, tried = {{}}, threading.Event(), threading.Event()

        def iterates(raw, out):
            out[...] = raw
            if not tried.is_set():
                made.wait(30)
                try:
                    for _ in holder["loader"]:
                        break
                    holder["outcome"] = "iterated"
                except pinfeed.PinfeedError as e:
                    holder["outcome"] = str(e)
                tried.set()

        loader = pinfeed.Loader(
            np.zeros((40, 4), np.uint8), 10, device="cpu", num_threads=1,
            transform=iterates, transform_dtype=np.uint8,
        )
        holder["loader"] = loader
        made.set()
        if {when!r} == "during":
            batches = len(list(loader))
        if not tried.wait(20):
            print("hung", flush=True)
            os._exit(3)
        if {when!r} == "before":
            batches = len(list(loader))
        print("outcome:", holder["outcome"])
        print("batches:", batches)
        """
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "PanicException" not in done.stderr, done.stderr
    assert "iter() was called from inside the Loader's own transform" in done.stdout, done.stdout
    assert "batches: 4" in done.stdout, done.stdout


def test_ctrl_c_while_a_transform_never_returns_exits_at_once():
    code = """
        import time
        import numpy as np
        import pinfeed

        def slow(raw, out):
            out[...] = raw
            time.sleep(300)

        loader = pinfeed.Loader(
            np.zeros((40, 4), np.uint8), 10, device="cpu", num_threads=1,
            transform=slow, transform_dtype=np.uint8,
        )
        print("iterating", flush=True)
        for batch in loader:
            pass
        """
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's default in the child, also where the test runner was started with SIGINT
        # ignored (a shell's background job), which a child would inherit.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().strip() == "iterating"
        time.sleep(1.0)  # the consumer now waits for the transform's batch
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the process did not exit within 20 s of Ctrl-C")
    assert "KeyboardInterrupt" in err, err
    assert time.monotonic() - sent < 15


def blocked_loader(release):
    """A Loader whose one reader blocks in its transform until ``release`` is set."""

    def slow(raw, out):
        out[...] = raw
        release.wait(30)

    return pinfeed.Loader(
        data(), 10, device="cpu", num_threads=1, transform=slow, transform_dtype=np.uint8
    )


@pytest.mark.parametrize("how", ["close", "iter"])
def test_a_pass_cut_on_another_thread_raises_in_the_waiting_next(how):
    release = threading.Event()
    loader = blocked_loader(release)
    it = iter(loader)
    outcome = {}

    def consume():
        try:
            next(it)
            outcome["got"] = "a batch"
        except StopIteration:
            outcome["got"] = "the end"
        except PinfeedError as e:
            outcome["got"] = e

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        time.sleep(0.5)  # the consumer waits inside next()
        if how == "close":
            loader.close()
        else:
            iter(loader)
        consumer.join(10)
        assert not consumer.is_alive(), "next() still waits after the pass was cut"
        assert isinstance(outcome["got"], PinfeedError), outcome
        assert "closed before its end" in str(outcome["got"])
        with pytest.raises(PinfeedError):
            next(it)  # and it stays cut
    finally:
        release.set()
        loader.close()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "train.bin"
    np.arange(100_000, dtype=np.uint16).tofile(path)
    return path


@pytest.mark.parametrize("how", ["close", "iter"])
def test_random_token_steps_stop_at_once_when_the_pass_is_cut(token_file, how):
    # Up to 16 random steps travel in one loader batch: the cut must not wait for the next.
    tokens = pinfeed.TokenLoader(
        token_file, seq_len=8, batch_size=2, token_dtype="uint16", device="cpu", steps=100
    )
    it = iter(tokens)
    next(it)
    if how == "close":
        tokens.close()
    else:
        iter(tokens)
    with pytest.raises(PinfeedError, match="ended by"):
        next(it)
