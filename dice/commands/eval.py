"""``dice eval kernelbench``: generate (or read saved) candidates for KernelBench problems and validate them.

Metrics: compiled %, Exec % (correct), fast_1 / fast_2, unbiased pass@k; per-sample verdicts as JSON Lines,
a summary table, ``summary.json`` and a speedup plot. Re-running with the same ``--out`` resumes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dice import safeio
from dice.commands.common import CliError, check_input_file, print_json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model on a benchmark",
        description="Evaluate a model (or saved generations) on a benchmark.",
    )
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    kb = sub.add_parser(
        "kernelbench",
        help="KernelBench: Exec, fast_1, fast_2, pass@k",
        description=(
            "Run the model (or read a folder of saved generations) over KernelBench problems and validate "
            "each "
            "sample with the KernelBench protocol on this machine's GPU (compile-only checks without one). "
            "Defaults follow the DICE evaluation: levels 1-3, greedy decoding, block size 4."
        ),
    )
    kb.add_argument("--level", default="1-3", help="levels: 1, 1,2 or 1-3 (default 1-3)")
    kb.add_argument(
        "--problems", default=None, metavar="A-B", help="problem ids, e.g. 1-10 or 3,7,19 (default all)"
    )
    kb.add_argument("--samples", type=int, default=1, metavar="N", help="samples per problem (default 1)")
    kb.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="checkpoint folder (default $DICE_MODEL or the embedded model)",
    )
    kb.add_argument(
        "--generations",
        type=Path,
        default=None,
        metavar="DIR",
        help="validate saved programs DIR/level<L>/<id>/sample_<k>.py instead of running a model",
    )
    kb.add_argument(
        "--out",
        type=Path,
        default=Path("kernelbench-eval"),
        metavar="DIR",
        help="output folder; an existing one is resumed (default ./kernelbench-eval)",
    )
    kb.add_argument(
        "--problems-file",
        default=None,
        metavar="FILE",
        help="KernelBench problems as JSON Lines (level, problem_id, name, code); default "
        "$DICE_KERNELBENCH_PROBLEMS or the shared data copy when present",
    )
    kb.add_argument("--k", default=None, metavar="K,..", help="pass@k values (default 1 and N when N > 1)")
    kb.add_argument("--strict", action="store_true", help="allclose at 1e-4 instead of 1e-2")
    kb.add_argument("--no-timing", action="store_true", help="correctness only (no fast_p)")
    kb.add_argument("--workers", type=int, default=None, help="validator workers (default: per machine)")
    kb.add_argument("--timeout", type=float, default=120.0, metavar="S", help="run-phase timeout per sample")
    kb.add_argument(
        "--build-timeout", type=float, default=900.0, metavar="S", help="build timeout per sample"
    )
    kb.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    kb.add_argument("--block-size", type=int, default=4)
    kb.add_argument("--steps-per-block", type=int, default=4)
    kb.add_argument("--policy", default="static", choices=("static", "dynamic", "entropy"))
    kb.add_argument("--max-new-tokens", type=int, default=4096)
    kb.add_argument("--device", default=None, help="model device (default: cuda when available)")
    kb.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    kb.set_defaults(func=run_kernelbench)
    parser.set_defaults(func=lambda args: (parser.print_help(sys.stderr), 2)[1])


class _Generator:
    """Programs for (problem, sample): from saved files, or from the engine (saved under OUT/generations)."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.saved_root: Path | None = args.generations
        self.gen_root = out / "generations"
        self.args = args
        self._engine: Any = None

    def program(self, problem: Any, sample: int) -> tuple[str | None, str, str]:
        """(the program or None, where it comes from, why there is none)."""
        from dice.validator.kbeval import sample_path

        if self.saved_root is not None:
            path = sample_path(self.saved_root, problem, sample)
        else:
            path = sample_path(self.gen_root, problem, sample)
            if not os.path.lexists(path):
                self._generate(problem)
        if not os.path.lexists(path):
            return None, str(path), f"{path} is missing"
        try:  # a saved program is a user's file: a regular file of a source's size, read with a bound
            text = safeio.read_user_text(
                path, max_bytes=safeio.SOURCE_LIMIT, what="program", errors="replace"
            )
        except safeio.UserFileError as exc:
            return None, str(path), str(exc)
        return text, str(path), ""

    def _generate(self, problem: Any) -> None:
        from dice.validator.kbeval import sample_path
        from engine.answers import extract_program

        if self._engine is None:
            from engine import CheckpointError, ConfigError, load_engine

            try:
                self._engine = load_engine(self.args.model, device=self.args.device)
            except (CheckpointError, ConfigError, FileNotFoundError) as exc:
                raise CliError(f"cannot load the model: {exc}") from exc
        completions = self._engine.generate_program(
            problem.code,
            n=self.args.samples,
            max_new_tokens=self.args.max_new_tokens,
            block_size=self.args.block_size,
            steps_per_block=self.args.steps_per_block,
            policy=self.args.policy,
            temperature=self.args.temperature,
        )
        for k, completion in enumerate(completions):
            path = sample_path(self.gen_root, problem, k)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".txt").write_text(completion.text, encoding="utf-8")
            path.write_text(extract_program(completion.text), encoding="utf-8")


def run_kernelbench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dice.validator import ValidatorPool
    from dice.validator.kbeval import plot_speedups, read_records, summarize

    levels, ks, problems_file, problems = _select(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    verdicts_path = out / "verdicts.jsonl"
    old = read_records(verdicts_path)
    done = {(r["level"], r["problem_id"], r["sample"]) for r in old}
    todo = [(p, k) for p in problems for k in range(args.samples) if (p.level, p.problem_id, k) not in done]
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(
        f"KernelBench: {len(problems)} problems × {args.samples} samples from {problems_file}; "
        f"{len(todo)} to validate ({len(problems) * args.samples - len(todo)} already in {verdicts_path})"
    )
    wanted = {(p.level, p.problem_id, k) for p in problems for k in range(args.samples)}
    records = [r for r in old if (r["level"], r["problem_id"], r["sample"]) in wanted]
    start = time.perf_counter()
    with (
        ValidatorPool(args.workers, timeout_s=args.timeout, build_timeout_s=args.build_timeout) as pool,
        verdicts_path.open("a", encoding="utf-8") as sink,
    ):
        if not pool.gpu:  # said before the run, not after it
            console.print(
                "[yellow]no GPU: candidates are compile-checked only, so Exec and fast_p will be 0[/]"
            )
        records += _validate(args, console, pool, _Generator(args, out), todo, sink)

    summary = summarize(records, ks)
    summary["meta"] = {
        "problems_file": str(problems_file),
        "levels": levels,
        "samples": args.samples,
        "strict": args.strict,
        "timing": not args.no_timing,
        "gpu": pool.gpu,
        "seconds_this_run": round(time.perf_counter() - start, 1),
        "source": str(args.generations) if args.generations else (args.model or "embedded model"),
    }
    (out / "summary.json").write_text(safeio.dumps_strict(summary, indent=2) + "\n", encoding="utf-8")
    plot = plot_speedups(records, out / "speedups.png")
    _print_table(console, summary, ks)
    console.print(f"verdicts: {verdicts_path}  summary: {out / 'summary.json'}  plot: {plot}")
    if not pool.gpu:
        console.print("[yellow]no GPU: candidates were compile-checked only (Exec and fast_p are 0)[/]")
    if args.json:
        print_json(summary, indent=2)
    return 0


def _select(args: argparse.Namespace) -> tuple[list[int], list[int], Path, list[Any]]:
    """Levels, pass@k values, the problems file and the problems the flags ask for; CliError otherwise."""
    from dice.validator.kbeval import find_problems_file, load_problems, parse_int_set, select_problems

    if args.samples < 1:
        raise CliError("--samples must be at least 1")
    try:
        levels = parse_int_set(args.level, "--level")
        ids = parse_int_set(args.problems, "--problems") if args.problems else None
        ks = parse_int_set(args.k, "--k") if args.k else sorted({1, args.samples})
        if args.problems_file and os.path.lexists(args.problems_file):  # a FIFO or a device: say what it is
            check_input_file(Path(args.problems_file), what="problems file", max_bytes=safeio.DATA_LIMIT)
        problems_file = find_problems_file(args.problems_file)
        check_input_file(problems_file, what="problems file", max_bytes=safeio.DATA_LIMIT)
        problems = select_problems(load_problems(problems_file), levels, ids)
    except (ValueError, FileNotFoundError) as exc:
        raise CliError(str(exc)) from exc
    if any(k > args.samples for k in ks):
        raise CliError(f"pass@k needs k <= --samples ({args.samples})")
    if not problems:
        raise CliError(
            f"no problems in {problems_file} match --level {args.level}"
            + (f" --problems {args.problems}" if args.problems else "")
        )
    if args.generations is not None and not args.generations.is_dir():
        raise CliError(f"{args.generations}: no such folder")
    return levels, ks, problems_file, problems


def _validate(
    args: argparse.Namespace,
    console: Any,
    pool: Any,
    generator: _Generator,
    todo: list[tuple[Any, int]],
    sink: Any,
) -> list[dict[str, Any]]:
    """Validate every (problem, sample) of ``todo`` on ``pool`` through ``validate_many`` (at most two per
    worker in flight; programs are generated or read only as room frees up); each record is appended to
    ``sink`` as it finishes (so an interrupted run resumes). Returns the records."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dice.validator import InvalidReference, Verdict
    from dice.validator.batch import BatchStats, BatchTask, validate_many
    from dice.validator.reference import check_reference

    records: list[dict[str, Any]] = []
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
        bar = progress.add_task("validating", total=len(todo))

        def record(meta: dict[str, Any], verdict: Verdict) -> None:
            rec = {**meta, "verdict": verdict.to_json()}
            sink.write(safeio.dumps_strict(rec) + "\n")
            sink.flush()
            records.append(rec)
            progress.advance(bar)
            progress.update(bar, description=f"L{meta['level']}/{meta['problem_id']}: {verdict.status}")

        def tasks() -> Iterator[BatchTask]:
            for problem, sample in todo:
                meta = {"level": problem.level, "problem_id": problem.problem_id, "name": problem.name}
                meta["sample"] = sample
                progress.update(bar, description=f"L{problem.level}/{problem.problem_id} sample {sample}")
                program, source, why = generator.program(problem, sample)
                meta["source"] = source
                if program is None:
                    record(meta, Verdict("compile_error", False, message=f"no program: {why}"))
                    continue
                try:
                    check_reference(problem.code)
                except InvalidReference as exc:
                    console.print(
                        f"[yellow]skipping level {problem.level} problem {problem.problem_id}: {exc}[/]"
                    )
                    progress.advance(bar)
                    continue
                yield BatchTask(
                    problem.code, program, strict=args.strict, timing=not args.no_timing, key=meta
                )

        stats = BatchStats()
        for task, verdict in validate_many(pool, tasks(), stats=stats):
            record(task.key, verdict)
    if stats.finished:
        console.print(f"validated: {stats.describe()}")
    return records


def _print_table(console: Any, summary: dict[str, Any], ks: list[int]) -> None:
    from rich.table import Table

    table = Table(title="KernelBench (% of samples, averaged per problem)")
    columns = [
        "problems",
        "samples",
        "compiled",
        "exec",
        "fast_1",
        "fast_2",
        *[f"pass@{k}" for k in ks],
        "geomean_speedup",
    ]
    table.add_column("level")
    for col in columns:
        header = {
            "problems": "probs",
            "samples": "n",
            "compiled": "comp",
            "exec": "Exec",
            "geomean_speedup": "gmean×",
        }
        table.add_column(header.get(col, col), justify="right")
    for name, row in summary.items():
        if name == "meta" or not row.get("problems"):
            continue
        cells = []
        for col in columns:
            value = row.get(col)
            if value is None:
                cells.append("-")
            elif col in ("problems", "samples"):
                cells.append(str(value))
            elif col == "geomean_speedup":
                cells.append(f"{value:.2f}×")
            else:
                cells.append(f"{value:.1f}")
        table.add_row(name, *cells)
    console.print(table)
