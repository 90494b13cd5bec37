"""Shared test configuration: the ``gpu`` marker skips without CUDA; ``shared_data`` finds ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Without a GPU, Triton kernels (engine.triton_kernels) run in Triton's interpreter; it must be chosen before
# Triton is first imported (its own library functions are decorated at import).
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def single_threaded_torch():
    """Tiny CPU models: intra-op threads only add contention (20x slower on a loaded 2-core runner)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def find_shared_data() -> Path | None:
    """The ../shared/data folder beside the checkout (or $DICE_SHARED_DATA), or None when absent."""
    env = os.environ.get("DICE_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [REPO_ROOT.parent / "shared" / "data", REPO_ROOT / "shared" / "data"]
    for path in candidates:
        if path.is_dir():
            return path
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = find_shared_data()
    if path is None:
        pytest.skip("../shared/data is absent")
    return path


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
