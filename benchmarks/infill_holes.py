"""Where to cut a mask's hole for a model, and whether the dice-spec context helps it: held-out ``.cu`` holes
put back as mask comments and filled through the assistant's own prompt code.

    python benchmarks/infill_holes.py [--model PATH] [--items 60] [--data ../shared/data] [--results DIR]

Each held-out ``cu_infill`` hole of ``runs/dice-tiny-data/heldout.jsonl.gz`` (problems the model never saw)
whose code sits alone on its lines becomes ``/* <MASK> */`` in its file, the editor's case. Four prompts per
hole: the hole cut at the comment's bytes or widened to whole lines (``hole_cut`` "byte" / "line",
``dice.assistant.prompting``), each without context or with the problem's PyTorch reference as the dice-spec
context (what a ``.cu`` file with a dice-spec sends). Greedy fill with the assistant's default decode
(dynamic, threshold 0.9, block 4, 4 steps per block), at most 64 new tokens; the filled file's device code is
compiled with NVRTC in the validator's workers. Reported per setting: top-1 compiles (a non-blank fill, of
the holes whose original file compiles), exact match with the original (whitespace-normalised), blank
fills. Writes infill_holes_<model>.json and .md to --results (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dice.assistant.prompting import Hole, build_infill_request  # noqa: E402
from dice.cuda_source import extract_device_code, parse_document  # noqa: E402

MASK = "/* <MASK> */"
SETTINGS = [("byte", False), ("byte", True), ("line", False), ("line", True)]
DECODE = dict(block_size=4, steps_per_block=4, policy="dynamic", threshold=0.9, temperature=0.0)


def _norm(code: str) -> str:
    return re.sub(r"\s+", " ", code).strip()


def _alone_on_lines(prefix: str, suffix: str) -> bool:
    head = prefix[prefix.rfind("\n") + 1 :]
    tail = suffix.split("\n", 1)[0]
    return not head.strip() and not tail.strip()


def select_items(heldout: Path, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` holes alone on their lines, balanced over the four kinds, one per source and kind."""
    from training.corpus import INFILL_KINDS

    by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in INFILL_KINDS}
    seen: set[tuple[str, str]] = set()
    with gzip.open(heldout, "rt", encoding="utf-8") as fh:
        for line in fh:
            ex = json.loads(line)
            meta = ex.get("meta") or {}
            if ex["task"] != "cu_infill" or not _alone_on_lines(meta["prefix"], meta["suffix"]):
                continue
            key = (ex["id"].rsplit("-", 1)[0], meta["kind"])
            if key in seen:
                continue
            seen.add(key)
            by_kind[meta["kind"]].append({"group": ex["group"], **meta})
    out: list[dict[str, Any]] = []
    while len(out) < limit and any(by_kind.values()):
        for kind in INFILL_KINDS:
            if by_kind[kind] and len(out) < limit:
                out.append(by_kind[kind].pop(0))
    return out


def spec_of(ref_src: str) -> str:
    return f"/* dice-spec\n{ref_src.rstrip()}\n*/\n"


def main() -> int:
    """Long on purpose: the whole measurement protocol, read top to bottom in the order it runs (a
    benchmark script, as nanochat's are); split into helpers, the protocol would be scattered."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded dice-tiny)")
    parser.add_argument("--heldout", type=Path, default=ROOT / "runs/dice-tiny-data/heldout.jsonl.gz")
    parser.add_argument(
        "--data",
        type=Path,
        default=ROOT.parent / "shared/data",
        help="the PyTorch references (for the context settings)",
    )
    parser.add_argument("--items", type=int, default=60)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()

    from dice.validator import ValidatorPool
    from engine import load_engine
    from training.corpus import read_all

    refs = {s.group: s.ref_src for s in read_all(args.data)}
    items = [it for it in select_items(args.heldout, args.items * 2) if it["group"] in refs][: args.items]
    engine = load_engine(args.model, device="cpu")
    records = []
    t_start = time.perf_counter()
    with ValidatorPool(workers=2, timeout_s=60.0, gpu=False) as pool:
        for it in items:
            prefix, middle, suffix = it["prefix"], it["middle"], it["suffix"]
            rec: dict[str, Any] = {"group": it["group"], "kind": it["kind"], "middle": middle}
            # device code only, as training/evaluate.py compiles it: these are load_inline sources whose
            # host half includes torch/extension.h
            original = pool.submit_cu(extract_device_code(prefix + middle + suffix).source, run=False)
            pending = []
            for cut, with_spec in SETTINGS:
                # the spec goes first in the file, as a dice-spec comment: the assistant lifts it into context
                head = spec_of(refs[it["group"]]) if with_spec else ""
                doc = parse_document(head + prefix + MASK + suffix)
                (m,) = [m for m in doc.masks if m.start_byte == len((head + prefix).encode())]
                hole = Hole(
                    m.index, m.start_byte, m.end_byte, m.budget, m.function_start_byte, m.function_end_byte
                )
                req = build_infill_request(
                    doc, hole, default_max_new_tokens=64, budget_chars=None, hole_cut=cut
                )  # type: ignore[arg-type]
                t0 = time.perf_counter()
                out = engine.infill(
                    req.prefix,
                    req.suffix,
                    context=req.context,
                    n=1,
                    max_new_tokens=req.max_new_tokens,
                    **DECODE,
                )[0]
                fill = req.mask_fill(out.text)
                name = f"{cut}{'+spec' if with_spec else ''}"
                rec[name] = {
                    "fill": fill,
                    "generate_s": round(time.perf_counter() - t0, 3),
                    "exact": _norm(fill) == _norm(middle),
                    "blank": not fill.strip(),
                }
                pending.append(
                    (name, pool.submit_cu(extract_device_code(prefix + fill + suffix).source, run=False))
                )
            rec["original_compiles"] = original.result().compiled
            for name, fut in pending:
                # a blank fill is no candidate in the assistant (it only deletes the hole): never counted
                rec[name]["compiles"] = fut.result().compiled and not rec[name]["blank"]
            records.append(rec)
            print(
                f"{len(records)}/{len(items)} {it['kind']}: "
                + " ".join(
                    f"{n}={'C' if rec[n]['compiles'] else '-'}{'=' if rec[n]['exact'] else ''}"
                    for n, _ in pending
                ),
                flush=True,
            )
    elapsed = time.perf_counter() - t_start

    names = [f"{c}{'+spec' if s else ''}" for c, s in SETTINGS]
    usable = [r for r in records if r["original_compiles"]]
    summary = {
        n: {
            "compiles": sum(r[n]["compiles"] for r in usable),
            "exact": sum(r[n]["exact"] for r in usable),
            "blank": sum(r[n]["blank"] for r in usable),
            "mean_generate_s": round(sum(r[n]["generate_s"] for r in usable) / max(1, len(usable)), 3),
        }
        for n in names
    }
    by_kind = {
        k: {n: sum(r[n]["compiles"] for r in usable if r["kind"] == k) for n in names}
        | {"holes": sum(r["kind"] == k for r in usable)}
        for k in dict.fromkeys(r["kind"] for r in usable)
    }
    import torch

    result = {
        "command": "python " + " ".join(sys.argv),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "device": "cpu",
        },
        "model": engine.name,
        "items": len(records),
        "usable": len(usable),
        "elapsed_s": round(elapsed, 1),
        "summary": summary,
        "by_kind": by_kind,
        "records": records,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    stem = f"infill_holes_{engine.name}"
    (args.results / f"{stem}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    lines = [
        f"# Hole cut and dice-spec context for {engine.name}",
        "",
        f"`{result['command']}` on {result['machine']['platform']} (CPU, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads), {elapsed:.0f} s.",
        "",
        f"{len(records)} held-out `.cu` holes alone on their lines, as `{MASK}`; {len(usable)} of the "
        "original files compile and are counted. Greedy, dynamic 0.9, block 4, 4 steps, <= 64 new tokens.",
        "",
        "| prompt | top-1 compiles | exact match | blank fill | mean generate s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for n in names:
        s = summary[n]
        lines.append(f"| {n} | {s['compiles']} | {s['exact']} | {s['blank']} | {s['mean_generate_s']} |")
    lines += [
        "",
        "Top-1 compiles by hole kind:",
        "",
        "| kind | holes | " + " | ".join(names) + " |",
        "| --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for k, v in by_kind.items():
        lines.append(f"| {k} | {v['holes']} | " + " | ".join(str(v[n]) for n in names) + " |")
    (args.results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
