"""Server state shared by the handlers: settings, the assistant service's life cycle, status, documents,
diagnostics, filled regions and file watching. Feature flows (inline completion, commands) live in
``completion.py`` and ``commands.py`` and use this object; ``server.py`` only registers handlers.

Big documents (``OFF_LOOP_CHARS`` and more) are parsed in a child process (``parse_worker.py``), so that
the event loop keeps answering other requests meanwhile; a parse of a version that is no longer current is
stopped and its result never published. Mask diagnostics stop at ``MAX_MASK_DIAGNOSTICS`` per document.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from dice.validator.verdict import verdict_label
from lsp_server.config import DiceSettings, parse_settings, settings_to_wire
from lsp_server.diagnostics import compile_error_diagnostics, malformed_mask_diagnostics, mask_diagnostics
from lsp_server.documents import DocumentSnapshot, current_version, open_snapshot
from lsp_server.inline import AdaptiveDebounce, RequestTracker, Shown
from lsp_server.parse_worker import DocumentParses
from lsp_server.regions import FilledRegion, make_region, relocate
from lsp_server.status import STATUS_METHOD, SUGGESTION_STATUS_METHOD, StatusState, status_params
from lsp_server.verdicts import verdict_json
from lsp_server.watch import FileWatcher

if TYPE_CHECKING:
    from dice.assistant import AssistantService, AssistantSettings, ModelInfo
    from dice.cuda_source import CudaDocument, PositionIndex
    from dice.validator import Verdict

logger = logging.getLogger(__name__)

MODEL_KEY = "model"  # watcher key of the model folder
DIAGNOSTICS_DELAY_S = 0.15  # quiet time after an edit before masks are re-parsed
MODEL_RELOAD_DELAY_S = 1.0  # a checkpoint write touches many files: reload once, after they settle
REVALIDATE_DELAY_S = 0.3
# Texts this long are parsed off the event loop (a parse of 256 KiB takes ~40 ms, of 10 MB 1-2 s).
OFF_LOOP_CHARS = 256 * 1024
# Information diagnostics for masks, per document: a file with 200k masks would make 40 MB of diagnostics.
MAX_MASK_DIAGNOSTICS = 1000
# Files whose change means a different model: config and weights (and their index), tokenizer files.
MODEL_FILE_SUFFIXES = frozenset({".json", ".safetensors", ".bin", ".txt", ".model"})


class ServiceUnavailable(RuntimeError):
    """The assistant service could not be loaded; the message says why."""


@dataclass
class Offer:
    """Inline items returned for a document, kept to notice when the user accepts one."""

    start_byte: int
    texts: list[str]
    verdicts: list[Verdict | None]


@dataclass
class DocumentState:
    parsed_version: int | None = None
    parsed: CudaDocument | None = None  # of parsed_version
    mask_diagnostics: list[types.Diagnostic] = field(default_factory=list)
    compile_diagnostics: list[types.Diagnostic] = field(default_factory=list)
    regions: list[FilledRegion] = field(default_factory=list)
    offers: list[Offer] = field(default_factory=list)
    shown: Shown | None = None  # suggestions at the cursor, for typing through them
    last_verdict: dict[str, Any] | None = None
    diagnostics_task: asyncio.Task | None = None
    told: set[str] = field(default_factory=set)  # the limits a log message was sent for (``tell_once``)


class DiceSession:
    def __init__(self, ls: LanguageServer) -> None:
        self.ls = ls
        self.settings = DiceSettings()
        self.tracker = RequestTracker()
        self.debounce = AdaptiveDebounce()
        self.documents: dict[str, DocumentState] = {}
        self.service: AssistantService | None = None
        self.model_info: ModelInfo | None = None
        self.state: StatusState = "loading"
        self._service_task: asyncio.Task | None = None
        self._service_error: str | None = None
        self.server_down: str | None = None  # the last model call failed to reach the model server
        self._validation_only: AssistantService | None = None  # its model failed to load; it validates
        self._loaded_key: tuple[str, ...] | None = None
        self._busy: dict[str, int] = {"busy": 0, "validating": 0}
        self._watcher: FileWatcher | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._background: set[asyncio.Task] = set()
        self._parent_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.parses = DocumentParses()  # big documents, parsed in a child process
        self.closed = False
        self.typed_through = 0  # inline requests answered from a suggestion the user is typing

    # ----------------------------------------------------------------- messages and status
    def log(self, message: str, level: types.MessageType = types.MessageType.Info) -> None:
        logger.log(logging.WARNING if level <= types.MessageType.Warning else logging.INFO, "%s", message)
        self._on_loop(self.ls.window_log_message, types.LogMessageParams(type=level, message=message))

    def show(self, message: str, level: types.MessageType = types.MessageType.Info) -> None:
        self._on_loop(self.ls.window_show_message, types.ShowMessageParams(type=level, message=message))
        self.log(message, level)

    def set_status(self, state: StatusState, message: str | None = None) -> None:
        self.state = state
        info = self.model_info
        params = status_params(
            state,
            model=info.name if info is not None else None,
            device=info.device if info is not None else None,
            message=message,
        )
        self._on_loop(self.ls.protocol.notify, STATUS_METHOD, params)

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Send from any thread: protocol writes must happen on the event-loop thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            with contextlib.suppress(Exception):
                fn(*args)
            return
        if _running_loop() is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    @contextlib.asynccontextmanager
    async def busy(self, state: str, message: str) -> AsyncIterator[None]:
        """Status ``busy``/``validating`` while work runs; back to ``ready`` when nothing is left."""
        from engine.errors import RemoteError

        self._busy[state] += 1
        self.set_status(state, message)  # type: ignore[arg-type]
        try:
            yield
            if state == "busy":
                self.server_down = None  # a model call went through
        except RemoteError as exc:  # the model server went away: said once, kept in the status until back
            was, self.server_down = self.server_down, f"model server unavailable: {exc}"
            if was is None:
                self.show(self.server_down, types.MessageType.Error)
            raise
        finally:
            self._busy[state] -= 1
            if self.service is not None and not self.closed:
                if self.server_down is not None:
                    self.set_status("error", self.server_down)
                elif self._busy["busy"]:
                    self.set_status("busy")
                elif self._busy["validating"]:
                    self.set_status("validating")
                else:
                    self.set_status("ready", self._ready_message())

    def _workspace_root(self) -> str | None:
        """The client's workspace folder (the include path of last resort for the compile check)."""
        try:
            return self.ls.workspace.root_path or None
        except Exception:  # noqa: BLE001 - not initialised yet, or a client with no workspace
            return None

    def stats(self) -> dict[str, int]:
        """Work done so far (the ``dice/stats`` request): the service's counters (model calls, validations,
        cache hits; zero before a service exists) and suggestions served by typing through one."""
        counters = dict.fromkeys(("engine_calls", "validations", "document_cache_hits"), 0)
        for service in {id(s): s for s in (self.service, self._validation_only) if s is not None}.values():
            for key, value in service.stats.items():
                counters[key] = counters.get(key, 0) + value
        return {**counters, "typed_through": self.typed_through}

    def notify_suggestion_status(
        self,
        uri: str,
        position: types.Position,
        *,
        candidates: int,
        usable: int,
        shown: int,
        message: str | None,
    ) -> None:
        """``dice/suggestionStatus``: how an inline request ended (docs/INTERNALS.md, "LSP ⟷ clients")."""
        params = {
            "uri": uri,
            "position": {"line": position.line, "character": position.character},
            "candidates": candidates,
            "usable": usable,
            "shown": shown,
            "message": message,
        }
        if message:
            self.log(f"no usable suggestion: {message}", types.MessageType.Log)
        self._on_loop(self.ls.protocol.notify, SUGGESTION_STATUS_METHOD, params)

    def _ready_message(self) -> str | None:
        return self.model_info.describe() if self.model_info is not None else None

    # ----------------------------------------------------------------- life cycle
    def start(self) -> None:
        """Called on ``initialized``: file watching, parent-process watch, model loading."""
        self._loop = asyncio.get_running_loop()
        self._watcher = FileWatcher(self._loop, self._on_file_change)
        try:
            self._watcher.start()
        except Exception as exc:  # no inotify in some sandboxes: watching degrades, serving goes on
            self.log(f"file watching is off: {exc}", types.MessageType.Warning)
            self._watcher = None
        if self.ls.process_id:
            self._parent_task = asyncio.ensure_future(self._watch_parent(self.ls.process_id))
        self.load_service()

    async def _watch_parent(self, pid: int) -> None:
        # A client that dies without closing our stdin (e.g. SIGKILL of an editor using TCP) must not
        # leave the server (and its model) running.
        while not self.closed:
            await asyncio.sleep(3.0)
            if not _pid_alive(pid):
                logger.warning("client process %s is gone; exiting", pid)
                self.close()
                os._exit(1)  # no shutdown request came: exit status 1 (LSP)

    def close(self) -> None:
        """Stop everything: pending requests, timers, watchers, the service (threads and workers)."""
        if self.closed:
            return
        self.closed = True
        self.tracker.cancel_all()
        for timer in self._timers.values():
            timer.cancel()
        for task in list(self._background):
            task.cancel()
        if self._parent_task is not None:
            self._parent_task.cancel()
        if self._watcher is not None:
            self._watcher.stop()
        for service in (self.service, self._validation_only):
            if service is not None:
                _close_quietly(service)
        self.service = self._validation_only = None
        self.parses.stop()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_task_error)
        return task

    # ----------------------------------------------------------------- settings
    def apply_settings(self, raw: Any, *, initial: bool = False) -> None:
        parsed = parse_settings(raw)
        for problem in parsed.problems:
            self.show(problem, types.MessageType.Warning)
        if parsed.unknown:
            self.log(f"settings not read by the server: {', '.join(sorted(parsed.unknown))}")
        old, self.settings = self.settings, parsed.settings
        self.log(f"settings applied: {settings_to_wire(self.settings)}")
        if initial:
            return
        if old != self.settings:  # suggestions shown under the old settings are not typed through
            for state in self.documents.values():
                state.shown = None
        if old.model_key() != self.settings.model_key():
            self.log("model settings changed: reloading")
            self.load_service()
        elif old != self.settings and self.service is not None:
            self._update_service_settings(self.service)

    def assistant_settings(self) -> AssistantSettings:
        return self.settings.assistant_settings()

    def _update_service_settings(self, service: AssistantService) -> None:
        service.update_settings(self.assistant_settings())

    # ----------------------------------------------------------------- the assistant service
    def load_service(self) -> asyncio.Task:
        """(Re)load the service in a worker thread; requests wait on the returned task."""
        if self._service_task is not None and not self._service_task.done():
            self._service_task.cancel()
        self._service_task = asyncio.ensure_future(self._load_service())
        return self._service_task

    async def _load_service(self) -> AssistantService | None:
        old, self.service = self.service, None
        stale, self._validation_only = self._validation_only, None
        for previous in {id(x): x for x in (old, stale) if x is not None}.values():
            await asyncio.to_thread(_close_quietly, previous)
        self.model_info = None
        self._service_error = None
        from engine.locate import choose_model

        choice = choose_model(self.settings.model.path)
        server = self.settings.server_url()
        where = (
            f"the model server at {server}"
            if server
            else "the embedded model"
            if choice.embedded
            else str(choice.path)
        )
        self.set_status("loading", f"loading {where}")
        started = time.perf_counter()
        try:
            settings = self.assistant_settings()
            from dice.assistant import AssistantService

            # Constructing the service is cheap; loading the model is not and may fail (bad path). The
            # service still validates kernels without a model, so it is kept for that.
            service = self._validation_only = AssistantService(
                settings, workspace_root=self._workspace_root()
            )
            problem = None if server else choice.problem("dice.modelPath")
            if problem:  # said at once, before the engine (and torch) is imported for nothing
                raise FileNotFoundError(problem)
            info = await asyncio.to_thread(lambda: service.model_info)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._service_error = f"cannot load the model ({where}): {exc}"
            self.show(self._service_error, types.MessageType.Error)
            self.set_status("error", self._service_error)
            return None
        if self.closed:
            _close_quietly(service)
            return None
        self.service, self.model_info = service, info
        self._loaded_key = self.settings.model_key()
        self._watch_model_folder(info)
        self.log(f"loaded {self._ready_message() or where} in {time.perf_counter() - started:.1f} s")
        self.set_status("ready", self._ready_message())
        return service

    async def get_service(self, *, model: bool = True) -> AssistantService:
        """The loaded service, waiting for a load in progress; raises ServiceUnavailable.

        ``model=False``: validation only, which works even when the model could not be loaded.
        """
        if self.service is not None:
            return self.service
        task = self._service_task
        if task is None:
            task = self.load_service()
        try:
            service = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and self._service_task is not None and self._service_task is not task:
                return await self.get_service()  # superseded by a newer load
            raise
        if service is None:
            if not model and self._validation_only is not None:
                return self._validation_only
            raise ServiceUnavailable(self._service_error or "the model is not loaded")
        return service

    def _watch_model_folder(self, info: ModelInfo) -> None:
        if self._watcher is None:
            return
        from engine.locate import choose_model

        folder = Path(info.path) if info.path else choose_model(None).path
        if folder.is_dir() and not self.settings.server_url():  # a served model is not ours to watch
            self._watcher.watch_folder(MODEL_KEY, folder)

    # ----------------------------------------------------------------- documents
    def state_of(self, uri: str) -> DocumentState:
        return self.documents.setdefault(uri, DocumentState())

    def parse(self, snap: DocumentSnapshot) -> CudaDocument | None:
        """The CudaDocument of a snapshot (cached per version); None for binary or oversized text."""
        if not snap.analysable:
            return None
        from dice.cuda_source import parse_document

        state = self.state_of(snap.uri)
        cached = self._cached(state, snap)
        if cached is not None:
            return cached
        doc = parse_document(snap.text)
        if snap.version is not None:
            state.parsed_version, state.parsed = snap.version, doc
        return doc

    @staticmethod
    def _cached(state: DocumentState, snap: DocumentSnapshot) -> CudaDocument | None:
        if snap.version is not None and state.parsed_version == snap.version:
            return state.parsed
        return None

    def needs_worker(self, snap: DocumentSnapshot) -> bool:
        """A big text not parsed yet for this version: ``parse`` would stop the event loop for it."""
        if not snap.analysable or len(snap.text) < OFF_LOOP_CHARS:
            return False
        state = self.documents.get(snap.uri)
        return state is None or self._cached(state, snap) is None

    async def parse_async(self, snap: DocumentSnapshot) -> CudaDocument | None:
        """``parse``, with a big text parsed in the worker process (one parse per version, shared by every
        request that waits for it); the event loop serves other requests meanwhile."""
        if not self.needs_worker(snap):
            return self.parse(snap)
        doc = await self.parses.parse(snap.uri, snap.version, snap.text)
        state = self.documents.get(snap.uri)
        if state is not None and snap.version is not None and self._version(snap.uri) == snap.version:
            state.parsed_version, state.parsed = snap.version, doc
        return doc

    def _version(self, uri: str) -> int | None:
        return current_version(self.ls.workspace, uri)

    async def index_of(self, snap: DocumentSnapshot) -> PositionIndex:
        """The parsed document's position index when it is of this version, else a new one (off the loop)."""
        from dice.cuda_source import PositionIndex

        doc = self._cached(self.documents.get(snap.uri) or DocumentState(), snap)
        if doc is not None:
            return doc.index
        small = len(snap.text) < OFF_LOOP_CHARS
        return PositionIndex(snap.text) if small else await asyncio.to_thread(PositionIndex, snap.text)

    def on_open(self, uri: str) -> None:
        self.debounce.record_edit(uri)
        self.schedule_diagnostics(uri, delay=0.0)

    def on_change(self, uri: str) -> None:
        self.debounce.record_edit(uri)
        snap = open_snapshot(self.ls.workspace, uri)
        state = self.state_of(uri)
        self.parses.forget(uri, keep_version=snap.version if snap is not None else None)  # a version gone
        if snap is not None and (state.regions or state.offers):
            data = snap.text.encode("utf-8", errors="surrogatepass")
            self._accept_offers(state, data)
            state.regions = relocate(state.regions, data)
        self.schedule_diagnostics(uri, delay=DIAGNOSTICS_DELAY_S)

    def on_close(self, uri: str) -> None:
        self.tracker.cancel_document(uri)
        self.debounce.forget(uri)
        state = self.documents.pop(uri, None)
        if state is not None and state.diagnostics_task is not None:
            state.diagnostics_task.cancel()
        self.parses.forget(uri)
        if self._watcher is not None:
            self._watcher.forget(uri)
        self._on_loop(
            self.ls.text_document_publish_diagnostics, types.PublishDiagnosticsParams(uri=uri, diagnostics=[])
        )

    def remember_offer(self, uri: str, offer: Offer) -> None:
        self.state_of(uri).offers = [offer]

    def _accept_offers(self, state: DocumentState, data: bytes) -> None:
        """An offered inline item found in the text was accepted: it becomes a region with its verdict."""
        for offer in state.offers:
            for text, verdict in zip(offer.texts, offer.verdicts, strict=False):
                if text.strip() and data.startswith(text.encode("utf-8"), offer.start_byte):
                    state.regions.append(make_region(offer.start_byte, text, verdict))
                    state.offers = []
                    return

    def add_regions(self, uri: str, regions: list[FilledRegion]) -> None:
        state = self.state_of(uri)
        state.regions = [r for r in state.regions if all(r.start_byte != n.start_byte for n in regions)]
        state.regions.extend(regions)

    def schedule_diagnostics(self, uri: str, *, delay: float) -> None:
        state = self.state_of(uri)
        if state.diagnostics_task is not None and not state.diagnostics_task.done():
            state.diagnostics_task.cancel()
        state.diagnostics_task = self.spawn(self._publish_after(uri, delay))

    async def _publish_after(self, uri: str, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        snap = open_snapshot(self.ls.workspace, uri)
        if snap is None:
            return
        doc = await self.parse_async(snap) if snap.is_cuda else None
        if self._version(uri) != snap.version:
            return  # edited meanwhile: the newer version's task publishes
        self._publish(snap, doc)

    def publish_diagnostics(self, uri: str) -> None:
        snap = open_snapshot(self.ls.workspace, uri)
        if snap is None:
            return
        if snap.is_cuda and self.needs_worker(snap):
            self.schedule_diagnostics(uri, delay=0.0)  # not parsed yet: parsed off the loop, then published
            return
        self._publish(snap, self.parse(snap) if snap.is_cuda else None)

    def _publish(self, snap: DocumentSnapshot, doc: CudaDocument | None) -> None:
        uri = snap.uri
        state = self.state_of(uri)
        state.mask_diagnostics = self._mask_diagnostics(uri, doc)
        if doc is not None and self._watcher is not None and snap.path is not None:
            from dice.validator.spec_files import spec_reference_files

            spec = doc.spec.source if doc.spec is not None else None
            self._watcher.watch_files(uri, spec_reference_files(spec, snap.path))
        self.ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=uri,
                diagnostics=state.mask_diagnostics + state.compile_diagnostics,
                version=snap.version,
            )
        )

    def _mask_diagnostics(self, uri: str, doc: CudaDocument | None) -> list:
        if doc is None:
            return []
        limit, found = MAX_MASK_DIAGNOSTICS, len(doc.masks) + len(doc.malformed_masks)
        if found > limit:
            self.tell_once(
                uri, "diagnostics", f"{found} masks; diagnostics show the first {limit} (commands see all)"
            )
        return (
            mask_diagnostics(doc.masks[:limit]) + malformed_mask_diagnostics(doc.malformed_masks[:limit])
        )[:limit]

    def tell_once(self, uri: str, limit: str, message: str) -> None:
        """A window/logMessage warning that a feature is limited for this (huge) file, once per document."""
        state = self.state_of(uri)
        if limit not in state.told:
            state.told.add(limit)
            self.log(f"{Path(to_fs_path(uri) or uri).name}: {message}", types.MessageType.Warning)

    def record_validation(self, snap: DocumentSnapshot, verdict: Verdict) -> None:
        """Keep a validation's verdict: compile errors become diagnostics, filled regions take its label."""
        state = self.state_of(snap.uri)
        state.last_verdict = verdict_json(verdict) or None
        state.compile_diagnostics = compile_error_diagnostics(snap.text, verdict)
        state.regions = [make_region(r.start_byte, r.text, verdict) for r in state.regions]
        self.publish_diagnostics(snap.uri)
        self.refresh_code_lenses()

    def refresh_code_lenses(self) -> None:
        caps = self.ls.client_capabilities.workspace
        if caps is not None and caps.code_lens is not None and caps.code_lens.refresh_support:
            self.spawn(self.ls.workspace_code_lens_refresh_async(None))

    # ----------------------------------------------------------------- file watching
    def _on_file_change(self, keys: set[str], path: Path) -> None:
        if self.closed:
            return
        for key in keys:
            if key == MODEL_KEY:
                if path.suffix not in MODEL_FILE_SUFFIXES:
                    continue  # training curves, logs, editor swap files: the model did not change
                self.log(f"model folder changed ({path.name}): reloading")
                self._debounced(MODEL_KEY, MODEL_RELOAD_DELAY_S, self.load_service)
            else:
                self.log(f"{path.name} changed on disk: re-validating {key}")
                self._debounced(key, REVALIDATE_DELAY_S, functools.partial(self._spawn_revalidate, key))

    def _spawn_revalidate(self, uri: str) -> None:
        self.spawn(self.revalidate(uri))

    def _debounced(self, key: str, delay: float, fn: Callable[[], Any]) -> None:
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        assert self._loop is not None
        self._timers[key] = self._loop.call_later(delay, fn)

    async def revalidate(self, uri: str) -> None:
        """A reference a document depends on changed: forget stale suggestions, validate it again."""
        snap = open_snapshot(self.ls.workspace, uri)
        if snap is None or not snap.analysable:
            return
        state = self.state_of(uri)
        state.offers = []
        state.shown = None  # their verdicts are stale too
        try:
            service = await self.get_service(model=False)
        except ServiceUnavailable as exc:
            self.log(f"cannot re-validate {uri}: {exc}", types.MessageType.Warning)
            return
        # every cached verdict (and every suggestion holding one) may rest on the file that changed
        service.invalidate()
        async with self.busy("validating", f"re-validating {Path(to_fs_path(uri) or uri).name}"):
            verdict = await service.validate_document(snap.text, filename=snap.path)
        self.record_validation(snap, verdict)
        self.log(f"re-validated {Path(to_fs_path(uri) or uri).name}: {verdict_label(verdict)}")


def _close_quietly(service: AssistantService) -> None:
    with contextlib.suppress(Exception):
        service.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True  # alive (PermissionError: someone else's process, alive too)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    with contextlib.suppress(RuntimeError):
        return asyncio.get_running_loop()
    return None


def _log_task_error(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("background task failed", exc_info=task.exception())
