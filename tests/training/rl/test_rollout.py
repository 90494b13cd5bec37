"""BiC-RL tasks and rollouts (CPU, tiny model): CuKe's files read in order with clear errors, prompts equal to
the engine's own, programs reassembled exactly, and rollouts with their step maps, batched and seeded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.answers import extract_program
from engine.infill import InfillPlan
from engine.prompts import chat, infill_prompt, kernelbench_prompt
from training.cuke.records import Pair
from training.cuke.tasks import e2e_record, infill_record
from training.rl.rollout import (
    Rollout,
    RolloutSettings,
    SuffixWatch,
    _make_rollout,
    _RowWatch,
    plan_chunks,
    rollout,
    rollout_chunks,
    rollout_stats,
    rows_within_budget,
)
from training.rl.tasks import (
    MASK,
    CuPrompting,
    Task,
    TaskFileError,
    file_split,
    load_tasks,
    make_task,
    program_from,
)

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(64).cuda(), torch.randn(64).cuda()]


def get_init_inputs():
    return []
"""

PROGRAM = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_source = """
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int n = a.numel();
    add_kernel<<<(n + 255) / 256, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

add_cpp = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"
add = load_inline(name="add", cpp_sources=add_cpp, cuda_sources=add_source, functions=["add_cuda"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return add.add_cuda(a, b)
'''

CU_TEXT = """__global__ void scale(float* x, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        /* <MASK> */
    }
}
"""
CU_TARGET = "x[i] = x[i] * s;"


def pair(i: int, level: int | None = 1) -> Pair:
    return Pair(id=f"p{i}", source="test", pytorch_code=REF, cuda_code=PROGRAM, level=level)


def infill_rec(i: int, level: int = 1) -> dict:
    rec = infill_record(pair(i), level=level)
    assert rec is not None
    return rec


def cu_rec(i: int, kind: str = "statement") -> dict:
    return {
        "id": f"cu-{i}",
        "text": CU_TEXT,
        "target": CU_TARGET,
        "origin": "t:k.cu",
        "has_spec": False,
        "kind": kind,
    }


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- tasks
def test_load_tasks_keeps_file_order_and_kinds(tmp_path):
    infill = write_jsonl(tmp_path / "infill.jsonl", [infill_rec(2, level=2), infill_rec(1, level=1)])
    cu = write_jsonl(tmp_path / "cu_infill.jsonl", [cu_rec(1), cu_rec(0, "kernel_body")])
    e2e = write_jsonl(tmp_path / "e2e.jsonl", [e2e_record(pair(3), level=3), e2e_record(pair(4), level=None)])
    tasks = load_tasks([infill, cu], "infill")
    assert [t.id for t in tasks] == [
        "p2",
        "p1",
        "cu-1",
        "cu-0",
    ]  # never re-sorted: file order is the schedule
    assert [t.kind for t in tasks] == ["infill", "infill", "cu_infill", "cu_infill"]
    assert [t.level for t in tasks] == [2, 1, 1, 1]
    assert [(t.id, t.kind, t.level) for t in load_tasks(str(e2e), "e2e")] == [
        ("p3", "e2e", 3),
        ("p4", "e2e", 1),
    ]


def test_phase_and_kind_mismatch_refused(tmp_path):
    infill = write_jsonl(tmp_path / "infill.jsonl", [infill_rec(1)])
    e2e = write_jsonl(tmp_path / "e2e.jsonl", [e2e_record(pair(1), level=1)])
    with pytest.raises(TaskFileError, match=r"e2e\.jsonl: holds e2e\.jsonl tasks .*phase 'infill'"):
        load_tasks([infill, e2e], "infill")
    with pytest.raises(TaskFileError, match=r"infill\.jsonl: holds infill\.jsonl tasks .*phase 'e2e'"):
        load_tasks([infill], "e2e")
    with pytest.raises(ValueError, match="unknown phase"):
        load_tasks([infill], "sft")


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (["{not json"], r"bad\.jsonl:1: not JSON"),
        ([json.dumps([1, 2])], r"bad\.jsonl:1: a task record is a JSON object"),
        (
            ["", json.dumps({k: v for k, v in infill_rec(1).items() if k != "middle"})],
            r"bad\.jsonl:2 .*'middle'",
        ),
        (
            [json.dumps(infill_rec(1) | {"middle": "x"})],
            r":1 \(id 'p1'\): prefix \+ middle \+ suffix differs",
        ),
        ([json.dumps(infill_rec(1) | {"level": "one"})], r":1 \(id 'p1'\): field 'level' must be"),
        ([json.dumps(cu_rec(1) | {"text": CU_TEXT + MASK})], r":1 \(id 'cu-1'\): text must hold exactly one"),
        ([json.dumps(infill_rec(1)), json.dumps(cu_rec(1))], r":2 \(id 'cu-1'\): .*one kind per file"),
        ([json.dumps({"id": 1, "stuff": 2})], r":1 \(id 1\): not a task record"),
        ([json.dumps(infill_rec(1)), json.dumps(infill_rec(1))], r"task id 'p1' also in"),
        ([], r"bad\.jsonl: no tasks"),
    ],
)
def test_schema_errors_name_file_and_line(tmp_path, lines, error):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    with pytest.raises(TaskFileError, match=error):
        load_tasks([path], "infill")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(TaskFileError, match="no such task file"):
        load_tasks([tmp_path / "absent.jsonl"], "e2e")


def test_prompts_are_the_engines_own():
    rec = infill_rec(1)
    prompt, response_prefix = infill_prompt(rec["prefix"], rec["suffix"], REF)
    assert make_task(rec).prompt == prompt + response_prefix
    assert make_task(e2e_record(pair(1), level=1)).prompt == kernelbench_prompt(REF, variant="rl")
    before, after = CU_TEXT.split(MASK)
    prompt, response_prefix = infill_prompt(before, after, None)
    assert make_task(cu_rec(1)).prompt == prompt + response_prefix
    assert make_task({"id": "t", "prompt": "exact"}).prompt == "exact"


def test_program_from_round_trip():
    rec = infill_rec(1)
    task = make_task(rec)
    # What SFT teaches after the pre-filled prefix (training.corpus.render): middle, suffix, fence.
    assert program_from(task, rec["middle"] + rec["suffix"].rstrip() + "\n```") == rec["cuda_code"]
    assert program_from(task, rec["middle"] + rec["suffix"]) == rec["cuda_code"]
    # The middle is cut where the suffix starts, whatever follows.
    suffix = rec["suffix"]
    head = suffix[: suffix.index("\n", len(suffix) - len(suffix.lstrip())) + 1]  # its first line
    assert program_from(task, rec["middle"] + head + "garbage") == rec["cuda_code"]
    cu = make_task(cu_rec(1))
    assert program_from(cu, CU_TARGET + "\n    }\n}\n") == CU_TEXT.replace(MASK, CU_TARGET)
    assert program_from(cu, CU_TARGET + " x[0] = 0;") == CU_TEXT.replace(MASK, CU_TARGET)  # statement shape
    answer = "Here:\n```python\nclass ModelNew:\n    pass\n```\n"
    assert program_from(make_task(e2e_record(pair(1), level=1)), answer) == extract_program(answer)


def test_cu_tasks_are_prompted_as_the_assistant_prompts_the_model(tmp_path):
    """A line-cut model (dice.json "line") sees the hole's whole line and a window of the file, as the
    assistant's fill of the same mask would; the program is still the whole file."""
    from dice.assistant.prompting import Hole, build_infill_request
    from dice.cuda_source import parse_document

    filler = "".join(f"__device__ float pad{i}(float v) {{ return v * {i}.0f + 1.0f; }}\n" for i in range(60))
    text = filler + CU_TEXT + filler
    rec = {**cu_rec(1), "text": text}
    line = make_task(rec, cu=CuPrompting("line", 1500))
    doc = parse_document(text)
    mask = doc.masks[0]
    hole = Hole(0, mask.start_byte, mask.end_byte, None, mask.function_start_byte, mask.function_end_byte)
    req = build_infill_request(doc, hole, default_max_new_tokens=64, budget_chars=1500, hole_cut="line")
    prompt, response_prefix = infill_prompt(req.prefix, req.suffix, None)
    assert line.prompt == prompt + response_prefix  # byte for byte the assistant's prompt
    assert req.prefix.endswith("if (i < n) {\n") and req.suffix.startswith("    }\n}\n")
    assert 2 * len(req.prefix.encode()) + len(req.suffix.encode()) <= 1500 and len(text) > 3 * 1500
    # the answer holds the whole line (indentation, line break); the program is the whole file
    filled = text.replace(MASK, CU_TARGET)
    assert program_from(line, "        " + CU_TARGET + "\n    }\n") == filled
    assert program_from(line, "        " + CU_TARGET) == filled  # the line break is kept
    prefix, suffix = file_split(line)
    assert text.startswith(prefix) and text.endswith(suffix) and prefix.endswith("{\n")
    # the default (byte cut, whole file) is unchanged
    assert make_task(rec).prompt == "".join(infill_prompt(*text.split(MASK), None))
    # the trainer takes the cut from the model folder's dice.json unless told
    (tmp_path / "dice.json").write_text('{"infill_holes": "line"}')
    path = write_jsonl(tmp_path / "cu_infill.jsonl", [rec])
    loaded = load_tasks([path], "infill", cu=CuPrompting("line", 1500))
    assert loaded[0].prompt == line.prompt
    with pytest.raises(ValueError, match="hole cut"):
        CuPrompting("word")


@pytest.mark.parametrize(
    ("prefix", "suffix", "shape"),
    [
        ("a = 1\n", "\nb = 2\n", None),  # blank line first: anchored
        ("a = 1\n", "b = 2\n", None),  # the hole starts a line: anchored at line starts
        ("x = f(", ")\n", None),  # mid-line: found anywhere
        ("    ", "\n}\n", "statement"),
        ("y = ", ";\n", "expression"),
        ("", "", None),  # no suffix line: only the fence ends it
    ],
)
def test_suffix_watch_agrees_with_the_plan(prefix, suffix, shape):
    plan = InfillPlan.make(prefix, suffix, shape=shape)
    texts = [
        "c = 3\nb = 2\nrest",
        "c = 3 b = 2",
        "xb = 2\n",
        "q)\nz",
        "foo(1, 2);\n}",
        "a + b;",
        "zz\n```\n",
        "long " * 50,
        "g(a) > 0)\n",  # mid-line: the fill's own ")" is not the suffix's
        'h(")") + (1)) {',
    ]
    for text in texts:
        for size in (1, 3, 7, len(text)):
            watch = SuffixWatch(plan)
            seen = [watch.feed(text[i : i + size]) for i in range(0, len(text), size)]
            ends = [plan.reached_end(text[: i + size]) for i in range(0, len(text), size)]
            # Once the middle is complete the decoder stops: the first True must come at the same piece.
            assert (True in seen and seen.index(True)) == (True in ends and ends.index(True)), (text, size)


# ---------------------------------------------------------------------------------------------- rollouts
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from engine import load_engine
    from engine.testing import make_tiny_checkpoint

    return load_engine(make_tiny_checkpoint(tmp_path_factory.mktemp("tiny")), device="cpu")


def toy_tasks(n: int = 2) -> list[Task]:
    words = ["add two vectors", "scale a matrix by two", "a relu kernel"]
    return [make_task({"id": f"t{i}", "prompt": chat(words[i % len(words)])}) for i in range(n)]


def test_rollout_groups_shapes_and_step_maps(engine):
    tasks = toy_tasks(2)
    groups = rollout(engine, tasks, group_size=3, max_new_tokens=24, seed=1)
    assert [len(g) for g in groups] == [3, 3]
    for task, group in zip(tasks, groups, strict=True):
        assert [r.sample for r in group] == [0, 1, 2]
        for r in group:
            assert r.task_id == task.id
            assert list(r.prompt_ids) == engine.tokenizer.encode(task.prompt)
            assert 0 < len(r.response_ids) == len(r.step_map) <= 24
            assert min(r.step_map) >= 1
            blocks: dict[int, list[int]] = {}
            for i, step in enumerate(r.step_map):
                blocks.setdefault(r.block_of(i, 4), []).append(step)
            keys = sorted(blocks)
            assert keys == list(range(keys[0], keys[0] + len(keys)))  # no block skipped
            for a, b in zip(keys, keys[1:], strict=False):
                assert max(blocks[a]) < min(blocks[b])  # every step of a block before the next block's
            assert r.steps >= max(r.step_map)
            assert r.finished == (r.ended_by != "budget")
            if r.ended_by == "stop":
                assert r.response_ids[-1] in engine.tokenizer.stop_ids()
    stats = rollout_stats(groups)
    assert stats.samples == 6 and stats.tokens == sum(len(r.response_ids) for g in groups for r in g)
    assert stats.tokens_per_step == pytest.approx(stats.tokens / stats.steps) and stats.tokens_per_step >= 1.0


def test_rollout_is_seeded(engine):
    tasks = toy_tasks(2)
    first = rollout(engine, tasks, group_size=2, max_new_tokens=16, seed=7)
    assert rollout(engine, tasks, group_size=2, max_new_tokens=16, seed=7) == first
    other = rollout(engine, tasks, group_size=2, max_new_tokens=16, seed=8)
    assert [r.response_ids for g in other for r in g] != [r.response_ids for g in first for r in g]
    # the G samples of a task differ (one generator draws every row)
    assert len({r.response_ids for r in first[0]}) > 1


def test_batching_across_tasks_equals_one_task_at_a_time_when_greedy(engine):
    """The engine guarantees that a batch gives what its rows give one by one (engine.decode); the random
    draws of temperature > 0 depend on the batch, so the comparison is greedy."""
    tasks = toy_tasks(3)
    kw = dict(group_size=2, max_new_tokens=12, temperature=0.0, seed=0)
    together = rollout(engine, tasks, **kw)
    alone = [rollout(engine, [t], **kw)[0] for t in tasks]
    assert together == alone
    assert rollout(engine, tasks, batch_rows=3, **kw) == together  # chunked: one task per batch
    assert rollout(engine, tasks, batch_rows=1, **kw) == together  # a group cut into pieces


def test_sampled_rollout_reproducible_per_batch_rows(engine):
    tasks = toy_tasks(2)
    a = rollout(engine, tasks, group_size=3, max_new_tokens=8, seed=3, batch_rows=2)
    assert rollout(engine, tasks, group_size=3, max_new_tokens=8, seed=3, batch_rows=2) == a
    assert [[r.sample for r in g] for g in a] == [[0, 1, 2], [0, 1, 2]]


def test_top_k_one_samples_the_greedy_rollout_and_top_p_filters(engine):
    """``--top-k`` / ``--top-p`` reach the sampler: top-k 1 at T 1 draws the argmax, so the rollouts (tokens,
    step maps) are the greedy ones; a tiny nucleus does the same (it keeps the most likely token only)."""
    tasks = toy_tasks(2)
    kw = dict(group_size=2, max_new_tokens=12, seed=5)
    greedy = rollout(engine, tasks, temperature=0.0, **kw)
    assert rollout(engine, tasks, temperature=1.0, top_k=1, **kw) == greedy
    assert rollout(engine, tasks, temperature=1.0, top_p=1e-6, **kw) == greedy
    assert rollout(engine, tasks, temperature=1.0, **kw) != greedy  # the random tiny model: T 1 differs


def test_a_kv_budget_lowers_the_rows_per_chunk_and_release_frees_the_engine(engine):
    """One chunk's K/V cache is rows x slots x bytes per slot; a budget of three rows' worth decodes the
    groups three rows at a time (a group cut into pieces), greedy results unchanged; the engine still
    generates after ``release_buffers``."""
    tasks = toy_tasks(2)
    prompts = [engine.tokenizer.encode(t.prompt) for t in tasks]
    base = RolloutSettings(group_size=4, temperature=0.0, max_new_tokens=12)
    per_row = 256 * engine.kv_bytes_per_slot()  # the slots of these prompts round up to one 256-slot page
    cfg = engine.config
    assert (
        engine.kv_bytes_per_slot() == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    )
    assert rows_within_budget(engine, prompts, base) is None
    capped = RolloutSettings(
        group_size=4, temperature=0.0, max_new_tokens=12, kv_budget_bytes=3 * per_row + 1
    )
    assert rows_within_budget(engine, prompts, capped) == 3
    assert rows_within_budget(engine, prompts, RolloutSettings(batch_rows=2, kv_budget_bytes=10**12)) == 2
    assert rows_within_budget(engine, prompts, RolloutSettings(kv_budget_bytes=1)) == 1
    chunks = list(rollout_chunks(engine, tasks, capped))
    assert [sum(len(rows) for _t, _f, rows in c) for c in chunks] == [3, 1, 3, 1]
    whole = rollout(engine, tasks, group_size=4, temperature=0.0, max_new_tokens=12)
    got = [[None] * 4 for _ in tasks]
    for c in chunks:
        for t, first, rows in c:
            got[t][first : first + len(rows)] = rows
    assert got == whole
    engine.release_buffers()
    assert rollout(engine, tasks, group_size=4, temperature=0.0, max_new_tokens=12) == whole


def test_plan_chunks():
    assert plan_chunks(3, 2, None) == [[(0, 0, 2), (1, 0, 2), (2, 0, 2)]]
    assert plan_chunks(3, 2, 5) == [[(0, 0, 2), (1, 0, 2)], [(2, 0, 2)]]
    assert plan_chunks(2, 5, 2) == [
        [(0, 0, 2)],
        [(0, 2, 2)],
        [(0, 4, 1)],
        [(1, 0, 2)],
        [(1, 2, 2)],
        [(1, 4, 1)],
    ]
    with pytest.raises(ValueError):
        plan_chunks(1, 0, None)


def test_stop_token_is_kept_with_its_step():
    stop = frozenset({9})
    task = make_task({"id": "t", "prompt": "p"})
    decode = lambda ids: "".join(chr(97 + i) for i in ids)  # noqa: E731
    r = _make_rollout(task, 1, [5], [0, 1, 9, 2], [1, 3, 2, 4], True, stop, decode)
    assert (r.response_ids, r.step_map, r.text, r.ended_by, r.finished, r.steps) == (
        (0, 1, 9),
        (1, 3, 2),
        "ab",
        "stop",
        True,
        4,
    )
    r = _make_rollout(task, 0, [5], [0, 1], [1, 2], False, stop, decode)
    assert (r.ended_by, r.finished, r.text) == ("budget", False, "ab")
    watch = _RowWatch(stop, None, decode)
    assert not watch([0, 1, 2, 3]) and watch([0, 1, 2, 3, 4, 9, 5])


def test_rollout_is_a_plain_record():
    r = Rollout("t", 0, (1,), (2, 3), (1, 2), "x", True, "stop", 2)
    assert r.block_of(0, 4) == 0 and r.block_of(3, 4) == 1


def test_infill_rollout_stops_where_the_middle_ends(engine):
    from training.rl.tasks import infill_plan

    task = make_task(cu_rec(1))
    (group,) = rollout(engine, [task], group_size=2, max_new_tokens=16, seed=0)
    plan = infill_plan(task)
    for r in group:
        assert len(r.response_ids) == len(r.step_map) <= 16
        # ended by the watch only when the plan agrees the middle is complete
        assert (r.ended_by == "until") <= plan.reached_end(r.text)
        assert program_from(task, r.text).startswith(CU_TEXT.split(MASK)[0])


def test_identifier_scope_keeps_cu_rollouts_to_the_prompts_words(engine, tmp_path):
    """``.cu`` infill tasks decode under the prompt's identifier scope (engine.scope), as the assistant fills
    them; a toy (or KernelBench-format) task in the same batch is not restricted."""
    cu = load_tasks([write_jsonl(tmp_path / "cu_infill.jsonl", [cu_rec(0)])], "infill")
    tasks = cu + toy_tasks(1)
    settings = dict(group_size=6, max_new_tokens=16, seed=2, temperature=1.0, stop_at_suffix=False)
    scoped = RolloutSettings(**settings, identifier_scope=True)
    groups: list = [None, None]
    for pieces in rollout_chunks(engine, tasks, scoped):
        for t, _first, rows in pieces:
            groups[t] = rows
    mask = engine.scope_mask(cu[0].prompt)
    assert all(bool(mask[i]) for r in groups[0] for i in r.response_ids)
    free = rollout(engine, tasks, **settings)
    # the unrestricted samples of the same tasks leave the cu task's scope (else nothing was tested) ...
    assert any(i >= len(mask) or not mask[i] for r in free[0] for i in r.response_ids)
    # ... and the toy task's rows may use every token
    from training.rl.rollout import _scope_masks

    cu_mask, toy_mask = _scope_masks(engine, tasks)
    assert torch.equal(cu_mask, mask) and bool(toy_mask.all()) and not bool(cu_mask.all())
