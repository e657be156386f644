"""``_pinfeed.pyi`` against the compiled module: every public name in both, and every function's
and method's parameters (names, kinds, defaults) as the module's ``__text_signature__`` says.

mypy's stubtest checks the same and more; this check needs nothing but the standard library, so
it runs everywhere the tests do. With mypy installed, stubtest runs as well.
"""

import ast
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pinfeed import _pinfeed

STUB = Path(_pinfeed.__file__).with_name("_pinfeed.pyi")
# Dunders a stub spells out because they are the protocol (the rest are Python's own).
PROTOCOL = {"__iter__", "__next__", "__dlpack__", "__dlpack_device__", "__new__"}


def stub_tree():
    return ast.parse(STUB.read_text())


def public(name):
    return not name.startswith("_") or name in PROTOCOL or name in ("__version__", "__all__")


def stub_names(body):
    """Names a stub body defines: ``{name: node}`` (the first of overloads)."""
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.setdefault(node.name, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.setdefault(node.target.id, node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            names.setdefault(node.targets[0].id, node)
    return {k: v for k, v in names.items() if public(k)}


def stub_params(fn, skip_first):
    """``[(name, kind, default)]`` of a stub function; ``...`` where the default is not given
    as a literal."""
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, d in zip(positional, defaults):
        out.append((arg.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, d))
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, None))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, d))
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, None))
    if skip_first:
        out = out[1:]

    def literal(d):
        if d is None:
            return inspect.Parameter.empty
        try:
            return ast.literal_eval(d)
        except ValueError:
            return ...

    return [(n, k, literal(d)) for n, k, d in out]


def runtime_params(obj):
    sig = inspect.signature(obj)
    params = []
    for p in sig.parameters.values():
        kind = p.kind
        if kind == inspect.Parameter.POSITIONAL_ONLY:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append((p.name, kind, p.default))
    return params


def same_params(stub, runtime):
    if [(n, k) for n, k, _ in stub] != [(n, k) for n, k, _ in runtime]:
        return False
    for (_, _, s), (_, _, r) in zip(stub, runtime):
        if (s is inspect.Parameter.empty) != (r is inspect.Parameter.empty):
            return False
        if s is not ... and r is not ... and s is not inspect.Parameter.empty and s != r:
            return False
    return True


def test_every_public_name_is_in_the_stub_and_every_stub_name_in_the_module():
    module = {n for n in dir(_pinfeed) if public(n)}
    assert sorted(_pinfeed.__all__) == sorted(module - {"__all__", "__new__"})
    stub = set(stub_names(stub_tree().body))
    assert module - stub == set(), "in the module, not the stub"
    assert stub - module == set(), "in the stub, not the module"
    (stub_all,) = [
        node.value
        for node in stub_tree().body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__"
    ]
    assert sorted(ast.literal_eval(stub_all)) == sorted(module - {"__all__", "__new__"})


def test_functions_match_their_text_signature():
    for name, node in stub_names(stub_tree().body).items():
        if not isinstance(node, ast.FunctionDef):
            continue
        stub = stub_params(node, skip_first=False)
        runtime = runtime_params(getattr(_pinfeed, name))
        assert same_params(stub, runtime), f"{name}: stub {stub}, module {runtime}"


def test_classes_match_their_members_and_signatures():
    for name, node in stub_names(stub_tree().body).items():
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(_pinfeed, name)
        members = stub_names(node.body)
        # Every class has a `__new__`; one that can be called has a text signature.
        runtime = {n for n in vars(cls) if public(n) and n != "__new__"}
        if cls.__text_signature__ is not None:
            runtime.add("__new__")
        assert set(members) == runtime, f"{name}: stub {sorted(members)}, module {sorted(runtime)}"
        for member, fn in members.items():
            if not isinstance(fn, ast.FunctionDef):
                continue
            is_static = any(
                isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list
            )
            if any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list):
                assert inspect.isdatadescriptor(vars(cls)[member]), f"{name}.{member}"
                continue
            stub = stub_params(fn, skip_first=not is_static)
            if member == "__new__":
                target = cls
            else:
                target = getattr(cls, member)
            if target.__text_signature__ is None and member in ("__iter__", "__next__"):
                continue  # slot wrappers: CPython's own signature
            runtime = runtime_params(target)
            if runtime and runtime[0][0] == "self" and not is_static:
                runtime = runtime[1:]
            assert same_params(stub, runtime), f"{name}.{member}: stub {stub}, module {runtime}"


def test_stubtest_agrees():
    """mypy's stubtest where mypy is installed; else the checks above, run once more here, so
    that this test never passes without checking."""
    if importlib.util.find_spec("mypy") is None:
        test_every_public_name_is_in_the_stub_and_every_stub_name_in_the_module()
        test_functions_match_their_text_signature()
        test_classes_match_their_members_and_signatures()
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "pinfeed._pinfeed"],
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        pytest.fail(run.stdout + run.stderr)
