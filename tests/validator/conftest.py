"""Fixtures for the validator tests: the hand-written candidates, a small KernelBench reference, pools."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dice.validator import ValidatorPool

CANDIDATES = Path(__file__).parent / "candidates"

# A KernelBench-format reference of the ReLU problem, small enough for any test (problem 19's real sizes
# are 4096 x 393216); the tests that need the real problems read ../shared/data.
RELU_REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 16
dim = 1024


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
"""


def candidate(name: str) -> str:
    return (CANDIDATES / name).read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def cpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValidatorPool]:
    """A compile-only pool (no GPU) with its own build cache."""
    import os

    old = os.environ.get("DICE_CACHE_DIR")
    os.environ["DICE_CACHE_DIR"] = str(tmp_path_factory.mktemp("dice-cache"))
    try:
        with ValidatorPool(2, gpu=False, timeout_s=30) as pool:
            yield pool
    finally:
        if old is None:
            os.environ.pop("DICE_CACHE_DIR", None)
        else:
            os.environ["DICE_CACHE_DIR"] = old


def copy_realproj(source: Path, dest: Path) -> Path:
    """A copy of ``shared/data/realproj`` at ``dest`` with its ``compile_commands.json`` written from the
    template (``{ROOT}`` = the copy, ``{PIP_CUDA_INCLUDE}`` = the pip CUDA headers; ``directory`` and
    ``file`` made absolute), as SOURCE.md describes."""
    import json
    import shutil

    from dice.validator.paths import pip_cuda_include_dir

    shutil.copytree(source, dest)
    pip = pip_cuda_include_dir() or "/usr/local/cuda/include"
    entries = []
    for entry in json.loads((dest / "compile_commands.template.json").read_text()):
        args = [a.replace("{ROOT}", str(dest)).replace("{PIP_CUDA_INCLUDE}", pip) for a in entry["arguments"]]
        entries.append(
            {
                "directory": str(dest / entry["directory"]),
                "file": str(dest / entry["file"]),
                "arguments": args,
            }
        )
    (dest / "compile_commands.json").write_text(json.dumps(entries, indent=1))
    return dest


@pytest.fixture(scope="session")
def realproj(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = shared_data / "realproj"
    if not (source / "compile_commands.template.json").is_file():
        pytest.skip("../shared/data/realproj is absent")
    return copy_realproj(source, tmp_path_factory.mktemp("realproj") / "realproj")
