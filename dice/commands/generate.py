"""``dice generate REF.py``: a whole ``ModelNew`` CUDA program for a KernelBench-format PyTorch reference."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from dice.assistant.settings import PROGRAM_MAX_NEW_TOKENS
from dice.commands.common import CliError, check_writable, print_json, write_user_file


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from dice.commands.console import add_settings_arguments

    parser = subparsers.add_parser(
        "generate",
        help="generate a CUDA ModelNew for a KernelBench-format PyTorch reference",
        description=(
            "Prompt the DICE model with the KernelBench one-shot prompt for REF.py (a PyTorch Model with "
            "get_inputs/get_init_inputs), draw N samples, validate each with the KernelBench protocol and "
            "write the best one to --out with its verdict as a header comment."
        ),
    )
    parser.add_argument("ref", type=Path, metavar="REF.py", help="KernelBench-format PyTorch reference")
    add_settings_arguments(parser, count_flag="--samples", count_default=4)
    parser.set_defaults(max_new_tokens=PROGRAM_MAX_NEW_TOKENS)  # a whole program, not a fill
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="where to write the best program (default: REF_dice.py beside REF.py)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.add_argument("--json", action="store_true", help="print every sample with its verdict as JSON")
    parser.set_defaults(func=run)


def check_reference(path: Path, source: str) -> None:
    """CliError unless ``source`` is a KernelBench-format reference (``dice.validator.reference``)."""
    from dice.validator.reference import InvalidReference
    from dice.validator.reference import check_reference as check

    try:
        check(source)
    except InvalidReference as exc:
        raise CliError(f"{path}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    from dice.assistant.rules import program_with_header, usable
    from dice.commands.common import read_text_file
    from dice.commands.console import (
        ProgressDisplay,
        check_model_path,
        settings_from_args,
        stderr_console,
    )
    from dice.validator.verdict import first_line, verdict_label

    console = stderr_console(args.quiet)
    ref: Path = args.ref
    source = read_text_file(ref, what="KernelBench reference")
    check_reference(ref, source)
    out: Path = args.out or ref.with_name(f"{ref.stem}_dice.py")
    if out.resolve() == ref.resolve():
        raise CliError(f"--out {out} is the reference itself; choose another file")
    if os.path.lexists(out) and not args.force:
        raise CliError(f"{out} exists; pass --force to overwrite it or choose another --out")
    if not out.parent.is_dir():
        raise CliError(f"{out.parent}: no such folder for --out")
    check_writable(out, exclusive=not args.force)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    problem = check_model_path(settings)
    if problem:
        raise CliError(problem)

    from dice.assistant import AssistantService
    from engine.errors import RemoteError

    with AssistantService(settings) as service:
        try:
            with console.status("Loading the model…", spinner="dots"):
                info = asyncio.run(service.load())
        except Exception as exc:
            raise CliError(f"cannot load the model: {exc}") from exc
        console.print(f"Model: {info.describe()}")
        if settings.validation_level == "run" and not service.gpu:
            console.print("No CUDA GPU: samples are compile-checked only (not run, not timed).")
        console.print(
            f"Generating {settings.candidates} sample{'s' if settings.candidates != 1 else ''} for {ref}."
        )
        with ProgressDisplay(console, enabled=not args.quiet) as display:
            try:
                programs = asyncio.run(
                    service.generate_kernel(source, max_new_tokens=args.max_new_tokens, progress=display)
                )
            except RemoteError as exc:  # the model server went away or refused the request
                raise CliError(str(exc)) from exc
            except ValueError as exc:  # the validator's reference check, or a prompt too long for the model
                raise CliError(f"{ref}: {exc}") from exc

    if not programs:
        raise CliError("the model produced no program", code=1)
    for i, program in enumerate(programs):
        console.print(f"  #{i + 1}: {verdict_label(program.verdict)} · confidence {program.confidence:.2f}")
    best = programs[0]
    if args.json:
        print_json(
            {
                "reference": str(ref),
                "out": str(out),
                "model": info.to_json(),
                "samples": [p.to_json() for p in programs],
            },
            indent=2,
            ensure_ascii=False,
        )
    text = program_with_header(best.source, best.verdict, reference_name=ref.name, model=info.describe())
    # without --force, a file that appeared at --out meanwhile is refused, never replaced
    write_user_file(out, text, exclusive=not args.force)
    console.print(f"Wrote the best sample to {out}.")
    if not usable(best.verdict, settings.validation_level):
        message = first_line(best.verdict.message) if best.verdict is not None else ""
        console.print(f"No usable sample ({verdict_label(best.verdict)}){': ' + message if message else ''}.")
        return 1
    return 0
