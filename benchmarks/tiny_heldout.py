"""The embedded model on held-out single-statement holes of never-seen projects and files, filled through
the product.

    python benchmarks/tiny_heldout.py [--set realproj|heldout-files|both] [--model DIR] [--holes 60]
        [--candidates 4] [--seed 0] [--per-file 3] [--data ../shared/data] [--results benchmarks/results]
        [--projects ggml,moderngpu] [--quick] [--heldout-files runs/dice-tiny-data/heldout_files.jsonl.gz]
        [--split runs/dice-tiny-data/split.json] [--max-sampled 400]

Hole sets (``tiny_heldout_holes``; ``--set``, default realproj):

- ``realproj``: ``../shared/data/realproj`` (4 real projects that compile with nvcc through their compile
  commands; ggml-org/ggml and NVIDIA/CUDALibrarySamples are held out of training by project, moderngpu and
  Learn-CUDA-Programming are not in the training data at all) is copied to a temporary folder and its
  ``compile_commands.json`` written (``realproj_compile.copy_realproj``); its ``.cu``/``.cuh`` files (the
  files the editor and ``dice complete`` fill) are sampled. ``--holes`` holes, every one checked.
- ``heldout-files``: the ``.cu``/``.cuh`` corpus files ``dice train corpus`` held out *by file* (``--split``
  split.json, ``why == "file"``; the rest of their projects was trained on), from ``--heldout-files``; each
  file alone in its own temporary workspace at its repository path, no compile database (the product's
  fallback: NVRTC on the device code, nvcc on the whole file). Up to ``--max-sampled`` holes are sampled and
  tried in order until ``--holes`` are checkable. A file whose untouched text does not compile makes all its
  holes not checkable without checking each (one compile per file).

Sampling (both sets): seeded statement lines inside function bodies (``realproj_compile.statement_lines``,
then: tree-sitter sees exactly one statement or declaration on the line, 6..160 characters, not a bare
``return;``/``break;``/``continue;``), spread round-robin over projects and files, at most ``--per-file`` (3)
per file. Each hole's line becomes the editor's ``/* <MASK> */`` at the line's indentation, as a user would
write it.

Checkable: before filling, the file with the original statement (plus a comment, so no verdict is reused)
and with ``realproj_compile.GARBAGE`` in its place are validated with the same pool and build options; a
hole is checkable only when the original compiles and the garbage is a ``compile_error``. Rates are over
checkable holes; the others are listed with their reason ("why_not": the original does not compile (a
missing header, another error) or the garbage is not caught).

Fill: ``dice.assistant.AssistantService`` with the hole's workspace (``workspace_root``; realproj: its
``compile_commands.json`` as ``compile_commands``), ``trusted_workspace`` False (compile-only verdicts),
``candidates=N``, the product's default decode settings, ``complete_document(text, filename=<path in the
workspace>)``. ``--latency-ms`` defaults to 0 (no budget, the CLI's default) so every candidate is validated;
the editor's default is 2000 ms, under which the sampled candidates mostly come back unvalidated. The engine
is loaded here, primed as the service primes it, and injected wrapped in a recorder that times each
``engine.infill`` call (model time, apart from validation) and keeps the greedy call's text: the service puts
the greedy fill first and samples the others, but its ranked candidates do not say which was greedy, so the
greedy text is cut to the hole's shape with the service's own ``fills.shaped_fill`` and looked up among the
candidates ("model-top"; none when the greedy fill was blank). "shown" is the rank-0 candidate, what the
editor shows. "compiles": status ``compiled``/``correct`` and not flagged ``fill_not_checked``. Each verdict
records which compiler decided it (``checker``: nvcc on the whole file, or NVRTC on the device code alone).

Writes to --results ``tiny_heldout_<model>`` (realproj), ``tiny_heldout_files_<model>`` (heldout-files) or
``tiny_heldout_both_<model>``: ``.jsonl`` (one line per hole, as it goes), ``.json`` / ``.md`` (rewritten
after every hole, so a killed run leaves its summary; tables by project, by set, or overall).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from realproj_compile import GARBAGE, replace_line, with_comment  # noqa: E402
from tiny_heldout_holes import (  # noqa: E402, F401 - the tests reach the helpers through this module
    SETS,
    HoleSet,
    HoleSpec,
    candidate_files,
    heldout_by_file,
    heldout_files_set,
    hole_lines,
    mask_line,
    realproj_set,
    sample_holes,
    sample_texts,
)
from tiny_heldout_report import TARGETS, checkability, summarise, write_results  # noqa: E402, F401

COMPILES = ("compiled", "correct")
MISSING_HEADER = ("No such file or directory", "cannot open source file")
STEMS = {
    "realproj": "tiny_heldout_{}",
    "heldout-files": "tiny_heldout_files_{}",
    "both": "tiny_heldout_both_{}",
}
GROUP_BY = {"realproj": "project", "heldout-files": None, "both": "set"}


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
                "prefix": prefix[prefix.rfind("\n") + 1 :],  # the hole's line: all mask_fill reads of it
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

    req = InfillRequest(call["prefix"], "", None, 0, line_aligned=hole_cut == "line", shape=call["shape"])
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
    """Status, flags, which compiler decided (the message says "whole file with nvcc (<command>, ...)" or
    "device code with NVRTC")."""
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


def _original_why(v: Any) -> str:
    """Why an original does not compile, in a few words (the checkability counts)."""
    if v.status == "compile_error":
        missing = any(m in v.message or m in v.log for m in MISSING_HEADER)
        return "original does not compile: " + ("missing header" if missing else "other error")
    return f"original does not compile: {v.status}"


def _submit(pool: Any, path: Path, text: str, build: Any) -> Any:
    from dice.assistant.rules import code_run_refusal

    return pool.submit_cu(
        text, run=False, filename=path.name, folder=path.parent, build=build, not_run=code_run_refusal(False)
    )


async def check_file(pool: Any, path: Path, build: Any) -> dict[str, Any] | None:
    """The untouched file's verdict: None when it compiles, else the not-checkable part of its holes'
    records (the heldout-files set: one compile per file instead of two per hole)."""
    start = time.perf_counter()
    future = _submit(pool, path, path.read_text(encoding="utf-8", errors="replace"), build)
    verdict = await asyncio.wrap_future(future)
    if verdict.status in COMPILES:
        return None
    return {
        "checkable": False,
        "not_checkable_because": f"original file: {verdict.status}: {_verdict_json(verdict)['message']}",
        "why_not": _original_why(verdict),
        "original_verdict": _verdict_json(verdict),
        "garbage_verdict": None,
        "check_s": round(time.perf_counter() - start, 3),
    }


async def check_hole(pool: Any, path: Path, hole: HoleSpec, build: Any) -> dict[str, Any]:
    """Validate the original statement and the garbage statement in place (the checkability test)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    start = time.perf_counter()
    futures = [
        _submit(pool, path, t, build)
        for t in (with_comment(text, hole.line), replace_line(text, hole.line, GARBAGE))
    ]
    original, garbage = await asyncio.to_thread(lambda: [f.result() for f in futures])
    reasons, why = [], None
    if original.status not in COMPILES:
        reasons.append(f"original statement: {original.status}")
        why = _original_why(original)
    if garbage.status != "compile_error":
        unchecked = any(u["line"] <= hole.line <= u["end_line"] for u in garbage.unchecked)
        reasons.append(f"garbage: {garbage.status}" + (" (line in the unchecked list)" if unchecked else ""))
        why = why or "garbage not caught" + (" (line not type-checked)" if unchecked else "")
    return {
        "checkable": not reasons,
        "not_checkable_because": "; ".join(reasons) or None,
        "why_not": why,
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
    service: Any, recorder: RecordingEngine, path: Path, hole: HoleSpec, n: int, hole_cut: str
) -> dict[str, Any]:
    """Fill the masked hole through the service; the candidates, which was greedy and the timings."""
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


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from engine.locate import EMBEDDED_MODEL

    data = ROOT / "runs" / "dice-tiny-data"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--set", choices=(*SETS, "both"), default="realproj", help="which holes (default realproj)"
    )
    ap.add_argument("--model", type=Path, default=EMBEDDED_MODEL)
    ap.add_argument(
        "--holes",
        type=int,
        default=None,
        help="realproj: holes to sample; heldout-files: checkable holes to find (default 60; --quick: 6)",
    )
    ap.add_argument("--candidates", type=int, default=4, help="the service's candidates per hole")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-file", type=int, default=3)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--heldout-files", type=Path, default=data / "heldout_files.jsonl.gz")
    ap.add_argument("--split", type=Path, default=data / "split.json")
    ap.add_argument(
        "--max-sampled", type=int, default=400, help="heldout-files: candidate holes sampled at most"
    )
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


@dataclasses.dataclass
class Run:
    """What every hole of a run shares: the pool, the engine, the base settings, the results so far."""

    args: argparse.Namespace
    pool: Any
    recorder: RecordingEngine
    hole_cut: str
    settings: Any  # AssistantSettings without a compile database
    meta: dict[str, Any]
    stem: str
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def save(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with (self.args.results / f"{self.stem}.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.meta["wall_s"] = time.time() - self.meta["started"]
        write_results(self.args.results, self.stem, self.meta, self.records)


async def run_sets(args: argparse.Namespace, sets: list[HoleSet], meta: dict[str, Any], stem: str) -> None:
    """Check and fill the holes of every set, appending to the jsonl and rewriting the json/md after each."""
    from dice.assistant import AssistantService
    from dice.assistant.settings import AssistantSettings
    from dice.validator import ValidatorPool
    from engine.model_settings import read_hole_cut

    settings = AssistantSettings(
        model_path=str(args.model),
        candidates=args.candidates,
        max_latency_ms=args.latency_ms,
        trusted_workspace=False,
    )
    meta["settings"] = {k: v for k, v in dataclasses.asdict(settings).items() if k != "compile_commands"}
    started = time.perf_counter()
    recorder = load_engine(args.model, args.device)
    meta["load_s"] = round(time.perf_counter() - started, 2)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{stem}.jsonl").write_text("")
    with ValidatorPool(args.workers) as pool:
        meta["validator"] = f"{pool.workers} validator workers"
        with AssistantService(settings, engine=recorder, validator=pool) as service:
            meta["model_info"] = service.model_info.describe()
        meta["hole_cut"] = read_hole_cut(args.model)
        run = Run(args, pool, recorder, meta["hole_cut"], settings, meta, stem)
        for hole_set in sets:
            await run_set(run, hole_set)
    meta["finished"] = True
    meta["wall_s"] = time.time() - meta["started"]
    write_results(args.results, stem, meta, run.records)


async def run_set(run: Run, hs: HoleSet) -> None:
    """Each hole of ``hs`` in order (until ``hs.stop_after`` are checkable): check it, fill it when it is
    checkable, through a service whose workspace is the hole's."""
    from dice.assistant import AssistantService
    from dice.assistant.validation import build_options

    settings = run.settings.replace(compile_commands=str(hs.compile_commands or ""))
    file_failures: dict[str, dict[str, Any] | None] = {}
    checkable = 0
    for i, hole in enumerate(hs.holes):
        if hs.stop_after is not None and checkable >= hs.stop_after:
            break
        path, workspace = hs.path(hole), str(hs.workspaces[hole.file])
        build = build_options(settings, workspace)
        record: dict[str, Any] = {"set": hs.name, **dataclasses.asdict(hole)}
        if hs.file_precheck and hole.file not in file_failures:
            file_failures[hole.file] = await check_file(run.pool, path, build)
        failed = file_failures.get(hole.file)
        if failed is not None:
            record |= failed
            file_failures[hole.file] = {**failed, "check_s": 0.0}  # counted once, on the file's first hole
        else:
            record |= await check_hole(run.pool, path, hole, build)
        checkable += bool(record["checkable"])
        try:
            if record["checkable"]:
                with AssistantService(
                    settings, engine=run.recorder, validator=run.pool, workspace_root=workspace
                ) as service:
                    record |= await fill_hole(
                        service, run.recorder, path, hole, run.args.candidates, run.hole_cut
                    )
        except Exception as exc:  # noqa: BLE001 - recorded; the hole then counts as not filled
            record["fill_error"] = repr(exc)
        run.save(record)
        _progress(i, len(hs.holes), record)


def _progress(i: int, n: int, r: dict[str, Any]) -> None:
    where = f"{r['set']} {r['file'].split('/')[-1]}:{r['line'] + 1}"
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


def build_sets(args: argparse.Namespace, tmp: Path) -> list[HoleSet]:
    """The sets ``--set`` asks for whose data is here (a missing one is skipped, saying why)."""
    projects = [p for p in args.projects.split(",") if p.strip()]
    names = SETS if args.set == "both" else (args.set,)
    sets = []
    if "realproj" in names:
        source = args.data / "realproj"
        if (source / "compile_commands.template.json").is_file():
            sets.append(
                realproj_set(source, tmp / "realproj", args.holes, args.seed, args.per_file, projects)
            )
        else:
            print(f"{source} is absent: no realproj holes", file=sys.stderr)
    if "heldout-files" in names:
        missing = [str(p) for p in (args.heldout_files, args.split) if not p.is_file()]
        if missing:
            print(
                f"{' and '.join(missing)} absent: no heldout-files holes (`dice train corpus` writes them)",
                file=sys.stderr,
            )
        else:
            sets.append(
                heldout_files_set(
                    args.heldout_files,
                    args.split,
                    tmp / "heldout-files",
                    checkable=args.holes,
                    max_sampled=args.max_sampled,
                    seed=args.seed,
                    per_file=args.per_file,
                    projects=projects,
                )
            )
    return sets


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.model = args.model.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="tiny-heldout-"))
    env_before = os.environ.get("DICE_CACHE_DIR")
    os.environ["DICE_CACHE_DIR"] = str(tmp / "cache")  # no verdict or build of an earlier run is reused
    try:
        sets = build_sets(args, tmp)
        if not sets:
            return 2
        stem = STEMS[args.set].format(args.model.name)
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
            "set": args.set,
            "group_by": GROUP_BY[args.set],
            "sets": {hs.name: hs.info for hs in sets},
            "holes": sum(len(hs.holes) for hs in sets),
            "per_file": args.per_file,
            "candidates": args.candidates,
            "validator": "",
            "model_info": "",
            "finished": False,
        }
        for hs in sets:
            files, lines = hs.info["files"], hs.info["hole_lines"]
            print(f"{hs.name}: {len(hs.holes)} holes from {files} files ({lines} eligible lines)", flush=True)
        asyncio.run(run_sets(args, sets, meta, stem))
    finally:
        if env_before is None:
            os.environ.pop("DICE_CACHE_DIR", None)
        else:
            os.environ["DICE_CACHE_DIR"] = env_before
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"results in {args.results}/{stem}.{{md,json,jsonl}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
