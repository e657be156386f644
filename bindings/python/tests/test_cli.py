"""The ``pinfeed`` command that installing the package provides: the CLI, run in-process."""

import json
import subprocess
import sys
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import pytest

import pinfeed

ENTRY_POINT = [sys.executable, "-c", "from pinfeed._cli import main; main()"]


def _console_script():
    """The ``pinfeed`` script the install wrote: beside a ``--target`` install, or in the
    interpreter's scripts folder."""
    for folder in (Path(pinfeed.__file__).parents[1] / "bin", Path(sysconfig.get_path("scripts"))):
        script = folder / "pinfeed"
        if script.is_file():
            return [str(script)]
    return None


def _commands():
    script = _console_script()
    return [ENTRY_POINT] + ([script] if script else [])


@pytest.fixture(params=_commands(), ids=lambda c: "script" if len(c) == 1 else "entry_point")
def command(request):
    return request.param


def test_the_console_script_is_installed():
    assert _console_script() is not None, "no pinfeed script beside the installed package"


def test_gen_then_stream(command, tmp_path):
    path = tmp_path / "data.npy"
    gen = subprocess.run(
        command + ["gen", str(path), "--records", "100", "--shape", "3,5"],
        capture_output=True,
        text=True,
    )
    assert gen.returncode == 0, gen.stderr
    stream = subprocess.run(
        command + ["stream", str(path), "--batch-size", "16", "--device", "cpu", "--json", "--crc"],
        capture_output=True,
        text=True,
    )
    assert stream.returncode == 0, stream.stderr
    report = json.loads(stream.stdout)
    assert report["records"] == 100
    assert report["bytes"] == 100 * 15
    assert report["batches"] == 7
    assert report["device"] == "cpu"
    assert report["crc32"] == zlib.crc32(np.load(path).tobytes())


def test_errors_are_one_line_with_status_2(command, tmp_path):
    missing = tmp_path / "missing.npy"
    run = subprocess.run(
        command + ["stream", str(missing), "--batch-size", "4", "--device", "cpu"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pinfeed: error:"), run.stderr
    assert str(missing) in lines[0]


def test_a_closed_stdout_ends_quietly(command, tmp_path):
    """Python ignores SIGPIPE: the command sees EPIPE and stops with status 0, no traceback."""
    path = tmp_path / "data.npy"
    subprocess.run(
        command + ["gen", str(path), "--records", "4096"], check=True, capture_output=True
    )
    proc = subprocess.Popen(
        command + ["stream", str(path), "--batch-size", "1024", "--device", "cpu", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 0, stderr
    assert stderr == b""
