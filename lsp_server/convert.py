"""The one place the server turns the project's own positions, ranges and edits (``dice.cuda_source``) into
lsprotocol types and back: nothing below the language server knows lsprotocol."""

from __future__ import annotations

from lsprotocol import types

from dice.cuda_source import Position, Range, TextEdit


def lsp_position(pos: Position) -> types.Position:
    return types.Position(line=pos.line, character=pos.character)


def lsp_range(rng: Range | types.Range) -> types.Range:
    if isinstance(rng, types.Range):
        return rng
    return types.Range(start=lsp_position(rng.start), end=lsp_position(rng.end))


def lsp_edit(edit: TextEdit) -> types.TextEdit:
    return types.TextEdit(range=lsp_range(edit.range), new_text=edit.new_text)


def position_of(pos: types.Position) -> Position:
    return Position(pos.line, pos.character)
