"""Put fills in place of masks: the new text plus the minimal LSP edits that turn the old text into it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dice.cuda_source.document import CudaDocument, parse_document
from dice.cuda_source.positions import Range, decode_bytes, encode_text


@dataclass(frozen=True)
class TextEdit:
    """Replace ``range`` (LSP form: 0-based lines, UTF-16 characters, end exclusive) by ``new_text``: the
    shape of an LSP ``TextEdit``, which the language server converts it to."""

    range: Range
    new_text: str

    def to_json(self) -> dict[str, Any]:
        return {"range": self.range.to_json(), "newText": self.new_text}


@dataclass(frozen=True)
class SpliceResult:
    """``text`` is the spliced document; ``edits`` (ranges in the *original* text, non-overlapping, in file
    order) produce it when applied together, as one LSP ``WorkspaceEdit`` or ``TextEdit[]`` is."""

    text: str
    edits: list[TextEdit]


def splice(text: str, fills: Mapping[int, str], *, doc: CudaDocument | None = None) -> SpliceResult:
    """Replace mask ``i`` (its comment, see :class:`~dice.cuda_source.document.Mask`) by ``fills[i]``.

    Masks without a fill, and every other byte, are left byte-identical. Each edit covers only what
    differs between a mask's comment and its fill (common prefix/suffix trimmed, never splitting a CRLF),
    and a fill equal to its comment gives no edit. ``doc`` may be passed when ``text`` is already parsed.
    Raises ``ValueError`` for a fill whose index is not a mask of ``text`` or whose value is not a string.
    """
    if doc is None or doc.text != text:
        doc = parse_document(text)
    masks = {mask.index: mask for mask in doc.masks}
    for key, value in fills.items():
        if key not in masks:
            known = f"0-{len(masks) - 1}" if masks else "none"
            raise ValueError(f"no mask with index {key!r} in this text (mask indices: {known})")
        if not isinstance(value, str):
            raise ValueError(f"the fill for mask {key} is {type(value).__name__}, not str")
    data = doc.data
    pieces: list[bytes] = []
    edits: list[TextEdit] = []
    cursor = 0
    for index in sorted(fills):
        mask = masks[index]
        fill = encode_text(fills[index])
        pieces.append(data[cursor : mask.start_byte])
        pieces.append(fill)
        cursor = mask.end_byte
        edit = _minimal_edit(data, mask.start_byte, mask.end_byte, fill)
        if edit is not None:
            start, end, new = edit
            edits.append(TextEdit(range=doc.index.range_of(start, end), new_text=decode_bytes(new)))
    pieces.append(data[cursor:])
    return SpliceResult(text=decode_bytes(b"".join(pieces)), edits=edits)


def _minimal_edit(data: bytes, start: int, end: int, fill: bytes) -> tuple[int, int, bytes] | None:
    """Trim the common prefix and suffix of ``data[start:end]`` and ``fill`` at character boundaries."""
    old = data[start:end]
    if old == fill:
        return None
    prefix = 0
    limit = min(len(old), len(fill))
    while prefix < limit and old[prefix] == fill[prefix]:
        prefix += 1
    prefix = _char_boundary(old, prefix)
    suffix = 0
    limit -= prefix
    while suffix < limit and old[len(old) - 1 - suffix] == fill[len(fill) - 1 - suffix]:
        suffix += 1
    # Move the suffix start forward to a character boundary (it is shared by both strings).
    while suffix > 0 and (old[len(old) - suffix] & 0xC0) == 0x80:
        suffix -= 1
    # An edit boundary between CR and LF would leave a position that LSP clients read differently.
    absolute_start = start + prefix
    if (
        prefix > 0
        and data[absolute_start - 1 : absolute_start] == b"\r"
        and old[prefix : prefix + 1] == b"\n"
    ):
        prefix -= 1
    absolute_end = end - suffix
    if (
        suffix > 0
        and data[absolute_end : absolute_end + 1] == b"\n"
        and old[len(old) - suffix - 1 : len(old) - suffix] == b"\r"
    ):
        suffix -= 1
    return start + prefix, end - suffix, fill[prefix : len(fill) - suffix]


def _char_boundary(data: bytes, offset: int) -> int:
    """Largest offset <= ``offset`` that does not fall inside a UTF-8 sequence."""
    while 0 < offset < len(data) and (data[offset] & 0xC0) == 0x80:
        offset -= 1
    return offset
