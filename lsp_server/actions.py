"""Code actions and the command ids they run (fixed in docs/INTERNALS.md), plus command-argument parsing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lsprotocol import types

from dice.cuda_source import Mask
from lsp_server.convert import lsp_range

FILL_ALL_MASKS = "dice.fillAllMasks"
FILL_MASK = "dice.fillMask"
GENERATE_KERNEL = "dice.generateKernel"
VALIDATE_KERNEL = "dice.validateKernel"
SERVER_COMMANDS = (FILL_ALL_MASKS, FILL_MASK, GENERATE_KERNEL, VALIDATE_KERNEL)

SOURCE_KIND = "source.dice"


def _overlaps(a: types.Range, b: types.Range) -> bool:
    return (a.start.line, a.start.character) <= (b.end.line, b.end.character) and (
        b.start.line,
        b.start.character,
    ) <= (a.end.line, a.end.character)


def cuda_actions(uri: str, masks: Sequence[Mask], rng: types.Range) -> list[types.CodeAction]:
    """Actions for a .cu/.cuh document: fill the mask under the range, fill all, validate."""
    actions: list[types.CodeAction] = []
    for mask in masks:
        mask_range = lsp_range(mask.range)
        if _overlaps(mask_range, rng):
            at = {"line": mask_range.start.line, "character": mask_range.start.character}
            actions.append(
                types.CodeAction(
                    title="DICE: Fill this mask",
                    kind=types.CodeActionKind.RefactorRewrite,
                    command=types.Command(
                        title="DICE: Fill this mask", command=FILL_MASK, arguments=[uri, at]
                    ),
                )
            )
            break
    if masks:
        actions.append(
            types.CodeAction(
                title=f"DICE: Fill all masks ({len(masks)})",
                kind=f"{SOURCE_KIND}.fillAllMasks",
                command=types.Command(title="DICE: Fill all masks", command=FILL_ALL_MASKS, arguments=[uri]),
            )
        )
    actions.append(
        types.CodeAction(
            title="DICE: Validate this kernel",
            kind=f"{SOURCE_KIND}.validateKernel",
            command=types.Command(
                title="DICE: Validate this kernel", command=VALIDATE_KERNEL, arguments=[uri]
            ),
        )
    )
    return actions


def reference_actions(uri: str) -> list[types.CodeAction]:
    """Actions for a KernelBench-format PyTorch reference (.py)."""
    title = "DICE: Generate CUDA kernel from this PyTorch reference"
    return [
        types.CodeAction(
            title=title,
            kind=f"{SOURCE_KIND}.generateKernel",
            command=types.Command(title=title, command=GENERATE_KERNEL, arguments=[uri]),
        )
    ]


def filter_kinds(actions: list[types.CodeAction], only: Sequence[str] | None) -> list[types.CodeAction]:
    """Honour ``CodeActionContext.only``: a kind matches itself and its sub-kinds."""
    if not only:
        return actions
    wanted = [str(k) for k in only]
    return [a for a in actions if any(str(a.kind) == k or str(a.kind).startswith(k + ".") for k in wanted)]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class CommandArgumentError(ValueError):
    """A command was called with arguments it cannot use; the message is shown to the user."""


@dataclass(frozen=True)
class CommandTarget:
    uri: str
    position: types.Position | None = None


def parse_arguments(command: str, args: Sequence[Any] | None) -> CommandTarget:
    """``[uri]`` or ``[uri, {line, character}]`` (``dice.fillMask``), leniently: a dict with ``uri``,
    a TextDocumentIdentifier-shaped dict, or a Position-shaped dict all work."""
    args = list(args or [])
    if not args:
        raise CommandArgumentError(f"{command}: expected the document uri as the first argument")
    first = args[0]
    if isinstance(first, dict):
        uri = first.get("uri") or (first.get("textDocument") or {}).get("uri")
    else:
        uri = first
    if not isinstance(uri, str) or not uri:
        raise CommandArgumentError(f"{command}: the first argument must be a document uri, got {first!r}")
    position = None
    if command == FILL_MASK:
        raw = args[1] if len(args) > 1 else (first.get("position") if isinstance(first, dict) else None)
        if not isinstance(raw, dict):
            raise CommandArgumentError(
                f"{command}: expected a position {{line, character}} as the second argument"
            )
        line, character = raw.get("line"), raw.get("character")
        if not (isinstance(line, int) and isinstance(character, int) and _count(line) and _count(character)):
            raise CommandArgumentError(f"{command}: bad position {raw!r}")
        position = types.Position(line=line, character=character)
    return CommandTarget(uri=uri, position=position)
