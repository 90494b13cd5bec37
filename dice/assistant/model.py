"""The one owner of the weights: the engine is loaded once and every generation runs on a single dedicated
thread (``dice-model``), so requests queue rather than contend, and a coroutine only ever awaits it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dice.assistant.request import Request
from dice.assistant.settings import AssistantSettings
from dice.assistant.types import ModelInfo
from engine.model_settings import HoleCut, read_hole_cut

if TYPE_CHECKING:
    from engine.interface import InferenceEngine
    from engine.locate import ModelChoice

V = TypeVar("V")
log = logging.getLogger(__name__)


class ModelOwner:
    """Loads the engine the settings name (lazily, on the model thread) and runs work on that thread.

    An engine passed in is used as is: never reloaded, and its identity is part of the cache key.
    """

    def __init__(self, settings: AssistantSettings, engine: InferenceEngine | None = None) -> None:
        if engine is not None:
            from engine.interface import InferenceEngine

            if not isinstance(engine, InferenceEngine):
                raise TypeError(f"{type(engine).__name__} does not implement engine.InferenceEngine")
        self.settings = settings
        self._engine = engine
        self._owned = engine is None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dice-model")
        self._lock = threading.Lock()
        self._info: ModelInfo | None = None
        self._hole_cut: HoleCut = "byte"  # the loaded model's (read_hole_cut), set with _info
        self._closed = False

    # ------------------------------------------------------------------------------------ what is loaded
    @property
    def engine(self) -> InferenceEngine | None:
        return self._engine

    @property
    def info(self) -> ModelInfo | None:
        """What is loaded (None before loading)."""
        return self._info

    @property
    def hole_cut(self) -> HoleCut:
        return self._hole_cut

    def server_url(self) -> str | None:
        """The model server the settings name (``server``, else ``$DICE_SERVER``), or None: in-process."""
        return self.settings.server.strip() or os.environ.get("DICE_SERVER", "").strip() or None

    def describe_source(self) -> str:
        url = self.server_url()
        if url and self._owned:
            return f"the model server at {url}"
        return self.choice().describe()

    def choice(self) -> ModelChoice:
        from engine.locate import choose_model

        return choose_model(self.settings.model_path)

    def key(self) -> tuple[Any, ...]:
        """Identifies the model in cache keys: the folder it came from, or the injected engine."""
        info = self._info
        return (
            self.server_url() or str(self.choice().path),
            self.settings.server_model,
            None if info is None else info.name,
            None if info is None else info.device,
            None if self._owned else id(self._engine),
        )

    # ------------------------------------------------------------------------------------ loading
    def load_blocking(self) -> ModelInfo:
        """Load on the model thread and wait (no-op when loaded)."""
        if self._info is None:
            self._thread.submit(self._load).result()
        assert self._info is not None
        return self._info

    async def load(self, request: Request) -> ModelInfo:
        """Load on the model thread (no-op when loaded), with "loading" progress events."""
        if self._info is not None:
            return self._info
        request.emit("loading", 0, 1, f"loading {self.describe_source()}")
        await self.run(self._load, request)
        assert self._info is not None
        request.emit("loading", 1, 1, f"loaded {self._info.describe()}")
        return self._info

    def _load(self) -> None:
        with self._lock:
            loaded = self._engine
            if loaded is None:
                url = self.server_url()
                if url:
                    from engine.remote import connect

                    loaded = connect(
                        url,
                        api_key=os.environ.get("DICE_SERVER_API_KEY") or None,
                        model=self.settings.server_model or None,
                    )
                else:
                    import engine as engine_pkg

                    loaded = engine_pkg.load_engine(self.settings.model_path, device=self._device())
                    _prime(loaded)
                self._engine = loaded
            if self._info is None:
                self._hole_cut = (
                    read_hole_cut(loaded.path) if loaded.path is not None else served_hole_cut(loaded)
                )
                self._info = describe_engine(loaded, self.choice())

    def _device(self) -> str:
        if self.settings.device != "auto":
            return self.settings.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def update(self, settings: AssistantSettings) -> None:
        """New settings; another model path or device drops an owned model (it is reloaded on next use)."""

        def which(s: AssistantSettings) -> tuple[Any, ...]:
            return (s.model_path, s.device, s.server, s.server_model)

        reload = which(settings) != which(self.settings)
        self.settings = settings
        if reload and self._owned:
            with self._lock:
                _close_engine(self._engine)
                self._engine = None
                self._info = None

    # ------------------------------------------------------------------------------------ running
    async def run(self, fn: Callable[[], V], request: Request) -> V:
        """``fn()`` on the model thread. Cancelling the awaiting task tells the model thread to stop at its
        next denoising step; an ``engine.Cancelled("cancel")`` from it comes back as CancelledError."""
        from engine.errors import Cancelled

        if self._closed:
            raise RuntimeError("the assistant service is closed")
        future = self._thread.submit(fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            request.stop.set()
            raise
        except Cancelled as exc:
            if exc.reason == "cancel" or request.cancelled:
                raise asyncio.CancelledError("request cancelled") from exc
            raise

    async def wait_idle(self) -> None:
        """Return once everything submitted to the model thread so far has finished (a cancelled generation
        included: it stops at its next denoising step)."""
        if not self._closed:
            await asyncio.wrap_future(self._thread.submit(lambda: None))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._thread.shutdown(wait=True, cancel_futures=True)
        if self._owned:
            _close_engine(self._engine)
        self._engine = None


def _prime(engine: InferenceEngine) -> None:
    """Prefill the infilling template's fixed opening (~1,000 tokens) into the engine's prefix cache, so
    that the first request after loading prefills only its file (on 2 CPU cores: ~0.2 s once here,
    instead of in that request). A failure here costs only the speed-up."""
    started = time.perf_counter()
    try:
        tokens = engine.prime_prefix_cache()
    except Exception:  # noqa: BLE001 - never fail a load over an optimisation
        log.exception("could not prefill the prompt template into the prefix cache")
        return
    if tokens:
        log.info("prefilled the %d-token prompt opening in %.2f s", tokens, time.perf_counter() - started)


def _close_engine(engine: Any) -> None:
    """A remote engine holds connections; an in-process one has nothing to close."""
    close = getattr(engine, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - closing never fails a settings change
            log.exception("could not close the engine")


def served_hole_cut(engine: Any) -> HoleCut:
    """The hole cut a served model declares (``dice serve`` lists its dice.json's ``infill_holes`` in
    ``/v1/models``); "byte" for servers that do not say."""
    cut = getattr(engine, "hole_cut", None)
    return cut if cut in ("byte", "line") else "byte"


def describe_engine(engine: InferenceEngine, choice: ModelChoice) -> ModelInfo:
    """Name, folder, device, parameter count and dtype of a loaded engine."""
    dtype = str(engine.dtype).removeprefix("torch.")
    name = engine.name or choice.path.name
    return ModelInfo(
        name=str(name),
        path=choice.user_path if engine.path is not None or getattr(engine, "url", None) is None else None,
        device=str(engine.device),
        parameters=int(engine.num_parameters),
        dtype=dtype,
    )
