"""The OpenAI request bodies ``dice serve`` accepts (pydantic, as FastAPI validates them), their DICE
extras, and the errors in OpenAI's shape.

The extras are top-level fields, which is where the ``openai`` client's ``extra_body`` puts them:
``policy`` ("static" | "dynamic" | "entropy"), ``threshold``, ``steps_per_block``, ``block_size``,
``top_k``, ``stop_token_ids``, ``ignore_eos`` (as vLLM: the tokenizer's stop ids do not end a choice) and
``return_step_map``. Fields nobody implements here (``logprobs``,
``echo``, ``suffix``, ``best_of`` > ``n``, penalties, ``logit_bias``) are refused with a 400 rather than
silently ignored; fields the API does not know are ignored, as vLLM and SGLang do.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 16
MAX_N = 64


class ApiError(Exception):
    """An error answered as ``{"error": {message, type, param, code}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind=self.kind, param=self.param, code=self.code)


def error_body(
    message: str, *, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = Field(None, validate_default=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    user: str | None = None
    # Not implemented: refused when set to anything but their "off" value.
    logprobs: Any = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # DICE extras (the server's defaults when absent)
    policy: Literal["static", "dynamic", "entropy"] | None = None
    threshold: float | None = Field(None, gt=0.0)
    steps_per_block: int | None = Field(None, ge=1, le=64)
    block_size: int | None = Field(None, ge=1, le=64)
    top_k: int | None = Field(None, ge=1)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False  # vLLM's name: the tokenizer's own stop ids do not end a choice
    return_step_map: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return [s for s in stops if s]

    def refuse_unsupported(self) -> None:
        for name, off in (
            ("logprobs", (None, False, 0)),
            ("presence_penalty", (0.0,)),
            ("frequency_penalty", (0.0,)),
            ("logit_bias", (None, {})),
        ):
            if getattr(self, name) not in off:
                raise ApiError(400, f"'{name}' is not supported by dice serve", param=name)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise ApiError(400, "'echo' is not supported by dice serve", param="echo")
        if self.suffix:
            raise ApiError(400, "'suffix' is not supported by dice serve", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ApiError(400, "'best_of' other than n is not supported by dice serve", param="best_of")

    def prompt_parts(self) -> list[str | list[int]]:
        """One entry per prompt: a text or its token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ApiError(400, "the prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, "only text content parts are supported", param="messages")
            parts.append(part["text"])
        return "".join(parts)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def conversation(self) -> list[tuple[str, str]]:
        # "developer" is OpenAI's newer name for the system role
        return [("system" if m.role == "developer" else m.role, m.text()) for m in self.messages]

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize`` body (the remote engine counts prompt tokens with it)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """A readable message from FastAPI's validation errors, and the first bad field."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}", None
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") in (
        "model_attributes_type",
        "dict_type",
    ):
        given = first.get("input")
        if isinstance(given, (bytes, str)):  # no JSON content type: the body was not parsed
            return "the request body is not a JSON object (send it as application/json)", None
        return f"the request body must be a JSON object, got {type(given).__name__}", None
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    where = f"'{param}': " if param else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}{first.get('msg', 'invalid value')}{more}", param
