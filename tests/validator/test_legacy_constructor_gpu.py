"""GPU (device machine): the six DeepSeek-R1 kernels of KernelBench PR-67 that build their parameters with
the legacy constructor ``nn.Parameter(torch.Tensor(...))`` and then initialise them. KernelBench's harness
judged each correct (5/5 trials); each is validated against the v0 reference in its own prompt. Before the
construction rule of :mod:`dice.validator.kbsetup` all six were ``incorrect`` (the candidate's weights came
from the CPU generator, the reference's from the CUDA one).

Needs the PR-67 data (``$DICE_SHARED_DATA`` or ``../shared/data``) and pyarrow; skips without them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dice.validator import ValidatorPool, gpu_available

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
LEGACY = [(1, 60), (1, 65), (1, 77), (1, 79), (1, 86), (2, 18)]


def _agreement_module():
    spec = importlib.util.spec_from_file_location(
        "validator_agreement", ROOT / "benchmarks" / "validator_agreement.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _first_answers() -> dict[tuple[int, int], dict]:
    pytest.importorskip("pyarrow")
    agreement = _agreement_module()
    folder = agreement.default_data() / "kernelbench-pr67-dsr1"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent")
    tasks, _ = agreement.load_pr67(folder)
    first: dict[tuple[int, int], dict] = {}
    for task in sorted(tasks, key=lambda t: t["meta"]["rank"]):
        key = (task["level"], task["problem"])
        if key in LEGACY and key not in first and "load_inline" in task["cand_src"]:
            first[key] = task
    return first


@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU (run on the device machine)")
def test_legacy_constructor_kernels_are_correct() -> None:
    first = _first_answers()
    assert sorted(first) == LEGACY
    for task in first.values():
        assert "torch.Tensor(" in task["cand_src"]  # the legacy constructor, as the issue found
    with ValidatorPool(workers=6, timeout_s=120.0) as pool:
        futures = {
            key: pool.submit_kernelbench(t["ref_src"], t["cand_src"], timing=False)
            for key, t in first.items()
        }
        verdicts = {key: f.result() for key, f in futures.items()}
    wrong = {
        f"L{k[0]}-{k[1]}": f"{v.status}: {v.message}" for k, v in verdicts.items() if v.status != "correct"
    }
    assert not wrong, wrong
    for verdict in verdicts.values():
        assert "construction: Model and ModelNew built on the CPU" in verdict.log
