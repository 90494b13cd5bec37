"""Whole-program generation for a KernelBench-format reference: sample ``ModelNew`` programs on the model
thread, validate each with the KernelBench protocol, rank them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dice.assistant.caches import LRU, digest
from dice.assistant.fills import Fill, dedupe, steps_for
from dice.assistant.model import ModelOwner
from dice.assistant.ranking import rank
from dice.assistant.request import Request
from dice.assistant.types import RankedProgram
from dice.assistant.validation import Validation

if TYPE_CHECKING:
    from dice.validator import Verdict


class ProgramGenerator:
    def __init__(
        self, model: ModelOwner, validation: Validation, *, cache_size: int, stats: dict[str, int]
    ) -> None:
        self.model = model
        self.validation = validation
        self.stats = stats
        self.programs: LRU[str, list[RankedProgram]] = LRU(cache_size)

    def budget(self, ref_src: str, requested: int) -> int:
        """``requested`` new tokens, capped by what the context window leaves after the prompt."""
        engine = self.model.engine
        assert engine is not None
        if engine.tokenizer is None:
            return requested
        from engine.prompts import kernelbench_prompt

        limit = int(engine.config.max_position_embeddings)
        prompt_tokens = len(engine.tokenizer.encode(kernelbench_prompt(ref_src)))
        room = limit - prompt_tokens
        if room < 1:
            raise ValueError(
                f"the KernelBench prompt for this reference takes {prompt_tokens} tokens: more "
                f"than the model's context window ({limit} tokens)"
            )
        return min(requested, room)

    async def generate(self, ref_src: str, n: int, budget: int, request: Request) -> list[RankedProgram]:
        """Sample 0 greedy, the others sampled; best first. Programs the validation did not judge are left
        out unless validation is off."""
        from engine.answers import extract_program

        s = self.model.settings
        key = digest(
            "program",
            ref_src,
            n,
            budget,
            s.decode_key(),
            s.validation_level,
            s.trusted_workspace,
            self.model.key(),
        )
        cached = self.programs.get(key)
        if cached is not None:
            self.stats["document_cache_hits"] += 1
            return list(cached)
        calls = 1 + (1 if n > 1 else 0)
        request.steps_total = calls * steps_for(budget, s)
        engine = self.model.engine
        assert engine is not None

        def generate(count: int, temperature: float, seed: int | None) -> list[Fill]:
            self.stats["engine_calls"] += 1
            on_step = request.on_step(respect_deadline=False, message="generating programs")
            outs = engine.generate_program(
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
            return [Fill.of(o, extract_program(o.text)) for o in outs]

        fills = await self.model.run(lambda: generate(1, 0.0, None), request)
        if n > 1:
            fills += await self.model.run(lambda: generate(n - 1, s.sample_temperature, s.seed), request)
        fills = dedupe(fills)
        verdicts: list[Verdict | None] = [None] * len(fills)
        if s.validation_level != "none":
            timing = s.validation_level == "run"
            verdicts = await self.validation.programs(
                request, ref_src, [f.text for f in fills], timing=timing
            )
        order = rank(fills, verdicts, [f.confidence for f in fills])
        result = [
            RankedProgram(source=fills[i].text, verdict=verdicts[i], confidence=fills[i].confidence)
            for i in order
            if s.validation_level == "none" or verdicts[i] is not None
        ]
        self.programs.put(key, result)
        return list(result)

    def clear(self) -> None:
        self.programs.clear()
