"""Exceptions the engine raises for bad checkpoints, configs and cancelled generations."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint folder cannot be loaded: missing/corrupt files, key or shape mismatch."""


class ConfigError(CheckpointError, ValueError):
    """config.json is missing a required field or holds an unusable value."""


class UnsupportedArchitectureError(CheckpointError):
    """config.json names a model family this engine does not implement."""


class Cancelled(Exception):  # noqa: N818 - reads better at call sites than CancelledError
    """Raised by an ``on_step`` callback to stop a generation between denoising steps.

    ``reason`` says why: "cancel" (the caller gave up on the request) or "deadline" (its latency budget ran
    out, and what was generated so far is not wanted either).
    """

    def __init__(self, reason: str = "cancel") -> None:
        super().__init__(reason)
        self.reason = reason


class RemoteError(RuntimeError):
    """A model server answered, but not with a usable answer: it refused the request (its own message is
    kept), listed no such model, or broke its stream off."""


class ServerUnavailable(RemoteError):  # noqa: N818 - the state a user is told about
    """The model server cannot be reached (connection refused, timed out) or keeps saying it is busy."""
