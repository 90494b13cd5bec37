"""``dice cuke build``: sources -> validated, deduplicated, split pairs -> task files, report and card.

The order matters for honesty and cost: the held-out problems are drawn (and every pair touching one, in
either KernelBench version, set aside) *before* anything is validated or written, exact duplicates are
dropped before the GPU sees them, near duplicates after (the faster one is kept, which only validation
knows), and every kept pair carries its own measured verdict. Output layout and schemas: ``docs/CUKE.md``.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.cuke import dedup, levels, readers, split, tasks
from training.cuke.records import CuFile, Pair, ReadError
from training.cuke.report import Report, write_all
from training.cuke.validate import VerdictCache, validate_pairs

TASK_FILES = ("sft.jsonl", "infill.jsonl", "e2e.jsonl", "cu_infill.jsonl", "cu_infill_heldout.jsonl")


@dataclass
class BuildConfig:
    sources: list[Path]
    out: Path
    fmt: str | None = None
    min_speedup: float = 2.0
    holdout_fraction: float = 0.1
    seed: int = 0
    teacher: str | None = None
    no_gpu: bool = False
    limit: int | None = None
    strict: bool = False
    workers: int | None = None
    deadline_s: float = 900.0
    cu_holes_per_file: int = 3
    cu_holdout_fraction: float = 0.1
    shape_variants: int = 4  # at most this many re-posed shapes per kept pair (0: none)
    time_budget_s: float | None = None  # validation stops after this long; a rerun resumes (the cache)
    # timing ends after the pilot rounds for a candidate below this speedup (None: half of min_speedup;
    # 0: every candidate timed in full). The GPU is the build's serial resource: 100 rounds of a kernel at
    # 0.3x only say it is not kept (benchmarks/results/cuke_h100.md: timing took 212 of 370 s).
    timing_cutoff: float | None = None
    order: str = "claimed"  # "claimed": the likeliest keepers first (see ordered()); "file": as read
    teacher_samples: int = 4
    command: str = "dice cuke build"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return "compile" if self.no_gpu else "gpu"

    @property
    def stop_below(self) -> float | None:
        """The validator's early stop of timing for this build (None: none)."""
        cut = self.min_speedup / 2 if self.timing_cutoff is None else self.timing_cutoff
        return cut if cut > 0 and self.mode == "gpu" else None

    def settings(self) -> dict[str, Any]:
        words = (
            "compile-only (--no-gpu): no correctness, no speedup"
            if self.no_gpu
            else f"correct under the full protocol and >= {self.min_speedup}x eager PyTorch on this GPU"
        )
        return {
            "command": self.command,
            "sources": [str(s) for s in self.sources],
            "format": self.fmt,
            "mode": self.mode,
            "mode_words": words,
            "min_speedup": self.min_speedup,
            "holdout_fraction": self.holdout_fraction,
            "seed": self.seed,
            "teacher": self.teacher,
            "limit": self.limit,
            "strict": self.strict,
            "shape_variants": self.shape_variants,
            "time_budget_s": self.time_budget_s,
            "timing_cutoff": self.stop_below,
            "order": self.order,
        }


@dataclass
class _Read:
    pairs: list[Pair] = field(default_factory=list)  # with a candidate
    refs: list[Pair] = field(default_factory=list)  # reference-only (problems, unsolved records)
    files: list[CuFile] = field(default_factory=list)


def read_sources(cfg: BuildConfig, rep: Report) -> _Read:
    """Every source, schema-checked; a bad record is reported (file, record, reason) and skipped."""
    got = _Read()
    for path in cfg.sources:
        fmt = cfg.fmt or readers.detect_format(path)
        info: dict[str, Any] = {
            "path": str(path),
            "format": fmt,
            "records": 0,
            "licence": None,
            "commits": [],
        }
        licences, commits = set(), set()

        def bad(err: ReadError, fmt: str = fmt) -> None:
            rep.read_errors.append(str(err))
            rep.count("read_errors", fmt)

        for rec in readers.read_source(path, fmt, limit=cfg.limit, on_error=bad):
            info["records"] += 1
            if isinstance(rec, CuFile):
                got.files.append(rec)
                proj = rep.projects.setdefault(
                    rec.repo, {"licence": rec.license, "commit": rec.commit, "files": 0}
                )
                proj["files"] += 1
                licences.add(rec.license or "?")
                if rec.commit:
                    commits.add(f"{rec.repo}@{rec.commit[:12]}")
                rep.count("read", rec.source)
                continue
            rep.count("read", rec.source)
            if rec.cuda_code is None:
                got.refs.append(rec)
            else:
                got.pairs.append(rec)
                rep.count("pairs", rec.source)
        info["licence"] = ", ".join(sorted(licences)) or _folder_licence(path)
        info["commits"] = sorted(commits)
        rep.sources.append(info)
    return got


_LICENCE_NAMES = re.compile(
    r"\b(MIT|Apache[- ]2\.0|BSD-[23]-Clause|MPL-2\.0|LGPL-[23]\.[01]|GPL-[23]\.0|ISC|Unlicense"
    r"|CC-BY-[\w.-]+)\b"
)


def _folder_licence(path: Path) -> str | None:
    """The licence named by a data folder's SOURCE.md: the bold name (or a known licence name) of its
    "Licence" section, else its first prose line mentioning one (a table row listing a ``LICENSE`` file is
    not a licence)."""
    folder = path if path.is_dir() else path.parent
    card = folder / "SOURCE.md"
    if not card.is_file():
        return None
    lines = card.read_text(encoding="utf-8", errors="replace").splitlines()
    heading = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith("#") and "licen" in line.lower()), None
    )
    if heading is not None:
        for line in lines[heading + 1 :]:
            if line.lstrip().startswith("#"):
                break
            bold = re.search(r"\*\*([^*]{1,60})\*\*", line)
            named = bold.group(1) if bold else (m.group(1) if (m := _LICENCE_NAMES.search(line)) else None)
            if named:
                return named.strip()
    for line in lines:
        low = line.lower()
        if "licen" in low and len(line) < 300 and not line.lstrip().startswith("|"):
            return line.strip("#-* ").strip()[:120]
    return None


def build(
    cfg: BuildConfig,
    *,
    pool: Any = None,
    teacher: Any = None,
    compile_check: Callable[[str], bool] | None = None,
    cu_pool: Any = None,
    console: Any = None,
) -> Report:
    """Run the whole build; ``pool`` (a ValidatorPool), ``teacher``, ``compile_check`` and ``cu_pool`` (the
    CPU pool that checks each ``.cu`` task's original as the reward will) default to the real ones (tests
    stub them at their process boundary). Returns the report, also written to ``cfg.out``."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    rep = Report(cfg.settings())
    t0 = time.perf_counter()
    got = read_sources(cfg, rep)
    rep.timings["read"] = time.perf_counter() - t0

    t = time.perf_counter()
    train, heldout_keys = _split(cfg, rep, got)
    rep.timings["dedup_and_split"] = time.perf_counter() - t

    kept: list[Pair] = []
    # the layer blocks' teacher works without any pair: a build from a teacher alone still asks it
    if train or cfg.teacher or teacher is not None:
        own_pool = pool is None
        if own_pool:
            from dice.validator import ValidatorPool

            pool = ValidatorPool(workers=cfg.workers, gpu=not cfg.no_gpu)
        deadline = None if cfg.time_budget_s is None else time.monotonic() + cfg.time_budget_s
        try:
            t = time.perf_counter()
            kept = _validate(cfg, rep, train, pool, deadline, phase="pairs") if train else []
            rep.timings["validate"] = time.perf_counter() - t
            t = time.perf_counter()
            kept += _augment(cfg, rep, kept, pool, teacher, deadline)
            rep.timings["augment"] = time.perf_counter() - t
        finally:
            if own_pool:
                pool.close()
    else:  # nothing to validate: the report still shows what augmentation would feed
        from training.cuke import augment

        rep.augmentation = augment.augmentation_plan(
            [], augment.layer_block_references(), None, samples=cfg.teacher_samples
        )
        rep.augmentation["mode"] = cfg.mode
    result = dedup.dedup_pairs(kept)
    source_of = {p.id: p.source for p in kept}
    for d in result.dropped:
        rep.count("near_duplicates", source_of[d.pair_id])
    kept = result.kept
    for p in kept:
        rep.count("kept", p.source)
    t = time.perf_counter()
    _write_tasks(cfg, rep, kept, got, heldout_keys, compile_check, cu_pool)
    rep.timings["tasks"] = time.perf_counter() - t
    rep.timings["total"] = time.perf_counter() - t0
    write_all(rep, cfg.out, console)
    return rep


def _split(cfg: BuildConfig, rep: Report, got: _Read) -> tuple[list[Pair], set[str]]:
    """Held-out problems drawn first (seeded), every pair touching one set aside, exact duplicates dropped."""
    evals = dedup.eval_problems_from(got.pairs + got.refs)
    # references without a candidate become e2e tasks: the same contamination rule applies to them
    matches = dedup.contamination(got.pairs + got.refs, evals)
    rep.contamination = dedup.contamination_table(got.pairs, matches, evals)
    keys = {p.problem for p in evals if p.problem} | {p.problem for p in got.pairs if p.problem}
    heldout = split.holdout_problems(keys, cfg.holdout_fraction, cfg.seed) if cfg.holdout_fraction else set()
    train, held, _reasons = split.split_pairs(got.pairs, heldout, matches)
    for p in held:
        rep.count("held_out", p.source)
    got.refs = split.split_pairs(got.refs, heldout, matches)[0]  # held-out references: no e2e task
    written = split.write_heldout_problems(cfg.out / "heldout_problems.jsonl", heldout, evals)
    rep.settings["heldout_problems"] = len(heldout)
    rep.settings["heldout_current_problems_written"] = written
    seen: dict[str, Pair] = {}
    unique = []
    for p in train:
        key = dedup.exact_key(p)
        if key in seen:
            rep.count("exact_duplicates", p.source)
            continue
        seen[key] = p
        unique.append(p)
    return unique, heldout


def _validate(
    cfg: BuildConfig,
    rep: Report,
    pairs: list[Pair],
    pool: Any,
    deadline: float | None = None,
    *,
    phase: str,
) -> list[Pair]:
    """Validate ``pairs`` (cached verdicts first); past ``deadline`` (a ``time.monotonic()`` instant) the rest
    are counted ``pending``, never dropped or guessed: a rerun of the same command validates only them."""
    from dice.validator.batch import BatchStats

    cache = VerdictCache(cfg.out / "cache" / "verdicts.jsonl")
    stats = BatchStats()
    budget = None if deadline is None else max(0.0, deadline - time.monotonic())
    kept = []
    answered: set[int] = set()
    # the source pairs' funnel; shape variants and teacher kernels have rows of their own ("aug_")
    stage = "" if phase == "pairs" else "aug_"
    try:
        for pair, chk in validate_pairs(
            ordered(pairs, cfg.order, cfg.min_speedup),
            pool=pool,
            cache=cache,
            mode=cfg.mode,
            strict=cfg.strict,
            deadline_s=cfg.deadline_s,
            budget_s=budget,
            stats=stats,
            stop_below=cfg.stop_below,
            gpu=_gpu_name() if cfg.mode == "gpu" else None,
        ):
            answered.add(id(pair))
            src = pair.source
            rep.count(stage + "validated", src)
            if phase == "pairs":
                rep.statuses[chk.status] += 1
                if chk.guard:
                    rep.guards[chk.guard] += 1
            if chk.compiled:
                rep.count(stage + "compiled", src)
            if chk.status == "correct":
                rep.count(stage + "correct", src)
                if chk.speedup is not None and phase == "pairs":
                    rep.speedups.append(chk.speedup)
            pair.meta.update(verdict=chk.status, speedup=chk.speedup, guard=chk.guard, mode=chk.mode)
            if chk.kept(cfg.min_speedup):
                if cfg.mode == "gpu":
                    rep.count(stage + "fast", src)
                kept.append(pair)
    finally:
        cache.close()
    for pair in pairs:
        if pair.cuda_code is not None and id(pair) not in answered:
            rep.count(stage + "pending", pair.source)
    rep.validation[phase] = stats.to_json() | {"cached": len(answered) - stats.finished}
    return kept


def _gpu_name() -> str | None:
    """This machine's GPU as the validator's verdicts name it (None without one: a stubbed pool in tests)."""
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no usable CUDA here: nothing to compare cached verdicts against
        return None


ORDERS = ("claimed", "file")


def ordered(pairs: list[Pair], order: str, min_speedup: float) -> list[Pair]:
    """The order pairs are validated in, which matters when a time budget ends the run first. ``file``: as
    read. ``claimed``: pairs whose source claims at least ``min_speedup`` first (largest claim first), then
    those with no claim (as read), then those claiming less (largest first). A claim only orders the work;
    what is kept is decided by the live timing."""
    if order == "file":
        return list(pairs)
    if order != "claimed":
        raise ValueError(f"unknown order {order!r} (use one of {', '.join(ORDERS)})")

    def key(item: tuple[int, Pair]) -> tuple[int, float]:
        i, p = item
        claim = p.meta.get("claimed_speedup")
        if not isinstance(claim, (int, float)) or math.isnan(claim):
            return (1, float(i))
        return (0 if claim >= min_speedup else 2, -float(claim))

    return [p for _, p in sorted(enumerate(pairs), key=key)]


def _augment(
    cfg: BuildConfig, rep: Report, kept: list[Pair], pool: Any, teacher: Any, deadline: float | None = None
) -> list[Pair]:
    """Shape variants of the kept pairs and teacher kernels for the layer blocks, validated like the rest
    (GPU mode only: compile-only verdicts say nothing about a shape). Without a teacher: the plan's counts."""
    from training.cuke import augment

    blocks = augment.layer_block_references()
    if teacher is None and cfg.teacher:
        # an endpoint's key from the environment, never a flag (it would land in the card's command line)
        teacher = augment.teacher_from_arg(cfg.teacher, **_teacher_options(cfg.teacher, os.environ))
    rep.augmentation = augment.augmentation_plan(
        kept, blocks, teacher, samples=cfg.teacher_samples, max_variants=max(cfg.shape_variants, 0)
    )
    rep.augmentation["mode"] = cfg.mode
    if cfg.mode != "gpu" and teacher is None:
        rep.augmentation["note"] = "compile-only build: no shape variants validated, no teacher"
        return []
    extra: list[Pair] = []
    if cfg.mode == "gpu" and cfg.shape_variants > 0:
        extra += [v for p in kept for v in augment.shape_variants(p, max_variants=cfg.shape_variants)]
    if teacher is not None:
        extra += augment.teacher_candidates(blocks, teacher, cfg.teacher_samples)
    got = _validate(cfg, rep, extra, pool, deadline, phase="augmentation") if extra else []
    rep.augmentation["candidates"] = len(extra)
    rep.augmentation["validated"] = rep.funnel.get("aug_validated", 0)  # the rest: aug_pending
    rep.augmentation["kept"] = len(got)
    return got


def _teacher_options(arg: str, env: Any) -> dict[str, Any]:
    key = env.get("DICE_TEACHER_API_KEY") or env.get("OPENAI_API_KEY")
    return {"api_key": key} if key and arg.startswith(("http://", "https://")) else {}


def _level(pair: Pair, rep: Report) -> int:
    try:
        guess = levels.classify_level(pair.pytorch_code).level
    except ValueError:
        guess = pair.level or 1
    if pair.level is not None:
        key = "agree" if pair.level == guess else "disagree"
        rep.level_agreement[key] = rep.level_agreement.get(key, 0) + 1
    return guess


def _write_tasks(
    cfg: BuildConfig,
    rep: Report,
    kept: list[Pair],
    got: _Read,
    heldout_keys: set[str],
    compile_check: Callable[[str], bool] | None,
    cu_pool: Any = None,
) -> None:
    """The task files, each sorted by level (single op -> fused -> whole model: BiC-RL's data schedule)."""
    lv = {p.id: _level(p, rep) for p in kept}
    for p in kept:
        rep.levels[f"L{lv[p.id]}"] += 1
    by_level = sorted(kept, key=lambda p: (lv[p.id], p.id))
    sft = [tasks.sft_record(p, level=lv[p.id], speedup=p.meta.get("speedup")) for p in by_level]
    infill = [r for p in by_level if (r := tasks.infill_record(p, level=lv[p.id])) is not None]
    e2e_src: dict[str, Pair] = {}
    for p in by_level + sorted(got.refs, key=lambda r: r.id):  # got.refs: held-out ones already removed
        if p.problem and p.problem in heldout_keys:
            continue  # an evaluation problem: never a training task
        e2e_src.setdefault(dedup.normalize_code(p.pytorch_code), p)
    e2e = sorted(
        (tasks.e2e_record(p, level=lv.get(p.id) or _level(p, rep)) for p in e2e_src.values()),
        key=lambda r: (r["level"], r["id"]),
    )
    cu_train, cu_held = _cu_tasks(cfg, rep, kept, got.files, compile_check, cu_pool)
    for name, rows in zip(TASK_FILES, (sft, infill, e2e, cu_train, cu_held), strict=True):
        with (cfg.out / name).open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        rep.tasks[name] = len(rows)


def _cu_tasks(
    cfg: BuildConfig,
    rep: Report,
    kept: list[Pair],
    files: list[CuFile],
    compile_check: Callable[..., bool] | None,
    cu_pool: Any = None,
) -> tuple[list[dict], list[dict]]:
    """``.cu`` infill tasks from the corpus and the kept kernels; held out by project and by file (seeded)
    *before* any hole is cut, so no held-out file or project lends a hole to training.

    A corpus file that does not compile alone is tried again with its project's headers
    (:mod:`training.cuke.headers`), written under ``OUT/cu_projects/``. Those headers may come from any
    corpus file of the same repository, a held-out one included: they are compile context on disk, which
    no prompt shows, and the split is of the files whose holes become tasks. Every header any candidate
    needs is written before the first compile (each compile sees the same tree); afterwards the tree keeps
    only what kept tasks need, and a kept file that could have opened a removed header is compiled again
    in the final tree (its tasks dropped if it no longer compiles), so the reward's tree is the one each
    kept original compiled in."""
    from training.cuke.headers import HeaderIndex, HeaderTree, sees_any

    rng = random.Random(cfg.seed)
    repos = sorted({f.repo for f in files})
    n_repos = max(1, round(len(repos) * cfg.cu_holdout_fraction)) if cfg.cu_holdout_fraction and repos else 0
    held_repos = set(rng.sample(repos, min(n_repos, max(0, len(repos) - 1)))) if len(repos) > 1 else set()
    held_files = {f.id for f in files if f.repo not in held_repos and rng.random() < cfg.cu_holdout_fraction}
    kernel_files = [cf for p in kept for cf in tasks.kernels_as_cu_files(p)]
    check = compile_check or tasks.nvrtc_compiles
    train_files = [f for f in files if f.repo not in held_repos and f.id not in held_files] + kernel_files
    held = [f for f in files if f.repo in held_repos or f.id in held_files]
    workers = 1 if compile_check is not None else max(1, min(8, os.cpu_count() or 1))
    tree = HeaderTree(HeaderIndex(files), cfg.out)
    tree.reset()
    contexts = tree.stage(f for f in files if "__global__" in f.text or "__device__" in f.text)
    stats = tasks.CuTaskStats()
    kw = dict(per_file=cfg.cu_holes_per_file, seed=cfg.seed, compile_check=check, workers=workers)
    kw |= {"stats": stats, "headers": contexts, "headers_base": cfg.out}
    train_rows = list(tasks.cu_infill_tasks(train_files, **kw))
    held_rows = [
        r | {"heldout": "project" if r["origin"].split(":", 1)[0] in held_repos else "file"}
        for r in tasks.cu_infill_tasks(held, **kw)
    ]
    texts = {f.id: f.text for f in files}
    while True:
        keep = {r["origin"]: contexts[r["origin"]] for r in train_rows + held_rows if "folder" in r}
        removed = tree.prune(keep)
        recheck = sorted(o for o, ctx in keep.items() if removed and sees_any(ctx, removed))
        jobs = [(texts[o], keep[o].include_dirs(cfg.out)) for o in recheck]
        failed = {o for o, ok in zip(recheck, _compile(jobs, check, workers), strict=True) if not ok}
        if not failed:
            break
        stats.compiled -= len(failed)
        stats.compiled_with_headers -= len(failed)
        stats.dropped_after_prune += len(failed)
        _uncount(stats, [r for r in train_rows + held_rows if r["origin"] in failed])
        train_rows = [r for r in train_rows if r["origin"] not in failed]
        held_rows = [r for r in held_rows if r["origin"] not in failed]
    texts |= {cf.id: cf.text for cf in kernel_files}
    train_rows, held_rows, check_stats = reward_check(train_rows, held_rows, texts, cfg.out, cu_pool)
    _uncount(stats, check_stats.pop("dropped_rows"))
    rep.cu_tasks = stats.to_json() | {
        "reward_check": check_stats,
        "held_out_repos": sorted(held_repos),
        "held_out_files": len(held_files),
        "headers": tree.stats.to_json(),
    }
    return train_rows, held_rows


def _uncount(stats: Any, rows: list[dict]) -> None:
    """Take dropped task rows out of the ``CuTaskStats`` tallies (no kind left at zero)."""
    for row in rows:
        stats.tasks -= 1
        stats.by_kind[row["kind"]] -= 1
    stats.by_kind = +stats.by_kind


def reward_check(
    train_rows: list[dict], held_rows: list[dict], texts: dict[str, str], out: Path, cu_pool: Any = None
) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """Keep the tasks whose *original* the RL reward would pay: each file's original is submitted to a CPU
    :class:`~dice.validator.ValidatorPool` exactly as ``ValidatorReward`` submits a filled one (alone, or in
    its folder with its include paths and an empty compile database), compile-only. The NVRTC check above
    sees the device code only; wherever nvcc is installed the validator also compiles a file with host code
    whole, and measured on the corpus a quarter of the NVRTC-kept files fail there (``<ATen/ATen.h>``,
    headers the corpus lacks): every fill of such a file would earn 0, its groups all dropped. A task whose
    hole lies in code no compiler type-checked for the original (a branch the preprocessor left out:
    ``mark_unchecked``) is dropped too: any fill there would "compile"; and so is one whose target, given
    as the answer, the reward would not reassemble into the original. One compile per file, not per task.
    Returns the kept rows and the counts (``dropped_rows``: the rows taken out, for the caller's tallies)."""
    from dice.validator.verdict import FLAG_FILL_NOT_CHECKED, mark_unchecked
    from training.cuke.cu_tasks import MASK as CU_MASK
    from training.cuke.cu_tasks import submit_task_file

    origins = sorted({r["origin"] for r in train_rows + held_rows})
    counts: dict[str, Any] = {"files": len(origins), "statuses": {}, "files_failed": 0}
    counts["holes_not_checked"] = 0
    counts["targets_not_reassembled"] = 0
    if not origins:
        return train_rows, held_rows, counts | {"dropped_rows": []}
    own = cu_pool is None
    if own:
        from dice.validator import ValidatorPool

        cu_pool = ValidatorPool(workers=max(1, os.cpu_count() or 1), gpu=False)
    first = {}
    for r in train_rows + held_rows:
        first.setdefault(r["origin"], r)
    no_db = out / "cache" / "no_compile_commands" / "compile_commands.json"
    start = time.perf_counter()
    try:
        futures = {
            o: submit_task_file(  # compile-only: whether the original compiles, not a spec run
                cu_pool,
                texts[o],
                folder=str(out / first[o]["folder"]) if "folder" in first[o] else None,
                include_paths=[str(out / p) for p in first[o].get("include_paths", ())],
                empty_database=no_db,
                run=False,
            )
            for o in origins
        }
        verdicts = {o: f.result() for o, f in futures.items()}
    finally:
        if own:
            cu_pool.close()
    counts["seconds"] = round(time.perf_counter() - start, 1)
    statuses = Counter(v.status for v in verdicts.values())
    counts["statuses"] = dict(sorted(statuses.items()))
    ok = {o for o, v in verdicts.items() if v.status in ("compiled", "correct")}
    counts["files_failed"] = len(origins) - len(ok)
    dropped: list[dict] = []

    def keeps(row: dict) -> bool:
        if row["origin"] not in ok:
            dropped.append(row)
            return False
        if not _reassembles(row):
            counts["targets_not_reassembled"] += 1
            dropped.append(row)
            return False
        line = row["text"][: row["text"].index(CU_MASK)].count("\n")
        if FLAG_FILL_NOT_CHECKED in mark_unchecked(verdicts[row["origin"]], line).flags:
            counts["holes_not_checked"] += 1
            dropped.append(row)
            return False
        return True

    train_rows = [r for r in train_rows if keeps(r)]
    held_rows = [r for r in held_rows if keeps(r)]
    return train_rows, held_rows, counts | {"dropped_rows": dropped}


def _reassembles(row: dict) -> bool:
    """Whether the RL reward, given the target as the model's answer, rebuilds the original file: the
    middle is cut where the suffix starts or the hole's shape ends (``engine.infill.InfillPlan.finish``),
    as ``training.rl.tasks.program_from`` cuts it for a task prompted with the whole file (its default).
    A task whose perfect answer is cut short could never be paid."""
    from engine.infill import InfillPlan
    from training.cuke.cu_tasks import CU_SHAPES
    from training.cuke.cu_tasks import MASK as CU_MASK

    before, after = row["text"].split(CU_MASK, 1)
    plan = InfillPlan.make(before, after, context=None, shape=CU_SHAPES.get(str(row.get("kind"))))
    return plan.finish(row["target"], True)[0] == row["target"]


def _compile(jobs: list[tuple[str, tuple[str, ...]]], check: Callable[..., bool], workers: int) -> list[bool]:
    from training.cuke.cu_tasks import compile_all, process_pool

    if workers <= 1 or len(jobs) <= 1:
        return compile_all(jobs, check)
    pool = process_pool(workers)
    try:
        return compile_all(jobs, check, pool)
    finally:
        pool.shutdown(cancel_futures=True)
