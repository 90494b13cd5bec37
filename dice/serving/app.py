"""``dice serve``'s HTTP API: OpenAI's ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (with
server-sent events), vLLM's ``/tokenize``, ``/health`` and Prometheus ``/metrics``, on FastAPI.

Generation never runs on the event loop: every job goes to the ``Batcher`` thread, and its updates come
back through an ``asyncio.Queue``. A client that disconnects (a dropped stream, or a closed connection
while a non-streaming answer is computed) cancels its job at the next block.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dice.serving.api import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    TokenizeRequest,
    error_body,
    validation_message,
)
from dice.serving.batcher import Batcher, DecodeKey, Job, Update
from dice.serving.metrics import Metrics

MAX_BODY_BYTES = 16 * 1024 * 1024
DISCONNECT_POLL_S = 0.25


@dataclass(frozen=True)
class ServeConfig:
    """What ``dice serve`` was started with. ``policy``/``threshold``/``steps_per_block``: the decoding a
    request gets when it names none (``steps_per_block`` None: the model's block size, one token a step
    under ``static``)."""

    model_name: str
    api_key: str | None = None
    max_batch: int = 32
    policy: str = "dynamic"
    threshold: float = 0.9
    steps_per_block: int | None = None
    window_s: float = 0.005
    max_body_bytes: int = MAX_BODY_BYTES
    # how the model's holes are prompted; None: what the served checkpoint's dice.json says (byte without one)
    infill_holes: str | None = None


class _Sink:
    """Carries a job's updates from the batcher's thread to the coroutine answering it."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Update] = asyncio.Queue()

    def __call__(self, update: Update) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, update)


class _Choice:
    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.step_map: list[int] = []
        self.confidences: list[float] = []
        self.finish_reason: str | None = None

    def add(self, u: Update) -> None:
        self.text.append(u.text)
        self.token_ids += u.token_ids
        self.step_map += u.step_map
        self.confidences += u.confidences
        self.finish_reason = u.finish_reason or self.finish_reason

    def extras(self, step_map: bool) -> dict[str, Any]:
        c = self.confidences
        out: dict[str, Any] = {"token_ids": self.token_ids, "confidence": sum(c) / len(c) if c else 0.0}
        if step_map:
            out["step_map"] = self.step_map
        return out


class DiceServer:
    """The engine, its batcher and metrics behind one FastAPI app (``.app``)."""

    def __init__(self, engine: Any, config: ServeConfig) -> None:
        if config.infill_holes is None:  # the card must declare the checkpoint's own hole cut: a client
            # prompting a "line" model with byte cuts gets other fills than the same model in process
            from engine.model_settings import read_hole_cut

            config = dataclasses.replace(config, infill_holes=read_hole_cut(getattr(engine, "path", None)))
        self.engine, self.config = engine, config
        self.metrics = Metrics()
        self.batcher = Batcher(
            engine, max_batch=config.max_batch, window_s=config.window_s, observe=self.metrics.observe
        )
        self.context = int(engine.config.max_position_embeddings)
        self.created = int(time.time())
        self.app = self._build()

    def close(self) -> None:
        self.batcher.close()

    # --------------------------------------------------------------------------------- the app
    def _build(self) -> FastAPI:
        app = FastAPI(title="dice serve", docs_url=None, redoc_url=None, openapi_url=None)
        app.add_exception_handler(ApiError, _api_error)
        app.add_exception_handler(RequestValidationError, _validation_error)
        app.add_exception_handler(StarletteHTTPException, _http_error)
        app.add_exception_handler(Exception, _internal_error)
        app.add_middleware(_BodyLimit, limit=self.config.max_body_bytes)
        auth = Depends(self._check_key)

        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/metrics", self.prometheus, methods=["GET"])
        app.add_api_route("/v1/models", self.models, methods=["GET"], dependencies=[auth])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"], dependencies=[auth])
        app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"], dependencies=[auth])
        app.add_api_route("/tokenize", self.tokenize, methods=["POST"], dependencies=[auth])
        return app

    def _check_key(self, request: Request) -> None:
        key = self.config.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(
                401, "invalid or missing API key (Authorization: Bearer KEY)", code="invalid_api_key"
            )

    async def health(self) -> Response:
        if not self.batcher.alive:
            return JSONResponse({"status": "error", "message": self.batcher.failure}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.config.model_name})

    async def prometheus(self) -> Response:
        self.metrics.queued.set(self.batcher.queued)
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(self) -> dict[str, Any]:
        card = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "dice",
            "root": self.config.model_name,
            "max_model_len": self.context,
            "block_size": int(self.engine.config.block_size),
        }
        if self.config.infill_holes:
            card["infill_holes"] = self.config.infill_holes
        return {"object": "list", "data": [card]}

    async def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        self._check_model(body.model)
        tokens = await asyncio.to_thread(self.engine.tokenizer.encode, body.prompt)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.context}

    # --------------------------------------------------------------------------------- generation
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        body.refuse_unsupported()
        self._check_model(body.model)
        prompts = [await self._ids(p) for p in body.prompt_parts()]
        return await self._generate(request, body, prompts, body.max_tokens or 16, chat=False)

    async def chat(self, body: ChatRequest, request: Request) -> Response:
        from engine.prompts import chat_messages

        body.refuse_unsupported()
        self._check_model(body.model)
        prompt = await self._ids(chat_messages(body.conversation()))
        budget = body.token_budget
        if budget is None:
            budget = self.context - len(prompt)
        return await self._generate(request, body, [prompt], budget, chat=True)

    def _check_model(self, name: str | None) -> None:
        if name not in (None, "", self.config.model_name):
            raise ApiError(
                404,
                f"the model '{name}' does not exist (this server has '{self.config.model_name}')",
                param="model",
                code="model_not_found",
            )

    async def _ids(self, part: str | list[int]) -> list[int]:
        if isinstance(part, str):
            ids = await asyncio.to_thread(self.engine.tokenizer.encode, part)
        else:
            vocab = int(self.engine.config.vocab_size)
            bad = next((t for t in part if not 0 <= t < vocab), None)
            if bad is not None:
                raise ApiError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", param="prompt")
            ids = list(part)
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        return ids

    def _key(self, body: CompletionRequest | ChatRequest) -> DecodeKey:
        c, cfg = self.config, self.engine.config
        block = body.block_size or int(cfg.block_size)
        steps = body.steps_per_block or c.steps_per_block or block
        if block % steps:
            raise ApiError(
                400, f"steps_per_block ({steps}) must divide block_size ({block})", param="steps_per_block"
            )
        vocab = int(cfg.vocab_size)
        extra = tuple(body.stop_token_ids or ())
        own = () if body.ignore_eos else tuple(self.engine.tokenizer.stop_ids())
        if any(not 0 <= t < vocab for t in extra):
            raise ApiError(400, "stop_token_ids must be token ids of the model", param="stop_token_ids")
        policy = body.policy or c.policy
        threshold = body.threshold if body.threshold is not None else c.threshold
        if threshold > 1 and policy != "entropy":
            raise ApiError(400, "threshold must be in (0, 1] unless policy is 'entropy'", param="threshold")
        return DecodeKey.make(
            block_size=block,
            steps_per_block=steps,
            policy=policy,
            threshold=threshold,
            temperature=float(body.temperature),
            top_p=None if body.top_p >= 1.0 else float(body.top_p),
            top_k=body.top_k,
            stop_ids=tuple(dict.fromkeys(extra + own)),
            seed=body.seed,
        )

    async def _generate(
        self,
        request: Request,
        body: CompletionRequest | ChatRequest,
        prompts: list[list[int]],
        max_tokens: int,
        *,
        chat: bool,
    ) -> Response:
        longest = max(map(len, prompts))
        if longest + max_tokens > self.context:
            raise ApiError(
                400,
                f"this model's maximum context length is {self.context} tokens; the request needs "
                f"{longest + max_tokens} ({longest} in the prompt, {max_tokens} to generate)",
                param="max_tokens" if longest < self.context else "prompt",
                code="context_length_exceeded",
            )
        sink = _Sink()
        job = Job(prompts, body.n, max_tokens, self._key(body), tuple(body.stop), sink)  # type: ignore[arg-type]
        self.metrics.prompt_tokens.inc(sum(map(len, prompts)))
        self.batcher.submit(job)
        answer = _Answer(self, job, sink, body, chat=chat, started=time.monotonic())
        if body.stream:
            return StreamingResponse(answer.events(request), media_type="text/event-stream")
        return await answer.whole(request)


class _Answer:
    """One generation request's answer, whole or streamed."""

    def __init__(
        self, server: DiceServer, job: Job, sink: _Sink, body: Any, *, chat: bool, started: float
    ) -> None:
        self.server, self.job, self.sink, self.body, self.chat = server, job, sink, body, chat
        self.started = started
        self.endpoint = "chat" if chat else "completions"
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.choices = [_Choice() for _ in range(len(job.prompts) * job.n)]
        self.first_text = False

    async def _updates(self, request: Request) -> AsyncIterator[Update]:
        """The job's updates until "done"; raises ApiError on "error". A client that goes away (polled
        here, or the stream closed under us) cancels the job."""
        metrics = self.server.metrics
        metrics.running.inc()
        ended = False
        try:
            while True:
                try:
                    update = await asyncio.wait_for(self.sink.queue.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                if update.kind == "error":
                    ended = True
                    status = 503 if "shutting down" in update.message else 500
                    raise ApiError(status, update.message, kind="server_error")
                if update.kind == "done":
                    ended = True
                    return
                if update.text and not self.first_text:
                    self.first_text = True
                    metrics.first_token.observe(time.monotonic() - self.started)
                self.choices[update.choice].add(update)
                yield update
        finally:
            metrics.running.dec()
            if not ended:
                self.job.cancelled.set()
                metrics.cancelled.inc()

    def _usage(self) -> dict[str, int]:
        prompt = sum(map(len, self.job.prompts))
        completion = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _record(self, status: int) -> None:
        m = self.server.metrics
        m.requests.labels(self.endpoint, str(status)).inc()
        m.latency.labels(self.endpoint).observe(time.monotonic() - self.started)

    async def whole(self, request: Request) -> Response:
        try:
            async for _ in self._updates(request):
                pass
        except ApiError as exc:
            self._record(exc.status)
            raise
        if self.job.cancelled.is_set():
            self._record(499)
            return Response(status_code=499)  # nginx's "client closed request": nobody reads it
        step_map = self.body.return_step_map
        choices = []
        for i, c in enumerate(self.choices):
            text = "".join(c.text)
            item: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason, "logprobs": None}
            if self.chat:
                item["message"] = {"role": "assistant", "content": text}
            else:
                item["text"] = text
            item["dice"] = c.extras(step_map)
            choices.append(item)
        self._record(200)
        return JSONResponse(
            {
                "id": self.id,
                "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created,
                "model": self.server.config.model_name,
                "choices": choices,
                "usage": self._usage(),
            }
        )

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        obj = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.server.config.model_name,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    async def events(self, request: Request) -> AsyncIterator[str]:
        step_map = self.body.return_step_map
        if self.chat:
            yield self._chunk(
                [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    for i in range(len(self.choices))
                ]
            )
        try:
            async for u in self._updates(request):
                dice: dict[str, Any] = {"token_ids": u.token_ids, "confidences": u.confidences}
                if step_map:
                    dice["step_map"] = u.step_map
                item: dict[str, Any] = {"index": u.choice, "finish_reason": u.finish_reason, "dice": dice}
                if self.chat:
                    item["delta"] = {"content": u.text} if u.text else {}
                else:
                    item["text"], item["logprobs"] = u.text, None
                yield self._chunk([item])
        except ApiError as exc:
            self._record(exc.status)
            yield f"data: {json.dumps(exc.body())}\n\n"
            return
        if self.job.cancelled.is_set():
            self._record(499)
            return
        options = self.body.stream_options
        if options is not None and options.include_usage:
            yield self._chunk([], usage=self._usage())
        self._record(200)
        yield "data: [DONE]\n\n"


# ------------------------------------------------------------------------------------- errors
async def _api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _validation_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    message, param = validation_message(list(exc.errors()))
    return JSONResponse(error_body(message, param=param), status_code=400)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), kind=kind), status_code=exc.status_code)


async def _internal_error(_request: Request, exc: Exception) -> Response:
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}", kind="server_error"), 500)


class _TooLarge(Exception):
    pass


class _BodyLimit:
    """413 for a body over ``limit`` bytes, said before it is read whole (Content-Length) or as soon as
    the bytes read pass it (chunked)."""

    def __init__(self, app: Callable[..., Any], limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
            return
        total = 0

        async def limited() -> dict:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Callable) -> None:
        body = json.dumps(
            error_body(f"the request body is over the {self.limit // (1024 * 1024)} MiB limit")
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
