"""Fills shaped like their hole, before and after: the same held-out holes filled with the decoder stopped at
the suffix only (before) and at the end of the hole's shape (after, ``engine.shape``), through the assistant's
own prompt code (``dice.assistant.prompting``: the model's hole cut, the shape of ``dice.assistant.shape``).

    python benchmarks/infill_shape.py [--model PATH] [--heldout runs/dice-tiny-data/heldout.jsonl.gz]
        [--data ../shared/data] [--items 120] [--expressions 60] [--repeats 3] [--results DIR]

Holes (problems the model never saw; the held-out file of ``scripts/build_dice_tiny.sh corpus``, rebuilt from
``--data`` (default ../shared/data) into a temporary folder when it is absent):

- the model card's held-out ``.cu`` holes (``training.evaluate.select_infill_items(heldout, 120, seed 0)``:
  one statement, 2-4 statements, a loop body, a whole kernel body, balanced), each alone on its line(s),
  put back as the editor's ``// <MASK:48>``;
- expression holes: the right-hand side of held-out single-line assignments / initialisations
  (``lhs = rhs;``, one per CUDA source, seeded), as ``lhs = /* <MASK:48> */;``;
- rest-of-line holes: the same statements with the cursor after ``lhs = `` and the rest of the line gone
  (the implicit hole at a cursor, zero width; the middle is ``rhs;``).

Greedy fill under two decodes: the assistant's default (dynamic, threshold 0.9, block 4, 4 steps per block)
and DICE's evaluation setting (static, 4 steps, the model card's); at most 48 new tokens (the masks'
budget). Each fill is timed ``--repeats`` times (the fastest counts), each on a prefix cache holding only the
template's opening (what a newly opened file sees). All fills are generated first, then compiled (NVRTC,
device code, in the validator's workers), so the compiles never share the CPU with a timed generation.
Reported per hole kind and decode, before and after: top-1 compiles (a non-blank fill, of the holes whose
original file compiles), exact match with the original (whitespace-normalised), fills that span several
lines, new tokens, denoising steps and generation time. Writes
infill_shape_<model>.json and .md to --results (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dice.assistant.fills import prompt_token_counter, shaped_fill  # noqa: E402
from dice.assistant.prompting import Hole, build_infill_request  # noqa: E402
from dice.cuda_source import extract_device_code, function_at, parse_document  # noqa: E402
from engine.model_settings import read_hole_cut  # noqa: E402

BUDGET = 48
LINE_MASK = f"// <MASK:{BUDGET}>"
INLINE_MASK = f"/* <MASK:{BUDGET}> */"
DECODES = {
    "assistant": dict(block_size=4, steps_per_block=4, policy="dynamic", threshold=0.9, temperature=0.0),
    "dice-eval": dict(block_size=4, steps_per_block=4, policy="static", temperature=0.0),
}
NOTES = [
    "How to read it: *shape* is what `dice.assistant.shape.hole_shape` gave the holes of that row; a "
    '"block" hole (the whole body of its braces) is filled the same way before and after, so its rows '
    "differ only by timing noise. *multi-line*: the fill (trimmed) holds a line break. *denoising steps*: "
    "forwards of the decoder for that fill (deterministic); *generate s*: the fastest of the timed runs, the "
    "whole `engine.infill` call (prompt prefill included); *median time after/before*: per hole, the after "
    "fill's time over the before fill's, timed back to back (block rows show the noise). Exact match is "
    "whitespace-normalised.",
    "",
    "The model card's 9/118 (`benchmarks/results/sft_dice_tiny_heldout.json`) are the first 119 holes here "
    "with the training prompt's raw prefix/suffix, 64 new tokens and static decoding; here they go through "
    "the editor's `// <MASK:48>` and the assistant's prompt code.",
]
# `lhs = rhs;` / `T name = rhs;` with a plain `=` (not ==, <=, >=, !=, op=)
_ASSIGN = re.compile(r"^(?P<lhs>[^=;{}]*[^=!<>+\-*/%&|^ ])\s*=(?!=)\s*(?P<rhs>[^;{}]+);$")


def _norm(code: str) -> str:
    return re.sub(r"\s+", " ", code).strip()


def hole_items(heldout: Path, items: int, expressions: int, seed: int = 0) -> list[dict[str, Any]]:
    """The holes: the model card's selection as line masks, then expression and rest-of-line holes."""
    from training.corpus import read_examples
    from training.evaluate import select_infill_items

    examples = read_examples(heldout)
    if not examples:
        raise SystemExit(f"{heldout}: no examples")
    out = [
        {"id": ex.id, "group": ex.group, "kind": ex.meta["kind"], "place": "line mask", **_pieces(ex.meta)}
        for ex in select_infill_items(examples, items, seed)
    ]
    seen: set[str] = set()
    statements = []
    for ex in examples:
        meta = ex.meta or {}
        source = ex.id.rsplit("-", 1)[0]
        if ex.task != "cu_infill" or meta.get("kind") != "statement" or source in seen:
            continue
        m = _ASSIGN.match(meta["middle"])
        if m and len(m.group("rhs").strip()) >= 3 and m.group("rhs").count("(") == m.group("rhs").count(")"):
            seen.add(source)
            statements.append((ex, m))
    random.Random(seed).shuffle(statements)
    for ex, m in statements[:expressions]:
        meta, lhs, rhs = ex.meta, m.group("lhs"), m.group("rhs").strip()
        head = meta["prefix"] + meta["middle"][: m.start("rhs")]
        base = {"id": ex.id, "group": ex.group, "lhs": lhs}
        out.append(
            base
            | {"kind": "expression", "place": "inline mask", "prefix": head, "middle": rhs}
            | {"suffix": meta["middle"][m.end("rhs") :] + meta["suffix"]}
        )
        out.append(
            base
            | {"kind": "rest of line", "place": "cursor", "prefix": head, "middle": rhs + ";"}
            | {"suffix": meta["suffix"]}
        )
    return out


def build_heldout(data: Path) -> Path:
    """The held-out split of dice-tiny's corpus (scripts/build_dice_tiny.sh's seed, fraction and variants),
    rebuilt from ``data`` into a temporary folder, removed at exit (a few seconds; no tokenizer)."""
    import atexit
    import shutil
    import tempfile

    from training.corpus import CorpusConfig, build_corpus

    out = Path(tempfile.mkdtemp(prefix="dice-heldout-"))
    atexit.register(shutil.rmtree, out, True)
    print(f"building the held-out split from {data} in {out}", flush=True)
    build_corpus(CorpusConfig(data, out, seed=0, heldout_fraction=0.08, cu_variants=16))
    return out / "heldout.jsonl.gz"


def _pieces(meta: dict[str, Any]) -> dict[str, str]:
    return {"prefix": meta["prefix"], "middle": meta["middle"], "suffix": meta["suffix"]}


def request_of(item: dict[str, Any], hole_cut: str) -> Any:
    """The assistant's infilling request for the hole as the editor would send it."""
    prefix, suffix = item["prefix"], item["suffix"]
    if item["place"] == "cursor":
        doc = parse_document(prefix + suffix)
        at = len(prefix.encode())
        func = function_at(doc, at)
        hole = Hole(-1, at, at, None, func and func.start_byte, func and func.end_byte)
    else:
        mask = LINE_MASK if item["place"] == "line mask" else INLINE_MASK
        doc = parse_document(prefix + mask + suffix)
        (m,) = [m for m in doc.masks if m.start_byte == len(prefix.encode())]
        hole = Hole(m.index, m.start_byte, m.end_byte, m.budget, m.function_start_byte, m.function_end_byte)
    return build_infill_request(
        doc,
        hole,
        default_max_new_tokens=BUDGET,
        budget_chars=None,
        hole_cut=hole_cut,  # type: ignore[arg-type]
    )


def fill_hole(engine: Any, req: Any, decode: dict[str, Any], shaped: bool, repeats: int) -> dict[str, Any]:
    """One greedy fill, timed ``repeats`` times (the fastest counts: the machine is shared), each time on a
    prefix cache that holds the template's opening only."""
    times = []
    for _ in range(repeats):
        engine.clear_prefix_cache()
        engine.prime_prefix_cache()
        t0 = time.perf_counter()
        out = engine.infill(
            req.prefix,
            req.suffix,
            context=req.context,
            n=1,
            max_new_tokens=req.max_new_tokens,
            shape=req.shape if shaped else None,
            **decode,
        )[0]
        times.append(time.perf_counter() - t0)
    fill = shaped_fill(req, out.text) if shaped else req.mask_fill(out.text)
    return {
        "fill": fill,
        "generate_s": round(min(times), 4),
        "tokens": len(out.token_ids),
        "steps": max(out.step_map, default=0),  # denoising forwards of the row (deterministic)
        "multiline": "\n" in fill.strip(),
        "blank": not fill.strip(),
    }


def summarise(records: list[dict[str, Any]], decode: str, when: str) -> dict[str, Any]:
    usable = [r for r in records if r["original_compiles"]]
    rows = [r[decode][when] for r in usable]
    n = max(1, len(rows))
    return {
        "holes": len(rows),
        "compiles": sum(x["compiles"] for x in rows),
        "exact": sum(x["exact"] for x in rows),
        "multiline": sum(x["multiline"] for x in rows),
        "blank": sum(x["blank"] for x in rows),
        "mean_tokens": round(sum(x["tokens"] for x in rows) / n, 1),
        "mean_steps": round(sum(x["steps"] for x in rows) / n, 1),
        "mean_generate_s": round(sum(x["generate_s"] for x in rows) / n, 3),
        "total_generate_s": round(sum(x["generate_s"] for x in rows), 1),
        # per hole, this fill's time over the "before" fill's (paired, so the machine's load cancels out)
        "median_time_ratio": round(
            statistics.median(
                x["generate_s"] / r[decode]["before"]["generate_s"] for x, r in zip(rows, usable, strict=True)
            )
            if rows
            else 1.0,
            3,
        ),
    }


def summarise_all(records: list[dict[str, Any]]) -> dict[str, Any]:
    """decode -> hole kind (and "all") -> {"shape": the shapes given, "before": ..., "after": ...}."""
    groups = {
        kind: [r for r in records if r["kind"] == kind] for kind in dict.fromkeys(r["kind"] for r in records)
    }
    groups["all"] = records
    return {
        decode: {
            kind: {
                "shape": ", ".join(sorted({r["shape"] for r in rows})) if kind != "all" else "",
                **{when: summarise(rows, decode, when) for when in ("before", "after")},
            }
            for kind, rows in groups.items()
        }
        for decode in DECODES
    }


def compile_all(records: list[dict[str, Any]]) -> None:
    """NVRTC verdicts of every original and filled file (identical texts compiled once)."""
    from dice.validator import ValidatorPool

    with ValidatorPool(workers=2, timeout_s=60.0, gpu=False) as pool:
        futures: dict[str, Any] = {}

        def submit(text: str) -> Any:
            source = extract_device_code(text).source
            if source not in futures:
                futures[source] = pool.submit_cu(source, run=False)
            return futures[source]

        pending = []
        for r in records:
            pending.append((r, None, None, submit(r["prefix"] + r["middle"] + r["suffix"])))
            for decode in DECODES:
                for when in ("before", "after"):
                    fill = r[decode][when]["fill"]
                    pending.append((r, decode, when, submit(r["prefix"] + fill + r["suffix"])))
        for r, decode, when, fut in pending:
            verdict = fut.result()
            if decode is None:
                r["original_compiles"] = verdict.compiled
            else:
                x = r[decode][when]
                # a blank fill is no candidate in the assistant (it only deletes the hole): never counted
                x["compiles"] = verdict.compiled and not x["blank"]
                x["exact"] = _norm(x["fill"]) == _norm(r["middle"])


def write_results(result: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"infill_shape_{result['model']}"
    # the files around the holes are the held-out split's (rebuilt from the ids): not repeated here
    kept = [{k: v for k, v in r.items() if k not in ("prefix", "suffix")} for r in result["records"]]
    (out / f"{stem}.json").write_text(
        json.dumps(result | {"records": kept}, indent=1, ensure_ascii=False) + "\n"
    )
    m = result["machine"]
    lines = [
        f"# Fills shaped like their hole: {result['model']}, before and after",
        "",
        f"`{result['command']}`, {result['date']}, on {m['platform']} ({m['cpus']} CPUs, torch {m['torch']}, "
        f"CPU, float32), {result['elapsed_s']:.0f} s in all; load average (1/5/15 min) "
        f"{m['load_average_1_5_15_min']['start']} at the start, {m['load_average_1_5_15_min']['end']} at the "
        "end (the machine is shared).",
        "",
        f"{result['items']} held-out holes (problems never seen in training); {result['usable']} of the "
        "original files compile (NVRTC, device code) and are counted. before: the decoder stops at the "
        "suffix only (`engine.infill(shape=None)`); after: also where the hole's shape ends "
        f"(`shape=` the assistant's `InfillRequest.shape`). Greedy, <= {BUDGET} new tokens; time per fill "
        "with only the template's opening in the prefix cache.",
        "",
        "| decode | holes | shape | top-1 compiles before → after | exact before → after | multi-line "
        "before → after | mean new tokens | mean denoising steps | mean generate s | median time "
        "after/before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for decode, kinds in result["summary"].items():
        for kind, s in kinds.items():
            b, a = s["before"], s["after"]
            lines.append(
                f"| {decode} | {kind} ({b['holes']}) | {s['shape']} | {b['compiles']} → {a['compiles']} | "
                f"{b['exact']} → {a['exact']} | {b['multiline']} → {a['multiline']} | "
                f"{b['mean_tokens']} → {a['mean_tokens']} | {b['mean_steps']} → {a['mean_steps']} | "
                f"{b['mean_generate_s']} → {a['mean_generate_s']} | {a['median_time_ratio']} |"
            )
    lines += ["", *result["notes"]]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return out / f"{stem}.md"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded dice-tiny)")
    parser.add_argument("--heldout", type=Path, default=ROOT / "runs/dice-tiny-data/heldout.jsonl.gz")
    parser.add_argument(
        "--data",
        type=Path,
        default=ROOT.parent / "shared/data",
        help="to rebuild --heldout when it is absent",
    )
    parser.add_argument("--items", type=int, default=120, help="line-mask holes (the model card's selection)")
    parser.add_argument("--expressions", type=int, default=60, help="expression (and rest-of-line) holes")
    parser.add_argument("--repeats", type=int, default=3, help="timings per fill (the fastest is kept)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()

    import os

    import torch

    from engine import load_engine

    load_before = os.getloadavg()
    heldout = args.heldout if args.heldout.is_file() else build_heldout(args.data)
    engine = load_engine(args.model, device="cpu")
    hole_cut = read_hole_cut(engine.path)
    count = prompt_token_counter(engine)
    assert count is not None
    t_start = time.perf_counter()
    records = []
    for item in hole_items(heldout, args.items, args.expressions):
        req = request_of(item, hole_cut)
        if count(req) + BUDGET > 4096:
            continue  # longer than anything the model was trained on (the model card's rule)
        rec = item | {"shape": req.shape}
        for decode, settings in DECODES.items():
            rec[decode] = {
                when: fill_hole(engine, req, settings, when == "after", args.repeats)
                for when in ("before", "after")
            }
        records.append(rec)
        print(
            f"{len(records)} {item['kind']} [{req.shape}]: {rec['assistant']['after']['fill'][:70]!r}",
            flush=True,
        )
    compile_all(records)
    result = {
        "command": " ".join(
            (
                [f"DICE_CPU_THREADS={os.environ['DICE_CPU_THREADS']}"]
                if "DICE_CPU_THREADS" in os.environ
                else []
            )
            + ["python", *sys.argv]
        ),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_average_1_5_15_min": {
                "start": [round(x, 2) for x in load_before],
                "end": [round(x, 2) for x in os.getloadavg()],
            },
        },
        "model": engine.name,
        "hole_cut": hole_cut,
        "items": len(records),
        "usable": sum(r["original_compiles"] for r in records),
        "elapsed_s": round(time.perf_counter() - t_start, 1),
        "summary": summarise_all(records),
        "notes": NOTES,
        "records": records,
    }
    print(write_results(result, args.results).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
