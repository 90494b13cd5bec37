"""``dice validate``: compile, check and time a candidate in isolated workers.

``dice validate FILE.cu`` compiles the device code (NVRTC; nvcc too for files with host code) and, with a
``dice-spec`` and a GPU, runs and times it. ``dice validate REF.py CANDIDATE.py`` applies the KernelBench
protocol. Exit codes: 0 compiled/correct, 1 the candidate failed (any other status), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dice.commands.common import CliError, print_json, read_text_file
from dice.commands.console import add_build_arguments, check_build_arguments


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="compile, check and time a .cu file or a KernelBench candidate",
        description=(
            "Validate FILE.cu (compile; with a dice-spec and a GPU: run against the reference and time it) "
            "or a KernelBench candidate against its reference (REF.py CANDIDATE.py). Candidates run in "
            "isolated worker processes. Exit code 0: compiled or correct; 1: the candidate failed; "
            "2: bad input."
        ),
    )
    parser.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="FILE.cu, or REF.py CANDIDATE.py (KernelBench format)",
    )
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.add_argument("--strict", action="store_true", help="KernelBench: allclose at 1e-4 instead of 1e-2")
    parser.add_argument("--no-timing", action="store_true", help="KernelBench: check correctness only")
    parser.add_argument("--compile-only", action="store_true", help=".cu: compile, do not run the dice-spec")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a run may take before its worker is killed (default 60)",
    )
    parser.add_argument(
        "--build-timeout",
        type=float,
        default=900.0,
        metavar="S",
        help="seconds a build may take (default 900; a cold load_inline build takes ~1 min)",
    )
    parser.add_argument("--log", action="store_true", help="print the full compiler/run log")
    add_build_arguments(parser)
    parser.set_defaults(func=run)


def _wait(future: Any, label: str, *, quiet: bool) -> Any:
    """The future's verdict, with a spinner on stderr while it runs (not for --json or off a terminal)."""
    if quiet or not sys.stderr.isatty():
        return future.result()
    from rich.console import Console

    with Console(stderr=True).status(label):
        return future.result()


def run(args: argparse.Namespace) -> int:
    from dice.validator import InvalidReference, ValidatorPool
    from dice.validator.build_flags import BuildOptions

    files: list[Path] = args.files
    if len(files) == 1:
        if files[0].suffix.lower() not in (".cu", ".cuh"):
            raise CliError(f"{files[0]}: expected a .cu/.cuh file, or two files REF.py CANDIDATE.py")
        text = read_text_file(files[0], what="CUDA source")
        check_build_arguments(args)
        with ValidatorPool(1, timeout_s=args.timeout, build_timeout_s=args.build_timeout) as pool:
            build = BuildOptions(
                compile_commands=args.compile_commands or None,
                include_paths=tuple(args.include_paths),
                defines=tuple(args.defines),
                workspace_root=str(Path.cwd()),
            )
            future = pool.submit_cu(
                text,
                run=not args.compile_only,
                filename=files[0].name,
                folder=files[0].resolve().parent,
                build=build,
            )
            verdict = _wait(future, f"validating {files[0].name}", quiet=args.json)
    elif len(files) == 2:
        ref_src = read_text_file(files[0], what="KernelBench reference")
        cand_src = read_text_file(files[1], what="candidate")
        with ValidatorPool(1, timeout_s=args.timeout, build_timeout_s=args.build_timeout) as pool:
            try:
                future = pool.submit_kernelbench(
                    ref_src, cand_src, strict=args.strict, timing=not args.no_timing
                )
            except InvalidReference as exc:
                raise CliError(f"{files[0]}: {exc}") from exc
            label = f"validating {files[1].name} (a first build of its extension can take a minute)"
            verdict = _wait(future, label, quiet=args.json or not pool.gpu)
    else:
        raise CliError("expected FILE.cu, or REF.py CANDIDATE.py")

    if args.json:
        print_json(verdict.to_json(), indent=2)
    else:
        from rich.console import Console

        console = Console(highlight=False)
        ok = verdict.status in ("correct", "compiled")
        style = "green" if ok else ("yellow" if verdict.status == "incorrect" else "red")
        console.print(f"[bold {style}]{verdict.status}[/] · {verdict.summary()}")
        if verdict.message:
            console.print(verdict.message, markup=False)
        if verdict.log and (args.log or verdict.status == "compile_error"):
            console.print(verdict.log, markup=False, style="dim")
    sys.stdout.flush()
    return 0 if verdict.status in ("correct", "compiled") else 1
