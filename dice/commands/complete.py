"""``dice complete FILE.cu``: fill every mask of a CUDA file with validated, ranked candidates."""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dice.commands.common import (
    CliError,
    check_writable,
    print_json,
    read_text_and_stat,
    read_text_file,
    require_cuda_source,
    write_user_file,
)

if TYPE_CHECKING:
    from rich.console import Console

    from dice.assistant import AssistantSettings, DocumentCompletion
    from dice.cuda_source import CudaDocument


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from dice.commands.console import add_build_arguments, add_settings_arguments

    parser = subparsers.add_parser(
        "complete",
        help="fill the masks of a CUDA file with validated candidates",
        description=(
            "Fill every /* <MASK> */ of FILE with the DICE model, validate each candidate (compile always; "
            "run and time against the file's dice-spec when a GPU exists), rank them (compiled > correct > "
            "faster > confidence) and print a unified diff of the best fills."
        ),
    )
    parser.add_argument("file", type=Path, metavar="FILE", help=".cu or .cuh file with masks")
    add_settings_arguments(parser, count_flag="--candidates", count_default=3)
    add_build_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print every candidate with its verdict as JSON")
    parser.add_argument(
        "--write",
        action="store_true",
        help="rewrite FILE with the best fills (refused when nothing compiled)",
    )
    parser.add_argument("--force", action="store_true", help="with --write: write even if nothing compiled")
    parser.set_defaults(func=run)


def _lines(text: str) -> list[str]:
    # split on "\n" only: str.splitlines would also split on \x0b, \x1c, U+2028... and misnumber the hunks
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def unified_diff(path: Path, before: str, after: str) -> str:
    # git's a/ b/ prefixes for relative paths (so `git apply` / `patch -p1` take it); absolute paths as is
    old, new = (str(path), str(path)) if path.is_absolute() else (f"a/{path}", f"b/{path}")
    lines = difflib.unified_diff(_lines(before), _lines(after), fromfile=old, tofile=new)
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def run(args: argparse.Namespace) -> int:
    from dice.commands.console import (
        check_build_arguments,
        check_model_path,
        settings_from_args,
        stderr_console,
    )
    from dice.cuda_source import parse_document

    console = stderr_console(args.quiet)
    path: Path = args.file
    require_cuda_source(path)
    text, read_stat = read_text_and_stat(path, what="CUDA source")
    doc = parse_document(text)
    if not doc.masks:
        if args.json:
            empty = {"file": str(path), "model": None, "masks": [], "best_verdict": None}
            print_json({**empty, "partial": False, "from_cache": False}, indent=2)
        console.print(f"No masks in {path}: nothing to fill (a mask is a comment such as /* <MASK> */).")
        return 0
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    problem = check_model_path(settings)
    if problem:
        raise CliError(problem)
    if args.force and not args.write:
        raise CliError("--force only makes sense with --write")
    check_build_arguments(args)
    if args.write:
        check_writable(path)
    result = _fill(args, console, settings, path, text, doc)
    _report(console, result)
    if args.json:
        print_json({"file": str(path), **result.to_json()}, indent=2, ensure_ascii=False)
    best_text = _keep_line_endings(text, result)
    if args.write:
        _write(console, settings, path, text, best_text, result, force=args.force, read_stat=read_stat)
    elif not args.json:
        if best_text == text:
            console.print(
                "No mask got a usable fill: nothing to change (try more --candidates or a larger model)."
            )
        sys.stdout.write(unified_diff(path, text, best_text))
    # exit 1 when no mask got a fill the editor would show (dice.assistant.rules.usable): scripts can tell
    return 0 if _any_usable(result, settings) else 1


def _any_usable(result: DocumentCompletion, settings: AssistantSettings) -> bool:
    from dice.assistant.rules import usable

    return any(
        mc.best is not None and usable(mc.best.verdict, settings.validation_level) for mc in result.masks
    )


def _keep_line_endings(text: str, result: DocumentCompletion) -> str:
    """The best text with the fills' line breaks written as the file writes its own: a fill the model wrote
    with ``\n`` goes into a CRLF file as ``\r\n`` (the rest of the file is unchanged)."""
    if "\r\n" not in text or not any("\n" in e.new_text for e in result.edits):
        return result.best_text
    from dice.cuda_source import PositionIndex

    index = PositionIndex(text)
    spans = sorted(
        (index.position_to_byte(e.range.start), index.position_to_byte(e.range.end), e.new_text)
        for e in result.edits
    )
    out, cursor = [], 0
    for start, end, new in spans:
        crlf = new.replace("\r\n", "\n").replace("\n", "\r\n")
        out += [index.data[cursor:start], crlf.encode("utf-8", "surrogatepass")]
        cursor = end
    out.append(index.data[cursor:])
    return b"".join(out).decode("utf-8", "surrogatepass")


def _fill(
    args: argparse.Namespace,
    console: Console,
    settings: AssistantSettings,
    path: Path,
    text: str,
    doc: CudaDocument,
) -> DocumentCompletion:
    """Load the model, say what will be checked, fill every mask."""
    from dice.assistant import AssistantService
    from dice.commands.console import ProgressDisplay
    from engine.errors import RemoteError

    with AssistantService(settings) as service:
        try:
            with console.status("Loading the model…", spinner="dots"):
                info = asyncio.run(service.load())
        except Exception as exc:  # a bad checkpoint is the user's input: say what is wrong, no traceback
            raise CliError(f"cannot load the model: {exc}") from exc
        console.print(f"Model: {info.describe()}")
        if settings.validation_level == "run":
            if not service.gpu:
                console.print("No CUDA GPU: candidates are compile-checked only (not run, not timed).")
            elif doc.spec is None:
                console.print(f"No dice-spec in {path}: candidates are compile-checked only.")
        elif settings.validation_level == "none":
            console.print("Validation is off: candidates are not compiled.")
        plural = "s" if len(doc.masks) != 1 else ""
        console.print(
            f"Filling {len(doc.masks)} mask{plural} in {path}, {settings.candidates} candidate"
            f"{'s' if settings.candidates != 1 else ''} each."
        )
        with ProgressDisplay(console, enabled=not args.quiet) as display:
            try:
                return asyncio.run(service.complete_document(text, progress=display, filename=path))
            except RemoteError as exc:  # the model server went away or refused the request
                raise CliError(str(exc)) from exc
            except ValueError as exc:  # e.g. a dice-spec reference too long for the model's context
                raise CliError(f"{path}: {exc}") from exc


def _report(console: Console, result: DocumentCompletion) -> None:
    from dice.validator.verdict import first_line, verdict_label

    for mc in result.masks:
        best = mc.best
        where = f"line {mc.mask.range.start.line + 1}"
        if mc.mask.function:
            where += f" in {mc.mask.function}"
        if best is None:
            console.print(
                f"  mask {mc.mask.index} ({where}): no candidate (every fill was blank or only "
                "a comment), left as is"
            )
            continue
        console.print(
            f"  mask {mc.mask.index} ({where}): {verdict_label(best.verdict)} · confidence "
            f"{best.confidence:.2f} · {len(mc.candidates)} candidate(s)"
        )
    if len(result.masks) > 1 and result.best_verdict is not None:
        console.print(f"  all fills together: {verdict_label(result.best_verdict)}")
    if result.best_verdict is not None and not result.best_verdict.compiled:
        console.print(f"  {first_line(result.best_verdict.message)}")
    if result.partial:
        console.print("The latency budget ran out: some candidates were not validated.")
    stats = result.stats
    if stats:
        dropped = int(stats.get("duplicates", 0))
        blank = int(stats.get("empty_fills", 0))
        extra = "".join(
            f"; {k} {what}{'s' if k != 1 else ''} dropped"
            for k, what in ((dropped, "duplicate candidate"), (blank, "blank fill"))
            if k
        )
        console.print(
            f"Generated in {stats.get('generate_s', 0):.2f}s, validated in "
            f"{stats.get('validate_s', 0):.2f}s ({int(stats.get('steps', 0))} denoising steps{extra})."
        )


def _write(
    console: Console,
    settings: AssistantSettings,
    path: Path,
    text: str,
    best_text: str,
    result: DocumentCompletion,
    *,
    force: bool,
    read_stat: os.stat_result | None = None,
) -> None:
    """``--write``: only fills that are usable (``dice.assistant.rules.usable``, as the editor shows them)
    unless ``--force``, and never over an edit made on disk meanwhile (``text`` is what DICE read, compared
    again with the file right before writing; ``read_stat``, the stat of that read, is compared by the
    writer). The writer keeps symlinks, hard links, owner and mode (``dice.safeio.write_user_file``)."""
    from dice.assistant.rules import usable
    from dice.validator.verdict import verdict_label

    if not any(mc.candidates for mc in result.masks):
        raise CliError(f"not writing {path}: the model produced no usable fill", code=1)
    verdict = result.best_verdict
    if not usable(verdict, settings.validation_level) and not force:
        why = (
            "no candidate combination compiled"
            if verdict is None or not verdict.compiled
            else f"the best fills together are {verdict_label(verdict)}"
        )
        raise CliError(
            f"not writing {path}: {why}; pass --force to write the best-ranked fills anyway", code=1
        )
    if read_text_file(path, what="CUDA source") != text:
        raise CliError(f"{path} changed on disk while DICE was working; not writing (run it again)", code=1)
    write_user_file(path, best_text, expected_stat=read_stat)
    plural = "s" if len(result.masks) != 1 else ""
    console.print(f"Wrote {path} ({len(result.masks)} mask{plural} filled).")
