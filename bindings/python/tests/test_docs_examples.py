"""Every ```python and ```bash block of README.md and docs/guide-*.md runs, in order, one
process per file, in a temporary folder, on the host backend (CUDA hidden), with the
``pinfeed`` command of the installed package on ``PATH``. Python blocks of one file share one
namespace, as a reader following the page would; bash blocks run with ``set -euo pipefail``.

A block that cannot run here is marked on the line before its fence with an HTML comment
giving the reason, ``<!-- skip: needs a CUDA device -->``; it is counted, and a skip without a
reason fails. A file that mentions ``PINFEED_EXAMPLE_S3`` gets a moto S3 server on 127.0.0.1,
its endpoint in that variable (the guides show it as the user's own endpoint). The README's
set-up lines, ``pip install ...`` and ``./scripts/test``, are not run: the package under test
is the one installed, and this test is part of that suite.

On a GPU machine, ``pytest --gpu`` also runs every file with CUDA visible, and with it the
blocks skipped as ``needs a CUDA device...`` (and ``needs two CUDA devices`` where there are
two).

``python tests/test_docs_examples.py FILE.md [--keep-going] [--gpu]`` runs one file by hand.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("guide-*.md"))]
RUNNABLE = ("python", "bash")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
SKIP = re.compile(r"^<!--\s*skip:(.*?)-->\s*$")
# Lines of a bash block that set up what the test already has (see above).
SETUP_LINE = re.compile(r"^\s*(pip install\b|\./scripts/test\b)")
# A block longer than this is a sign that an example lost its "small" data.
BLOCK_SECONDS = 60


class Block(NamedTuple):
    lang: str
    line: int  # of the opening fence, 1-based
    code: str
    skip: Optional[str]  # the reason, "" when the comment gives none; None: runs


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the skip comment on the line before it."""
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path.name}:{start + 1}: a code fence is never closed")
        skip = SKIP.match(lines[start - 1].strip()) if start else None
        found.append(
            Block(lang, start + 1, "\n".join(body) + "\n", None if not skip else skip[1].strip())
        )
        i += 1
    return found


def runs_here(reason: str, gpu: bool) -> bool:
    """Whether a block skipped for ``reason`` runs in a GPU run on this machine."""
    if not gpu:
        return False
    if reason.startswith("needs two CUDA devices"):
        import pinfeed

        return pinfeed.cuda_device_count() >= 2
    return reason.startswith("needs a CUDA device")


def run_file(path: Path, workdir: Path, keep_going: bool = False, gpu: bool = False) -> list:
    """Runs the runnable blocks of ``path`` in ``workdir``; one result a block. Stops at the
    first failure unless ``keep_going``. ``gpu``: runs the blocks that need CUDA devices too."""
    os.chdir(workdir)
    import pinfeed

    # The docs speak the current vocabulary: an old spelling in an example is a failure.
    old = getattr(pinfeed, "PinfeedDeprecationWarning", None)
    if old is not None:
        warnings.filterwarnings("error", category=old)
    namespace: dict = {"__name__": "__main__"}
    results = []
    for b in blocks(path):
        if b.lang not in RUNNABLE:
            continue
        where = f"{path.name}:{b.line}"
        if b.skip is not None and not runs_here(b.skip, gpu):
            results.append(dict(where=where, lang=b.lang, status="skipped", reason=b.skip))
            continue
        start = time.monotonic()
        try:
            if b.lang == "python":
                exec(compile(b.code, where, "exec"), namespace)
            else:
                code = "".join(
                    line for line in b.code.splitlines(True) if not SETUP_LINE.match(line)
                )
                run = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", code],
                    capture_output=True,
                    text=True,
                    timeout=BLOCK_SECONDS,
                )
                if run.returncode:
                    raise RuntimeError(
                        f"exit status {run.returncode}\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
                    )
            seconds = round(time.monotonic() - start, 2)
            results.append(dict(where=where, lang=b.lang, status="passed", seconds=seconds))
        except BaseException as e:  # noqa: B036 (SystemExit from an example is a failure too)
            tb = traceback.format_exc(limit=-6)
            results.append(dict(where=where, lang=b.lang, status="failed", error=tb))
            print(f"--- {where} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if not keep_going:
                break
    return results


def example_env(tmp: Path, gpu: bool) -> dict:
    """The environment of a docs run: no CUDA device (unless ``gpu``), the package's
    ``pinfeed`` first on PATH, caches in the temporary folder."""
    env = dict(os.environ)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    # torchrun and pinfeed's console script as the environment with pinfeed installed has them
    # (a venv may lack torchrun's script; a `pip install --target` folder puts none on PATH).
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    scripts = {
        "torchrun": "-m torch.distributed.run",
        "pinfeed": "-c 'from pinfeed._cli import main; main()'",
    }
    for name, args in scripts.items():
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        (bin_dir / name).chmod(0o755)
    path = [str(bin_dir), os.path.dirname(sys.executable), env.get("PATH", "")]
    env["PATH"] = os.pathsep.join(path)
    env["PINFEED_CACHE_DIR"] = str(tmp / "cache")
    env["MPLBACKEND"] = "Agg"
    # The examples' arrays are small: one BLAS thread each spares a CI machine's few cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return env


def run_in_subprocess(path: Path, tmp: Path, keep_going: bool = False, gpu: bool = False):
    """Runs one file in a fresh interpreter; returns (results, output)."""
    env = example_env(tmp, gpu)
    server = None
    if "PINFEED_EXAMPLE_S3" in path.read_text():
        sys.path.insert(0, str(HERE))
        from s3_server import Moto

        server = Moto()
        env["PINFEED_EXAMPLE_S3"] = server.endpoint
    work = tmp / "work"
    work.mkdir()
    out = tmp / "results.json"
    cmd = [sys.executable, __file__, str(path), "--workdir", str(work), "--json", str(out)]
    try:
        run = subprocess.run(
            cmd + (["--keep-going"] if keep_going else []) + (["--gpu"] if gpu else []),
            capture_output=True,
            text=True,
            env=env,
            timeout=10 * BLOCK_SECONDS,
        )
    finally:
        if server is not None:
            server.stop()
    results = json.loads(out.read_text()) if out.exists() else []
    return results, run.stdout[-4000:] + run.stderr[-8000:]


def test_the_docs_are_found():
    names = [p.name for p in DOCS]
    assert "README.md" in names and len(DOCS) >= 7, names


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_skip_says_why_and_gpu_examples_stay_few(path):
    found = blocks(path)
    runnable = [b for b in found if b.lang in RUNNABLE]
    assert runnable, f"{path.name} has no runnable example"
    for b in found:
        assert b.lang, f"{path.name}:{b.line}: a code block names no language"
        assert b.lang not in ("py", "sh", "shell", "console"), (
            f"{path.name}:{b.line}: write ```python or ```bash, which the test runs"
        )
        if b.skip is not None:
            assert b.skip, f"{path.name}:{b.line}: a skipped block must say why"
    skipped = [b for b in runnable if b.skip is not None]
    assert len(skipped) * 2 <= len(runnable), (
        f"{path.name}: {len(skipped)} of {len(runnable)} examples are skipped; keep GPU- and "
        "network-only examples few"
    )


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


@pytest.mark.parametrize(
    "path", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_links_reach_files_and_headings(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{path.name}: links to nothing: {broken}"


def test_slugs_are_githubs():
    assert slug("Seed tensor (to_device)") == "seed-tensor-to_device"
    assert slug("`MultiLoader`: several devices from one process") == (
        "multiloader-several-devices-from-one-process"
    )


def test_the_block_parser_reads_fences_and_skips(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        "text\n<!-- skip: needs a CUDA device -->\n```python\nimport a\n```\n"
        "<!-- skip: -->\n```bash\nls\n```\n```text\nnot run\n```\n"
    )
    got = blocks(md)
    assert [(b.lang, b.line, b.skip) for b in got] == [
        ("python", 3, "needs a CUDA device"),
        ("bash", 7, ""),
        ("text", 10, None),
    ]
    assert got[0].code == "import a\n"


def test_a_failing_example_fails_the_run_and_set_up_lines_are_left_out(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        "```python\nx = 1\n```\n"
        "```bash\npip install no-such-package-anywhere\n./scripts/test\necho set up\n```\n"
        "```python\nassert x == 1\n```\n```bash\ntest -e nothing-here\n```\n"
        "```python\nx = 2\n```\n"
    )
    results, output = run_in_subprocess(md, tmp_path)
    assert [r["status"] for r in results] == ["passed", "passed", "passed", "failed"], output


def test_an_old_spelling_in_an_example_fails(tmp_path):
    import pinfeed

    if not hasattr(pinfeed, "PinfeedDeprecationWarning"):
        pytest.skip("this pinfeed has no deprecated spellings yet")
    md = tmp_path / "x.md"
    md.write_text(
        "```python\nimport numpy as np\nimport pinfeed\n"
        "loader = pinfeed.Loader(np.zeros((8, 2)), 4, device='cpu')\n```\n"
        "```python\nloader.num_samples\n```\n```python\nloader.num_records\n```\n"
    )
    results, output = run_in_subprocess(md, tmp_path)
    assert [r["status"] for r in results] == ["passed", "passed", "failed"], output
    assert "PinfeedDeprecationWarning" in results[-1]["error"]


def check_run(path: Path, tmp: Path, gpu: bool) -> None:
    results, output = run_in_subprocess(path, tmp, gpu=gpu)
    failed = [r for r in results if r["status"] == "failed"]
    assert not failed, f"{failed[0]['where']} failed:\n{failed[0]['error']}\n{output}"
    ran = [r for r in results if r["status"] == "passed"]
    skipped = [r for r in results if r["status"] == "skipped"]
    assert len(ran) + len(skipped) == sum(b.lang in RUNNABLE for b in blocks(path)), output
    if not gpu:
        assert len(ran) == sum(b.lang in RUNNABLE and b.skip is None for b in blocks(path))
    print(f"{path.name}: {len(ran)} examples ran, {len(skipped)} skipped")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_example_runs_on_the_host_backend(path, tmp_path):
    pytest.importorskip("torch")
    check_run(path, tmp_path, gpu=False)


@pytest.mark.gpu
@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_example_runs_on_the_gpu(path, tmp_path, torch):
    check_run(path, tmp_path, gpu=True)


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Runs the examples of one Markdown file.")
    p.add_argument("file", type=Path)
    p.add_argument("--workdir", type=Path, help="run the blocks here (a server, if needed, not)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--keep-going", action="store_true", help="run every block past a failure")
    p.add_argument("--gpu", action="store_true", help="CUDA visible; run its blocks too")
    a = p.parse_args(argv)
    if a.workdir is None:  # by hand: this process sets up what the test would
        with tempfile.TemporaryDirectory() as tmp:
            results, output = run_in_subprocess(a.file.resolve(), Path(tmp), a.keep_going, a.gpu)
        print(output)
    else:
        results = run_file(a.file.resolve(), a.workdir, a.keep_going, a.gpu)
        if a.json:
            a.json.write_text(json.dumps(results))
            return 1 if any(r["status"] == "failed" for r in results) else 0
    for r in results:
        print(f"{r['status']:8} {r['where']:28} {r.get('seconds', '')} {r.get('reason', '')}")
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
