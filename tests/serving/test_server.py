"""``dice serve`` driven over loopback with the official ``openai`` client and raw HTTP."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import openai
import pytest

PROMPT = "__global__ void relu_kernel(const float* x, float* y, int n) {\n    int i = "
DECODE = {"policy": "dynamic", "threshold": 0.9}


def local_text(engine, prompt: str, max_tokens: int, **kw) -> str:
    kw = {"policy": "dynamic", "threshold": 0.9, **kw}
    out = engine.generate(engine.tokenizer.encode(prompt), max_new_tokens=max_tokens, **kw)
    return engine.tokenizer.decode(out.ids[0][:max_tokens])


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_models_and_health(served, tiny_engine):
    models = client(served.url).models.list()
    assert [m.id for m in models.data] == ["dice-tiny"]
    assert models.data[0].model_extra["max_model_len"] == tiny_engine.config.max_position_embeddings
    # the card declares the checkpoint's own hole cut (its dice.json) when the config names none, so a client
    # prompts the served model as it prompts the same model in process (the embedded model says "byte")
    from engine.model_settings import read_hole_cut

    assert models.data[0].model_extra["infill_holes"] == read_hole_cut(tiny_engine.path) == "byte"
    assert httpx.get(served.url + "/health").json()["status"] == "ok"


class _At:
    """An engine seen from another checkpoint folder (``path``): everything else is the real engine's."""

    def __init__(self, engine, path) -> None:
        self._engine, self.path = engine, path

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


def test_the_card_reads_a_line_cut_from_the_checkpoint(tiny_engine, tmp_path):
    """A checkpoint whose dice.json says "line" (not the default) is declared so on the card."""
    import asyncio

    from dice.serving import ServeConfig
    from dice.serving.app import DiceServer

    (tmp_path / "dice.json").write_text('{"infill_holes": "line"}')
    for config, cut in (
        (ServeConfig(model_name="m"), "line"),
        (ServeConfig(model_name="m", infill_holes="byte"), "byte"),
    ):
        server = DiceServer(_At(tiny_engine, tmp_path), config)  # a named cut wins over the checkpoint's
        try:
            assert asyncio.run(server.models())["data"][0]["infill_holes"] == cut
        finally:
            server.close()


def test_completion_is_the_engines_greedy_decode(served, tiny_engine):
    r = client(served.url).completions.create(
        model="dice-tiny", prompt=PROMPT, max_tokens=24, temperature=0, extra_body=DECODE
    )
    assert r.choices[0].text == local_text(tiny_engine, PROMPT, 24)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(tiny_engine.tokenizer.encode(PROMPT))
    assert r.usage.completion_tokens == len(r.choices[0].model_extra["dice"]["token_ids"])


def test_stream_gives_the_same_text_and_step_map(served):
    c = client(served.url)
    whole = c.completions.create(
        model="dice-tiny", prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"return_step_map": True}
    )
    chunks = list(
        c.completions.create(
            model="dice-tiny",
            prompt=PROMPT,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_step_map": True},
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    steps = [s for ch in chunks if ch.choices for s in ch.choices[0].model_extra["dice"]["step_map"]]
    assert steps == whole.choices[0].model_extra["dice"]["step_map"] and min(steps) >= 1
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len(chunks) > 2  # one chunk per block, not one at the end


def test_chat_completion_uses_chatml(served, tiny_engine):
    from engine.prompts import chat_messages

    messages = [{"role": "system", "content": "You write CUDA."}, {"role": "user", "content": "relu"}]
    r = client(served.url).chat.completions.create(
        model="dice-tiny", messages=messages, max_tokens=16, temperature=0, extra_body=DECODE
    )
    prompt = chat_messages([("system", "You write CUDA."), ("user", "relu")])
    assert r.choices[0].message.content == local_text(tiny_engine, prompt, 16)
    assert r.choices[0].message.role == "assistant"
    stream = client(served.url).chat.completions.create(
        model="dice-tiny", messages=messages, max_tokens=16, temperature=0, extra_body=DECODE, stream=True
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in stream) == r.choices[0].message.content


def test_token_prompts_several_prompts_and_n(served, tiny_engine):
    ids = tiny_engine.tokenizer.encode(PROMPT)
    c = client(served.url)
    by_ids = c.completions.create(model="dice-tiny", prompt=ids, max_tokens=12, temperature=0)
    by_text = c.completions.create(model="dice-tiny", prompt=PROMPT, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    other = "__device__ float sq(float v) {\n    return "
    r = c.completions.create(model="dice-tiny", prompt=[PROMPT, other], max_tokens=12, temperature=0, n=2)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text == by_text.choices[0].text
    alone = c.completions.create(model="dice-tiny", prompt=other, max_tokens=12, temperature=0)
    assert r.choices[2].text == alone.choices[0].text
    sampled = c.completions.create(
        model="dice-tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, n=3, seed=7
    )
    again = c.completions.create(
        model="dice-tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, n=3, seed=7
    )
    assert [x.text for x in sampled.choices] == [x.text for x in again.choices]  # a seed decides its samples


def test_stop_strings_cut_and_are_never_streamed(served, tiny_engine):
    full = local_text(tiny_engine, PROMPT, 40)
    stop = next(full[i : i + 3] for i in range(4, len(full) - 3) if full[i : i + 3].strip())
    c = client(served.url)
    r = c.completions.create(model="dice-tiny", prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    s = c.completions.create(
        model="dice-tiny", prompt=PROMPT, max_tokens=40, temperature=0, stop=stop, stream=True
    )
    assert "".join(ch.choices[0].text for ch in s) == r.choices[0].text


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
        ({"prompt": "x", "model": "gpt-4"}, 404, "does not exist"),
        ({"prompt": "x", "max_tokens": 9000}, 400, "maximum context length is {context} tokens"),
        ({"prompt": "x " * 9000, "max_tokens": 4}, 400, "maximum context length"),
        ({"prompt": [10**9], "max_tokens": 4}, 400, "outside the vocabulary"),
        ({"prompt": "", "max_tokens": 4}, 400, "empty"),
        ({"prompt": "x", "logprobs": 3}, 400, "not supported"),
        ({"prompt": "x", "temperature": -1}, 400, "temperature"),
        ({"prompt": "x", "threshold": 1.5}, 400, "threshold"),
        ({"prompt": "x", "steps_per_block": 3}, 400, "steps_per_block"),
        ({"max_tokens": 4}, 400, "prompt"),
        ([1, 2], 400, "JSON object"),
    ],
)
def test_bad_requests_get_a_clear_4xx(served, body, status, words):
    r = httpx.post(served.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words.format(context=served.server.context) in error["message"] and error["type"]


def test_malformed_json_huge_bodies_and_unknown_routes(served):
    r = httpx.post(
        served.url + "/v1/completions", content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(served.url + "/v1/completions", content=b"\xff\xfe garbage")
    assert r.status_code == 400
    r = httpx.post(served.url + "/v1/completions", content=b"x" * (17 * 1024 * 1024))
    assert r.status_code == 413
    assert httpx.get(served.url + "/v1/nothing").status_code == 404
    assert httpx.get(served.url + "/v1/completions").status_code == 405
    # and it keeps serving
    r = httpx.post(served.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200


def test_api_key(keyed):
    assert httpx.get(keyed.url + "/v1/models").status_code == 401
    bad = httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(keyed.url, "wrong").models.list()
    assert (
        client(keyed.url, "s3cret").completions.create(model="dice-tiny", prompt=PROMPT, max_tokens=4).choices
    )
    assert httpx.get(keyed.url + "/health").status_code == 200  # probes need no key


def test_dropped_stream_cancels_its_generation(served):
    before = metric(served.url, "dice_cancelled_requests_total")
    body = {"prompt": PROMPT, "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", served.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    # the client is gone; the model thread stops within a block or two and serves the next request
    started = time.monotonic()
    r = httpx.post(served.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200
    assert time.monotonic() - started < 20
    deadline = time.monotonic() + 10
    while metric(served.url, "dice_cancelled_requests_total") <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(served.url, "dice_cancelled_requests_total") > before


def test_ignore_eos_runs_to_max_tokens(served, tiny_engine):
    """The model's own stop ids end a choice unless ``ignore_eos`` says otherwise (vLLM's field). The prompt
    is an infilling prompt: the model writes the middle and the suffix's first line, then ``<|im_end|>``
    (plain code, as ``PROMPT``, it may continue past any length)."""
    from engine.infill import InfillPlan

    head = "__global__ void relu_kernel(const float* x, float* y, int n) {\n"
    prompt = InfillPlan.make(head + "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n", "}\n").prompt_text
    body = {"prompt": prompt, "max_tokens": 600, "temperature": 0, "stop": []}
    ended = httpx.post(served.url + "/v1/completions", json=body, timeout=120).json()
    assert ended["choices"][0]["finish_reason"] == "stop"
    assert ended["usage"]["completion_tokens"] < 600
    full = httpx.post(served.url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=120).json()
    assert full["choices"][0]["finish_reason"] == "length"
    assert full["usage"]["completion_tokens"] == 600


def test_a_short_request_leaves_its_batch_early(tiny_engine):
    """Two requests with the same decoding settings batch (the window is wide, so that a slow machine
    still gathers both); the short one is answered while the long one goes on."""
    from dice.serving import ServeConfig, start_in_thread

    same = {"prompt": PROMPT, "temperature": 0, "ignore_eos": True, "stop": []}
    done: dict[str, float] = {}
    with start_in_thread(tiny_engine, ServeConfig(model_name="dice-tiny", window_s=1.0)) as running:

        def post(name, max_tokens):
            body = {**same, "max_tokens": max_tokens}
            httpx.post(running.url + "/v1/completions", json=body, timeout=120).raise_for_status()
            done[name] = time.monotonic()

        threads = [threading.Thread(target=post, args=a) for a in (("long", 400), ("short", 4))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        batches = metric(running.url, "dice_batch_rows_count")
    assert batches == 1, "both requests should have decoded as one call"
    assert done["short"] < done["long"] - 0.5


def test_concurrent_clients_get_their_own_answers(served, tiny_engine):
    """32 clients, 3 requests each, all different: no lost, duplicated or crossed answers, and batches of
    more than one row did form."""
    prompts = [f"__global__ void k{i}(float* x, int n) {{\n    int i{i} = " for i in range(12)]
    expected = {p: local_text(tiny_engine, p, 8) for p in prompts}
    batches_before = metric(served.url, "dice_batch_rows_count")
    rows_before = metric(served.url, "dice_batch_rows_sum")

    def one_client(c: int) -> list[tuple[str, str, str]]:
        with httpx.Client(base_url=served.url, timeout=120) as http:
            out = []
            for k in range(3):
                p = prompts[(c + k) % len(prompts)]
                r = http.post(
                    "/v1/completions", json={"prompt": p, "max_tokens": 8, "temperature": 0, **DECODE}
                )
                r.raise_for_status()
                out.append((p, r.json()["choices"][0]["text"], r.json()["id"]))
            return out

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = [x for xs in pool.map(one_client, range(32)) for x in xs]
    assert len(results) == 96 and len({r[2] for r in results}) == 96
    assert all(text == expected[p] for p, text, _ in results)
    batches = metric(served.url, "dice_batch_rows_count") - batches_before
    rows = metric(served.url, "dice_batch_rows_sum") - rows_before
    assert rows == 96 and batches < 96  # requests that arrived together decoded together


def test_metrics_are_prometheus_text(served):
    text = httpx.get(served.url + "/metrics").text
    for name in ("dice_requests_total", "dice_request_seconds_bucket", "dice_generated_tokens_total"):
        assert name in text
