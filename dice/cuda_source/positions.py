"""LSP positions (line, UTF-16 code unit) and their conversion to and from UTF-8 byte offsets.

Tree-sitter speaks UTF-8 bytes; LSP speaks lines and UTF-16 code units. :class:`PositionIndex` is the one
place where the two meet, so every range the package hands out is converted the same way.

The byte encoding of a text is always :func:`encode_text` (UTF-8; lone surrogates, which a ``str`` can hold
but UTF-8 cannot, are kept as 3-byte sequences so that offsets stay consistent instead of raising).
Line breaks follow the LSP specification: ``\\n``, ``\\r\\n`` and a lone ``\\r``.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def encode_text(text: str) -> bytes:
    """The UTF-8 bytes every byte offset in this package refers to."""
    return text.encode("utf-8", "surrogatepass")


def decode_bytes(data: bytes) -> str:
    """Inverse of :func:`encode_text` for bytes it produced; invalid UTF-8 becomes U+FFFD."""
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace")


def utf16_length(text: str) -> int:
    """Number of UTF-16 code units of ``text``: characters outside the BMP count twice."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


@dataclass(frozen=True, order=True)
class Position:
    """An LSP position: 0-based line and 0-based UTF-16 code unit offset within the line."""

    line: int
    character: int

    def to_json(self) -> dict[str, int]:
        return {"line": self.line, "character": self.character}

    @classmethod
    def of(cls, position: Any) -> Position:
        """From anything with ``line`` and ``character`` (an LSP position of any library)."""
        return cls(int(position.line), int(position.character))


@dataclass(frozen=True)
class Range:
    """An LSP range; ``end`` is exclusive."""

    start: Position
    end: Position

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start.to_json(), "end": self.end.to_json()}

    @classmethod
    def of(cls, rng: Any) -> Range:
        """From anything with ``start`` and ``end`` positions (an LSP range of any library)."""
        return cls(Position.of(rng.start), Position.of(rng.end))


class PositionIndex:
    """Converts between byte offsets (in :func:`encode_text` of ``text``) and LSP positions.

    Building the index is one pass over the bytes (line starts only); each conversion costs a binary search
    plus the length of one line, so a 5 MB file stays cheap.
    """

    def __init__(self, text: str | bytes) -> None:
        self.data: bytes = text if isinstance(text, bytes) else encode_text(text)
        # line_starts[i] = byte offset where line i begins; content_ends[i] = where its line break begins.
        self.line_starts: list[int] = [0]
        self._content_ends: list[int] = []
        for match in _LINE_BREAK.finditer(self.data):
            self._content_ends.append(match.start())
            self.line_starts.append(match.end())
        self._content_ends.append(len(self.data))

    @property
    def line_count(self) -> int:
        return len(self.line_starts)

    def line_of_byte(self, byte_offset: int) -> int:
        """0-based line containing ``byte_offset`` (clamped to the text)."""
        byte_offset = min(max(byte_offset, 0), len(self.data))
        return bisect.bisect_right(self.line_starts, byte_offset) - 1

    def line_text(self, line: int) -> str:
        """The text of ``line`` without its line break."""
        return decode_bytes(self.data[self.line_starts[line] : self._content_ends[line]])

    def byte_to_position(self, byte_offset: int) -> Position:
        """LSP position of ``byte_offset``; an offset inside a character or a CRLF pair snaps backwards."""
        byte_offset = min(max(byte_offset, 0), len(self.data))
        line = self.line_of_byte(byte_offset)
        start = self.line_starts[line]
        end = min(byte_offset, self._content_ends[line])
        segment = self.data[start:end]
        if segment.isascii():
            return Position(line, len(segment))
        # Drop a trailing partial UTF-8 sequence (continuation bytes 0b10xxxxxx and their lead byte).
        cut = len(segment)
        while cut > 0 and (segment[cut - 1] & 0xC0) == 0x80:
            cut -= 1
        if cut > 0 and segment[cut - 1] >= 0xC0:
            lead = segment[cut - 1]
            need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            if len(segment) - (cut - 1) < need:
                segment = segment[: cut - 1]
        return Position(line, utf16_length(decode_bytes(segment)))

    def position_to_byte(self, position: Position | Any) -> int:
        """Byte offset of an LSP position; lines and characters past the end clamp to it (as LSP says)."""
        line, character = position.line, position.character
        if line < 0:
            return 0
        if line >= len(self.line_starts):
            return len(self.data)
        start, end = self.line_starts[line], self._content_ends[line]
        if character <= 0:
            return start
        segment = self.data[start:end]
        if segment.isascii():
            return start + min(character, len(segment))
        units = 0
        offset = start
        for ch in decode_bytes(segment):
            width = 2 if ord(ch) > 0xFFFF else 1
            if units + width > character:
                # Inside a surrogate pair: snap to the character's start.
                break
            units += width
            offset += len(encode_text(ch))
            if units == character:
                break
        return min(offset, end)

    def range_of(self, start_byte: int, end_byte: int) -> Range:
        return Range(self.byte_to_position(start_byte), self.byte_to_position(end_byte))
