"""``RemoteEngine``: the ``InferenceEngine`` of a model behind an OpenAI-compatible server (``dice serve``,
SGLang, LMDeploy, vLLM).

The prompts are the in-process engine's, rendered here (``engine.infill.InfillPlan``,
``engine.prompts.kernelbench_prompt``) and sent as raw text to ``/v1/completions``; the answers are streamed
(server-sent events), and a fill is taken out of the streamed text exactly as ``Engine.infill`` takes it out
of its own tokens. Once every choice holds its whole middle the stream is closed, which ends the generation
on a server that stops on disconnect (``dice serve``, vLLM, SGLang).

Only text crosses the wire; validation stays on the caller's machine. ``dice serve`` adds per-token ids,
confidences and (``return_step_map``) the step that committed each token to every chunk; from other
servers a completion has no token ids and confidence 0.0.

Failures: ``ServerUnavailable`` when the server cannot be reached or keeps answering 429/502/503/504
(after ``retries`` retries with exponential backoff, only before any text arrived), ``RemoteError`` for
an answer that refuses the request (4xx: the server's own message) or breaks off. ``on_step`` is called
after every chunk, and with ``None`` (a heartbeat) at least every 0.2 s while waiting, so a caller can
cancel (raise) even before the first token: the connection is then closed.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.decode import StepEvent
from engine.engine import Completion
from engine.errors import RemoteError, ServerUnavailable
from engine.infill import InfillPlan
from engine.prompts import kernelbench_prompt

RETRY_STATUS = (429, 502, 503, 504)
HEARTBEAT_S = 0.2
# Decoding keywords of Engine.generate that become request fields (the DICE extras of docs/SERVING.md).
_EXTRAS = ("policy", "threshold", "steps_per_block", "block_size", "top_k")


@dataclass(frozen=True)
class RemoteConfig:
    """``max_position_embeddings`` is the served model's context (``max_model_len`` of ``/v1/models``)."""

    max_position_embeddings: int
    block_size: int | None = None


@dataclass
class _Choice:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    step_map: list[int] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    ended: bool = False  # the caller has all it wants from this choice


class _Tokenizer:
    """Counts tokens with the server's ``/tokenize`` (vLLM's shape: ``{"prompt"}`` -> ``{"tokens"}``)."""

    def __init__(self, engine: RemoteEngine) -> None:
        self.engine = engine
        self._last: tuple[str, list[int]] | None = None

    def encode(self, text: str) -> list[int]:
        if self._last is not None and self._last[0] == text:
            return self._last[1]
        answer = self.engine._post_json("/tokenize", {"model": self.engine.name, "prompt": text})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise RemoteError(f"{self.engine.url}/tokenize answered without 'tokens'")
        self._last = (text, tokens)
        return tokens


def normalize_url(url: str) -> str:
    """``http://host:8000``, ``http://host:8000/`` and ``http://host:8000/v1`` name the same server."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"the server URL must start with http:// or https://, got {url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class RemoteEngine:
    """A served model. ``model`` picks one when the server hosts several (else the only one)."""

    path = None
    dtype = "remote"
    num_parameters = 0

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        transport: Any = None,
    ) -> None:
        import httpx

        self.url = normalize_url(url)
        self.retries, self.backoff_s = retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            transport=transport,
        )
        self.name, self.config = self._pick_model(model)
        self.device = f"server {self.url}"
        self.tokenizer: _Tokenizer | None = self._probe_tokenizer()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------------------ the server's models
    def _pick_model(self, wanted: str | None) -> tuple[str, RemoteConfig]:
        answer = self._request("GET", "/v1/models")
        cards = [c for c in answer.get("data") or [] if isinstance(c, dict) and isinstance(c.get("id"), str)]
        if not cards:
            raise RemoteError(f"{self.url}/v1/models lists no model")
        ids = [c["id"] for c in cards]
        if wanted:
            matches = [c for c in cards if c["id"] == wanted]
            if not matches:
                raise RemoteError(
                    f"the server at {self.url} has no model {wanted!r} (it has: {', '.join(ids)})"
                )
            card = matches[0]
        elif len(cards) > 1:
            raise RemoteError(
                f"the server at {self.url} hosts {len(cards)} models ({', '.join(ids)}): name one with "
                "--server-model / dice.modelServerModel"
            )
        else:
            card = cards[0]
        context = card.get("max_model_len") or card.get("context_length") or 32768
        block = card.get("block_size")
        self.hole_cut = card.get("infill_holes") if card.get("infill_holes") in ("byte", "line") else None
        return card["id"], RemoteConfig(int(context), int(block) if isinstance(block, int) else None)

    def _probe_tokenizer(self) -> _Tokenizer | None:
        """The server's ``/tokenize`` when it has one (dice serve, vLLM); else None (prompts are fitted by
        a byte estimate)."""
        tokenizer = _Tokenizer(self)
        try:
            tokenizer.encode("x")
        except (RemoteError, ServerUnavailable):
            return None
        return tokenizer

    # ------------------------------------------------------------------------------ InferenceEngine
    def prime_prefix_cache(self, text: str | None = None) -> int:
        return 0  # the server keeps its own caches

    def infill(
        self,
        prefix: str,
        suffix: str,
        *,
        context: str | None = None,
        n: int = 1,
        max_new_tokens: int = 256,
        shape: str | None = None,
        on_step: Callable[[Any], None] | None = None,
        **decode: Any,
    ) -> list[Completion]:
        """As ``Engine.infill``: the middles only, cut where the suffix starts or the hole's shape ends."""
        plan = InfillPlan.make(prefix, suffix, context=context, shape=shape)
        until = decode.pop("until", None)

        def ended(i: int, c: _Choice) -> bool:
            return plan.reached_end(c.text) or bool(
                until is not None and c.token_ids and until(i, c.token_ids)
            )

        choices = self._complete(plan.prompt_text, n, max_new_tokens, decode, on_step, ended)
        out = []
        for c in choices:
            middle, finished = plan.finish(c.text, c.finish_reason == "stop")
            out.append(_completion(c, middle, finished or c.ended))
        return out

    def generate_program(
        self,
        ref_src: str,
        *,
        n: int = 1,
        max_new_tokens: int = 4096,
        variant: str = "eval",
        on_step: Callable[[Any], None] | None = None,
        **decode: Any,
    ) -> list[Completion]:
        """As ``Engine.generate_program``: DICE's KernelBench prompt; text = the whole answer."""
        until = decode.pop("until", None)

        def ended(i: int, c: _Choice) -> bool:
            return bool(until is not None and c.token_ids and until(i, c.token_ids))

        prompt = kernelbench_prompt(ref_src, variant=variant)
        choices = self._complete(prompt, n, max_new_tokens, decode, on_step, ended)
        return [_completion(c, c.text, c.finish_reason == "stop" or c.ended) for c in choices]

    # ------------------------------------------------------------------------------ the wire
    def _body(self, prompt: str, n: int, max_tokens: int, decode: dict[str, Any]) -> dict[str, Any]:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        body: dict[str, Any] = {
            "model": self.name,
            "prompt": prompt,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": float(decode.pop("temperature", 0.0) or 0.0),
            "stream": True,
            "return_step_map": True,
        }
        top_p = decode.pop("top_p", None)
        if top_p is not None:
            body["top_p"] = top_p
        seed = decode.pop("seed", None)
        if seed is not None:
            body["seed"] = seed
        stop_ids = decode.pop("stop_ids", None)
        if stop_ids:
            body["stop_token_ids"] = list(stop_ids)
        for name in _EXTRAS:
            value = decode.pop(name, None)
            if value is not None:
                body[name] = value
        decode.pop("dice_eval_compat", None)  # a local ranking detail; servers rank by their own rule
        if decode:
            raise TypeError(f"unexpected decoding arguments: {', '.join(sorted(decode))}")
        return body

    def _complete(
        self,
        prompt: str,
        n: int,
        max_tokens: int,
        decode: dict[str, Any],
        on_step: Callable[[Any], None] | None,
        ended: Callable[[int, _Choice], bool],
    ) -> list[_Choice]:
        body = self._body(prompt, n, max_tokens, dict(decode))
        choices = [_Choice() for _ in range(n)]
        for attempt in range(self.retries + 1):
            stream = _Stream(self._http, body)
            try:
                self._read(stream, choices, on_step, ended)
                return choices
            except _Retry as exc:
                if attempt == self.retries or any(c.text or c.token_ids for c in choices):
                    raise ServerUnavailable(f"the model server at {self.url}: {exc}") from None
                time.sleep(exc.wait if exc.wait is not None else self.backoff_s * 2**attempt)
            finally:
                stream.close()
        raise AssertionError("unreachable")

    def _read(
        self,
        stream: _Stream,
        choices: list[_Choice],
        on_step: Callable[[Any], None] | None,
        ended: Callable[[int, _Choice], bool],
    ) -> None:
        chunks = 0
        while True:
            try:
                item = stream.items.get(timeout=HEARTBEAT_S)
            except queue.Empty:
                if on_step is not None:
                    on_step(None)  # a heartbeat: lets the caller cancel while the server is silent
                continue
            if isinstance(item, BaseException):
                raise item
            if item is None:  # [DONE] or the end of the stream
                return
            for part in item.get("choices") or []:
                i = part.get("index", 0)
                if not isinstance(i, int) or not 0 <= i < len(choices):
                    raise RemoteError(f"{self.url} answered a choice index {i!r} it was not asked for")
                _merge(choices[i], part)
            chunks += 1
            if on_step is not None:
                committed = sum(len(c.token_ids) for c in choices)
                on_step(StepEvent(block=chunks - 1, step=0, total_steps=chunks, committed=committed))
            for i, c in enumerate(choices):
                if not c.ended and c.finish_reason is None and ended(i, c):
                    c.ended = True
            if all(c.ended or c.finish_reason is not None for c in choices):
                return  # every choice holds what we want: closing the stream ends the generation

    def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        import httpx

        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, **kw)
            except httpx.HTTPError as exc:
                problem = _connection_problem(exc)
                if attempt == self.retries:
                    raise ServerUnavailable(
                        f"cannot reach the model server at {self.url}: {problem}"
                    ) from None
                time.sleep(self.backoff_s * 2**attempt)
                continue
            if response.status_code in RETRY_STATUS and attempt < self.retries:
                time.sleep(_retry_after(response) or self.backoff_s * 2**attempt)
                continue
            if response.status_code in RETRY_STATUS:
                raise ServerUnavailable(f"the model server at {self.url} is busy: {_message(response)}")
            if response.status_code >= 400:
                raise RemoteError(f"{self.url}{path}: {response.status_code} {_message(response)}")
            try:
                return response.json()
            except ValueError:
                raise RemoteError(f"{self.url}{path} did not answer JSON") from None
        raise AssertionError("unreachable")

    def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", path, json=body)


class _Retry(Exception):  # noqa: N818 - internal signal
    def __init__(self, message: str, wait: float | None = None) -> None:
        super().__init__(message)
        self.wait = wait


class _Stream:
    """One streamed request, read on its own thread into ``items`` (chunks, then None; or an exception),
    so that the caller's thread stays free to send heartbeats and to close the connection."""

    def __init__(self, http: Any, body: dict[str, Any]) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self._http, self._body = http, body
        self._response: Any = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dice-remote-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import httpx

        try:
            with self._http.stream("POST", "/v1/completions", json=self._body) as response:
                self._response = response
                if response.status_code in RETRY_STATUS:
                    response.read()
                    raise _Retry(f"{response.status_code} {_message(response)}", _retry_after(response))
                if response.status_code >= 400:
                    response.read()
                    raise RemoteError(f"{response.status_code} {_message(response)}")
                for line in response.iter_lines():
                    if self._closed.is_set():
                        return
                    if not line.startswith("data:"):
                        continue  # comments, event names, keep-alives
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        item = json.loads(data)
                    except ValueError:
                        raise RemoteError(
                            f"the server sent an event that is not JSON: {data[:80]!r}"
                        ) from None
                    if isinstance(item, dict) and "error" in item:
                        err = item["error"]
                        raise RemoteError(str(err.get("message") if isinstance(err, dict) else err))
                    self.items.put(item)
            self.items.put(None)
        except httpx.HTTPError as exc:
            if not self._closed.is_set():
                self.items.put(_Retry(_connection_problem(exc)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            if not self._closed.is_set():
                self.items.put(exc)

    def close(self) -> None:
        self._closed.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.close()


def _merge(c: _Choice, part: dict[str, Any]) -> None:
    text = part.get("text")
    if text is None:  # a chat-shaped chunk
        text = (part.get("delta") or {}).get("content")
    c.text += text or ""
    dice = part.get("dice")
    if isinstance(dice, dict):
        c.token_ids += [t for t in dice.get("token_ids") or [] if isinstance(t, int)]
        c.confidences += [float(x) for x in dice.get("confidences") or []]
        c.step_map += [int(x) for x in dice.get("step_map") or []]
    if part.get("finish_reason"):
        c.finish_reason = str(part["finish_reason"])


def _completion(c: _Choice, text: str, finished: bool) -> Completion:
    conf = c.confidences
    return Completion(
        text=text,
        confidence=sum(conf) / len(conf) if conf else 0.0,
        step_map=list(c.step_map),
        token_ids=list(c.token_ids),
        finished=finished,
    )


def _message(response: Any) -> str:
    try:
        err = response.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except Exception:  # noqa: BLE001 - any body: say what we can
        pass
    text = (response.text or "").strip()
    return text[:200] or response.reason_phrase


def _retry_after(response: Any) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(float(value), 30.0) if value is not None else None
    except ValueError:
        return None


def _connection_problem(exc: Exception) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return f"connection failed ({exc or 'refused'})"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"


def connect(url: str, *, api_key: str | None = None, model: str | None = None, **kw: Any) -> RemoteEngine:
    """A ``RemoteEngine`` for ``url`` (ServerUnavailable / RemoteError say why not)."""
    return RemoteEngine(url, api_key=api_key, model=model, **kw)
