"""GPU tests (marker ``gpu``) need torch and a CUDA device: they are deselected unless pytest
is given ``--gpu``, so CI reports them as deselected, never as passed."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--gpu", action="store_true", default=False, help="run tests marked gpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch and a CUDA device (run with --gpu)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--gpu"):
        return
    selected, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("gpu") else selected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture(scope="module")
def torch():
    """torch with a CUDA device, for the GPU tests; skips (they are marked ``gpu``) without."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.fixture
def no_launcher_env(monkeypatch):
    """Tests that want RANK/WORLD_SIZE set them; a launcher's must not leak in."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
