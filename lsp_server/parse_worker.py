"""Big documents are parsed in a child process, so the event loop keeps answering while a 10 MB file is read.

Why a process and not a thread: tree-sitter holds the GIL for the whole parse of a bytestring (a 200k-line,
10 MB file: 0.8-1.5 s here), so a parse in a thread stops the event loop just the same. ``dice.cuda_source``
is pure (text in, ``CudaDocument`` out), so the parse runs as well in a child.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop a task that has started. The parse of a
version the user has already replaced would hold up the next one (and the server's exit); this worker is
killed instead, and started again for the next parse (a start is an import of ``dice.cuda_source``, ~0.2 s).

The document comes back pickled without its text and bytes (the parent has them) and with each dataclass
rebuilt by a Python function: a plain unpickle of a file with 25k masks is one C call that holds the GIL for
about a second, while these calls let the event loop in between (the parent unpickles in a thread). The
garbage collector is paused while a document is built (parse, dump, load): its objects hold no cycles, and
the full collections that a million new objects set off cost 3 s (each one a pause of the event loop too).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import io
import logging
import multiprocessing
import os
import pickle
import sys
import threading
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dice.cuda_source import CudaDocument

logger = logging.getLogger(__name__)

_DOCUMENT, _FAILED = b"D", b"E"


class WorkerFailed(RuntimeError):
    """The child died or could not parse: the caller parses in this process instead."""


class ParseWorker:
    """One child process that parses one text at a time (requests queue up in arrival order)."""

    def __init__(self) -> None:
        self._process: Any = None  # multiprocessing's spawn Process
        self._conn: Connection | None = None
        self._lock: asyncio.Lock | None = None
        self._start_lock = threading.Lock()
        self.starts = 0  # child processes started so far (a killed one is replaced on the next parse)

    async def parse(self, text: str) -> CudaDocument:
        """``dice.cuda_source.parse_document(text)``, computed in the child. Cancelling the caller kills the
        child (the next parse starts a new one); WorkerFailed when the child dies or raises."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            conn = await asyncio.to_thread(self._connection)
            try:
                payload = await asyncio.to_thread(_exchange, conn, text)
            except asyncio.CancelledError:
                self.stop()  # it is parsing a text nobody waits for any more
                raise
            except (EOFError, OSError) as exc:
                self.stop()
                raise WorkerFailed(f"the parse worker died: {exc!r}") from exc
        if payload[:1] != _DOCUMENT:
            raise WorkerFailed(payload[1:].decode("utf-8", "replace"))
        return await asyncio.to_thread(load_document, payload[1:], text)

    def _connection(self) -> Connection:
        with self._start_lock:
            if self._process is not None and self._process.is_alive() and self._conn is not None:
                return self._conn
            self.stop()
            ours, theirs = multiprocessing.Pipe()
            # spawn, not fork: the server has threads (pygls, the model, file watching)
            process = multiprocessing.get_context("spawn").Process(
                target=_child_main, args=(theirs,), name="dice-lsp-parser", daemon=True
            )
            process.start()
            theirs.close()
            self._process, self._conn = process, ours
            self.starts += 1
            return ours

    def stop(self) -> None:
        """Kill the child, if any (safe to call at any time, from any thread). The pipe is not closed here:
        a thread may still be reading it (it gets end-of-file now); it is closed when that thread drops it."""
        process = self._process
        self._process = self._conn = None
        if process is not None and process.is_alive():
            process.kill()
            process.join(timeout=5)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None


class DocumentParses:
    """Parses through the worker, one per (document, version), shared by every request that waits for it;
    a parse of a version that is gone is stopped (``forget``). A worker failure falls back to a thread."""

    def __init__(self) -> None:
        self.worker = ParseWorker()  # its child starts with the first parse
        self._jobs: dict[str, tuple[int, asyncio.Task]] = {}

    async def parse(self, uri: str, version: int | None, text: str) -> CudaDocument:
        if version is None:  # a file read from disk: nothing to share
            return await self._parse(text)
        job = self._jobs.get(uri)
        if job is None or job[0] != version or job[1].done():
            self.forget(uri)
            job = self._jobs[uri] = (version, asyncio.ensure_future(self._parse(text)))
        try:
            return await asyncio.shield(job[1])
        finally:
            if job[1].done() and self._jobs.get(uri) is job:
                del self._jobs[uri]

    def forget(self, uri: str, *, keep_version: int | None = None) -> None:
        """Stop the parse of ``uri`` (unless it is of ``keep_version``)."""
        job = self._jobs.get(uri)
        if job is not None and job[0] != keep_version:
            del self._jobs[uri]
            job[1].cancel()

    def stop(self) -> None:
        for uri in list(self._jobs):
            self.forget(uri)
        self.worker.stop()

    async def _parse(self, text: str) -> CudaDocument:
        try:
            return await self.worker.parse(text)
        except WorkerFailed as exc:
            from dice.cuda_source import parse_document

            logger.warning("%s: parsing in a thread instead", exc)
            return await asyncio.to_thread(parse_document, text)


def _exchange(conn: Connection, text: str) -> bytes:
    conn.send(text)
    return conn.recv_bytes()


def _child_main(conn: Connection) -> None:
    # stdout is the LSP channel of the parent: nothing this process might print may reach it
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from dice.cuda_source import parse_document

    while True:
        try:
            text = conn.recv()
        except (EOFError, OSError):
            return  # the server closed the pipe (or is gone)
        try:
            with paused_gc():
                payload = _DOCUMENT + dump_document(parse_document(text))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which parses itself
            payload = _FAILED + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
        conn.send_bytes(payload)


# ---------------------------------------------------------------------------------------------- transfer

_TEXT, _DATA = "text", "data"


class _DocumentPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, doc: CudaDocument) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._text, self._data = doc.text, doc.data

    def persistent_id(self, obj: Any) -> str | None:
        if obj is self._text:
            return _TEXT
        if obj is self._data:
            return _DATA
        return None

    def reducer_override(self, obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and hasattr(obj, "__dict__"):
            return _rebuild, (type(obj), obj.__dict__)
        return NotImplemented


class _DocumentUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, text: str) -> None:
        super().__init__(file)
        self._text = text
        self._data: bytes | None = None

    def persistent_load(self, pid: Any) -> Any:
        if pid == _TEXT:
            return self._text
        if pid == _DATA:
            if self._data is None:
                from dice.cuda_source import encode_text

                self._data = encode_text(self._text)
            return self._data
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _rebuild(cls: type, state: dict[str, Any]) -> Any:
    obj = object.__new__(cls)
    obj.__dict__.update(state)  # frozen dataclasses: the fields as they were, __init__ not run again
    return obj


def dump_document(doc: CudaDocument) -> bytes:
    """The document without its text and bytes (``load_document`` takes the text back)."""
    out = io.BytesIO()
    _DocumentPickler(out, doc).dump(doc)
    return out.getvalue()


def load_document(payload: bytes, text: str) -> CudaDocument:
    with paused_gc():
        return _DocumentUnpickler(io.BytesIO(payload), text).load()


@contextlib.contextmanager
def paused_gc():
    """No automatic garbage collection inside (when it was on, it is on again after)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
