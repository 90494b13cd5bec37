"""The ``dice/status`` notification (server -> client), shape fixed in docs/INTERNALS.md."""

from __future__ import annotations

from typing import Any, Literal

STATUS_METHOD = "dice/status"
# after each inline request the model answered: {uri, position, candidates, usable, shown, message}
SUGGESTION_STATUS_METHOD = "dice/suggestionStatus"

StatusState = Literal["loading", "ready", "busy", "validating", "error"]
STATES: tuple[str, ...] = ("loading", "ready", "busy", "validating", "error")


def status_params(
    state: StatusState, *, model: str | None = None, device: str | None = None, message: str | None = None
) -> dict[str, Any]:
    """The notification's params: every key always present so clients need no defaults."""
    if state not in STATES:
        raise ValueError(f"unknown status state {state!r}")
    return {"state": state, "model": model, "device": device, "message": message}
