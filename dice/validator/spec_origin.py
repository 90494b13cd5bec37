"""Specs come only from the user: which ``dice-spec`` a spliced candidate is run against, and the rule that
no fill may change it.

The spec is Python the validator executes, so a model fill must never supply or alter it. The caller
fingerprints the file as the user wrote it, before any splice (:func:`spec_origin`); the validator runs
that fingerprint's source and never re-reads a spec from the spliced text. It still parses the spliced
text, to refuse a fill that would change which spec the file shows (:func:`spec_change`): one more
``dice-spec`` marker (a block of its own, a second marker anywhere), a different first spec (a comment
opened or closed around the user's block), or a preprocessor conditional or definition newly around it
(``#if 0``). Such a candidate is ``rejected`` with the flag :data:`FLAG_FILL_CHANGES_SPEC`, before anything
is compiled or executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dice.validator.runtime_guards import rejected

if TYPE_CHECKING:
    from dice.cuda_source import CudaDocument
    from dice.validator.verdict import Verdict

FLAG_FILL_CHANGES_SPEC = "fill_changes_spec"
SPEC_MARKER = "dice-spec"


@dataclass(frozen=True)
class SpecOrigin:
    """The user's spec, as parsed from the file before the splice. ``source``: the spec's Python (None: the
    user's file has no spec); ``markers``: how often ``dice-spec`` occurs outside mask comments (a mask
    the fills replace may mention it); ``raw_markers``: how often in the whole text; ``enclosing``: the
    preprocessor constructs around the spec comment (:func:`enclosing_directives`)."""

    source: str | None
    markers: int
    raw_markers: int
    enclosing: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "markers": self.markers,
            "raw_markers": self.raw_markers,
            "enclosing": list(self.enclosing),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpecOrigin:
        return cls(
            data.get("source"),
            int(data["markers"]),
            int(data["raw_markers"]),
            tuple(data.get("enclosing") or ()),
        )


def enclosing_directives(doc: CudaDocument) -> tuple[str, ...]:
    """The preprocessor nodes around ``doc``'s spec comment, innermost first, each as its type and its
    condition or name (``"preproc_if 0"``); empty without a spec or at the top level."""
    from dice.cuda_source import parse_bytes

    if doc.spec is None:
        return ()
    node = parse_bytes(doc.data).root_node.descendant_for_byte_range(doc.spec.start_byte, doc.spec.end_byte)
    found: list[str] = []
    while node is not None:
        if node.type.startswith("preproc_"):
            head = node.child_by_field_name("condition") or node.child_by_field_name("name")
            text = (
                "" if head is None else doc.data[head.start_byte : head.end_byte].decode("utf-8", "replace")
            )
            found.append(f"{node.type} {' '.join(text.split())}".strip())
        node = node.parent
    return tuple(found)


def _markers_outside_masks(doc: CudaDocument) -> int:
    data, needle = doc.data, SPEC_MARKER.encode()
    return data.count(needle) - sum(data[m.start_byte : m.end_byte].count(needle) for m in doc.masks)


def spec_origin(doc: CudaDocument) -> SpecOrigin:
    """The fingerprint of the user's own file (parse it before splicing any fill)."""
    return SpecOrigin(
        None if doc.spec is None else doc.spec.source,
        _markers_outside_masks(doc),
        doc.text.count(SPEC_MARKER),
        enclosing_directives(doc),
    )


def _added(count: int, before: int) -> str | None:
    if count <= before:
        return None
    added = count - before
    return f"a fill adds {added} '{SPEC_MARKER}' marker{'s' if added > 1 else ''} (a spec block of its own)"


def marker_change(origin: SpecOrigin, text: str) -> str | None:
    """The cheap test, for the pool before it queues a task: the spliced ``text`` holds more ``dice-spec``
    markers than the user's file did. None otherwise (:func:`spec_change` has the last word)."""
    return _added(text.count(SPEC_MARKER), origin.raw_markers)


def spec_change(origin: SpecOrigin, spliced: CudaDocument) -> str | None:
    """Why the spliced file no longer shows the user's spec exactly as written, or None when it does."""
    reason = _added(_markers_outside_masks(spliced), origin.markers)
    if reason is not None:
        return reason
    source = None if spliced.spec is None else spliced.spec.source
    if source != origin.source:
        if source is None:
            return "the fills hide the user's dice-spec block (it is no longer a comment of its own)"
        if origin.source is None:
            return "the fills make a dice-spec block appear in a file that had none"
        return "the fills change the dice-spec block the file shows (a comment opened or closed around it)"
    enclosing = enclosing_directives(spliced)
    if enclosing != origin.enclosing:
        added = [d for d in enclosing if d not in origin.enclosing] or list(enclosing)
        return f"the fills put the user's dice-spec block inside a preprocessor construct ({added[0]})"
    return None


def fill_changes_spec(reason: str) -> Verdict:
    """The verdict of a candidate whose fills change the spec: rejected, nothing compiled or run."""
    verdict = rejected(
        FLAG_FILL_CHANGES_SPEC,
        f"{reason}; specs come only from the user, so this candidate was not compiled or run",
        compiled=False,
    )
    verdict.flags.append(FLAG_FILL_CHANGES_SPEC)
    return verdict
