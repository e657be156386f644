"""A pass's life from unusual places: its own transform, another thread, Ctrl-C. A cut pass
raises at once; stopping never waits for ever on user code; nothing panics."""

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest


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
