"""The assistant service: masks -> prompts -> engine -> validator -> ranking, for the CLI and the LSP server.

Threads: the model lives on one dedicated thread (``dice-model``, :mod:`dice.assistant.model`), which loads
it and runs every generation, so there is exactly one owner of the weights and requests queue rather than
contend. Validation runs in the validator's worker processes (:mod:`dice.assistant.validation`). The
coroutines only await those two, so the event loop stays responsive. Cancellation (an ``asyncio.Event`` or
cancelling the awaiting task) is seen by the model thread at the next denoising step and by the validation
loop between verdicts. The pipelines themselves are in :mod:`dice.assistant.fills` and
:mod:`dice.assistant.programs`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dice.assistant.fills import FillPipeline, hole_of
from dice.assistant.model import ModelOwner
from dice.assistant.programs import ProgramGenerator
from dice.assistant.request import ProgressCallback, Request
from dice.assistant.rules import implicit_mask_at
from dice.assistant.settings import PROGRAM_MAX_NEW_TOKENS, AssistantSettings
from dice.assistant.types import DocumentCompletion, ModelInfo, RankedProgram
from dice.assistant.validation import Validation, build_options
from dice.cuda_source import CudaDocument, parse_document

if TYPE_CHECKING:
    from dice.assistant.prompting import Hole
    from dice.cuda_source import Mask
    from dice.validator import ValidatorPool, Verdict
    from engine.interface import InferenceEngine

FileName = str | Path | None


class AssistantService:
    """Owns the engine (loaded once, on the GPU when there is one) and the validator pool.

    ``engine`` (an ``engine.InferenceEngine``) and ``validator`` may be injected (tests, or a process that
    already holds them); the service then does not close what it did not create.

    ``filename`` arguments name the user's file: its base name is what compiler logs call it, and when it is
    a path its folder is where its compile command is looked for, its relative includes resolve and a
    dice-spec imports sibling modules from. None: the validator's "kernel.cu". ``workspace_root``: the
    editor's workspace folder, on the include path when no compile command knows the file.
    """

    def __init__(
        self,
        settings: AssistantSettings | None = None,
        *,
        engine: InferenceEngine | None = None,
        validator: ValidatorPool | None = None,
        cache_size: int = 64,
        workspace_root: str | None = None,
    ) -> None:
        # counts work actually done (not served from cache); tests, benchmarks and dice/stats read them
        self.stats: dict[str, int] = {"engine_calls": 0, "validations": 0, "document_cache_hits": 0}
        self._model = ModelOwner(settings or AssistantSettings(), engine)
        self._validation = Validation(validator, cache_size=cache_size * 16, stats=self.stats)
        self._validation.trusted = self._model.settings.trusted_workspace
        self._fills = FillPipeline(self._model, self._validation, cache_size=cache_size, stats=self.stats)
        self._fills.workspace_root = workspace_root
        self._programs = ProgramGenerator(
            self._model, self._validation, cache_size=cache_size, stats=self.stats
        )
        self._closed = False

    # ---------------------------------------------------------------- model and settings
    @property
    def settings(self) -> AssistantSettings:
        return self._model.settings

    @property
    def engine(self) -> InferenceEngine | None:
        """The loaded engine (None before ``load``); another service can share it through ``engine=``."""
        return self._model.engine

    @property
    def model_loaded(self) -> bool:
        return self._model.engine is not None

    @property
    def model_info(self) -> ModelInfo:
        """What is loaded: name, path, device, parameter count and dtype (loads the model if needed)."""
        return self._model.load_blocking()

    async def load(self, progress: ProgressCallback | None = None) -> ModelInfo:
        """Load the model on the model thread (no-op when loaded) and say what was loaded."""
        return await self._model.load(Request(asyncio.get_running_loop(), progress, None, 0))

    def update_settings(self, settings: AssistantSettings) -> None:
        """Apply new settings; a different model path or device drops the loaded model (reloaded on next use).

        Cached results stay valid: every cache key includes the settings and the model that produced it.
        """
        self._model.update(settings)
        self._validation.trusted = settings.trusted_workspace

    @property
    def gpu(self) -> bool:
        """Whether candidates can be run and timed (a CUDA GPU is visible); else verdicts are compile-only."""
        return self._validation.gpu

    def invalidate(self) -> None:
        """Forget every verdict and every result that holds one (here and in the validator pool): a file the
        verdicts depend on (a dice-spec's sibling module) changed. Generated fills stay cached: the model's
        prompt did not change."""
        self._fills.clear()
        self._programs.clear()
        self._validation.invalidate()

    async def wait_idle(self) -> None:
        """Return once the model thread has finished everything submitted so far."""
        await self._model.wait_idle()

    # ---------------------------------------------------------------- public API
    async def complete_document(
        self,
        text: str,
        *,
        mask_indices: Sequence[int] | None = None,
        candidates: int | None = None,
        progress: ProgressCallback | None = None,
        cancel: asyncio.Event | None = None,
        filename: FileName = None,
    ) -> DocumentCompletion:
        """Fill the masks of ``text`` (all, or those in ``mask_indices``), jointly, ranked and validated.

        Raises ``asyncio.CancelledError`` when ``cancel`` is set (checked at every denoising step and between
        validations). With no masks, returns an empty completion whose ``best_text`` is ``text``.
        """
        doc = parse_document(text)
        wanted = None if mask_indices is None else set(mask_indices)
        holes = [hole_of(m) for m in doc.masks if wanted is None or m.index in wanted]
        masks = {m.index: m for m in doc.masks}
        return await self._complete(text, doc, holes, masks, candidates, progress, cancel, filename)

    async def complete_at(
        self,
        text: str,
        byte_offset: int,
        *,
        candidates: int | None = None,
        progress: ProgressCallback | None = None,
        cancel: asyncio.Event | None = None,
        filename: FileName = None,
    ) -> DocumentCompletion:
        """Fill the mask under ``byte_offset``; inside a kernel or device-function body without a mask, the
        cursor is an implicit zero-width mask (``mask.index == -1``, ``rules.implicit_mask_at``). Elsewhere
        (host code too), an empty completion."""
        doc = parse_document(text)
        for mask in doc.masks:
            if mask.start_byte <= byte_offset <= mask.end_byte:
                return await self._complete(
                    text, doc, [hole_of(mask)], {mask.index: mask}, candidates, progress, cancel, filename
                )
        implicit = implicit_mask_at(doc, byte_offset)
        if implicit is None:
            return DocumentCompletion(
                masks=[], best_text=text, edits=[], from_cache=False, model=self._model.info
            )
        return await self._complete(
            text, doc, [hole_of(implicit)], {-1: implicit}, candidates, progress, cancel, filename
        )

    async def generate_kernel(
        self,
        ref_src: str,
        *,
        samples: int | None = None,
        max_new_tokens: int | None = None,
        progress: ProgressCallback | None = None,
        cancel: asyncio.Event | None = None,
    ) -> list[RankedProgram]:
        """Whole ``ModelNew`` programs for a KernelBench-format reference, each validated with the KernelBench
        path, best first. Sample 0 is greedy, the others sampled. ``max_new_tokens`` defaults to
        PROGRAM_MAX_NEW_TOKENS (a whole program is far longer than a fill) and is capped by what the
        model's context window leaves after the prompt. No latency budget applies to whole programs.

        Raises ``ValueError`` (``dice.validator.InvalidReference``) when ``ref_src`` is not KernelBench
        format.
        """
        from dice.validator.reference import check_reference

        check_reference(ref_src)
        request = Request(asyncio.get_running_loop(), progress, cancel, 0)
        await self._model.load(request)
        requested = max_new_tokens or PROGRAM_MAX_NEW_TOKENS
        budget = await asyncio.to_thread(self._programs.budget, ref_src, requested)
        return await self._programs.generate(ref_src, samples or self.settings.candidates, budget, request)

    async def validate_document(self, text: str, *, filename: FileName = None) -> Verdict:
        """Compile the file's device code; run and time it against its dice-spec when there is a GPU and the
        workspace is trusted (``settings.trusted_workspace``; else compile-only, and the verdict says why)."""
        run = self.settings.validation_level != "compile"
        build = build_options(self.settings, self._fills.workspace_root)
        return await self._validation.document(text, run=run, filename=filename, build=build)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._model.close()
        self._validation.close()

    def __enter__(self) -> AssistantService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _complete(
        self,
        text: str,
        doc: CudaDocument,
        holes: list[Hole],
        masks: dict[int, Mask],
        candidates: int | None,
        progress: ProgressCallback | None,
        cancel: asyncio.Event | None,
        filename: FileName,
    ) -> DocumentCompletion:
        s = self.settings
        n = candidates or s.candidates
        if n < 1:
            raise ValueError(f"candidates must be >= 1, got {n}")
        if not holes:
            return DocumentCompletion(
                masks=[], best_text=text, edits=[], from_cache=False, model=self._model.info
            )
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        await self._model.load(Request(loop, progress, cancel, 0))
        # the latency budget starts once the model is loaded: loading is paid once, not per request
        request = Request(loop, progress, cancel, s.max_latency_ms)
        return await self._fills.complete(text, doc, holes, masks, n, request, filename, started=started)
