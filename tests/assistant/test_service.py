"""AssistantService end to end on CPU: real tree-sitter masks, real NVRTC compile verdicts, and either the
tiny real checkpoint or a scripted engine where a test needs exact fills."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dice.assistant import AssistantService, AssistantSettings, Progress
from dice.cuda_source import parse_document
from dice.validator.verdict import FLAG_FILL_NOT_CHECKED, verdict_label

from .conftest import BAD_SCALE, GOOD_SCALE, GOOD_SQUARE, TWO_MASKS, CountingEngine


def _fills_for_two_masks(prefix: str, suffix: str, n: int, temperature: float) -> list[tuple[str, float]]:
    if "square" in suffix:  # the hole in scale(): greedy is confident but broken, the sample compiles
        return [(BAD_SCALE, 0.9)] if temperature == 0.0 else [(GOOD_SCALE, 0.4)] * n
    return [(GOOD_SQUARE, 0.8)] if temperature == 0.0 else [("return v + v;", 0.3)] * n


def _apply_edits(text: str, edits: list[Any]) -> str:
    """Apply LSP TextEdits (ranges in the original text) the way an editor does."""
    doc = parse_document(text)
    data = doc.data
    out = []
    cursor = 0
    spans = sorted(
        (doc.index.position_to_byte(e.range.start), doc.index.position_to_byte(e.range.end), e.new_text)
        for e in edits
    )
    for start, end, new in spans:
        out.append(data[cursor:start])
        out.append(new.encode("utf-8"))
        cursor = end
    out.append(data[cursor:])
    return b"".join(out).decode("utf-8")


@pytest.fixture
def settings() -> AssistantSettings:
    return AssistantSettings(candidates=2, validation_level="compile", max_latency_ms=0)


async def test_masks_filled_ranked_and_spliced(scripted_engine_factory, validator_pool, settings) -> None:
    engine = scripted_engine_factory(_fills_for_two_masks)
    service = AssistantService(settings, engine=engine, validator=validator_pool)
    events: list[Progress] = []
    result = await service.complete_document(TWO_MASKS, progress=events.append)

    assert [m.mask.index for m in result.masks] == [0, 1]
    scale, square = result.masks
    # compiled beats confidence: the sampled fill wins over the more confident greedy one
    assert [c.text for c in scale.candidates] == [GOOD_SCALE, BAD_SCALE]
    assert [c.rank for c in scale.candidates] == [0, 1]
    assert scale.candidates[0].verdict.compiled and scale.candidates[0].verdict.status == "compiled"
    assert scale.candidates[1].verdict.status == "compile_error"
    assert square.candidates[0].text == GOOD_SQUARE  # both compile: confidence decides

    doc = parse_document(TWO_MASKS)
    m0, m1 = doc.masks
    data = TWO_MASKS.encode()
    expected = (
        data[: m0.start_byte]
        + GOOD_SCALE.encode()
        + data[m0.end_byte : m1.start_byte]
        + GOOD_SQUARE.encode()
        + data[m1.end_byte :]
    ).decode()
    assert result.best_text == expected
    assert _apply_edits(TWO_MASKS, result.edits) == expected
    assert result.best_verdict is not None and result.best_verdict.compiled
    assert not result.from_cache and not result.partial

    # each fill saw the file with the other hole still in it; the budget capped the second one
    first, second, _, _ = engine.requests  # greedy fills first, then the samples
    assert "// <MASK:16>" in first["suffix"] and first["max_new_tokens"] == settings.max_new_tokens
    assert "/* <MASK> */" in second["prefix"] and second["max_new_tokens"] == 16
    assert [r["temperature"] for r in engine.requests] == [
        0.0,
        0.0,
        settings.sample_temperature,
        settings.sample_temperature,
    ]
    assert {e.stage for e in events} == {"loading", "generating", "validating"}
    validating = [e for e in events if e.stage == "validating"]
    assert validating[-1].done == validating[-1].total == 4


async def test_same_request_twice_is_served_from_cache(
    scripted_engine_factory, validator_pool, settings
) -> None:
    engine = scripted_engine_factory(_fills_for_two_masks)
    service = AssistantService(settings, engine=engine, validator=validator_pool)
    first = await service.complete_document(TWO_MASKS)
    calls, validations = len(engine.requests), service.stats["validations"]

    second = await service.complete_document(TWO_MASKS)
    assert second.from_cache and not first.from_cache
    assert len(engine.requests) == calls  # the engine was not called again
    assert service.stats["validations"] == validations
    assert second.best_text == first.best_text

    # a change that matters (the text) misses the document cache
    third = await service.complete_document(TWO_MASKS.replace("float a", "float alpha"))
    assert not third.from_cache and len(engine.requests) > calls


async def test_compiler_logs_name_the_users_file(scripted_engine_factory, validator_pool) -> None:
    engine = scripted_engine_factory(lambda p, s, n, t: [(BAD_SCALE if "square" in s else GOOD_SQUARE, 0.5)])
    service = AssistantService(
        AssistantSettings(candidates=1, validation_level="compile"), engine=engine, validator=validator_pool
    )
    default = await service.complete_document(TWO_MASKS)
    named = await service.complete_document(TWO_MASKS, filename="/some/dir/tiled_matmul.cu")
    # the same text under another name is not served the other name's cached log
    assert not named.from_cache
    assert default.best_verdict is not None and named.best_verdict is not None
    assert default.best_verdict.status == named.best_verdict.status == "compile_error"
    assert "kernel.cu(6): error" in default.best_verdict.log
    assert "tiled_matmul.cu(6): error" in named.best_verdict.log and "kernel.cu" not in named.best_verdict.log
    assert "/some/dir" not in named.best_verdict.log  # the base name only
    again = await service.complete_document(TWO_MASKS, filename="/some/dir/tiled_matmul.cu")
    assert again.from_cache and again.best_verdict is not None  # same file: served from the cache
    # the same name in another folder is another file (its compile command and includes differ)
    assert not (await service.complete_document(TWO_MASKS, filename="tiled_matmul.cu")).from_cache
    assert "tiled_matmul.cu(6)" in again.best_verdict.log

    verdict = await service.validate_document(named.best_text, filename="tiled_matmul.cu")
    assert verdict.status == "compile_error" and verdict.diagnostics[0]["line"] == 5
    assert verdict.log.startswith("tiled_matmul.cu(6): error")


async def test_validation_none_and_mask_selection(scripted_engine_factory) -> None:
    engine = scripted_engine_factory(_fills_for_two_masks)
    service = AssistantService(AssistantSettings(candidates=1, validation_level="none"), engine=engine)
    result = await service.complete_document(TWO_MASKS, mask_indices=[1])
    assert [m.mask.index for m in result.masks] == [1]
    assert result.masks[0].candidates[0].verdict is None
    assert "/* <MASK> */" in result.best_text and GOOD_SQUARE in result.best_text
    assert len(engine.requests) == 1 and service.stats["validations"] == 0


async def test_no_masks_calls_nothing(scripted_engine_factory) -> None:
    engine = scripted_engine_factory(_fills_for_two_masks)
    service = AssistantService(AssistantSettings(), engine=engine)
    text = "__global__ void k(float* x) { x[0] = 1.0f; }\n"
    result = await service.complete_document(text)
    assert result.masks == [] and result.best_text == text and result.edits == []
    assert engine.requests == []


async def test_complete_at_cursor_is_an_implicit_mask(scripted_engine_factory, validator_pool) -> None:
    engine = scripted_engine_factory(lambda p, s, n, t: [("if (i < n) y[i] = a * x[i];\n    ", 0.7)])
    service = AssistantService(
        AssistantSettings(candidates=1, validation_level="compile"), engine=engine, validator=validator_pool
    )
    text = TWO_MASKS.replace("    /* <MASK> */\n", "    \n")
    cursor = text.encode().index(b"threadIdx.x;\n") + len(b"threadIdx.x;\n    ")
    result = await service.complete_at(text, cursor)
    assert len(result.masks) == 1 and result.masks[0].mask.index == -1
    assert result.masks[0].mask.function == "scale"
    assert engine.requests[0]["prefix"] == text.encode()[:cursor].decode()
    assert engine.requests[0]["suffix"] == text.encode()[cursor:].decode()
    data = text.encode()
    # a cursor on an otherwise blank line is a statement hole: the fill ends after its statement
    assert result.best_text.encode() == data[:cursor] + b"if (i < n) y[i] = a * x[i];" + data[cursor:]
    (edit,) = result.edits
    assert edit.range.start == edit.range.end
    assert result.best_verdict is not None and result.best_verdict.compiled

    # on the mask itself: that mask; outside any function: nothing
    at_mask = await service.complete_at(TWO_MASKS, parse_document(TWO_MASKS).masks[1].start_byte + 3)
    assert [m.mask.index for m in at_mask.masks] == [1]
    outside = await service.complete_at(TWO_MASKS, 3)
    assert outside.masks == [] and outside.best_text == TWO_MASKS


async def test_latency_budget_returns_best_validated_so_far(scripted_engine_factory, validator_pool) -> None:
    engine = scripted_engine_factory(_fills_for_two_masks, step_delay_s=0.005)  # 20 ms per generation
    settings = AssistantSettings(candidates=3, validation_level="compile", max_latency_ms=1)
    service = AssistantService(settings, engine=engine, validator=validator_pool)
    result = await service.complete_document(TWO_MASKS)
    assert result.partial
    # the greedy fill of every mask is always generated and validated; sampling was cut by the deadline
    assert [len(m.candidates) for m in result.masks] == [1, 1]
    assert all(r["temperature"] == 0.0 for r in engine.requests)
    assert result.masks[0].candidates[0].verdict.status == "compile_error"
    # partial results are not cached: with time to spare the same request does the full work
    service.update_settings(settings.replace(max_latency_ms=0))
    full = await service.complete_document(TWO_MASKS)
    assert not full.from_cache and not full.partial
    assert full.masks[0].candidates[0].text == GOOD_SCALE


async def test_cancel_stops_within_one_denoising_step(tiny_engine) -> None:
    engine = CountingEngine(tiny_engine, step_delay_s=0.01)
    settings = AssistantSettings(candidates=1, validation_level="none", max_new_tokens=64, policy="static")
    service = AssistantService(settings, engine=engine)
    cancel = asyncio.Event()
    seen_at_cancel: list[int] = []

    def progress(event: Progress) -> None:
        if event.stage == "generating" and event.done >= 3 and not cancel.is_set():
            cancel.set()
            seen_at_cancel.append(engine.steps)  # read after setting: later steps are the overrun

    with pytest.raises(asyncio.CancelledError):
        await service.complete_document(TWO_MASKS, progress=progress, cancel=cancel)
    assert seen_at_cancel, "generation finished before it could be cancelled"
    assert engine.steps <= seen_at_cancel[0] + 1
    assert engine.calls == 1  # the second mask was never started

    # the model thread is free again: a new (short) request runs to the end
    service.update_settings(settings.replace(max_new_tokens=4))
    result = await service.complete_document(TWO_MASKS, mask_indices=[1])
    assert len(result.masks) == 1 and not result.from_cache and result.masks[0].candidates[0].tokens <= 4


async def test_cancelling_the_task_stops_the_model_thread(tiny_engine) -> None:
    engine = CountingEngine(tiny_engine, step_delay_s=0.01)
    settings = AssistantSettings(candidates=1, validation_level="none", max_new_tokens=64, policy="static")
    service = AssistantService(settings, engine=engine)
    task = asyncio.create_task(service.complete_document(TWO_MASKS))
    while engine.steps < 2 and not task.done():
        await asyncio.sleep(0.005)
    assert not task.done(), "generation finished before it could be cancelled"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    at_cancel = engine.steps
    # the model thread runs one job at a time: this returns once the cancelled generation has ended, so a
    # generation that kept decoding to its end (64 steps) would show here, with no timing to guess
    await service.wait_idle()
    assert engine.steps <= at_cancel + 1
    # the model thread is free: the next (short) request runs to the end
    service.update_settings(settings.replace(max_new_tokens=4))
    result = await service.complete_document(TWO_MASKS, mask_indices=[1])
    assert engine.calls == 2 and len(result.masks) == 1


async def test_tiny_model_end_to_end(tiny_engine, validator_pool) -> None:
    text = TWO_MASKS.replace("<MASK:16>", "<MASK:5>")
    settings = AssistantSettings(
        candidates=2, validation_level="compile", max_latency_ms=0, max_new_tokens=10
    )
    service = AssistantService(settings, engine=tiny_engine, validator=validator_pool)
    result = await service.complete_document(text)
    doc = parse_document(text)
    assert len(result.masks) == 2
    for mc in result.masks:
        assert 1 <= len(mc.candidates) <= 2
        assert [c.rank for c in mc.candidates] == list(range(len(mc.candidates)))
        for c in mc.candidates:
            assert c.verdict is not None and c.verdict.status in ("compiled", "compile_error")
    # max_new_tokens caps the first hole, the <MASK:5> budget the second: counted in the model's tokens
    assert all(c.tokens is not None and 1 <= c.tokens <= 10 for c in result.masks[0].candidates)
    assert all(c.tokens is not None and 1 <= c.tokens <= 5 for c in result.masks[1].candidates)
    # best_text is the file with exactly the two comments replaced
    data, best = text.encode(), result.best_text.encode()
    m0, m1 = doc.masks
    f0, f1 = (mc.candidates[0].text.encode() for mc in result.masks)
    assert best == data[: m0.start_byte] + f0 + data[m0.end_byte : m1.start_byte] + f1 + data[m1.end_byte :]
    assert result.model is not None and result.model.device == "cpu" and result.model.parameters > 0


async def test_cancel_between_validations(scripted_engine_factory, validator_pool) -> None:
    engine = scripted_engine_factory(_fills_for_two_masks)
    service = AssistantService(
        AssistantSettings(candidates=2, validation_level="compile", max_latency_ms=0),
        engine=engine,
        validator=validator_pool,
    )
    cancel = asyncio.Event()

    def progress(event: Progress) -> None:
        if event.stage == "validating":
            cancel.set()

    with pytest.raises(asyncio.CancelledError):
        await service.complete_document(TWO_MASKS, progress=progress, cancel=cancel)
    assert len(engine.requests) == 4  # generation had finished
    assert service.stats["validations"] == 0  # no verdict was waited for after the cancel


async def test_generate_kernel_ranks_validated_programs(
    scripted_engine_factory, validator_pool, repo_root
) -> None:
    ref = (repo_root / "examples" / "kernelbench_softmax.py").read_text()
    good = (repo_root / "examples" / "solutions" / "kernelbench_softmax.py").read_text()
    broken = "import torch\nclass ModelNew(torch.nn.Module:\n    pass\n"

    def programs(ref_src: str, _: str, n: int, temperature: float) -> list[tuple[str, float]]:
        assert ref_src == ref
        if temperature == 0.0:  # confident but broken
            return [(f"Here is the code:\n```python\n{broken}```\n", 0.9)]
        return [(f"```python\n{good}```", 0.2)] * n

    engine = scripted_engine_factory(programs)
    service = AssistantService(
        AssistantSettings(candidates=3, validation_level="compile"), engine=engine, validator=validator_pool
    )
    ranked = await service.generate_kernel(ref)
    assert [p.source for p in ranked] == [good.strip() + "\n", broken]  # fences and prose removed
    assert ranked[0].verdict.status == "compiled" and ranked[1].verdict.status == "compile_error"
    calls = len(engine.requests)
    again = await service.generate_kernel(ref)
    assert [p.source for p in again] == [p.source for p in ranked] and len(engine.requests) == calls


def test_blank_means_whitespace_and_comments_only() -> None:
    from dice.assistant.fills import is_blank as _is_blank

    assert _is_blank("  \n\t") and _is_blank("// TODO\n  /* later */ ") and _is_blank("/* unterminated")
    assert not _is_blank('printf("// not a comment");') and not _is_blank("x = 1; // set x")


async def test_blank_fills_are_not_candidates(scripted_engine_factory, validator_pool) -> None:
    def fills(prefix: str, suffix: str, n: int, temperature: float) -> list[tuple[str, float]]:
        if "square" in suffix:
            return [("  \n", 0.99)] if temperature == 0.0 else [(GOOD_SCALE, 0.3)] * n
        return [("\n", 0.99)] if temperature == 0.0 else [("// return v * v;", 0.9)] * n  # no code

    engine = scripted_engine_factory(fills)
    service = AssistantService(
        AssistantSettings(candidates=2, validation_level="compile", max_latency_ms=0),
        engine=engine,
        validator=validator_pool,
    )
    result = await service.complete_document(TWO_MASKS)
    scale, square = result.masks
    assert [c.text for c in scale.candidates] == [GOOD_SCALE]
    assert square.candidates == []
    assert result.best_text == TWO_MASKS.replace("/* <MASK> */", GOOD_SCALE)  # the blank hole stays a mask
    assert result.best_verdict is not None and result.best_verdict.compiled
    assert result.stats["empty_fills"] == 3  # distinct blank fills: "  \n", "\n", "// return v * v;"


async def test_loading_primes_the_prompt_opening(tiny_checkpoint) -> None:
    """A service that loads its own model prefills the template's opening, so the first request reuses it."""
    from engine.prompts import infill_opening

    settings = AssistantSettings(
        model_path=str(tiny_checkpoint), device="cpu", candidates=1, validation_level="none"
    )
    service = AssistantService(settings)
    await service.load()
    engine = service.engine
    opening = engine.tokenizer.encode(infill_opening())
    assert len(engine.prefix_cache) == 1 and engine.prefix_cache.tokens == len(opening) // 4 * 4
    before = engine.prefix_cache.reused_tokens
    await service.complete_document(TWO_MASKS, mask_indices=[0])
    assert engine.prefix_cache.reused_tokens - before >= len(opening) // 4 * 4 - 4
    service.close()


async def test_invalidate_forgets_verdicts_but_keeps_fills(scripted_engine_factory, validator_pool) -> None:
    """What the language server calls when a file a dice-spec imports changed: every verdict (and every
    document result holding one) is computed again; the fills, whose prompt did not change, are not."""
    engine = scripted_engine_factory(_fills_for_two_masks)
    settings = AssistantSettings(candidates=1, validation_level="compile", max_latency_ms=0)
    service = AssistantService(settings, engine=engine, validator=validator_pool)
    await service.complete_document(TWO_MASKS)
    again = await service.complete_document(TWO_MASKS)
    assert again.from_cache and service.stats["document_cache_hits"] == 1
    calls, validations = service.stats["engine_calls"], service.stats["validations"]

    service.invalidate()
    fresh = await service.complete_document(TWO_MASKS)
    assert not fresh.from_cache
    assert service.stats["engine_calls"] == calls  # fills came from the fill cache
    assert service.stats["validations"] > validations  # verdicts were computed again, not read back


async def test_cursor_in_host_code_is_not_a_hole(scripted_engine_factory) -> None:
    """One rule for the editor and the service (dice.assistant.rules.implicit_mask_at): kernels and device
    functions only. The service used to fill host bodies that the editor never offered and nothing checked."""
    engine = scripted_engine_factory(lambda p, s, n, t: [("x = 1;", 0.9)])
    service = AssistantService(AssistantSettings(candidates=1, validation_level="none"), engine=engine)
    text = "void host_helper(int* out) {\n    \n}\n__global__ void k(float* y) {\n    \n}\n"
    host = text.index("{\n    ") + 6
    kernel = text.index("{\n    ", host) + 6
    assert (await service.complete_at(text, host)).masks == [] and engine.requests == []
    assert len((await service.complete_at(text, kernel)).masks) == 1


TEMPLATE_HOLE = """\
template <typename T>
__global__ void unrolled(T* y) {
    /* <MASK> */
}
"""


async def test_a_fill_in_a_template_nothing_instantiates_is_not_checked(
    scripted_engine_factory, validator_pool
) -> None:
    # nothing instantiates `unrolled`: its syntax is checked, its types never are, so a fill that is only
    # wrong once T is known is "not checked", never "compiled ✓"
    async def verdict_of(fill: str) -> Any:
        engine = scripted_engine_factory(lambda p, s, n, t: [(fill, 0.9)])
        settings = AssistantSettings(candidates=1, validation_level="compile")
        service = AssistantService(settings, engine=engine, validator=validator_pool)
        result = await service.complete_document(TEMPLATE_HOLE, filename="unrolled.cu")
        return result.masks[0].candidates[0].verdict

    syntax = await verdict_of("for for for ;")
    assert syntax is not None
    # nvcc parses the template and finds the syntax error; NVRTC alone does not parse it: not checked
    assert syntax.status == "compile_error" or FLAG_FILL_NOT_CHECKED in syntax.flags
    typed = await verdict_of("y[0] = T::no_such_member(y);")
    assert typed is not None and typed.status == "compiled"
    assert FLAG_FILL_NOT_CHECKED in typed.flags
    assert typed.message.startswith("fill not checked: template never instantiated")
    assert verdict_label(typed).startswith("not checked (template never instantiated)")
    assert "compiled ✓" not in verdict_label(typed)
