"""The one vocabulary of the Python API (issue 48): ``__all__``, the signatures of every entry
point, the old spellings (each warns once a process and still works), the errors raised, and
the size of the package's files and functions."""

import ast
import inspect
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import pinfeed
from pinfeed import _deprecation

# The sources in this checkout, not the installed copy (which has no bindings beside it).
PACKAGE = Path(__file__).resolve().parents[1] / "python" / "pinfeed"
BINDINGS = PACKAGE.parents[1] / "src"
IMAGES = Path(__file__).resolve().parents[3] / "crates/source/tests/fixtures/images"

LOADERS = [pinfeed.Loader, pinfeed.TokenLoader, pinfeed.ImageLoader, pinfeed.MultiLoader]
ENTRY_POINTS = LOADERS + [pinfeed.prefetch, pinfeed.to_device, pinfeed.Prefetcher]

# SPEC's table: the shared keyword-only options, their defaults, wherever they appear.
SHARED = {
    "device": "auto",
    "framework": None,
    "shuffle": False,
    "seed": 0,
    "rank": None,
    "world_size": None,
    "drop_last": False,
    "pinned_budget": None,
    "num_threads": None,
    "storage_options": None,
    "cache_dir": None,
    "cache_limit": None,
    "queue_depth": None,
    "epochs": 1,
}
# Batches read ahead: 4 on the loaders, 2 for prefetch().
PREFETCH = {"loader": 4, "prefetch": 2}
# Every loader has these (the loaders' own sizes and options).
EVERY_LOADER = set(SHARED) - {"device", "epochs"} | {"prefetch"}


def params(entry):
    target = entry.__init__ if inspect.isclass(entry) else entry
    ps = list(inspect.signature(target).parameters.values())
    return ps[1:] if inspect.isclass(entry) else ps


def test_all_is_sorted_and_is_the_public_names():
    assert pinfeed.__all__ == sorted(pinfeed.__all__)
    assert len(set(pinfeed.__all__)) == len(pinfeed.__all__)
    public = {
        name
        for name, value in vars(pinfeed).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    public |= {"__version__", "transforms"}
    assert set(pinfeed.__all__) == public
    for name in pinfeed.__all__:
        assert hasattr(pinfeed, name), name


def test_every_entry_point_starts_with_source_and_shares_its_options():
    for entry in ENTRY_POINTS:
        ps = params(entry)
        assert ps[0].name == "source", entry
        assert ps[0].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
        for p in ps:
            if p.name in SHARED:
                what = f"{entry.__name__}({p.name}=)"
                assert p.kind == inspect.Parameter.KEYWORD_ONLY, what
                assert p.default == SHARED[p.name] and type(p.default) is type(SHARED[p.name]), what
            if p.name == "prefetch":
                kind = "prefetch" if entry in (pinfeed.prefetch, pinfeed.Prefetcher) else "loader"
                assert p.kind == inspect.Parameter.KEYWORD_ONLY and p.default == PREFETCH[kind]
    for loader in LOADERS:
        names = {p.name for p in params(loader)}
        assert EVERY_LOADER <= names, (loader.__name__, EVERY_LOADER - names)
        assert "num_samples" in dir(loader), loader
    # What the user receives is dtype; the stored width of tokens is token_dtype.
    token = {p.name: p for p in params(pinfeed.TokenLoader)}
    assert "token_dtype" in token and "int_dtype" not in token and "path" not in token
    assert [p.name for p in params(pinfeed.TokenLoader)][:3] == ["source", "seq_len", "batch_size"]
    assert [p.name for p in params(pinfeed.ImageLoader)][:3] == ["source", "batch_size", "size"]
    assert "as_torch" not in {p.name for p in params(pinfeed.Loader)}


def test_shuffle_modes_a_loader_cannot_do_are_refused_naming_those_it_can(tmp_path):
    tokens = tmp_path / "t.bin"
    np.arange(500, dtype=np.uint16).tofile(tokens)
    kw = dict(token_dtype="uint16", sample="sequential", device="cpu")
    loader = pinfeed.TokenLoader(tokens, 8, 2, shuffle="random", **kw)
    assert loader.shuffle == "random"
    with pytest.raises(pinfeed.PinfeedValueError, match="'random'.*cannot shuffle 'block'"):
        pinfeed.TokenLoader(tokens, 8, 2, shuffle="block", **kw)
    with pytest.raises(pinfeed.PinfeedValueError, match="'gpu' or 'none'"):
        pinfeed.Loader(np.zeros((4, 2)), 2, device="cpu", shuffle="sideways")


def test_image_loader_refuses_object_storage_in_one_line(tmp_path):
    with pytest.raises(pinfeed.PinfeedValueError, match="reads images from local files"):
        pinfeed.ImageLoader("s3://bucket/train/", 4, device="cpu")
    with pytest.raises(pinfeed.PinfeedValueError, match="storage_options apply to object"):
        pinfeed.ImageLoader(tmp_path, 4, device="cpu", storage_options={"region": "x"})


def test_image_loader_delivers_each_framework(tmp_path):
    root = tmp_path / "tree" / "a"
    root.mkdir(parents=True)
    for name in ("baseline.jpg", "rgb.png", "444.jpg"):
        (root / name).write_bytes((IMAGES / name).read_bytes())
    kw = dict(size=8, device="cpu", crop="center", mean=0.5, std=0.25)
    ref = [b for b in pinfeed.ImageLoader(tmp_path / "tree", 2, **kw)]
    torch = pytest.importorskip("torch")
    got = list(pinfeed.ImageLoader(tmp_path / "tree", 2, framework="torch", **kw))
    for (x, y), (gx, gy) in zip(ref, got):
        assert isinstance(gx, torch.Tensor) and gy.dtype == torch.int64
        np.testing.assert_allclose(gx.numpy(), x, atol=1e-6)
        np.testing.assert_array_equal(gy.numpy(), y)
    jax = pytest.importorskip("jax")
    got = list(pinfeed.ImageLoader(tmp_path / "tree", 2, framework="jax", **kw))
    for (x, y), (gx, gy) in zip(ref, got):
        assert isinstance(gx, jax.Array)
        np.testing.assert_allclose(np.asarray(gx), x, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(gy), y)


# Each old spelling, run in a fresh process: (code, the new spelling its warning names).
OLD_SPELLINGS = {
    "TokenLoader path=": (
        "pinfeed.TokenLoader(path=TOK, seq_len=4, batch_size=2, "
        "token_dtype='uint16', steps=1, device='cpu')",
        "source=",
    ),
    "TokenLoader dtype=<stored width>": (
        "pinfeed.TokenLoader(TOK, 4, 2, dtype='uint16', steps=1, device='cpu')",
        "token_dtype='uint16'",
    ),
    "TokenLoader int_dtype=": (
        "pinfeed.TokenLoader(TOK, 4, 2, token_dtype='<u2', "
        "int_dtype='int32', steps=1, device='cpu')",
        "dtype=",
    ),
    "ImageLoader path=": (
        "pinfeed.ImageLoader(path=IMG, batch_size=1, size=4, device='cpu')",
        "source=",
    ),
    "Loader as_torch=": (
        "pinfeed.Loader(ARR, 2, device='cpu', as_torch=True)",
        'framework="torch"',
    ),
    "prefetch depth=": ("pinfeed.prefetch([ARR], device='cpu', depth=1)", "prefetch="),
    "prefetch positional": ("pinfeed.prefetch([ARR], 'cpu', 1, '1MiB')", "device="),
    "to_device positional": ("pinfeed.to_device(ARR, 'cpu', '1MiB')", "device="),
    "Loader.num_records": ("pinfeed.Loader(ARR, 2, device='cpu').num_records", "num_samples"),
    "TokenLoader.int_dtype": (
        "pinfeed.TokenLoader(TOK, 4, 2, token_dtype='uint16', steps=1, device='cpu').int_dtype",
        "dtype",
    ),
}

SETUP = """
import sys, warnings
import numpy as np
import pinfeed
TOK, IMG = sys.argv[1], sys.argv[2]
ARR = np.arange(8, dtype=np.float32).reshape(4, 2)
"""


@pytest.mark.parametrize("case", sorted(OLD_SPELLINGS))
def test_each_old_spelling_warns_once_and_still_works(tmp_path, case):
    code, new = OLD_SPELLINGS[case]
    tokens = tmp_path / "t.bin"
    np.arange(200, dtype=np.uint16).tofile(tokens)
    images = tmp_path / "img" / "a"
    images.mkdir(parents=True)
    (images / "x.jpg").write_bytes((IMAGES / "baseline.jpg").read_bytes())
    script = SETUP + textwrap.dedent(f"""
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            first = {code}
            second = {code}
            list(first) if hasattr(first, "__iter__") and not hasattr(first, "shape") else None
        ours = [w for w in seen if issubclass(w.category, pinfeed.PinfeedDeprecationWarning)]
        assert issubclass(pinfeed.PinfeedDeprecationWarning, DeprecationWarning)
        assert issubclass(pinfeed.PinfeedDeprecationWarning, pinfeed.PinfeedWarning)
        messages = [str(w.message) for w in ours]
        # Once each: a second use of the same spelling is silent.
        assert messages and len(set(messages)) == len(messages), messages
        assert {new!r} in messages[0], messages
        assert all(w.filename == "<string>" for w in ours), [w.filename for w in ours]
        print("ok")
    """)
    run = subprocess.run(
        [sys.executable, "-c", script, str(tokens), str(tmp_path / "img")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


def test_old_spellings_give_what_the_new_ones_give(tmp_path):
    tokens = tmp_path / "t.bin"
    np.random.default_rng(0).integers(0, 1 << 16, 300, dtype=np.uint16).tofile(tokens)
    kw = dict(steps=2, seed=3, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pinfeed.PinfeedDeprecationWarning)
        old = list(
            pinfeed.TokenLoader(
                path=tokens, seq_len=4, batch_size=2, dtype="uint16", int_dtype="int32", **kw
            )
        )
        arr = np.arange(12.0).reshape(6, 2)
        torch = pytest.importorskip("torch")
        as_torch = list(pinfeed.Loader(arr, 4, device="cpu", as_torch=True))
        moved = pinfeed.to_device(arr, "cpu", "1MiB")
    new = list(pinfeed.TokenLoader(tokens, 4, 2, token_dtype="uint16", dtype="int32", **kw))
    for (x, y), (nx, ny) in zip(old, new):
        assert x.dtype == np.int32
        np.testing.assert_array_equal(x, nx)
        np.testing.assert_array_equal(y, ny)
    assert all(isinstance(b, torch.Tensor) for b in as_torch)
    np.testing.assert_array_equal(moved, arr)
    with pytest.raises(pinfeed.PinfeedTypeError, match="not both"):
        pinfeed.TokenLoader(tokens, 4, 2, path=tokens, **kw)


def test_the_once_registry_is_per_spelling():
    _deprecation.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            _deprecation.warn_once("Here", "old=", "use new= instead")
        _deprecation.warn_once("There", "old=", "use new= instead")
    assert [str(w.message) for w in seen] == [
        "Here: old= is deprecated; use new= instead",
        "There: old= is deprecated; use new= instead",
    ]
    _deprecation.reset()


def test_every_error_is_a_pinfeed_error():
    # No bare raise of a builtin error class in the package: each is a PinfeedError subclass.
    bare = re.compile(r"raise (ValueError|TypeError|OverflowError|RuntimeError|KeyError)\(")
    for path in PACKAGE.glob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not bare.search(line), f"{path.name}:{n}: {line.strip()}"
    assert issubclass(pinfeed.PinfeedTypeError, TypeError)
    assert issubclass(pinfeed.PinfeedTypeError, pinfeed.PinfeedError)


# Limits from the project's standards (SPEC.md, issue 48).
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_LOADER_INIT_LINES = 60


def python_functions(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


RUST_FN = re.compile(
    r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(unsafe\s+)?(extern \"C\"\s+)?fn\s+(\w+)"
)


def rust_functions(path):
    """``(name, line, lines)`` of each ``fn`` with a body: from its ``fn`` line to the brace
    that closes it (braces in strings and comments are rare enough here not to matter)."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = RUST_FN.match(line)
        if not m:
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            code = lines[j].split("//")[0]
            if not opened and code.rstrip().endswith(";") and "{" not in code:
                break  # a declaration without a body (a trait's)
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth <= 0:
                yield m.group(6), i + 1, j - i + 1
                break


def test_files_and_functions_stay_small():
    too_long = []
    for path in sorted(PACKAGE.glob("*.py")):
        n = len(path.read_text().splitlines())
        if n > MAX_FILE_LINES:
            too_long.append(f"{path.name}: {n} lines")
        for name, line, length in python_functions(path):
            if length > MAX_FUNCTION_LINES:
                too_long.append(f"{path.name}:{line} {name}: {length} lines")
    for path in sorted(BINDINGS.glob("*.rs")):
        for name, line, length in rust_functions(path):
            if length > MAX_FUNCTION_LINES:
                too_long.append(f"{path.name}:{line} fn {name}: {length} lines")
    assert not too_long, too_long
    init = pinfeed.Loader.__init__.__wrapped__
    lines = len(inspect.getsource(init).splitlines())
    assert lines < MAX_LOADER_INIT_LINES, f"Loader.__init__: {lines} lines"


def test_the_size_scan_sees_long_functions(tmp_path):
    long_py = tmp_path / "long.py"
    long_py.write_text("def f():\n" + "    x = 1\n" * 90)
    assert [(n, length) for n, _, length in python_functions(long_py)] == [("f", 91)]
    long_rs = tmp_path / "long.rs"
    body = "    if x { y(); }\n" * 85
    long_rs.write_text("pub(crate) fn g() -> u8 {\n" + body + "    0\n}\nfn h();\n")
    assert [(n, length) for n, _, length in rust_functions(long_rs)] == [("g", 88)]
    assert os.path.isdir(BINDINGS)
