"""What a caller may rely on from an engine: the ``InferenceEngine`` protocol.

``engine.Engine`` satisfies it, and so must any stand-in (the tests' scripted engines, a future remote
engine behind an HTTP server): the assistant service is typed against this protocol and probes nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class CompletionLike(Protocol):
    """One generated text: ``engine.Completion`` or a stand-in's."""

    @property
    def text(self) -> str: ...

    @property
    def confidence(self) -> float: ...

    @property
    def token_ids(self) -> Sequence[int]: ...


class TokenCounter(Protocol):
    """The part of a tokenizer a caller needs to fit prompts into the context window."""

    def encode(self, text: str) -> list[int]: ...


class ContextConfig(Protocol):
    @property
    def max_position_embeddings(self) -> int: ...


StepCallback = Callable[[Any], None]  # receives engine.StepEvent; may raise to cancel between steps


@runtime_checkable
class InferenceEngine(Protocol):
    """A loaded model that fills holes and writes whole programs.

    ``tokenizer`` is None for an engine that cannot count tokens (prompts are then fitted by a byte
    estimate). ``infill`` and ``generate_program`` take the decoding keywords of ``engine.Engine.generate``
    (``block_size``, ``steps_per_block``, ``policy``, ``threshold``, ``temperature``, ``seed``); ``on_step``
    is called after every denoising step and may raise to stop the generation. A remote engine
    (``engine.remote``) calls it after every streamed chunk, and with ``None`` as a heartbeat while it
    waits for the server, so that a cancel is seen before the first token too.
    """

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> Path | None: ...

    @property
    def config(self) -> ContextConfig: ...

    @property
    def tokenizer(self) -> TokenCounter | None: ...

    @property
    def device(self) -> Any: ...

    @property
    def dtype(self) -> Any: ...

    @property
    def num_parameters(self) -> int: ...

    def infill(
        self,
        prefix: str,
        suffix: str,
        *,
        context: str | None = None,
        n: int = 1,
        max_new_tokens: int = 256,
        on_step: StepCallback | None = None,
        **decode: Any,
    ) -> Sequence[CompletionLike]: ...

    def generate_program(
        self,
        ref_src: str,
        *,
        n: int = 1,
        max_new_tokens: int = 4096,
        on_step: StepCallback | None = None,
        **decode: Any,
    ) -> Sequence[CompletionLike]: ...

    def prime_prefix_cache(self, text: str | None = None) -> int:
        """Prefill the infilling template's fixed opening ahead of the first request (0: nothing cached)."""
        ...
