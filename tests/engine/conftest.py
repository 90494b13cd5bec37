"""Fixtures for the engine tests: one tiny random checkpoint per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.testing import make_tiny_checkpoint


@pytest.fixture(autouse=True)
def _single_threaded_torch():
    """Tiny CPU models: intra-op threads only add contention (20x slower on a loaded 2-core runner)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "dice-tiny")
