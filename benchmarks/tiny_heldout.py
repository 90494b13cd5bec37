"""The embedded model on held-out single-statement holes of real projects, filled through the product.

    python benchmarks/tiny_heldout.py [--model DIR] [--holes 60] [--candidates 4] [--seed 0]
        [--data ../shared/data] [--results benchmarks/results] [--projects ggml,moderngpu] [--quick]

Holes: ``../shared/data/realproj`` (4 real projects that compile with nvcc through their compile commands;
ggml-org/ggml and NVIDIA/CUDALibrarySamples are held out of training by project, moderngpu and
Learn-CUDA-Programming are not in the training data at all) is copied to a temporary folder and its
``compile_commands.json`` written (``realproj_compile.copy_realproj``). In its ``.cu``/``.cuh`` files (the
files the editor and ``dice complete`` fill), a seeded sample of statement lines inside function bodies
(``realproj_compile.statement_lines``, then: tree-sitter sees exactly one statement or declaration on the
line, 6..160 characters, not a bare ``return;``/``break;``/``continue;``), spread round-robin over projects
and files, at most ``--per-file`` (3) per file. Each hole's line becomes the editor's ``/* <MASK> */`` at the
line's indentation, as a user would write it.

Checkable: before filling, the file with the original statement (plus a comment, so no verdict is reused)
and with ``realproj_compile.GARBAGE`` in its place are validated with the same pool and build options; a
hole is checkable only when the original compiles and the garbage is a ``compile_error``. Rates are over
checkable holes; the others are listed with their reason.

Fill: ``dice.assistant.AssistantService`` with the copy as workspace (``workspace_root``, its
``compile_commands.json`` as ``compile_commands``), ``trusted_workspace`` False (compile-only verdicts),
``candidates=N``, the product's default decode settings, ``complete_document(text, filename=<path in the
copy>)``. ``--latency-ms`` defaults to 0 (no budget, the CLI's default) so every candidate is validated; the
editor's default is 2000 ms, under which the sampled candidates mostly come back unvalidated. The engine is
loaded here, primed as the service primes it, and injected wrapped in a recorder that times each
``engine.infill`` call (model time, apart from validation) and keeps the greedy call's text: the service puts
the greedy fill first and samples the others, but its ranked candidates do not say which was greedy, so
the greedy text is cut to the hole's shape with the service's own ``fills.shaped_fill`` and looked up among
the candidates ("model-top"; none when the greedy fill was blank). "shown" is the rank-0 candidate, what
the editor shows. "compiles": status ``compiled``/``correct`` and not flagged ``fill_not_checked``.

Writes tiny_heldout_<model>.jsonl (one line per hole, as it goes), and .json / .md (rewritten after every
hole, so a killed run leaves its summary) to --results.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from realproj_compile import GARBAGE, copy_realproj, replace_line, statement_lines, with_comment  # noqa: E402

from dice.cuda_source import parse_bytes, parse_document  # noqa: E402
from dice.cuda_source.positions import encode_text  # noqa: E402

MASK = "/* <MASK> */"
MASK_SUFFIXES = (".cu", ".cuh", ".cuda")  # the files the editor and `dice complete` fill
MIN_CHARS, MAX_CHARS = 6, 160
TRIVIAL = {"return;", "break;", "continue;", "}"}
COMPILES = ("compiled", "correct")
TARGETS = {"shown_compiles": 0.5, "shown_exact": 0.2}  # issue 21, for the shipped model


@dataclasses.dataclass(frozen=True)
class HoleSpec:
    project: str
    file: str  # relative to the realproj copy
    line: int  # 0-based
    original: str  # the statement, stripped


# ------------------------------------------------------------------------------------------------ holes
def hole_lines(text: str) -> list[int]:
    """0-based lines that hold exactly one whole statement inside a function body (see the module doc)."""
    data = encode_text(text)
    root = parse_bytes(data).root_node
    doc = parse_document(text)
    # tree-sitter's recovery can stretch a function over the rest of the file (macro-heavy code): not a body
    bodies = [
        (doc.index.line_of_byte(f.body_start_byte), doc.index.line_of_byte(f.body_end_byte))
        for f in doc.functions
        if not f.recovered
    ]
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(encode_text(line)))
    lines = text.splitlines()
    out = []
    for n in statement_lines(text):
        content = lines[n].strip()
        if not MIN_CHARS <= len(content) <= MAX_CHARS or content in TRIVIAL:
            continue
        if not any(first < n < last for first, last in bodies):
            continue
        raw = lines[n]
        start = starts[n] + len(encode_text(raw[: len(raw) - len(raw.lstrip())]))
        if _whole_statement(root, start, start + len(encode_text(content))):
            out.append(n)
    return out


def _whole_statement(root: Any, start: int, end: int) -> bool:
    node = root.named_descendant_for_byte_range(start, end)
    while node is not None and node.start_byte == start and node.end_byte == end:
        if node.type == "declaration" or (
            node.type.endswith("_statement") and node.type != "compound_statement"
        ):
            return True
        node = node.parent
    return False


def mask_line(text: str, line: int) -> str:
    """The file with ``line`` replaced by the editor's mask comment at the line's indentation."""
    return replace_line(text, line, MASK)


def candidate_files(root: Path, projects: list[str] | None = None) -> list[str]:
    """The realproj files the editor fills (TUs and headers with a mask suffix), relative, sorted."""
    tus = [e["file"] for e in json.loads((root / "compile_commands.template.json").read_text())]
    headers_file = root / "headers.json"
    headers = list(json.loads(headers_file.read_text())) if headers_file.is_file() else []
    files = sorted({f for f in tus + headers if f.endswith(MASK_SUFFIXES)})
    if projects:
        files = [f for f in files if any(p.lower() in f.split("/")[0].lower() for p in projects)]
    return files


def sample_holes(root: Path, files: list[str], n: int, seed: int, per_file: int = 3) -> list[HoleSpec]:
    """``n`` holes, seeded: round-robin over projects; within a project, one hole per file in a shuffled
    file order before any file's second, at most ``per_file`` per file."""
    rng = random.Random(seed)
    by_project: dict[str, list[list[HoleSpec]]] = {}
    for rel in files:
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
        picks = [HoleSpec(rel.split("/")[0], rel, k, lines[k].strip()) for k in hole_lines(text)]
        rng.shuffle(picks)
        if picks:
            by_project.setdefault(rel.split("/")[0], []).append(picks[:per_file])
    queues = {}
    for project, per in sorted(by_project.items()):
        rng.shuffle(per)
        queues[project] = [p[k] for k in range(per_file) for p in per if k < len(p)]
    out: list[HoleSpec] = []
    while len(out) < n and any(queues.values()):
        for project in sorted(queues):
            if queues[project] and len(out) < n:
                out.append(queues[project].pop(0))
    return out


# ------------------------------------------------------------------------------------------------ engine
class RecordingEngine:
    """Forwards to the real engine; times every ``infill`` call and keeps what it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def infill(self, prefix: str, suffix: str, **kwargs: Any) -> Any:
        start = time.perf_counter()
        outs = self.inner.infill(prefix, suffix, **kwargs)
        self.calls.append(
            {
                "greedy": "seed" not in kwargs and not kwargs.get("temperature"),
                "n": kwargs.get("n", 1),
                "shape": kwargs.get("shape"),
                "seconds": time.perf_counter() - start,
                "texts": [o.text for o in outs],
                "tokens": [len(o.token_ids) for o in outs],
            }
        )
        return outs


def greedy_fill(call: dict[str, Any], hole_cut: str) -> str:
    """The greedy call's text as the service turns it into a candidate (``fills.shaped_fill``)."""
    from dice.assistant.fills import shaped_fill
    from dice.assistant.prompting import InfillRequest

    req = InfillRequest("", "", None, 0, line_aligned=hole_cut == "line", shape=call["shape"])
    return shaped_fill(req, call["texts"][0])


def weights_sha256(model: Path) -> dict[str, str]:
    out = {}
    for path in sorted(model.glob("*.safetensors")):
        with path.open("rb") as f:
            out[path.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


# ------------------------------------------------------------------------------------------------ one hole
def _norm(code: str) -> str:
    return re.sub(r"\s+", " ", code).strip()


def _verdict_json(v: Any) -> dict[str, Any]:
    """Status, flags, which compiler decided (the message says "whole file with nvcc (<command>, ...)")."""
    message = "" if v is None else v.message
    checked = next((x for x in message.splitlines() if "with nvcc" in x), "")
    return {
        "status": None if v is None else v.status,
        "flags": [] if v is None else list(v.flags),
        "checker": "nvcc" if checked else ("nvrtc" if "NVRTC" in message else "other"),
        "command": re.sub(r".*with nvcc \((.*?), sm_.*", r"\1", checked) if checked else None,
        "message": (message.splitlines() or [""])[0][:300],
    }


def compiles(v: Any) -> bool:
    return v is not None and v.status in COMPILES and "fill_not_checked" not in v.flags


async def check_hole(pool: Any, root: Path, hole: HoleSpec, build: Any) -> dict[str, Any]:
    """Validate the original statement and the garbage statement in place (the checkability test)."""
    from dice.assistant.rules import code_run_refusal

    path = root / hole.file
    text = path.read_text(encoding="utf-8", errors="replace")
    start = time.perf_counter()
    futures = [
        pool.submit_cu(
            t, run=False, filename=path.name, folder=path.parent, build=build, not_run=code_run_refusal(False)
        )
        for t in (with_comment(text, hole.line), replace_line(text, hole.line, GARBAGE))
    ]
    original, garbage = await asyncio.to_thread(lambda: [f.result() for f in futures])
    reasons = []
    if original.status not in COMPILES:
        reasons.append(f"original statement: {original.status}")
    if garbage.status != "compile_error":
        unchecked = any(u["line"] <= hole.line <= u["end_line"] for u in garbage.unchecked)
        reasons.append(f"garbage: {garbage.status}" + (" (line in the unchecked list)" if unchecked else ""))
    return {
        "checkable": not reasons,
        "not_checkable_because": "; ".join(reasons) or None,
        "original_verdict": _verdict_json(original),
        "garbage_verdict": _verdict_json(garbage),
        "check_s": round(time.perf_counter() - start, 3),
    }


def _cand(c: Any, original: str, greedy: bool) -> dict[str, Any]:
    return {
        "rank": c.rank,
        "text": c.text,
        "greedy": greedy,
        "confidence": round(float(c.confidence), 4),
        "tokens": c.tokens,
        "compiles": compiles(c.verdict),
        "exact": _norm(c.text) == _norm(original),
        "multiline": "\n" in c.text.strip(),
        **_verdict_json(c.verdict),
    }


async def fill_hole(
    service: Any, recorder: RecordingEngine, root: Path, hole: HoleSpec, n: int, hole_cut: str
) -> dict[str, Any]:
    """Fill the masked hole through the service; the candidates, which was greedy and the timings."""
    path = root / hole.file
    text = mask_line(path.read_text(encoding="utf-8", errors="replace"), hole.line)
    recorder.calls = []
    start = time.perf_counter()
    result = await service.complete_document(text, filename=str(path), candidates=n)
    total = time.perf_counter() - start
    cands = result.masks[0].candidates if result.masks else []
    greedy_calls = [c for c in recorder.calls if c["greedy"]]
    greedy_text = greedy_fill(greedy_calls[0], hole_cut) if greedy_calls else None
    rows = [_cand(c, hole.original, c.text == greedy_text) for c in cands]
    top = next((r for r in rows if r["greedy"]), None)
    shown = rows[0] if rows else None
    return {
        "candidates": rows,
        "greedy_raw": greedy_calls[0]["texts"][0] if greedy_calls else None,
        "greedy_blank": top is None,
        "model_top": top,
        "shown": shown,
        "blank": not rows,
        "any_compiles": any(r["compiles"] for r in rows),
        "any_exact": any(r["exact"] for r in rows),
        "greedy_model_s": round(sum(c["seconds"] for c in greedy_calls), 3),
        "model_s": round(sum(c["seconds"] for c in recorder.calls), 3),
        "validate_s": round(result.stats.get("validate_s", 0.0), 3),
        "total_s": round(total, 3),
        "partial": result.partial,
        "duplicates": int(result.stats.get("duplicates", 0)),
        "empty_fills": int(result.stats.get("empty_fills", 0)),
    }


# ------------------------------------------------------------------------------------------------ summary
def _rate(rs: list[dict[str, Any]], ok: Any) -> dict[str, Any]:
    hits = sum(1 for r in rs if ok(r))
    return {"n": len(rs), "hits": hits, "rate": round(hits / len(rs), 3) if rs else None}


def _times(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return {"n": len(values), "median_s": round(statistics.median(values), 2), "p90_s": round(p90, 2)}


def _of(key: str, field: str) -> Any:
    return lambda r: bool(r[key] and r[key][field])


METRICS = [
    ("model-top (greedy) compiles", "top_compiles", _of("model_top", "compiles")),
    ("shown (rank 0 after validation) compiles", "shown_compiles", _of("shown", "compiles")),
    ("any of N compiles", "any_compiles", lambda r: r["any_compiles"]),
    ("model-top = original", "top_exact", _of("model_top", "exact")),
    ("shown = original", "shown_exact", _of("shown", "exact")),
    ("any of N = original", "any_exact", lambda r: r["any_exact"]),
    ("no candidate (every fill blank)", "blank", lambda r: r["blank"]),
    ("greedy fill blank", "greedy_blank", lambda r: r["greedy_blank"]),
    ("model-top multi-line (one-line hole)", "top_multiline", _of("model_top", "multiline")),
    ("shown multi-line (one-line hole)", "shown_multiline", _of("shown", "multiline")),
]
TIMES = [
    ("greedy fill, model only", "greedy_model_s"),
    ("all N fills, model only", "model_s"),
    ("validation of the candidates", "validate_s"),
    ("whole complete_document call", "total_s"),
]


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per project and overall: the rates over checkable filled holes, times, and the hole counts."""
    projects = sorted({r["project"] for r in records})
    groups = {"all": records} | {p: [r for r in records if r["project"] == p] for p in projects}
    out = {}
    for name, rs in groups.items():
        done = [r for r in rs if r["checkable"] and "candidates" in r]
        row: dict[str, Any] = {
            "sampled": len(rs),
            "checkable": sum(1 for r in rs if r["checkable"]),
            "filled": len(done),
        }
        for _, key, ok in METRICS:
            row[key] = _rate(done, ok)
        for _, key in TIMES:
            row[key] = _times([r[key] for r in done])
        cands = [c for r in done for c in r["candidates"]]
        row["nvcc_verdicts"] = _rate(cands, lambda c: c["checker"] == "nvcc")
        out[name] = row
    return out


def _cell(cell: dict[str, Any]) -> str:
    if "hits" in cell:
        return f"{cell['hits']}/{cell['n']}" + (f" ({100 * cell['rate']:.0f}%)" if cell["n"] else "")
    return f"{cell['median_s']} / {cell['p90_s']}" if cell.get("n") else "-"


def _code(text: str | None) -> str:
    if text is None:
        return "(none)"
    return "`" + text.replace("\n", "⏎").replace("`", "'").replace("|", "\\|")[:120] + "`"


def write_results(out: Path, name: str, meta: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """tiny_heldout_<name>.json (meta, summary, records) and .md (the tables and examples)."""
    summary = summarise(records)
    out.mkdir(parents=True, exist_ok=True)
    payload = {**meta, "summary": summary, "records": records}
    (out / f"tiny_heldout_{name}.json").write_text(json.dumps(payload, indent=1))
    (out / f"tiny_heldout_{name}.md").write_text(_markdown(meta, summary, records))


def _markdown(meta: dict[str, Any], summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    cols = list(summary)
    done = "" if meta.get("finished") else f" (unfinished: {len(records)}/{meta['holes']} holes so far)"
    lines = [
        f"# dice-tiny on held-out single-statement holes: {meta['model_name']}{done}",
        "",
        f"- machine: {meta['machine']}",
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}; wall time {meta.get('wall_s', 0):.0f} s; seed {meta['seed']}",
        f"- model: `{meta['model_path']}` ({meta['model_info']}); weights sha256 "
        + ", ".join(f"{k} `{v}`" for k, v in meta["weights_sha256"].items()),
        f"- settings: {meta['settings']}",
        f"- toolchain: {meta['nvcc']}; {meta['validator']}",
        f"- holes: {meta['holes']} sampled from {meta['files']} `.cu`/`.cuh` files of "
        f"`../shared/data/realproj` ({meta['hole_lines']} eligible statement lines), "
        f"at most {meta['per_file']} per file",
        "",
        "Rates are over checkable holes (original compiles, garbage statement caught). *model-top*: the "
        "greedy fill (none when it was blank); *shown*: the rank-0 candidate after validation, what the "
        "editor shows; *compiles*: `compiled` (compile-only: untrusted workspace, no dice-spec) and not "
        "`fill_not_checked`; *= original*: whitespace-normalised; *multi-line*: the fill holds a line break. "
        f"{meta['candidates']} candidates, latency budget {meta['settings'].get('max_latency_ms')} ms "
        "(0: none, every candidate validated). Times: median / p90 seconds.",
        "",
        "| | " + " | ".join(c.split("+")[-1] for c in cols) + " |",
        "| --- |" + " --- |" * len(cols),
        "| holes sampled / checkable / filled | "
        + " | ".join(
            f"{summary[c]['sampled']} / {summary[c]['checkable']} / {summary[c]['filled']}" for c in cols
        )
        + " |",
    ]
    for label, key, _ in METRICS:
        lines.append(f"| {label} | " + " | ".join(_cell(summary[c][key]) for c in cols) + " |")
    for label, key in TIMES:
        lines.append(f"| {label}, s | " + " | ".join(_cell(summary[c][key]) for c in cols) + " |")
    nvcc = " | ".join(_cell(summary[c]["nvcc_verdicts"]) for c in cols)
    lines.append(f"| candidate verdicts decided by nvcc (project command) | {nvcc} |")
    lines += ["", "## Targets (issue 21, shipped model)", ""]
    for key, target in TARGETS.items():
        cell = summary["all"][key]
        met = cell["rate"] is not None and cell["rate"] >= target
        lines.append(f"- {key}: {_cell(cell)} against >= {100 * target:.0f}%: {'met' if met else 'NOT met'}")
    lines += ["", "## Holes that were not checkable (or not filled)", ""]
    lines += [
        f"- `{r['file']}` line {r['line'] + 1}: {r.get('fill_error') or r['not_checkable_because']}"
        for r in records
        if "candidates" not in r
    ] or ["none"]
    lines += ["", "## Examples (first checkable holes)", ""]
    lines += ["| file:line | original | model-top (status) | shown (status) |", "| --- | --- | --- | --- |"]
    for r in [r for r in records if r["checkable"] and "candidates" in r][:12]:
        top, shown = r["model_top"], r["shown"]
        lines.append(
            f"| `{r['file'].split('/')[-1]}:{r['line'] + 1}` | {_code(r['original'])} | "
            f"{_code(top and top['text'])} ({top and top['status']}) | "
            f"{_code(shown and shown['text'])} ({shown and shown['status']}) |"
        )
    lines += ["", f"Per-hole records: tiny_heldout_{meta['model_name']}.jsonl and .json."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from engine.locate import EMBEDDED_MODEL

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=EMBEDDED_MODEL)
    ap.add_argument("--holes", type=int, default=None, help="holes to sample (default 60; --quick: 6)")
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-file", type=int, default=3)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--projects", default="", help="comma-separated parts of project folder names")
    ap.add_argument("--quick", action="store_true", help="6 holes (a smoke run)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--workers", type=int, default=None, help="validator workers (default: the product's)")
    ap.add_argument("--latency-ms", type=int, default=0, help="the service's latency budget (0: none)")
    args = ap.parse_args(argv)
    if args.holes is None:
        args.holes = 6 if args.quick else 60
    return args


def _environment() -> dict[str, str]:
    """The machine and the nvcc version, for the results' header."""
    import torch

    from dice.validator.paths import nvcc_path

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    nvcc = nvcc_path()
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout if nvcc else "no nvcc"
    return {
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, {gpu}",
        "nvcc": " ".join(out.strip().splitlines()[-2:]),
    }


def load_engine(model: Path, device: str) -> RecordingEngine:
    """The engine the service would load (same loader), primed as the service primes it, wrapped."""
    import torch

    import engine as engine_pkg

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = engine_pkg.load_engine(str(model), device=device)
    loaded.prime_prefix_cache()
    return RecordingEngine(loaded)


async def run_holes(
    args: argparse.Namespace, root: Path, holes: list[HoleSpec], meta: dict[str, Any]
) -> None:
    """Check and fill every hole, appending to the jsonl and rewriting the json/md after each."""
    from dice.assistant import AssistantService
    from dice.assistant.settings import AssistantSettings
    from dice.assistant.validation import build_options
    from dice.validator import ValidatorPool
    from engine.model_settings import read_hole_cut

    settings = AssistantSettings(
        model_path=str(args.model),
        candidates=args.candidates,
        max_latency_ms=args.latency_ms,
        compile_commands=str(root / "compile_commands.json"),
        trusted_workspace=False,
    )
    meta["settings"] = {k: v for k, v in dataclasses.asdict(settings).items() if k != "compile_commands"}
    started = time.perf_counter()
    recorder = load_engine(args.model, args.device)
    meta["load_s"] = round(time.perf_counter() - started, 2)
    hole_cut = read_hole_cut(args.model)
    name = meta["model_name"]
    jsonl = args.results / f"tiny_heldout_{name}.jsonl"
    args.results.mkdir(parents=True, exist_ok=True)
    jsonl.write_text("")
    records: list[dict[str, Any]] = []
    with ValidatorPool(args.workers) as pool:
        meta["validator"] = f"{pool.workers} validator workers"
        with AssistantService(settings, engine=recorder, validator=pool, workspace_root=str(root)) as service:
            meta["model_info"] = service.model_info.describe()
            build = build_options(settings, str(root))
            for i, hole in enumerate(holes):
                record: dict[str, Any] = dataclasses.asdict(hole)
                record |= await check_hole(pool, root, hole, build)
                try:
                    if record["checkable"]:
                        record |= await fill_hole(service, recorder, root, hole, args.candidates, hole_cut)
                except Exception as exc:  # noqa: BLE001 - recorded; the hole then counts as not filled
                    record["fill_error"] = repr(exc)
                records.append(record)
                with jsonl.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                meta["wall_s"] = time.time() - meta["started"]
                write_results(args.results, name, meta, records)
                _progress(i, len(holes), record)
    meta["finished"] = True
    meta["wall_s"] = time.time() - meta["started"]
    write_results(args.results, name, meta, records)


def _progress(i: int, n: int, r: dict[str, Any]) -> None:
    where = f"{r['file'].split('/')[-1]}:{r['line'] + 1}"
    if "candidates" not in r:
        why = r.get("fill_error") or f"not checkable: {r['not_checkable_because']}"
        print(f"[{i + 1}/{n}] {where} {why}", flush=True)
        return
    top, shown = r["model_top"], r["shown"]
    print(
        f"[{i + 1}/{n}] {where} top {top and top['status']} shown {shown and shown['status']} "
        f"any {r['any_compiles']} exact {bool(shown and shown['exact'])} "
        f"model {r['model_s']:.1f}s validate {r['validate_s']:.1f}s",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    source = args.data / "realproj"
    if not (source / "compile_commands.template.json").is_file():
        print(f"{source} is absent", file=sys.stderr)
        return 2
    args.model = args.model.resolve()
    projects = [p for p in args.projects.split(",") if p.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="tiny-heldout-"))
    env_before = os.environ.get("DICE_CACHE_DIR")
    os.environ["DICE_CACHE_DIR"] = str(tmp / "cache")  # no verdict or build of an earlier run is reused
    try:
        root = copy_realproj(source, tmp / "realproj")
        files = candidate_files(root, projects)
        holes = sample_holes(root, files, args.holes, args.seed, args.per_file)
        eligible = sum(len(hole_lines((root / f).read_text(errors="replace"))) for f in files)
        meta = {
            "model_name": args.model.name,
            "model_path": str(args.model),
            "weights_sha256": weights_sha256(args.model),
            **_environment(),
            "command": "python benchmarks/tiny_heldout.py "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "started": time.time(),
            "seed": args.seed,
            "holes": len(holes),
            "files": len(files),
            "hole_lines": eligible,
            "per_file": args.per_file,
            "candidates": args.candidates,
            "validator": "",
            "model_info": "",
            "finished": False,
        }
        print(f"{len(holes)} holes from {len(files)} files ({eligible} eligible lines)", flush=True)
        asyncio.run(run_holes(args, root, holes, meta))
    finally:
        if env_before is None:
            os.environ.pop("DICE_CACHE_DIR", None)
        else:
            os.environ["DICE_CACHE_DIR"] = env_before
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"results in {args.results}/tiny_heldout_{meta['model_name']}.{{md,json,jsonl}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
