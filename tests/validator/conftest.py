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


# Stand-ins for the candidates' extension functions in the emulated GPU path (DICE_EMULATED_EXTENSIONS):
# the kernels are what a CPU cannot run; everything else -- judge, zygote, runner, shared buffers, guards,
# timing -- is the product's own code.
STANDINS = """import torch


def relu_forward(x, n=None, out=None):
    if out is not None:  # as a kernel writing an output argument, returning nothing
        out.copy_(torch.clamp_min(x, 0.0))
        return None
    return torch.clamp_min(x, 0.0)


def launch_profile():
    return {"ours": 1.0, "total": 1.0, "names": ["relu_kernel"]}
"""


class EmulatedJudge:
    """What ``kernelbench._run_judged`` needs from a worker, for the GPU path emulated on the CPU: this test
    process is the judge, its runners are forked by a real zygote."""

    def __init__(self, root: Path) -> None:
        from dice.validator.context import Integrity
        from dice.validator.zygote_client import Zygote

        self.gpu, self.emulated = False, True
        self.device_name = "CPU (the GPU path emulated)"
        self.integrity = Integrity()
        self.root = root
        self.cache_dir = root / "cache"
        self._count = 0
        self.zygote = Zygote()

    def task_dir(self) -> Path:
        self._count += 1
        path = self.root / f"task{self._count}"
        path.mkdir(parents=True)
        return path

    def acquire_gpu(self) -> None:
        pass

    def phase(self, name: str) -> None:
        pass


@pytest.fixture(scope="module")
def emulated_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``DICE_VALIDATOR_EMULATE=cpu`` with the stand-ins above, for one module's pools and judges (set
    for longer, it would turn the compile-only pools of other modules into emulated ones)."""
    folder = tmp_path_factory.mktemp("emulated")
    (folder / "standins.py").write_text(STANDINS)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DICE_VALIDATOR_EMULATE", "cpu")
        env.setenv("DICE_EMULATED_EXTENSIONS", str(folder / "standins.py"))
        yield folder


@pytest.fixture(scope="module")
def judge(emulated_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedJudge]:
    j = EmulatedJudge(tmp_path_factory.mktemp("judge"))
    try:
        yield j
    finally:
        j.zygote.close()


def judged(
    judge: EmulatedJudge,
    cand_src: str,
    *,
    ref: str = RELU_REF,
    strict: bool = False,
    timing: bool = True,
    stop_below: float | None = None,
):
    """The verdict of the judged run (static guards not applied: what reaches the runner)."""
    from dice.validator import kernelbench

    verdict, _restart = kernelbench._run_judged(judge, ref, cand_src, strict, timing, stop_below)
    return verdict


def candidate(name: str) -> str:
    return (CANDIDATES / name).read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def cpu_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValidatorPool]:
    """A compile-only pool (no GPU) with its own build cache."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DICE_CACHE_DIR", str(tmp_path_factory.mktemp("dice-cache")))
        with ValidatorPool(2, gpu=False, timeout_s=30) as pool:
            yield pool


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
