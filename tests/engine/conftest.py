"""Fixtures for the engine tests: one tiny random checkpoint per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.testing import make_tiny_checkpoint


@pytest.fixture(autouse=True)
def _one_intra_op_thread(single_threaded_torch):  # tests/conftest.py
    yield


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "dice-tiny")
