"""``dice masks FILE``: list the masks of a CUDA file (no model involved)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dice.commands.common import print_json, read_text_file, require_cuda_source
from dice.cuda_source import CudaDocument, parse_document


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "masks",
        help="list the /* <MASK> */ holes of a CUDA file",
        description=(
            "List every mask (/* <MASK> */, // <MASK:N>) of FILE in file order with its range, token budget "
            "and enclosing function. --json prints the list the editor integration uses: LSP ranges "
            "(0-based lines, UTF-16 characters); the table shows 1-based line:column."
        ),
    )
    parser.add_argument("file", type=Path, metavar="FILE", help=".cu or .cuh file")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per mask")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_cuda_source(args.file)
    doc = parse_document(read_text_file(args.file, what="CUDA source"))
    if args.json:
        print_json([mask.to_json() for mask in doc.masks], indent=2, ensure_ascii=False)
    else:
        print_table(args.file, doc)
    return 0


def print_table(path: Path, doc: CudaDocument) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    if not doc.masks:
        console.print(f"{path}: no masks")
    else:
        table = Table(
            title=f"{path}: {len(doc.masks)} mask{'s' if len(doc.masks) != 1 else ''}", title_justify="left"
        )
        table.add_column("#", justify="right")
        table.add_column("start", justify="right")
        table.add_column("end", justify="right")
        table.add_column("budget", justify="right")
        table.add_column("kind")
        table.add_column("function")
        for mask in doc.masks:
            start, end = mask.range.start, mask.range.end
            table.add_row(
                str(mask.index),
                f"{start.line + 1}:{start.character + 1}",
                f"{end.line + 1}:{end.character + 1}",
                str(mask.budget) if mask.budget is not None else "-",
                mask.kind or "-",
                mask.function or "(not in a function)",
            )
        console.print(table)
    if doc.spec is not None:
        first, last = doc.spec.range.start.line + 1, doc.spec.range.end.line + 1
        console.print(f"dice-spec: lines {first}-{last} (candidates are run and timed against it)")
    else:
        console.print("dice-spec: none (candidates are compile-checked only)")
    for bad in doc.malformed_masks:
        start = bad.range.start
        console.print(
            f"warning: {path}:{start.line + 1}:{start.character + 1}: {bad.text!r} is not a mask: "
            f"{bad.reason}"
        )
    if doc.has_errors:
        console.print("note: the file has syntax errors; masks outside a parsable function show no function")
