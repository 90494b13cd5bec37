"""BiC-RL rewards: verdicts to rewards through a stub pool (the pool's interface, as CuKe's tests stub
it), one real ``.cu`` compile through a CPU ValidatorPool, and the toy reward."""

from __future__ import annotations

import concurrent.futures
import re

import pytest

from dice.validator.verdict import FLAG_NOT_RUN, Verdict
from training.rl.rewards import (
    MATCH_FLOOR,
    Scored,
    ToyReward,
    ValidatorReward,
    blank_fill,
    similarity,
    speedup_reward,
)
from training.rl.rollout import Rollout
from training.rl.tasks import MASK, make_task

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(64), torch.randn(64)]


def get_init_inputs():
    return []
"""
SPEC = "/* dice-spec\nimport torch\ndef inputs():\n    return []\n*/\n"
CU = (
    "__global__ void k(float* x, int n) {\n    int i = threadIdx.x;\n    if (i < n) {\n        "
    + MASK
    + "\n    }\n}\n"
)


def stub_verdict(text: str) -> Verdict:
    """The verdict a program asks for with a ``STUB <status> [arg]`` marker (default: compile_error)."""
    m = re.search(r"STUB (\w+)(?: (\S+))?", text)
    status, arg = (m.group(1), m.group(2)) if m else ("compile_error", None)
    if status == "correct":
        return Verdict("correct", True, True, speedup=float(arg or 1.0), ref_ms=1.0, new_ms=1.0)
    if status == "rejected":
        return Verdict("rejected", True, False, message=f"rejected by guard {arg}: stub")
    if status == "compiled":
        return Verdict("compiled", True, None, message="compiled: stub", flags=[FLAG_NOT_RUN])
    return Verdict(status, status != "compile_error", False, message="stub")


class StubPool:
    """``submit_kernelbench`` / ``submit_cu`` answering from the program's ``STUB`` marker."""

    workers = 2

    def __init__(self, gpu: bool = True, hang: bool = False) -> None:
        self.gpu, self.hang = gpu, hang
        self.kb_calls: list[tuple[str, str, bool, bool]] = []
        self.cu_calls: list[tuple[str, object]] = []
        self.cleared = 0

    def _done(self, verdict: Verdict) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self.hang:
            future.set_result(verdict)
        return future

    def submit_kernelbench(self, ref_src, cand_src, *, strict=False, timing=True, not_run=None):
        self.kb_calls.append((ref_src, cand_src, strict, timing))
        return self._done(stub_verdict(cand_src))

    def submit_cu(self, text, *, run=True, spec_origin=None, **kw):
        self.cu_calls.append((text, spec_origin))
        return self._done(stub_verdict(text))

    def clear_cache(self) -> None:
        self.cleared += 1


def roll(task, texts: list[str]) -> list[Rollout]:
    return [Rollout(task.id, j, (1,), (2,), (1,), text, True, "stop", 1) for j, text in enumerate(texts)]


def answer(marker: str) -> str:
    return f"```python\nclass ModelNew:\n    pass  # STUB {marker}\n```"


E2E = make_task({"id": "e", "pytorch_code": REF, "level": 1})


def test_kernelbench_rewards_guards_and_duplicates():
    pool = StubPool()
    reward = ValidatorReward(pool)
    texts = [
        answer("correct 3.0"),
        answer("incorrect"),
        answer("rejected timing_hack"),
        answer("correct 3.0"),
    ]
    (scores,) = reward([E2E], [roll(E2E, texts)])
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 1.0]
    assert [s.status for s in scores] == ["correct", "incorrect", "rejected", "correct"]
    assert scores[2].guard == "timing_hack" and scores[0].guard is None
    assert [s.passed for s in scores] == [True, False, False, True]
    assert len(pool.kb_calls) == 3  # the repeated program is validated once in a batch ...
    assert all(
        ref == REF and not timing for ref, _c, _s, timing in pool.kb_calls
    )  # no timing without the term
    assert pool.cleared == 1  # ... and the pool's cache is cleared so a later step checks it again
    reward([E2E], [roll(E2E, texts[:1])])
    assert pool.cleared == 2 and len(pool.kb_calls) == 4
    kept = StubPool()
    ValidatorReward(kept, reuse_verdicts=True)([E2E], [roll(E2E, texts[:1])])
    assert kept.cleared == 0


def test_speedup_term_for_e2e_only():
    assert speedup_reward(2.0) == pytest.approx(1.3)
    assert speedup_reward(64.0) == pytest.approx(2.3)  # capped at log2 = 2
    assert speedup_reward(0.5) == pytest.approx(0.05)  # floored: correct never pays below wrong
    assert speedup_reward(None) == pytest.approx(0.3)
    assert speedup_reward(float("inf")) == pytest.approx(2.3)
    pool = StubPool()
    reward = ValidatorReward(pool, speedup_term=True)
    rec = {
        "id": "i",
        "pytorch_code": REF,
        "cuda_code": "A\nB\n",
        "prefix": "A\n",
        "middle": "B\n",
        "suffix": "",
    }
    infill = make_task(rec)
    e2e_scores, infill_scores = reward(
        [E2E, infill],
        [roll(E2E, [answer("correct 2.0"), answer("incorrect")]), roll(infill, ["STUB correct 4.0"])],
    )
    assert [s.reward for s in e2e_scores] == [pytest.approx(1.3), 0.0]
    assert e2e_scores[0].speedup == 2.0
    assert [s.reward for s in infill_scores] == [1.0]
    timings = {cand: timing for _r, cand, _s, timing in pool.kb_calls}
    assert timings[answer("correct 2.0").split("\n", 1)[1].rsplit("```", 1)[0]] is True
    assert timings["A\nSTUB correct 4.0"] is False  # the infill program: prefix + middle (+ empty suffix)


def test_compile_only_kernelbench_verdicts_pay_only_when_asked():
    texts = [answer("compiled")]
    assert ValidatorReward(StubPool(gpu=False))([E2E], [roll(E2E, texts)])[0][0].reward == 0.0
    smoke = ValidatorReward(StubPool(gpu=False), accept_compiled=True)
    assert smoke([E2E], [roll(E2E, texts)])[0][0] == Scored(
        1.0, "compiled", None, None, "compiled: stub", True
    )


def cu_task(text: str, i: int = 0):
    return make_task({"id": f"cu{i}", "text": text, "target": "x[i] = 0;", "kind": "statement"})


def test_cu_rewards_compile_spec_and_blank():
    plain, spec = cu_task(CU, 0), cu_task(SPEC + CU, 1)
    fills = [
        "x[i] = 0; // STUB compiled",
        "x[i] = 1; // STUB correct",
        "x[i] = ; // STUB compile_error",
        "  // hi ",
    ]
    for gpu, spec_pays in ((True, [0.0, 1.0, 0.0, 0.0]), (False, [1.0, 1.0, 0.0, 0.0])):
        pool = StubPool(gpu=gpu)
        got = ValidatorReward(pool)([plain, spec], [roll(plain, fills), roll(spec, fills)])
        assert [s.reward for s in got[0]] == [1.0, 1.0, 0.0, 0.0]  # no spec: compiling is enough
        assert [s.reward for s in got[1]] == spec_pays  # a spec and a GPU: it must also run correct
        assert got[0][3].status == "blank" and len(pool.cu_calls) == 6  # the blank fill is never compiled
        texts = {text for text, _origin in pool.cu_calls}
        assert (SPEC + CU).replace(MASK, "x[i] = 0; // STUB compiled") in texts
        origins = {origin.source for _text, origin in pool.cu_calls}
        # the user's spec, fingerprinted from the masked file
        assert origins == {None, "import torch\ndef inputs():\n    return []\n"}


def test_deadline_gives_timeout_zero():
    for task, texts in ((cu_task(CU), ["x[i] = 0;"]), (E2E, [answer("correct")])):
        got = ValidatorReward(StubPool(hang=True), deadline_s=0.05)([task], [roll(task, texts)])
        assert got[0][0].status == "timeout" and got[0][0].reward == 0.0


def test_submit_is_a_future_of_the_same_scores():
    pool = StubPool()
    texts = [answer("correct"), answer("incorrect")]
    with ValidatorReward(pool) as reward:
        future = reward.submit([E2E], [roll(E2E, texts)])
        assert future.result(timeout=10) == reward([E2E], [roll(E2E, texts)])
        assert reward.last_stats["validated"] == 2
    with pytest.raises(ValueError, match="rollout groups"):
        ValidatorReward(pool)([E2E], [])


def test_toy_reward():
    task = make_task({"id": "t", "prompt": "p"})
    rollouts = [
        Rollout("t", 0, (1,), (5, 6), (1, 2), "has kernel", True),
        Rollout("t", 1, (1,), (7,), (1,), "no", False),
    ]
    assert [s.reward for s in ToyReward("kernel")([task], [rollouts])[0]] == [1.0, 0.0]
    assert [s.reward for s in ToyReward(7)([task], [rollouts])[0]] == [0.0, 1.0]
    assert ToyReward(7).submit([task], [rollouts]).result()[0][1].passed


def test_blank_fill():
    assert blank_fill("  /* x */ // y\n ") and not blank_fill("x = 1; // y")


def test_a_fill_that_only_compiles_earns_by_its_likeness_to_the_original():
    """A compile check alone is foolable (``;`` compiles in any statement hole): a compiled fill earns
    MATCH_FLOOR plus its token similarity to the original, the original itself 1; a correct run earns 1."""
    task = cu_task(CU)
    fills = [
        "x[i]   =  0 ;  // STUB compiled (the original, re-laid out and commented)",
        "; // STUB compiled",
        "return; // STUB compiled",
        "x[i] = 1; // STUB compiled",
        "x[i] = 1; // STUB correct",
        "x[i] = ; // STUB compile_error",
    ]
    got = ValidatorReward(StubPool(gpu=False))([task], [roll(task, fills)])[0]
    assert got[0].reward == 1.0 and got[0].exact and got[0].status == "compiled"
    noop, ret, near = got[1].reward, got[2].reward, got[3].reward
    assert MATCH_FLOOR <= noop <= 0.4 and MATCH_FLOOR <= ret <= 0.4  # compiles, resembles nothing
    assert 0.8 < near < 1.0 and not got[3].exact  # one token off
    assert got[4].reward == 1.0 and got[4].status == "correct"  # run against a spec: cannot be a no-op
    assert got[5].reward == 0.0 and all(s.passed for s in got[:5])
    binary = ValidatorReward(StubPool(gpu=False), cu_reward="compile")([task], [roll(task, fills)])[0]
    assert [s.reward for s in binary] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]  # DICE's: any compiled fill pays 1
    with pytest.raises(ValueError, match="cu_reward"):
        ValidatorReward(StubPool(), cu_reward="bleu")
    assert similarity("a->b[i] += 1; /* c */", "a -> b [ i ] += 1 ;") == 1.0
    assert similarity("", "x = 1;") == 0.0


def test_real_cu_compile_reward_on_a_cpu_pool():
    from dice.validator import ValidatorPool

    task = cu_task(CU)
    with ValidatorPool(workers=1, gpu=False) as pool, ValidatorReward(pool, deadline_s=120) as reward:
        fills = [
            "x[i] = 2.0f * x[i];",
            "x[i] = undefined_name;",
            "/* dice-spec\ndef inputs(): return []\n*/ x[i] = 0;",
        ]
        scores = reward([task], [roll(task, fills)])[0]
    # compiled, but not what the hole held (x[i] = 0;): the floor plus its token similarity
    expected = MATCH_FLOOR + (1 - MATCH_FLOOR) * similarity(fills[0], "x[i] = 0;")
    assert [(s.reward, s.status) for s in scores] == [
        (pytest.approx(expected), "compiled"),
        (0.0, "compile_error"),
        (0.0, "rejected"),
    ]
    assert 0.5 < expected < 1.0 and scores[0].passed and not scores[0].exact
    assert "undefined" in scores[1].message
    assert (
        scores[2].guard == "fill_changes_spec"
    )  # a fill may not bring its own spec (to be paid for compiling)


class RecordingPool(StubPool):
    """A stub pool that also keeps the folder and build options each ``submit_cu`` got."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.cu_kwargs: list[dict] = []

    def submit_cu(self, text, *, run=True, spec_origin=None, **kw):
        self.cu_kwargs.append(kw)
        return super().submit_cu(text, run=run, spec_origin=spec_origin)


def header_task(tmp_path, i: int = 0, text: str = CU):
    for sub in ("cu_projects/o+r/src", "cu_projects/o+r/include"):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    record = {"id": f"h{i}", "text": text, "target": "x[i] = 0;", "kind": "statement"}
    record |= {"folder": "cu_projects/o+r/src", "include_paths": ["cu_projects/o+r/include"]}
    return make_task(record, base_dir=tmp_path)


def test_a_header_task_is_compiled_in_its_folder_with_its_include_paths(tmp_path):
    import json
    import os
    from pathlib import Path

    pool = RecordingPool(gpu=False)
    task, plain = header_task(tmp_path), cu_task(CU, 1)
    reward = ValidatorReward(pool)
    got = reward(
        [task, plain],
        [roll(task, ["x[i] = 0; // STUB compiled"]), roll(plain, ["x[i] = 0; // STUB compiled"])],
    )
    assert [g[0].reward for g in got] == [1.0, 1.0]
    with_headers, alone = pool.cu_kwargs
    assert alone == {}  # a file that compiled alone is compiled alone, as before
    assert with_headers["folder"] == str(tmp_path / "cu_projects/o+r/src")
    build = with_headers["build"]
    assert build.include_paths == (str(tmp_path / "cu_projects/o+r/include"),)
    # an empty database named explicitly: no compile_commands.json above the folder lends its flags
    assert os.path.basename(build.compile_commands) == "compile_commands.json"
    assert json.loads(Path(build.compile_commands).read_text()) == []
    reward.close()
    assert not os.path.exists(build.compile_commands)


def test_real_header_task_reward_on_a_cpu_pool(tmp_path):
    from dice.validator import ValidatorPool

    pytest.importorskip("cupy", reason="NVRTC comes through CuPy, which is not installed")
    text = '#include "defs.cuh"\n#include "lib/zero.cuh"\n' + CU
    task = header_task(tmp_path, text=text)
    (tmp_path / "cu_projects/o+r/src/defs.cuh").write_text(
        "#pragma once\n#define ZERO_AT(p, i) ((p)[i] = 0)\n"
    )
    (tmp_path / "cu_projects/o+r/include/lib").mkdir()
    (tmp_path / "cu_projects/o+r/include/lib/zero.cuh").write_text(
        "#pragma once\n__device__ inline float zero_of(float) { return 0.0f; }\n"
    )
    fills = ["ZERO_AT(x, i);", "x[i] = zero_of(x[i]);", "x[i] = not_declared(x[i]);"]
    alone = make_task({"id": "alone", "text": text, "target": "x[i] = 0;", "kind": "statement"})
    with ValidatorPool(workers=1, gpu=False) as pool, ValidatorReward(pool, deadline_s=120) as reward:
        scores = reward([task, alone], [roll(task, fills), roll(alone, fills[:1])])
    assert [s.status for s in scores[0]] == ["compiled", "compiled", "compile_error"]
    assert scores[0][0].reward > MATCH_FLOOR and scores[0][2].reward == 0.0
    assert scores[1][0].status == "compile_error"  # the same file without its headers does not compile
