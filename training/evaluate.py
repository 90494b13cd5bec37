"""Held-out quality of a checkpoint on ``.cu`` infilling: does its top candidate compile, is it the original?

For held-out ``cu_infill`` examples (problems never seen in training), the engine fills the hole
(``Engine.infill``: the same prompt as the editor, greedy, static 4 steps per 4-token block, DICE's evaluation
setting); the filled file's device code is compiled with NVRTC in the validator's worker processes (model
output never runs or compiles in this process). Items whose *original* file does not compile are left out of
the compile rate, so a failure is the model's. There is no ``dice-spec`` (no inputs, no reference run) for
these files, so "correct" can only be judged by text: exact match with the original middle (whitespace
normalised) is reported as a strict lower bound of correctness. NVRTC sees the device code only: a hole
the compiler does not type-check (host code, a template nothing instantiates) is found by compiling a probe
no C++ context accepts in its place; such items are counted (``not_checked``) and left out of the rates.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

from training.corpus import INFILL_KINDS, Example, read_examples

PROBE = "@dice_probe@"  # a stray '@' is an error in any statement or expression NVRTC parses


def _normalise(code: str) -> str:
    return re.sub(r"\s+", " ", code).strip()


def _kinds(present) -> list[str]:
    """The hole kinds of ``present`` in a fixed order: the KernelBench cuts first, then any other (the
    real-code corpus adds ``expression``), sorted."""
    return [k for k in INFILL_KINDS if k in present] + sorted(k for k in present if k not in INFILL_KINDS)


def select_infill_items(examples: list[Example], limit: int, seed: int) -> list[Example]:
    """Up to ``limit`` held-out .cu infill items, balanced over kinds, one per CUDA source and kind."""
    by_kind: dict[str, list[Example]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for ex in examples:
        if ex.task != "cu_infill" or not ex.meta:
            continue
        source = ex.id.rsplit("-", 1)[0]
        key = (source, ex.meta["kind"])
        if key in seen:
            continue
        seen.add(key)
        by_kind[ex.meta["kind"]].append(ex)
    rng = random.Random(seed)
    for items in by_kind.values():
        rng.shuffle(items)
    out: list[Example] = []
    kinds = _kinds(by_kind)
    while len(out) < limit and any(by_kind.values()):
        for kind in kinds:
            if by_kind.get(kind) and len(out) < limit:
                out.append(by_kind[kind].pop())
    return out


def evaluate_heldout(
    model_dir: Path,
    heldout: Path,
    *,
    seq_len: int = 4096,
    max_infill: int = 200,
    max_new_tokens: int = 64,
    seed: int = 0,
) -> dict:
    """Generate and compile held-out .cu infills; returns per-item records and a summary by kind.

    An item whose prompt (the one the engine builds for the hole) plus ``max_new_tokens`` exceeds ``seq_len``
    (longer than anything the model was trained on) or the model's context is skipped and counted in the
    summary's ``skipped_too_long``."""
    from dice.validator import ValidatorPool
    from engine import load_engine
    from engine.infill import InfillPlan

    engine = load_engine(model_dir, device="cpu")
    limit = min(seq_len, engine.config.max_position_embeddings)
    items = select_infill_items(read_examples(heldout), max_infill, seed)
    records = []
    skipped = 0
    started = time.perf_counter()
    with ValidatorPool(workers=2, timeout_s=60.0, gpu=False) as pool:
        for ex in items:
            plan = InfillPlan.make(ex.meta["prefix"], ex.meta["suffix"])
            prompt_tokens = len(engine.tokenizer.encode(plan.prompt_text))
            if prompt_tokens + max_new_tokens > limit:
                skipped += 1
                continue
            records.append(_infill_record(engine, pool, ex, prompt_tokens, max_new_tokens))
    summary: dict = {
        "items": len(records),
        "skipped_too_long": skipped,
        "context_limit": limit,
        "seconds": round(time.perf_counter() - started, 1),
        "by_kind": {},
    }
    summary.update(_stats(records))
    for kind in _kinds({r["kind"] for r in records}):
        rows = [r for r in records if r["kind"] == kind]
        if rows:
            summary["by_kind"][kind] = _stats(rows)
    summary["groups"] = len({r["group"] for r in records})
    return {"summary": summary, "records": records}


def _infill_record(engine, pool, ex: Example, prompt_tokens: int, max_new_tokens: int) -> dict:
    """Fill one item's hole (greedy, static 4 steps per block) and compile the original, the filled and the
    emptied file's device code."""
    from dice.cuda_source import extract_device_code

    meta = ex.meta
    t0 = time.perf_counter()
    best = engine.infill(
        meta["prefix"],
        meta["suffix"],
        n=1,
        max_new_tokens=max_new_tokens,
        policy="static",
        steps_per_block=4,
        temperature=0.0,
    )[0]
    gen_s = time.perf_counter() - t0
    reference = extract_device_code(meta["prefix"] + meta["middle"] + meta["suffix"]).source
    candidate = extract_device_code(meta["prefix"] + best.text + meta["suffix"]).source
    # Baseline: the file with the hole left empty (deleting a statement often still compiles).
    empty = extract_device_code(meta["prefix"] + meta["suffix"]).source
    # Checkability: NVRTC sees the device code only, so a hole in host code (or in code nothing
    # instantiates) is never type-checked and any fill there "compiles". A probe no C++ context accepts
    # must fail in the hole for a fill's verdict to mean anything (the product's rule: compiled only when
    # the filled code was type-checked).
    probe = extract_device_code(meta["prefix"] + PROBE + meta["suffix"]).source
    futures = [pool.submit_cu(src, run=False) for src in (reference, candidate, empty, probe)]
    ref_v, cand_v, empty_v, probe_v = (f.result() for f in futures)
    return {
        "id": ex.id,
        "group": ex.group,
        "kind": meta["kind"],
        "prompt_tokens": prompt_tokens,
        "middle": meta["middle"],
        "candidate": best.text,
        "finished": best.finished,
        "confidence": best.confidence,
        "exact": _normalise(best.text) == _normalise(meta["middle"]),
        "reference_compiles": ref_v.compiled,
        "candidate_compiles": cand_v.compiled,
        "candidate_status": cand_v.status,
        "empty_compiles": empty_v.compiled,
        "hole_checked": not probe_v.compiled,
        "generate_s": round(gen_s, 3),
    }


def _stats(rows: list[dict]) -> dict:
    """Compile and exact-match rates of some records, over those whose original file compiles and whose hole
    the compiler type-checks (``not_checked``: originals that compile around a hole nothing checks)."""
    usable = [r for r in rows if r["reference_compiles"] and r.get("hole_checked", True)]
    not_checked = sum(1 for r in rows if r["reference_compiles"] and not r.get("hole_checked", True))
    compiled = sum(r["candidate_compiles"] for r in usable)
    exact = sum(r["exact"] for r in usable)
    empty = sum(r["empty_compiles"] for r in usable)
    return {
        "items": len(rows),
        "reference_compiles": len(usable) + not_checked,
        "not_checked": not_checked,
        "checked": len(usable),
        "top1_compiles": compiled,
        "top1_compile_rate": round(compiled / len(usable), 4) if usable else None,
        "empty_fill_compile_rate": round(empty / len(usable), 4) if usable else None,
        "top1_exact_match": exact,
        "top1_exact_rate": round(exact / len(usable), 4) if usable else None,
        "finished": sum(r["finished"] for r in rows),
        "statuses": dict(Counter(r["candidate_status"] for r in usable)),
    }
