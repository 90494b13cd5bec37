"""``dice cuke build``: rebuild a CuKe-style dataset (validated PyTorch->CUDA pairs, task files) from any
pairs a user has; see ``training/cuke`` and ``docs/CUKE.md``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dice.commands.common import CliError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cuke", help="build the CuKe dataset and the BiC-RL task sets")
    sub = parser.add_subparsers(dest="cuke_command", metavar="STAGE", required=True)
    b = sub.add_parser(
        "build",
        help="read, validate (GPU: correct and fast; --no-gpu: compile only), dedup, split, write tasks",
        description=(
            "Every kept pair is validated here (never trusted from its source). GPU: correct under the full "
            "protocol and >= --min-speedup faster than eager PyTorch, timed live; --no-gpu: Python syntax, "
            "static guards and NVRTC only, said so in the card. Killed builds resume (OUT/cache)."
        ),
    )
    b.add_argument(
        "--source", type=Path, action="append", required=True, help="a file or folder (repeatable)"
    )
    b.add_argument("--out", type=Path, required=True, help="output folder")
    b.add_argument("--format", default=None, help="the sources' format (default: detected per source)")
    b.add_argument("--min-speedup", type=float, default=2.0, help="keep pairs at least this much faster")
    b.add_argument("--holdout-fraction", type=float, default=0.1, help="KernelBench problems held out")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--teacher", default=None, help="URL of an OpenAI-compatible server, or a checkpoint folder"
    )
    b.add_argument(
        "--no-gpu", action="store_true", help="validate by compiling only (no correctness, no speed)"
    )
    b.add_argument("--limit", type=int, default=None, help="read at most N records per source")
    b.add_argument("--strict", action="store_true", help="tolerance 1e-4 instead of 1e-2")
    b.add_argument("--workers", type=int, default=None, help="validator workers (default: the pool's)")
    b.add_argument(
        "--shape-variants",
        type=int,
        default=4,
        metavar="N",
        help="re-pose each kept pair at up to N other input shapes, each validated (GPU only; 0: none)",
    )
    b.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop validating after this long and write what is done (the card says partial); "
        "the same command again resumes from OUT/cache",
    )
    b.add_argument(
        "--timing-cutoff",
        type=float,
        default=None,
        metavar="F",
        help="end a candidate's timing after its 10 pilot rounds when it is below F times eager PyTorch "
        "(default: half of --min-speedup; 0: time every candidate in full); never keeps a pair",
    )
    b.add_argument(
        "--order",
        choices=("claimed", "file"),
        default="claimed",
        help="validation order: pairs whose source claims >= --min-speedup first (default), or as read",
    )
    b.add_argument("--cu-holes-per-file", type=int, default=3)
    b.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    from training.cuke import readers
    from training.cuke.build import BuildConfig, build
    from training.cuke.records import ReadError

    for src in args.source:
        if not src.exists():
            raise CliError(f"{src}: no such file or folder")
    if args.format is not None and args.format not in readers.FORMATS:
        raise CliError(f"unknown --format {args.format!r} (use one of {', '.join(readers.FORMATS)})")
    if args.min_speedup <= 0:
        raise CliError("--min-speedup must be > 0")
    if args.shape_variants < 0:
        raise CliError("--shape-variants must be >= 0")
    if args.timing_cutoff is not None and not 0 <= args.timing_cutoff <= args.min_speedup:
        raise CliError("--timing-cutoff must be between 0 and --min-speedup")
    if args.time_budget is not None and args.time_budget <= 0:
        raise CliError("--time-budget must be > 0 seconds")
    if not 0 <= args.holdout_fraction < 1:
        raise CliError("--holdout-fraction must be in [0, 1)")
    if not args.no_gpu:
        import torch

        if not torch.cuda.is_available():
            raise CliError(
                "no CUDA GPU here: pass --no-gpu to validate by compiling only (said so in the card)"
            )
    cfg = BuildConfig(
        sources=list(args.source),
        out=args.out,
        fmt=args.format,
        min_speedup=args.min_speedup,
        holdout_fraction=args.holdout_fraction,
        seed=args.seed,
        teacher=args.teacher,
        no_gpu=args.no_gpu,
        limit=args.limit,
        strict=args.strict,
        workers=args.workers,
        cu_holes_per_file=args.cu_holes_per_file,
        shape_variants=args.shape_variants,
        time_budget_s=args.time_budget,
        timing_cutoff=args.timing_cutoff,
        order=args.order,
        command="dice " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["cuke"] else "dice cuke build",
    )
    try:
        rep = build(cfg)
    except ReadError as exc:
        raise CliError(str(exc)) from exc
    print(f"wrote {args.out}: " + ", ".join(f"{k} {v}" for k, v in rep.tasks.items()))
    return 0
