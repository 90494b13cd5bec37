"""The fill pipeline: holes -> prompts that fit the context window -> greedy and sampled fills on the model
thread -> blank fills dropped -> each candidate validated in the whole file -> ranked.

Hole i is validated with the holes before it at their chosen fill and the holes after it at their greedy
fill, so the last hole's best verdict is the verdict of ``best_text`` itself. Under a latency budget the
greedy fill of every hole and its verdict always come out; sampling and further validation stop at the
deadline (the result is then ``partial`` and not cached).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dice.assistant.caches import LRU, digest
from dice.assistant.model import ModelOwner
from dice.assistant.prompting import Hole, InfillRequest, build_infill_request
from dice.assistant.ranking import rank
from dice.assistant.request import Request
from dice.assistant.settings import AssistantSettings
from dice.assistant.types import Candidate, DocumentCompletion, MaskCompletion
from dice.assistant.validation import Validation, build_options, verdict_context
from dice.cuda_source import CudaDocument, Mask, TextEdit, splice
from dice.cuda_source.positions import decode_bytes, encode_text
from dice.validator.spec_origin import spec_origin
from dice.validator.verdict import mark_unchecked

if TYPE_CHECKING:
    from dice.validator import Verdict
    from engine.interface import CompletionLike, InferenceEngine

# documents can be megabytes each: the document cache is also bounded by the text it holds
DOCUMENT_CACHE_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass
class Fill:
    """One generated fill, as the pipeline carries it until it is ranked."""

    text: str
    confidence: float
    tokens: int | None = None

    @classmethod
    def of(cls, completion: CompletionLike, text: str | None = None) -> Fill:
        return cls(
            completion.text if text is None else text, float(completion.confidence), len(completion.token_ids)
        )


class FillPipeline:
    """Fills holes of a document with the owner's model and validates them with ``validation``."""

    def __init__(
        self, model: ModelOwner, validation: Validation, *, cache_size: int, stats: dict[str, int]
    ) -> None:
        self.model = model
        self.validation = validation
        self.stats = stats
        self.workspace_root: str | None = None  # the editor's workspace: include path of last resort
        self.documents: LRU[str, DocumentCompletion] = LRU(
            cache_size, max_weight=DOCUMENT_CACHE_BYTES, weight=_completion_size
        )
        self.fills: LRU[str, list[Fill]] = LRU(cache_size * 8)

    @property
    def settings(self) -> AssistantSettings:
        return self.model.settings

    async def complete(
        self,
        text: str,
        doc: CudaDocument,
        holes: list[Hole],
        masks: dict[int, Mask],
        n: int,
        request: Request,
        filename: str | Path | None,
        *,
        started: float,
    ) -> DocumentCompletion:
        """The completion of ``holes`` (the model is loaded); ``started``: ``time.perf_counter()`` when the
        caller began (timings count from there)."""
        s = self.settings
        t0 = started
        # the file name is in the key: cached verdicts carry compiler logs that name the file
        key = digest(
            "document",
            text,
            [(h.index, h.start_byte, h.end_byte) for h in holes],
            n,
            s.decode_key(),
            s.validation_level,
            s.trusted_workspace,
            self.model.key(),
            verdict_context(text, filename, build_options(s, self.workspace_root)),
        )
        cached = self.documents.get(key)
        if cached is not None and _verdicts_current(cached):
            self.stats["document_cache_hits"] += 1
            return dataclasses.replace(cached, from_cache=True)

        requests = await asyncio.to_thread(lambda: [self.fit_request(doc, h) for h in holes])
        calls_per_hole = 1 + (1 if n > 1 else 0)
        request.steps_total = sum(calls_per_hole * steps_for(r.max_new_tokens, s) for r in requests)
        fills, timing, duplicates = await self._generate_all(requests, n, request)
        t_generated = time.perf_counter()
        # a blank (or comment-only) fill only deletes the hole: it would "compile" and outrank every real
        # attempt
        empty = sum(1 for f in fills for x in f if is_blank(x.text))
        fills = [[x for x in f if not is_blank(x.text)] for f in fills]
        results, chosen, best_verdict = await self._validate_and_rank(
            doc, holes, masks, fills, request, filename
        )
        best_text, edits = splice_holes(doc, holes, chosen)
        completion = DocumentCompletion(
            masks=results,
            best_text=best_text,
            edits=edits,
            from_cache=False,
            best_verdict=best_verdict,
            partial=request.partial,
            model=self.model.info,
            stats={
                "generate_s": t_generated - t0,
                "greedy_s": timing - t0,
                "validate_s": time.perf_counter() - t_generated,
                "total_s": time.perf_counter() - t0,
                "steps": float(request.steps_done),
                "empty_fills": float(empty),
                "duplicates": float(duplicates),  # candidates dropped as the same text as an earlier one
            },
        )
        if not completion.partial:
            self.documents.put(key, completion)
        return completion

    async def _generate_all(
        self, requests: list[InfillRequest], n: int, request: Request
    ) -> tuple[list[list[Fill]], float, int]:
        """The greedy fill of every hole first (something to show even under a tight latency budget), then
        ``n - 1`` sampled ones per hole until the deadline. Returns the fills, when the greedy ones were
        done, and how many sampled fills were dropped as duplicates."""
        s = self.settings
        fills: list[list[Fill]] = []
        for i, req in enumerate(requests):
            request.raise_if_cancelled()
            label = f"filling mask {i + 1}/{len(requests)}"
            greedy = await self.infill(request, req, 1, None, label, respect_deadline=False)
            assert greedy is not None  # the greedy fill ignores the deadline
            fills.append(greedy)
        t_greedy = time.perf_counter()
        duplicates = 0
        if n > 1:
            for i, req in enumerate(requests):
                request.raise_if_cancelled()
                if request.past_deadline:
                    request.partial = True
                    break
                label = f"sampling mask {i + 1}/{len(requests)}"
                more = await self.infill(
                    request, req, n - 1, s.sample_temperature, label, respect_deadline=True
                )
                if more is None:
                    request.partial = True
                    break
                merged = dedupe(fills[i] + more)
                duplicates += len(fills[i]) + len(more) - len(merged)
                fills[i] = merged
        request.emit("generating", request.steps_total, request.steps_total, "generated")
        return fills, t_greedy, duplicates

    async def _validate_and_rank(
        self,
        doc: CudaDocument,
        holes: list[Hole],
        masks: dict[int, Mask],
        fills: list[list[Fill]],
        request: Request,
        filename: str | Path | None,
    ) -> tuple[list[MaskCompletion], dict[int, str], Verdict | None]:
        level = self.settings.validation_level
        build = build_options(self.settings, self.workspace_root)
        chosen: dict[int, str] = {}
        results: list[MaskCompletion] = []
        total_checks = sum(len(f) for f in fills)
        checks_done = 0
        best_verdict: Verdict | None = None
        # the spec is the user's, read before any fill is spliced in; fills that change it are rejected
        spec = await asyncio.to_thread(spec_origin, doc)
        for i, hole in enumerate(holes):
            request.raise_if_cancelled()
            if not fills[i]:  # nothing but blank or comment-only fills: the hole stays as it is
                results.append(MaskCompletion(mask=masks[hole.index], candidates=[]))
                continue
            others: dict[int, str] = {}
            for j, h in enumerate(holes):
                if j < i and h.index in chosen:
                    others[h.index] = chosen[h.index]
                elif j > i and fills[j]:
                    others[h.index] = fills[j][0].text
            texts = [splice_holes(doc, holes, {**others, hole.index: f.text})[0] for f in fills[i]]
            verdicts = await self.validation.texts(
                request,
                texts,
                level=level,
                filename=filename,
                build=build,
                done_before=checks_done,
                total=total_checks,
                spec=spec,
            )
            # a fill in code no compiler type-checked (a template nothing instantiates ...) says so
            line = _hole_line(doc, holes, others, hole)
            verdicts = [None if v is None else mark_unchecked(v, line) for v in verdicts]
            checks_done += len(texts)
            keep = [k for k in range(len(texts)) if level == "none" or verdicts[k] is not None]
            if len(keep) < len(texts):
                request.partial = True
            kept = [fills[i][k] for k in keep]
            kept_verdicts = [verdicts[k] for k in keep]
            order = rank(kept, kept_verdicts, [f.confidence for f in kept])
            ranked = [
                Candidate(
                    text=kept[k].text,
                    verdict=kept_verdicts[k],
                    confidence=kept[k].confidence,
                    rank=r,
                    tokens=kept[k].tokens,
                )
                for r, k in enumerate(order)
            ]
            chosen[hole.index] = ranked[0].text
            best_verdict = ranked[0].verdict
            results.append(MaskCompletion(mask=masks[hole.index], candidates=ranked))
        return results, chosen, best_verdict

    def fit_request(self, doc: CudaDocument, hole: Hole) -> InfillRequest:
        """The infilling request for ``hole``, trimmed until the rendered prompt plus the new tokens fit the
        model's context window (counted with the model's own tokenizer and template)."""
        s = self.settings
        engine = self.model.engine
        assert engine is not None

        def build(budget: int | None) -> InfillRequest:
            return build_infill_request(
                doc,
                hole,
                default_max_new_tokens=s.max_new_tokens,
                budget_chars=budget,
                hole_cut=self.model.hole_cut,
            )

        limit = int(engine.config.max_position_embeddings)
        # no BPE token of code averages 16 bytes: this pre-cut only spares tokenizing a huge file
        req = build(16 * limit)
        count = prompt_token_counter(engine)
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

    async def infill(
        self,
        request: Request,
        req: InfillRequest,
        count: int,
        temperature: float | None,
        label: str,
        *,
        respect_deadline: bool,
    ) -> list[Fill] | None:
        """``count`` fills of one hole (greedy when ``temperature`` is None); None when the deadline hit."""
        from engine.errors import Cancelled

        s = self.settings
        key = digest("fill", req.key(), count, temperature, s.decode_key(), self.model.key())
        cached = self.fills.get(key)
        if cached is not None:
            request.steps_done += steps_for(req.max_new_tokens, s)
            return list(cached)
        engine = self.model.engine
        assert engine is not None

        def work() -> list[Fill]:
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
                shape=req.shape,
                on_step=request.on_step(respect_deadline=respect_deadline, message=label),
                **decode,
            )
            return [Fill.of(o, shaped_fill(req, o.text)) for o in outs]

        try:
            fills = await self.model.run(work, request)
        except Cancelled as exc:
            if exc.reason == "deadline":
                return None
            raise
        self.fills.put(key, fills)
        return list(fills)

    def clear(self) -> None:
        """Forget finished documents (their verdicts may be stale); generated fills stay valid."""
        self.documents.clear()


# ------------------------------------------------------------------------------------------------ helpers
def steps_for(max_new_tokens: int, settings: AssistantSettings) -> int:
    """An upper bound on the denoising steps of one generation (progress totals)."""
    # the prompt tail may share the first block with new tokens: one extra block at most
    blocks = math.ceil(max_new_tokens / settings.block_size) + 1
    return blocks * settings.steps_per_block


def prompt_token_counter(engine: InferenceEngine) -> Callable[[InfillRequest], int] | None:
    """Counts the tokens ``engine.infill`` would feed the model for a request (None: cannot tell)."""
    tokenizer = engine.tokenizer
    if tokenizer is None:
        return None
    from engine.prompts import infill_prompt

    def count(req: InfillRequest) -> int:
        prompt, response_prefix = infill_prompt(req.prefix, req.suffix, req.context)
        return len(tokenizer.encode(prompt + response_prefix))

    return count


def shaped_fill(req: InfillRequest, middle: str) -> str:
    """The text that replaces the hole, from an engine's middle: cut where the hole's shape ends (again:
    an injected engine may not know ``shape``; the cut is idempotent), then mapped onto the mask's range."""
    from engine.shape import cut_to_shape

    return req.mask_fill(cut_to_shape(middle, req.shape)[0])


_COMMENT = re.compile(r"/\*.*?(?:\*/|\Z)|//[^\n]*", re.DOTALL)


def is_blank(fill: str) -> bool:
    """Nothing but whitespace and comments (a comment look-alike inside a string leaves the string's
    other characters behind, so real code is never called blank)."""
    return not _COMMENT.sub("", fill).strip()


def dedupe(fills: list[Fill]) -> list[Fill]:
    """Identical fills collapse to the first (greedy) one, keeping the highest confidence seen."""
    out: dict[str, Fill] = {}
    for f in fills:
        if f.text in out:
            out[f.text].confidence = max(out[f.text].confidence, f.confidence)
        else:
            out[f.text] = dataclasses.replace(f)
    return list(out.values())


def splice_holes(doc: CudaDocument, holes: list[Hole], fills: dict[int, str]) -> tuple[str, list[TextEdit]]:
    """Splice fills into the document; explicit masks go through dice.cuda_source.splice, the implicit
    cursor hole (index -1) is a zero-width insertion."""
    if -1 in fills:
        hole = next(h for h in holes if h.index == -1)
        data = doc.data
        new = data[: hole.start_byte] + encode_text(fills[-1]) + data[hole.end_byte :]
        rng = doc.index.range_of(hole.start_byte, hole.end_byte)
        return decode_bytes(new), [TextEdit(range=rng, new_text=fills[-1])]
    result = splice(doc.text, fills, doc=doc)
    return result.text, list(result.edits)


def _hole_line(doc: CudaDocument, holes: list[Hole], others: dict[int, str], hole: Hole) -> int:
    """The 0-based line where ``hole``'s fill starts in the text spliced with ``others`` (the other holes'
    fills shift it by the line breaks they add or remove)."""
    data = doc.data
    line = data.count(b"\n", 0, hole.start_byte)
    for h in holes:
        if h.index in others and h.end_byte <= hole.start_byte:
            line += others[h.index].count("\n") - data.count(b"\n", h.start_byte, h.end_byte)
    return line


def _verdicts_current(completion: DocumentCompletion) -> bool:
    """Whether no file the completion's verdicts rest on (headers, database, spec modules) changed."""
    verdicts = [c.verdict for m in completion.masks for c in m.candidates] + [completion.best_verdict]
    return all(v is None or v.current for v in verdicts)


def hole_of(mask: Mask) -> Hole:
    return Hole(
        index=mask.index,
        start_byte=mask.start_byte,
        end_byte=mask.end_byte,
        budget=mask.budget,
        function_start_byte=mask.function_start_byte,
        function_end_byte=mask.function_end_byte,
    )


def _completion_size(c: DocumentCompletion) -> int:
    return len(c.best_text) + sum(len(x.text) for m in c.masks for x in m.candidates)
