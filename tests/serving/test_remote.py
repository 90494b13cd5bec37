"""The assistant's remote backend (``engine.remote.RemoteEngine``): the same fills through ``dice serve`` as
in process, retries, a server that is down or goes away, cancellation, model choice."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from engine.errors import Cancelled, RemoteError, ServerUnavailable
from engine.remote import RemoteEngine, normalize_url

ROOT = Path(__file__).resolve().parents[2]
PREFIX = (
    "__global__ void saxpy(int n, float a, const float* x, float* y) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) {\n        "
)
SUFFIX = "\n    }\n}\n"
DECODE = {"block_size": 4, "steps_per_block": 4, "policy": "dynamic", "threshold": 0.9}


@pytest.fixture(scope="module")
def remote(served):
    engine = RemoteEngine(served.url)
    yield engine
    engine.close()


@pytest.mark.parametrize("shape", ["statement", "line", "expression", "block", None])
def test_greedy_fills_equal_the_in_process_engine(remote, tiny_engine, shape):
    local = tiny_engine.infill(PREFIX, SUFFIX, n=1, max_new_tokens=64, shape=shape, temperature=0.0, **DECODE)
    far = remote.infill(PREFIX, SUFFIX, n=1, max_new_tokens=64, shape=shape, temperature=0.0, **DECODE)
    assert [c.text for c in far] == [c.text for c in local]
    assert far[0].finished == local[0].finished
    assert far[0].confidence == pytest.approx(local[0].confidence)
    assert far[0].token_ids == local[0].token_ids


def test_seeded_samples_and_programs_equal_the_in_process_engine(remote, tiny_engine):
    kw = {"n": 3, "max_new_tokens": 48, "shape": "statement", "temperature": 0.8, "seed": 11, **DECODE}
    assert [c.text for c in remote.infill(PREFIX, SUFFIX, **kw)] == [
        c.text for c in tiny_engine.infill(PREFIX, SUFFIX, **kw)
    ]
    ref = (ROOT / "examples" / "softmax_rows.cu").read_text()[:400]
    local = tiny_engine.generate_program(ref, max_new_tokens=40, temperature=0.0, **DECODE)
    far = remote.generate_program(ref, max_new_tokens=40, temperature=0.0, **DECODE)
    assert far[0].text == local[0].text


def test_model_card_and_token_counts(remote, tiny_engine):
    assert remote.name == "dice-tiny"
    assert remote.config.max_position_embeddings == tiny_engine.config.max_position_embeddings
    assert remote.tokenizer is not None
    assert remote.tokenizer.encode(PREFIX) == tiny_engine.tokenizer.encode(PREFIX)


def test_the_assistant_fills_the_same_through_a_server(served, tiny_engine):
    from dice.assistant import AssistantService, AssistantSettings

    text = (ROOT / "examples" / "vector_add.cu").read_text()
    settings = AssistantSettings(validation_level="none", candidates=3, max_latency_ms=0)

    async def fill(service):
        return await service.complete_document(text, filename="vector_add.cu")

    with AssistantService(settings, engine=tiny_engine) as here:
        local = asyncio.run(fill(here))
    with AssistantService(settings.replace(server=served.url)) as there:
        far = asyncio.run(fill(there))
        assert there.model_info.describe() == f"dice-tiny on the server at {served.url}"
    assert far.best_text == local.best_text
    assert [[c.text for c in m.candidates] for m in far.masks] == [
        [c.text for c in m.candidates] for m in local.masks
    ]


def test_cli_complete_with_server_flag(served, tmp_path, capsys, monkeypatch):
    from dice.cli import main

    src = tmp_path / "vector_add.cu"
    src.write_text((ROOT / "examples" / "vector_add.cu").read_text())
    argv = ["complete", str(src), "--validation", "none", "--json", "--quiet", "--candidates", "2"]
    main(argv)
    local = json.loads(capsys.readouterr().out)
    main([*argv, "--server", served.url + "/v1"])
    far = json.loads(capsys.readouterr().out)
    assert [m["candidates"] for m in far["masks"]] == [m["candidates"] for m in local["masks"]]
    monkeypatch.setenv("DICE_SERVER", "http://127.0.0.1:9")  # nothing listens on the discard port
    assert main(argv) == 2
    assert "cannot reach the model server at http://127.0.0.1:9" in capsys.readouterr().err


def test_a_server_that_is_down_says_so():
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match="cannot reach the model server at http://127.0.0.1:9"):
        RemoteEngine("http://127.0.0.1:9", retries=1, backoff_s=0.05)
    assert time.monotonic() - started < 5
    with pytest.raises(ValueError, match="http://"):
        normalize_url("localhost:8000")
    assert normalize_url("http://h:1/v1/") == "http://h:1"


def test_a_server_that_goes_away_mid_session(tiny_engine):
    from dice.serving import ServeConfig, start_in_thread

    running = start_in_thread(tiny_engine, ServeConfig(model_name="dice-tiny"))
    engine = RemoteEngine(running.url, retries=1, backoff_s=0.05)
    assert engine.infill(PREFIX, SUFFIX, max_new_tokens=8, **DECODE)
    running.stop()
    with pytest.raises(ServerUnavailable, match="the model server at"):
        engine.infill(PREFIX, SUFFIX, max_new_tokens=8, **DECODE)


def test_cancel_while_waiting_closes_the_stream(served, remote):
    from tests.serving.test_server import metric

    before = metric(served.url, "dice_cancelled_requests_total")
    calls = []

    def on_step(event):
        calls.append(event)
        if len(calls) == 2:
            raise Cancelled("cancel")

    with pytest.raises(Cancelled):
        # many steps to cancel in, within the embedded model's 3,072 positions (the prompt is ~1,200)
        remote.infill(PREFIX, SUFFIX, max_new_tokens=1024, on_step=on_step, stop_ids=[], **DECODE)
    deadline = time.monotonic() + 10
    while metric(served.url, "dice_cancelled_requests_total") <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(served.url, "dice_cancelled_requests_total") > before


def _card(*names):
    return {"object": "list", "data": [{"id": n, "object": "model", "max_model_len": 4096} for n in names]}


def _sse(*texts):
    chunks = [{"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in texts]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_retries_with_backoff_then_gives_up():
    seen = {"models": 0, "completions": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            seen["models"] += 1
            if seen["models"] < 3:
                return httpx.Response(
                    503, json={"error": {"message": "warming up"}}, headers={"retry-after": "0"}
                )
            return httpx.Response(200, json=_card("sdar-8b"))
        if request.url.path == "/tokenize":
            return httpx.Response(404, json={"detail": "Not Found"})
        seen["completions"] += 1
        if seen["completions"] == 1:
            return httpx.Response(502, text="bad gateway")
        if seen["completions"] == 2:
            return httpx.Response(
                200, text=_sse("a[i] ", "= 1;", "\n    }"), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(503, json={"error": {"message": "overloaded"}})

    engine = RemoteEngine(
        "http://sglang:30000", retries=2, backoff_s=0.01, transport=httpx.MockTransport(handler)
    )
    assert engine.name == "sdar-8b" and engine.tokenizer is None  # no /tokenize: prompts fit by estimate
    out = engine.infill(PREFIX, SUFFIX, max_new_tokens=16, shape="statement")
    assert out[0].text == "a[i] = 1;" and out[0].token_ids == [] and out[0].confidence == 0.0
    with pytest.raises(ServerUnavailable, match="overloaded"):
        engine.infill(PREFIX, SUFFIX, max_new_tokens=16)


def test_refusals_keep_the_servers_message_and_models_are_chosen():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=_card("dice-1.7b", "dice-8b"))
        if request.url.path == "/tokenize":
            return httpx.Response(404)
        body = json.loads(request.content)
        assert body["model"] == "dice-8b" and body["threshold"] == 1.0 and body["stream"] is True
        return httpx.Response(400, json={"error": {"message": "prompt is too long"}})

    transport = httpx.MockTransport(handler)
    with pytest.raises(RemoteError, match="hosts 2 models"):
        RemoteEngine("http://box:8000", transport=transport)
    with pytest.raises(RemoteError, match="no model 'x'"):
        RemoteEngine("http://box:8000", model="x", transport=transport)
    engine = RemoteEngine("http://box:8000", model="dice-8b", transport=transport)
    with pytest.raises(RemoteError, match="prompt is too long") as info:
        engine.infill(PREFIX, SUFFIX, threshold=1.0)
    assert not isinstance(info.value, ServerUnavailable)
