"""Filled regions: text the server inserted (by command or an accepted suggestion) and its verdict, shown as
a code lens and on hover. Regions follow later edits by finding their text again; a region whose text is
gone is dropped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lsprotocol import types

from dice.validator import Verdict
from dice.validator.verdict import verdict_label
from lsp_server.verdicts import verdict_json

ToPosition = Callable[[int], types.Position]  # byte offset -> LSP position


@dataclass(frozen=True)
class FilledRegion:
    start_byte: int
    text: str  # the inserted text; located again after edits
    label: str
    verdict: dict[str, Any] | None

    @property
    def end_byte(self) -> int:
        return self.start_byte + len(self.text.encode("utf-8"))


def make_region(start_byte: int, text: str, verdict: Verdict | None) -> FilledRegion:
    return FilledRegion(start_byte, text, verdict_label(verdict), verdict_json(verdict) or None)


def relocate(regions: Sequence[FilledRegion], data: bytes) -> list[FilledRegion]:
    """Regions moved to where their text now is (the occurrence nearest the old place), others dropped."""
    out: list[FilledRegion] = []
    for region in regions:
        needle = region.text.encode("utf-8")
        if not needle.strip():
            continue
        if data[region.start_byte : region.start_byte + len(needle)] == needle:
            out.append(region)
            continue
        best = None
        at = data.find(needle)
        while at != -1:
            if best is None or abs(at - region.start_byte) < abs(best - region.start_byte):
                best = at
            at = data.find(needle, at + 1)
        if best is not None:
            out.append(replace(region, start_byte=best))
    return out


def code_lenses(regions: Sequence[FilledRegion], to_position: ToPosition) -> list[types.CodeLens]:
    lenses = []
    for region in regions:
        start = to_position(region.start_byte)
        lenses.append(
            types.CodeLens(
                range=types.Range(start=start, end=start),
                # An empty command id: clients show the title without making it clickable.
                command=types.Command(title=f"DICE: {region.label}", command=""),
            )
        )
    return lenses


def hover_at(
    regions: Sequence[FilledRegion], byte_offset: int, to_position: ToPosition
) -> types.Hover | None:
    for region in regions:
        if region.start_byte <= byte_offset <= region.end_byte:
            lines = [f"**DICE** — {region.label}"]
            v = region.verdict or {}
            for key, name in (("ref_ms", "reference"), ("new_ms", "this kernel")):
                if isinstance(v.get(key), (int, float)):
                    lines.append(f"- {name}: {v[key]:.3f} ms")
            if v.get("message"):
                lines.append(f"- {v['message']}")
            return types.Hover(
                contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n".join(lines)),
                range=types.Range(start=to_position(region.start_byte), end=to_position(region.end_byte)),
            )
    return None
