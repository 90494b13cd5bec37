"""Verdicts as the server sends them: the verdict object of ``docs/CONTRACTS.md``. The label clients
show is ``dice.validator.verdict.verdict_label``; which candidates may be shown is
``dice.assistant.rules.usable``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dice.validator import Verdict


def verdict_json(verdict: Verdict | Mapping[str, Any] | None) -> dict[str, Any]:
    """The verdict object of a ``Verdict`` (or a dict that already is one); {} for None."""
    if verdict is None:
        return {}
    if isinstance(verdict, Verdict):
        return verdict.to_json()
    return dict(verdict)
