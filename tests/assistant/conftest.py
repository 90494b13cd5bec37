"""Assistant test fixtures: the tiny real checkpoint, and a scripted engine for exact ranking cases."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# A kernel and a device function, each with a hole; the second hole has a token budget.
TWO_MASKS = """\
#include <cuda_runtime.h>

// scale: y = a * x   (é, 𝄞: non-ASCII bytes before the masks shift UTF-8 and UTF-16 offsets)
__global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    /* <MASK> */
}

__device__ float square(float v) {
    // <MASK:16>
}
"""

GOOD_SCALE = "if (i < n) y[i] = a * x[i];"
BAD_SCALE = "y[i] = a * ;"
GOOD_SQUARE = "return v * v;"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("dice-tiny"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint: Path) -> Any:
    import engine

    return engine.load_engine(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="session")
def validator_pool() -> Any:
    """One pool for the whole session: starting workers (CuPy import) is the slow part."""
    from dice.validator import ValidatorPool

    pool = ValidatorPool(workers=2, timeout_s=60.0)
    yield pool
    pool.close()


@dataclass
class _Completion:
    text: str
    confidence: float
    step_map: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Config:
    max_position_embeddings: int = 4096
    block_size: int = 4


class CountingEngine:
    """Wraps an engine: counts calls and denoising steps, optionally slows each step (for cancellation
    tests), and forwards everything else."""

    def __init__(self, inner: Any, *, step_delay_s: float = 0.0) -> None:
        self.inner = inner
        self.calls = 0
        self.steps = 0
        self.step_delay_s = step_delay_s
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _wrap(self, on_step: Callable[[Any], None] | None) -> Callable[[Any], None]:
        def wrapped(event: Any) -> None:
            with self._lock:
                self.steps += 1
            if self.step_delay_s:
                threading.Event().wait(self.step_delay_s)
            if on_step is not None:
                on_step(event)

        return wrapped

    def infill(self, prefix: str, suffix: str, *, on_step: Any = None, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner.infill(prefix, suffix, on_step=self._wrap(on_step), **kwargs)

    def generate_program(self, ref_src: str, *, on_step: Any = None, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner.generate_program(ref_src, on_step=self._wrap(on_step), **kwargs)


class ScriptedEngine:
    """An engine whose fills are given by the test (for exact ranking and write cases); it calls
    ``on_step`` ``steps`` times per generation like the real decode loop, so cancellation is exercised.
    It implements ``engine.InferenceEngine`` (no tokenizer: prompts are fitted by a byte estimate)."""

    name = "scripted"
    device = "cpu"
    dtype = "float32"
    num_parameters = 0
    path = None
    tokenizer = None

    def prime_prefix_cache(self, text: str | None = None) -> int:
        return 0

    def __init__(
        self,
        fills: Callable[[str, str, int, float], list[tuple[str, float]]],
        steps: int = 4,
        step_delay_s: float = 0.0,
    ) -> None:
        self.fills = fills
        self.steps = steps
        self.step_delay_s = step_delay_s
        self.config = _Config()
        self.requests: list[dict[str, Any]] = []

    def infill(
        self,
        prefix: str,
        suffix: str,
        *,
        context: str | None = None,
        n: int = 1,
        max_new_tokens: int = 256,
        on_step: Any = None,
        temperature: float = 0.0,
        **_: Any,
    ) -> list[_Completion]:
        self.requests.append(
            dict(
                prefix=prefix,
                suffix=suffix,
                context=context,
                n=n,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
            )
        )
        self._steps(on_step)
        return [_Completion(t, c) for t, c in self.fills(prefix, suffix, n, temperature)]

    def generate_program(
        self, ref_src: str, *, n: int = 1, on_step: Any = None, temperature: float = 0.0, **_: Any
    ) -> list[_Completion]:
        self.requests.append(dict(ref_src=ref_src, n=n, temperature=temperature))
        self._steps(on_step)
        return [_Completion(t, c) for t, c in self.fills(ref_src, "", n, temperature)]

    def _steps(self, on_step: Any) -> None:
        for step in range(self.steps):
            if self.step_delay_s:
                threading.Event().wait(self.step_delay_s)
            if on_step is not None:
                on_step(step)


@pytest.fixture
def scripted_engine_factory() -> Callable[..., ScriptedEngine]:
    return ScriptedEngine


class _SharedPool:
    """The session's validator pool behind the ValidatorPool constructor, so each CLI run does not pay for
    starting workers; close() is a no-op (the session fixture closes the real one)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def close(self) -> None:
        pass


@pytest.fixture
def shared_pool(monkeypatch: pytest.MonkeyPatch, validator_pool: Any) -> None:
    import dice.validator

    monkeypatch.setattr(dice.validator, "ValidatorPool", lambda *a, **k: _SharedPool(validator_pool))
