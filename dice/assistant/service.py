"""The assistant service: masks -> prompts -> engine -> validator -> ranking, for the CLI and the LSP server.

Threads: the model lives on one dedicated thread (``dice-model``), which loads it and runs every
generation, so there is exactly one owner of the weights and requests queue rather than contend.
Validation runs in the validator's worker processes. The coroutines only await those two, so the event
loop stays responsive. Cancellation (an ``asyncio.Event`` or cancelling the awaiting task) is seen by the
model thread at the next denoising step and by the validation loop between verdicts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dice.assistant.prompting import Hole, HoleCut, InfillRequest, build_infill_request, read_hole_cut
from dice.assistant.ranking import rank
from dice.assistant.types import (
    PROGRAM_MAX_NEW_TOKENS,
    AssistantSettings,
    Candidate,
    DocumentCompletion,
    MaskCompletion,
    ModelInfo,
    Progress,
    RankedProgram,
)
from dice.cuda_source import CudaDocument, Mask, Range, function_at, parse_document, splice
from dice.cuda_source.positions import decode_bytes, encode_text

if TYPE_CHECKING:
    from lsprotocol.types import TextEdit

    from dice.validator import ValidatorPool, Verdict

ProgressCallback = Callable[[Progress], None]
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# Progress events from the model thread are thinned to one per interval (the last one always goes out).
_PROGRESS_INTERVAL_S = 0.05

log = logging.getLogger(__name__)


class _LRU(Generic[K, V]):
    """A thread-safe LRU map bounded by entry count and, optionally, by the summed ``weight`` of entries."""

    def __init__(
        self, capacity: int, *, max_weight: int | None = None, weight: Callable[[V], int] | None = None
    ) -> None:
        self.capacity = capacity
        self.max_weight = max_weight
        self._weigh = weight or (lambda _v: 0)
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key][0]

    def put(self, key: K, value: V) -> None:
        w = self._weigh(value)
        if self.max_weight is not None and w > self.max_weight:
            return  # one entry bigger than the whole cache: not worth evicting everything for
        with self._lock:
            if key in self._items:
                self._weight -= self._items.pop(key)[1]
            self._items[key] = (value, w)
            self._weight += w
            while len(self._items) > self.capacity or (
                self.max_weight is not None and self._weight > self.max_weight
            ):
                self._weight -= self._items.popitem(last=False)[1][1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._weight = 0

    def __len__(self) -> int:
        return len(self._items)


@dataclasses.dataclass
class _Fill:
    text: str
    confidence: float
    tokens: int | None = None

    @classmethod
    def of(cls, completion: Any, text: str | None = None) -> _Fill:
        ids = getattr(completion, "token_ids", None)
        return cls(
            completion.text if text is None else text,
            float(completion.confidence),
            None if ids is None else len(ids),
        )


class _Run:
    """Per-request state shared between the coroutine and the model thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        progress: ProgressCallback | None,
        cancel: asyncio.Event | None,
        max_latency_ms: int,
    ) -> None:
        self.loop = loop
        self.progress = progress
        self.cancel = cancel
        self.stop = threading.Event()  # set when the awaiting task itself is cancelled
        self.deadline = time.monotonic() + max_latency_ms / 1000 if max_latency_ms > 0 else math.inf
        self.partial = False
        self.steps_done = 0
        self.steps_total = 0
        self._last_emit = 0.0
        self._loop_thread = threading.get_ident()

    @property
    def cancelled(self) -> bool:
        return self.stop.is_set() or (self.cancel is not None and self.cancel.is_set())

    @property
    def past_deadline(self) -> bool:
        return time.monotonic() > self.deadline

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise asyncio.CancelledError("request cancelled")

    def emit(self, stage: str, done: int, total: int, message: str, *, force: bool = True) -> None:
        """Send a progress event on the event loop's thread (safe to call from any thread)."""
        if self.progress is None:
            return
        now = time.monotonic()
        if not force and now - self._last_emit < _PROGRESS_INTERVAL_S:
            return
        self._last_emit = now
        event = Progress(stage=stage, done=done, total=total, message=message)  # type: ignore[arg-type]
        if threading.get_ident() == self._loop_thread:
            self.progress(event)
        elif not self.loop.is_closed():
            # a cancelled request's generation may outlive its loop by one step: drop its events then
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.progress, event)

    def on_step_factory(self, *, respect_deadline: bool, message: str) -> Callable[[Any], None]:
        """The engine's ``on_step``: counts steps, reports them, and stops the generation when asked
        (``engine.Cancelled`` carrying ``dice_reason`` "cancel" or "deadline")."""
        from engine.errors import Cancelled

        def on_step(_event: Any) -> None:
            self.steps_done += 1
            done = min(self.steps_done, self.steps_total)
            self.emit("generating", done, self.steps_total, message, force=False)
            if self.cancelled:
                raise _cancelled(Cancelled, "cancel")
            if respect_deadline and self.past_deadline:
                raise _cancelled(Cancelled, "deadline")

        return on_step


def _cancelled(cancelled_type: type[BaseException], reason: str) -> BaseException:
    exc = cancelled_type(reason)
    exc.dice_reason = reason  # type: ignore[attr-defined]
    return exc


def _sha(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode("utf-8", errors="surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_program(text: str) -> str:
    """The python program of a model answer: the first fenced code block, or the whole text without one."""
    match = _CODE_BLOCK.search(text)
    return (match.group(1) if match else text).strip() + "\n"


class AssistantService:
    """Owns the engine (loaded once, on the GPU when there is one) and the validator pool.

    ``engine`` and ``validator`` may be injected (tests, or a process that already holds them); the service
    then does not close what it did not create.
    """

    def __init__(
        self,
        settings: AssistantSettings | None = None,
        *,
        engine: Any | None = None,
        validator: ValidatorPool | None = None,
        cache_size: int = 64,
    ) -> None:
        self.settings = settings or AssistantSettings()
        self._engine = engine
        self._owns_engine = engine is None
        self._validator = validator
        self._owns_validator = validator is None
        self._model_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dice-model")
        self._engine_lock = threading.Lock()
        self._validator_lock = threading.Lock()
        self._model_info: ModelInfo | None = None
        self._hole_cut: HoleCut = "byte"  # the loaded model's (read_hole_cut), set with _model_info
        self._gpu: bool | None = None
        # documents can be megabytes each: the document cache is also bounded by the text it holds
        self._documents: _LRU[str, DocumentCompletion] = _LRU(
            cache_size, max_weight=_DOCUMENT_CACHE_BYTES, weight=_completion_size
        )
        self._programs: _LRU[str, list[RankedProgram]] = _LRU(cache_size)
        self._fills: _LRU[str, list[_Fill]] = _LRU(cache_size * 8)
        self._verdicts: _LRU[str, Verdict] = _LRU(cache_size * 16)
        self._closed = False
        # counts work actually done (not served from cache); tests and benchmarks read them
        self.stats: dict[str, int] = {"engine_calls": 0, "validations": 0, "document_cache_hits": 0}

    # ---------------------------------------------------------------- model ownership
    @property
    def engine(self) -> Any | None:
        """The loaded engine (None before ``load``); another service can share it through ``engine=``."""
        return self._engine

    @property
    def model_loaded(self) -> bool:
        return self._engine is not None

    @property
    def model_info(self) -> ModelInfo:
        """What is loaded: name, path, device, parameter count and dtype (loads the model if needed)."""
        if self._model_info is None:
            self._model_thread.submit(self._load_engine_sync).result()
        assert self._model_info is not None
        return self._model_info

    async def load(self, progress: ProgressCallback | None = None) -> ModelInfo:
        """Load the model on the model thread (no-op when loaded) and say what was loaded."""
        if self._model_info is not None:
            return self._model_info
        run = _Run(asyncio.get_running_loop(), progress, None, 0)
        run.emit("loading", 0, 1, f"loading {self._model_label()}")
        await self._in_model_thread(self._load_engine_sync, run)
        assert self._model_info is not None
        run.emit("loading", 1, 1, f"loaded {self._model_info.describe()}")
        return self._model_info

    def _model_label(self) -> str:
        path = self.settings.model_path or os.environ.get("DICE_MODEL")
        return path or "the embedded model"

    def _resolve_device(self) -> str:
        if self.settings.device != "auto":
            return self.settings.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def _load_engine_sync(self) -> None:
        with self._engine_lock:
            if self._engine is None:
                import engine as engine_pkg

                self._engine = engine_pkg.load_engine(self.settings.model_path, device=self._resolve_device())
                self._prime(self._engine)
            if self._model_info is None:
                self._hole_cut = read_hole_cut(getattr(self._engine, "path", None))
                self._model_info = _describe_engine(self._engine, self.settings.model_path)

    @staticmethod
    def _prime(engine: Any) -> None:
        """Prefill the infilling template's fixed opening (~1,000 tokens) into the engine's prefix cache, so
        that the first request after loading prefills only its file (on 2 CPU cores: ~0.2 s once here,
        instead of in that request). A failure here costs only the speed-up."""
        prime = getattr(engine, "prime_prefix_cache", None)  # engines passed in may be stand-ins
        if prime is None:
            return
        started = time.perf_counter()
        try:
            tokens = prime()
        except Exception:  # noqa: BLE001 - never fail a load over an optimisation
            log.exception("could not prefill the prompt template into the prefix cache")
            return
        if tokens:
            log.info("prefilled the %d-token prompt opening in %.2f s", tokens, time.perf_counter() - started)

    def update_settings(self, settings: AssistantSettings) -> None:
        """Apply new settings; a different model path or device drops the loaded model (reloaded on next use).

        Cached results stay valid: every cache key includes the settings and the model that produced it.
        """
        reload = (settings.model_path, settings.device) != (self.settings.model_path, self.settings.device)
        self.settings = settings
        if reload and self._owns_engine:
            with self._engine_lock:
                self._engine = None
                self._model_info = None

    def _model_key(self) -> tuple[Any, ...]:
        info = self._model_info
        return (
            self.settings.model_path,
            os.environ.get("DICE_MODEL"),
            None if info is None else info.name,
            None if info is None else info.device,
            id(self._engine) if not self._owns_engine else None,
        )

    # ---------------------------------------------------------------- validator ownership
    @property
    def gpu(self) -> bool:
        """Whether candidates can be run and timed (a CUDA GPU is visible); else verdicts are compile-only."""
        if self._gpu is None:
            from dice.validator import gpu_available

            self._gpu = bool(gpu_available())
        return self._gpu

    def _pool(self) -> ValidatorPool:
        with self._validator_lock:
            if self._validator is None:
                from dice.validator import ValidatorPool

                self._validator = ValidatorPool()
            return self._validator

    # ---------------------------------------------------------------- public API
    async def complete_document(
        self,
        text: str,
        *,
        mask_indices: Sequence[int] | None = None,
        candidates: int | None = None,
        progress: ProgressCallback | None = None,
        cancel: asyncio.Event | None = None,
        filename: str | None = None,
    ) -> DocumentCompletion:
        """Fill the masks of ``text`` (all, or those in ``mask_indices``), jointly, ranked and validated.

        ``filename`` names the file in compiler logs (its base name; None: the validator's "kernel.cu").
        Raises ``asyncio.CancelledError`` when ``cancel`` is set (checked at every denoising step and between
        validations). With no masks, returns an empty completion whose ``best_text`` is ``text``.
        """
        doc = parse_document(text)
        wanted = None if mask_indices is None else set(mask_indices)
        holes = [_hole_of(m) for m in doc.masks if wanted is None or m.index in wanted]
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
        filename: str | None = None,
    ) -> DocumentCompletion:
        """Fill the mask under ``byte_offset``; inside a function body without a mask, the cursor is an
        implicit zero-width mask (``mask.index == -1``). Elsewhere, an empty completion. ``filename`` as
        in ``complete_document``."""
        doc = parse_document(text)
        for mask in doc.masks:
            if mask.start_byte <= byte_offset <= mask.end_byte:
                return await self._complete(
                    text, doc, [_hole_of(mask)], {mask.index: mask}, candidates, progress, cancel, filename
                )
        func = function_at(doc, byte_offset)
        if func is None or not (func.body_start_byte < byte_offset < func.body_end_byte):
            return DocumentCompletion(
                masks=[], best_text=text, edits=[], from_cache=False, model=self._model_info
            )
        pos = doc.index.byte_to_position(byte_offset)
        mask = Mask(
            index=-1,
            start_byte=byte_offset,
            end_byte=byte_offset,
            range=Range(start=pos, end=pos),
            budget=None,
            function=func.name,
            kind=func.kind,
            signature=func.signature,
            function_start_byte=func.start_byte,
            function_end_byte=func.end_byte,
        )
        return await self._complete(
            text, doc, [_hole_of(mask)], {-1: mask}, candidates, progress, cancel, filename
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
        s = self.settings
        n = samples or s.candidates
        loop = asyncio.get_running_loop()
        run = _Run(loop, progress, cancel, 0)
        await self.load(progress)
        requested = max_new_tokens or PROGRAM_MAX_NEW_TOKENS
        budget = await asyncio.to_thread(self._program_budget, ref_src, requested)
        key = _sha("program", ref_src, n, budget, s.decode_key(), s.validation_level, self._model_key())
        cached = self._programs.get(key)
        if cached is not None:
            self.stats["document_cache_hits"] += 1
            return list(cached)

        calls = 1 + (1 if n > 1 else 0)
        run.steps_total = calls * _steps_for(budget, s)

        def generate(count: int, temperature: float, seed: int | None) -> list[_Fill]:
            self.stats["engine_calls"] += 1
            on_step = run.on_step_factory(respect_deadline=False, message="generating programs")
            outs = self._engine.generate_program(
                ref_src,
                n=count,
                max_new_tokens=budget,
                block_size=s.block_size,
                steps_per_block=s.steps_per_block,
                policy=s.policy,
                threshold=s.threshold,
                temperature=temperature,
                seed=seed,
                on_step=on_step,
            )
            return [_Fill.of(o, extract_program(o.text)) for o in outs]

        fills = await self._generate(run, lambda: generate(1, 0.0, None))
        if n > 1:
            fills += await self._generate(run, lambda: generate(n - 1, s.sample_temperature, s.seed))
        fills = _dedupe(fills)

        verdicts: list[Verdict | None] = [None] * len(fills)
        if s.validation_level != "none":
            pool = await asyncio.to_thread(self._pool)
            timing = s.validation_level == "run"
            futures = [pool.submit_kernelbench(ref_src, f.text, timing=timing) for f in fills]
            verdicts = await self._await_verdicts(
                run, futures, [None] * len(fills), required=set(), label="validating programs"
            )
        order = rank(fills, verdicts, [f.confidence for f in fills])
        result = [
            RankedProgram(source=fills[i].text, verdict=verdicts[i], confidence=fills[i].confidence)
            for i in order
            if s.validation_level == "none" or verdicts[i] is not None
        ]
        self._programs.put(key, result)
        return list(result)

    def _program_budget(self, ref_src: str, requested: int) -> int:
        limit = _context_tokens(self._engine)
        tokenizer = getattr(self._engine, "tokenizer", None)
        if limit is None or tokenizer is None:
            return requested
        from engine.prompts import kernelbench_prompt

        prompt_tokens = len(tokenizer.encode(kernelbench_prompt(ref_src)))
        room = limit - prompt_tokens
        if room < 1:
            raise ValueError(
                f"the KernelBench prompt for this reference takes {prompt_tokens} tokens: more "
                f"than the model's context window ({limit} tokens)"
            )
        return min(requested, room)

    async def validate_document(self, text: str, *, filename: str | None = None) -> Verdict:
        """Compile the file's device code; run and time it against its dice-spec when there is a GPU.

        ``filename`` names the file in the compiler log (its base name; None: the validator's "kernel.cu").
        """
        run_it = self.settings.validation_level != "compile"
        pool = await asyncio.to_thread(self._pool)
        future = pool.submit_cu(text, run=run_it, **_name_kwargs(filename))
        self.stats["validations"] += 1
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._model_thread.shutdown(wait=True, cancel_futures=True)
        if self._owns_validator and self._validator is not None:
            self._validator.close()
        self._validator = None
        self._engine = None

    def __enter__(self) -> AssistantService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- the pipeline
    async def _complete(
        self,
        text: str,
        doc: CudaDocument,
        holes: list[Hole],
        masks: dict[int, Mask],
        candidates: int | None,
        progress: ProgressCallback | None,
        cancel: asyncio.Event | None,
        filename: str | None = None,
    ) -> DocumentCompletion:
        s = self.settings
        n = candidates or s.candidates
        if n < 1:
            raise ValueError(f"candidates must be >= 1, got {n}")
        if not holes:
            return DocumentCompletion(
                masks=[], best_text=text, edits=[], from_cache=False, model=self._model_info
            )
        t0 = time.perf_counter()
        await self.load(progress)
        loop = asyncio.get_running_loop()
        # the file name is in the key: cached verdicts carry compiler logs that name the file
        key = _sha(
            "document",
            text,
            [(h.index, h.start_byte, h.end_byte) for h in holes],
            n,
            s.decode_key(),
            s.validation_level,
            self._model_key(),
            _display_name(filename),
        )
        cached = self._documents.get(key)
        if cached is not None:
            self.stats["document_cache_hits"] += 1
            return dataclasses.replace(cached, from_cache=True)

        run = _Run(loop, progress, cancel, s.max_latency_ms)
        assert self._engine is not None
        requests = await asyncio.to_thread(lambda: [self._fit_request(doc, h) for h in holes])
        calls_per_hole = 1 + (1 if n > 1 else 0)
        run.steps_total = sum(calls_per_hole * _steps_for(r.max_new_tokens, s) for r in requests)

        # greedy fill of every hole first: something to show even under a tight latency budget
        fills: list[list[_Fill]] = []
        for i, req in enumerate(requests):
            run.raise_if_cancelled()
            label = f"filling mask {i + 1}/{len(requests)}"
            fills.append(await self._infill(run, req, 1, None, label, respect_deadline=False))
        t_greedy = time.perf_counter()
        if n > 1:
            for i, req in enumerate(requests):
                run.raise_if_cancelled()
                if run.past_deadline:
                    run.partial = True
                    break
                label = f"sampling mask {i + 1}/{len(requests)}"
                more = await self._infill(run, req, n - 1, s.sample_temperature, label, respect_deadline=True)
                if more is None:
                    run.partial = True
                    break
                fills[i] = _dedupe(fills[i] + more)
        run.emit("generating", run.steps_total, run.steps_total, "generated")
        t_generated = time.perf_counter()
        # a blank (or comment-only) fill only deletes the hole: it would "compile" and outrank every real
        # attempt
        empty = sum(1 for f in fills for x in f if _is_blank(x.text))
        fills = [[x for x in f if not _is_blank(x.text)] for f in fills]

        # validation: hole i is checked with holes before it at their chosen fill and holes after it at
        # their greedy fill, so that the last hole's best verdict is the verdict of best_text itself
        chosen: dict[int, str] = {}
        results: list[MaskCompletion] = []
        total_checks = sum(len(f) for f in fills)
        checks_done = 0
        best_verdict: Verdict | None = None
        for i, hole in enumerate(holes):
            run.raise_if_cancelled()
            if not fills[i]:  # nothing but blank or comment-only fills: the hole stays as it is
                results.append(MaskCompletion(mask=masks[hole.index], candidates=[]))
                continue
            others: dict[int, str] = {}
            for j, h in enumerate(holes):
                if j < i and h.index in chosen:
                    others[h.index] = chosen[h.index]
                elif j > i and fills[j]:
                    others[h.index] = fills[j][0].text
            texts = [_splice(doc, holes, {**others, hole.index: f.text})[0] for f in fills[i]]
            verdicts = await self._validate_texts(run, texts, checks_done, total_checks, filename)
            checks_done += len(texts)
            keep = [k for k in range(len(texts)) if s.validation_level == "none" or verdicts[k] is not None]
            if len(keep) < len(texts):
                run.partial = True
            kept_fills = [fills[i][k] for k in keep]
            kept_verdicts = [verdicts[k] for k in keep]
            order = rank(kept_fills, kept_verdicts, [f.confidence for f in kept_fills])
            ranked = [
                Candidate(
                    text=kept_fills[k].text,
                    verdict=kept_verdicts[k],
                    confidence=kept_fills[k].confidence,
                    rank=r,
                    tokens=kept_fills[k].tokens,
                )
                for r, k in enumerate(order)
            ]
            chosen[hole.index] = ranked[0].text
            best_verdict = ranked[0].verdict
            results.append(MaskCompletion(mask=masks[hole.index], candidates=ranked))
        t_validated = time.perf_counter()

        best_text, edits = _splice(doc, holes, chosen)
        completion = DocumentCompletion(
            masks=results,
            best_text=best_text,
            edits=edits,
            from_cache=False,
            best_verdict=best_verdict,
            partial=run.partial,
            model=self._model_info,
            stats={
                "generate_s": t_generated - t0,
                "greedy_s": t_greedy - t0,
                "validate_s": t_validated - t_generated,
                "total_s": time.perf_counter() - t0,
                "steps": float(run.steps_done),
                "empty_fills": float(empty),
            },
        )
        if not completion.partial:
            self._documents.put(key, completion)
        return completion

    def _fit_request(self, doc: CudaDocument, hole: Hole) -> InfillRequest:
        """The infilling request for ``hole``, trimmed until the rendered prompt plus the new tokens fit the
        model's context window (counted with the model's own tokenizer and template)."""
        s = self.settings

        def build(budget: int | None) -> InfillRequest:
            return build_infill_request(
                doc,
                hole,
                default_max_new_tokens=s.max_new_tokens,
                budget_chars=budget,
                hole_cut=self._hole_cut,
            )

        limit = _context_tokens(self._engine)
        if limit is None:
            return build(None)
        # no BPE token of code averages 16 bytes: this pre-cut only spares tokenizing a huge file
        req = build(16 * limit)
        count = _prompt_token_counter(self._engine)
        if count is None:  # an engine without a tokenizer: assume 3 bytes per token and 2k template tokens
            return build(3 * (limit - req.max_new_tokens - 2048))
        fixed = count(InfillRequest("", "", req.context, req.max_new_tokens))
        available = limit - req.max_new_tokens - fixed
        if available <= 0:
            what = "the instructions and the dice-spec reference" if req.context else "the instructions"
            raise ValueError(
                f"{what} take {fixed} tokens and {req.max_new_tokens} new tokens are asked for: "
                f"more than the model's context window ({limit} tokens)"
            )
        for _ in range(8):
            used = count(req) - fixed
            if used <= available:
                return req
            size = 2 * len(encode_text(req.prefix)) + len(encode_text(req.suffix))
            req = build(int(size * available / used * 0.9))
        return req

    async def _in_model_thread(self, fn: Callable[[], V], run: _Run) -> V:
        if self._closed:
            raise RuntimeError("the assistant service is closed")
        future = self._model_thread.submit(fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            run.stop.set()  # the model thread stops at its next denoising step
            raise

    async def _generate(self, run: _Run, fn: Callable[[], list[_Fill]]) -> list[_Fill]:
        try:
            return await self._in_model_thread(fn, run)
        except Exception as exc:
            if getattr(exc, "dice_reason", None) == "cancel" or run.cancelled:
                raise asyncio.CancelledError("request cancelled") from exc
            raise

    async def _infill(
        self,
        run: _Run,
        req: InfillRequest,
        count: int,
        temperature: float | None,
        label: str,
        *,
        respect_deadline: bool,
    ) -> list[_Fill] | None:
        """``count`` fills of one hole (greedy when ``temperature`` is None); None when the deadline hit."""
        s = self.settings
        key = _sha("fill", req.key(), count, temperature, s.decode_key(), self._model_key())
        cached = self._fills.get(key)
        if cached is not None:
            run.steps_done += _steps_for(req.max_new_tokens, s)
            return list(cached)
        engine = self._engine

        def work() -> list[_Fill]:
            self.stats["engine_calls"] += 1
            decode: dict[str, Any] = dict(
                block_size=s.block_size,
                steps_per_block=s.steps_per_block,
                policy=s.policy,
                threshold=s.threshold,
                temperature=temperature or 0.0,
            )
            if temperature is not None:
                decode["seed"] = s.seed
            outs = engine.infill(
                req.prefix,
                req.suffix,
                context=req.context,
                n=count,
                max_new_tokens=req.max_new_tokens,
                on_step=run.on_step_factory(respect_deadline=respect_deadline, message=label),
                **decode,
            )
            return [_Fill.of(o, req.mask_fill(o.text)) for o in outs]

        try:
            fills = await self._generate(run, work)
        except Exception as exc:
            if getattr(exc, "dice_reason", None) == "deadline":
                return None
            raise
        self._fills.put(key, fills)
        return list(fills)

    async def _validate_texts(
        self, run: _Run, texts: list[str], done_before: int, total: int, filename: str | None = None
    ) -> list[Verdict | None]:
        """Verdicts of whole-file texts, in parallel on the pool; None for those the deadline cut off
        (text 0, the greedy fill, is always awaited)."""
        level = self.settings.validation_level
        if level == "none":
            return [None] * len(texts)
        # the same text under another name gets its own verdict: the log names the file
        name = _display_name(filename)
        keys = [_sha("verdict", t, level, name) for t in texts]
        verdicts: list[Verdict | None] = [self._verdicts.get(k) for k in keys]
        missing = [i for i, v in enumerate(verdicts) if v is None]
        if not missing:
            return verdicts
        pool = await asyncio.to_thread(self._pool)
        futures: list[concurrent.futures.Future[Verdict] | None] = [None] * len(texts)
        for i in missing:
            futures[i] = pool.submit_cu(texts[i], run=(level == "run"), **_name_kwargs(filename))
        fresh = await self._await_verdicts(
            run,
            futures,
            verdicts,
            required={0},
            label="validating candidates",
            done_before=done_before,
            total=total,
        )
        for i in missing:
            if fresh[i] is not None:
                self._verdicts.put(keys[i], fresh[i])  # type: ignore[arg-type]
        return fresh

    async def _await_verdicts(
        self,
        run: _Run,
        futures: Sequence[concurrent.futures.Future[Verdict] | None],
        known: Sequence[Verdict | None],
        *,
        required: set[int],
        label: str,
        done_before: int = 0,
        total: int | None = None,
    ) -> list[Verdict | None]:
        results = list(known)
        total = total if total is not None else len(futures)
        waiting: dict[asyncio.Future[Verdict], int] = {
            asyncio.wrap_future(f): i for i, f in enumerate(futures) if f is not None
        }
        done_count = done_before + (len(futures) - len(waiting))
        run.emit("validating", done_count, total, label)
        cancel_task = asyncio.ensure_future(run.cancel.wait()) if run.cancel is not None else None
        try:
            while waiting:
                if run.cancelled:
                    raise asyncio.CancelledError("request cancelled")
                need = any(i in required for i in waiting.values())
                remaining = max(0.0, run.deadline - time.monotonic())
                timeout = None if need or math.isinf(run.deadline) else remaining
                wait_on: set[asyncio.Future[Any]] = set(waiting)
                if cancel_task is not None:
                    wait_on.add(cancel_task)
                done, _ = await asyncio.wait(wait_on, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:  # deadline: keep what is validated
                    run.partial = True
                    break
                for fut in done:
                    if fut is cancel_task:
                        continue
                    i = waiting.pop(fut)
                    results[i] = fut.result()
                    self.stats["validations"] += 1
                    done_count += 1
                    run.emit("validating", done_count, total, label)
        finally:
            for fut in waiting:
                fut.cancel()
            if cancel_task is not None:
                cancel_task.cancel()
        if run.cancelled:
            raise asyncio.CancelledError("request cancelled")
        return results


# ---------------------------------------------------------------- helpers
_DOCUMENT_CACHE_BYTES = 64 * 1024 * 1024


def _display_name(filename: str | None) -> str | None:
    """The name compiler logs give the file: its base name, as ``ValidatorPool.submit_cu`` uses it; None
    (or an empty name) leaves the validator's default."""
    if not filename:
        return None
    return Path(filename).name or None


def _name_kwargs(filename: str | None) -> dict[str, str]:
    # no keyword without a name: the pool's default ("kernel.cu") stays defined in one place
    name = _display_name(filename)
    return {} if name is None else {"filename": name}


def _completion_size(c: DocumentCompletion) -> int:
    return len(c.best_text) + sum(len(x.text) for m in c.masks for x in m.candidates)


def _hole_of(mask: Mask) -> Hole:
    return Hole(
        index=mask.index,
        start_byte=mask.start_byte,
        end_byte=mask.end_byte,
        budget=mask.budget,
        function_start_byte=mask.function_start_byte,
        function_end_byte=mask.function_end_byte,
    )


def _steps_for(max_new_tokens: int, settings: AssistantSettings) -> int:
    # the prompt tail may share the first block with new tokens: one extra block at most
    blocks = math.ceil(max_new_tokens / settings.block_size) + 1
    return blocks * settings.steps_per_block


def _prompt_token_counter(engine: Any) -> Callable[[InfillRequest], int] | None:
    """Counts the tokens ``engine.infill`` would feed the model for a request (None: cannot tell)."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        return None
    from engine.prompts import infill_prompt

    def count(req: InfillRequest) -> int:
        prompt, response_prefix = infill_prompt(req.prefix, req.suffix, req.context)
        return len(tokenizer.encode(prompt + response_prefix))

    return count


def _context_tokens(engine: Any) -> int | None:
    value = getattr(engine.config, "max_position_embeddings", None)
    return int(value) if value else None


_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)|//[^\n]*", re.DOTALL)


def _is_blank(fill: str) -> bool:
    """Nothing but whitespace and comments (a comment look-alike inside a string leaves the string's
    other characters behind, so real code is never called blank)."""
    return not _COMMENT.sub("", fill).strip()


def _dedupe(fills: list[_Fill]) -> list[_Fill]:
    """Identical fills collapse to the first (greedy) one, keeping the highest confidence seen."""
    out: dict[str, _Fill] = {}
    for f in fills:
        if f.text in out:
            out[f.text].confidence = max(out[f.text].confidence, f.confidence)
        else:
            out[f.text] = dataclasses.replace(f)
    return list(out.values())


def _splice(doc: CudaDocument, holes: list[Hole], fills: dict[int, str]) -> tuple[str, list[TextEdit]]:
    """Splice fills into the document; explicit masks go through dice.cuda_source.splice, the implicit
    cursor hole (index -1) is a zero-width insertion."""
    if -1 in fills:
        from lsprotocol.types import TextEdit

        hole = next(h for h in holes if h.index == -1)
        data = doc.data
        new = data[: hole.start_byte] + encode_text(fills[-1]) + data[hole.end_byte :]
        rng = doc.index.range_of(hole.start_byte, hole.end_byte).to_lsp()
        return decode_bytes(new), [TextEdit(range=rng, new_text=fills[-1])]
    result = splice(doc.text, fills, doc=doc)
    return result.text, list(result.edits)


def _describe_engine(engine: Any, model_path: str | None) -> ModelInfo:
    model = getattr(engine, "model", None)
    parameters = 0
    dtype = "unknown"
    if model is not None and hasattr(model, "parameters"):
        params = list(model.parameters())
        parameters = sum(p.numel() for p in params)
        if params:
            dtype = str(params[0].dtype).removeprefix("torch.")
    path = model_path or os.environ.get("DICE_MODEL") or None
    name = getattr(engine, "name", None) or (Path(path).name if path else "dice-tiny")
    return ModelInfo(
        name=str(name),
        path=path,
        device=str(getattr(engine, "device", "cpu")),
        parameters=int(parameters),
        dtype=dtype,
    )
