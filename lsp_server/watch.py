"""Files on disk that change what the server said: a ``dice-spec``'s reference module, a KernelBench
reference next to a ``.cu`` file (which ones: ``dice.validator.spec_files``), and the model folder.
watchdog threads hand events to the event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

logger = logging.getLogger(__name__)

OnChange = Callable[[set[str], Path], None]  # (keys watching the path, the path) on the loop thread


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: FileWatcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if raw:
                self._watcher._notice(Path(raw.decode() if isinstance(raw, bytes) else raw))


class FileWatcher:
    """Maps watched paths to keys (document uris, or ``"model"`` for a folder) and reports changes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_change: OnChange) -> None:
        self._loop = loop
        self._on_change = on_change
        self._lock = threading.Lock()
        self._files: dict[str, dict[Path, None]] = {}  # key -> files
        self._folders: dict[str, Path] = {}  # key -> folder watched recursively
        self._scheduled: dict[tuple[Path, bool], object] = {}
        self._observer: Observer | None = None

    def start(self) -> None:
        if self._observer is None:
            self._observer = Observer()
            self._observer.daemon = True
            self._observer.start()

    def stop(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
        self._scheduled.clear()

    def watch_files(self, key: str, files: Iterable[Path]) -> None:
        with self._lock:
            self._files[key] = dict.fromkeys(Path(f).resolve() for f in files)
        for folder in {f.parent for f in self._files[key]}:
            self._schedule(folder, recursive=False)

    def watch_folder(self, key: str, folder: Path | None) -> None:
        with self._lock:
            if folder is None:
                self._folders.pop(key, None)
                return
            self._folders[key] = Path(folder).resolve()
        self._schedule(self._folders[key], recursive=True)

    def forget(self, key: str) -> None:
        with self._lock:
            self._files.pop(key, None)
            self._folders.pop(key, None)

    def watched_files(self, key: str) -> set[Path]:
        with self._lock:
            return set(self._files.get(key, {}))

    def _schedule(self, folder: Path, *, recursive: bool) -> None:
        if self._observer is None or (folder, recursive) in self._scheduled or not folder.is_dir():
            return
        try:
            self._scheduled[(folder, recursive)] = self._observer.schedule(
                _Handler(self), str(folder), recursive=recursive
            )
        except (
            OSError
        ) as exc:  # e.g. inotify watch limit reached: the feature degrades, the server keeps going
            logger.warning("cannot watch %s: %s", folder, exc)

    def _notice(self, path: Path) -> None:
        # Runs on a watchdog thread.
        path = path.resolve()
        keys: set[str] = set()
        with self._lock:
            for key, files in self._files.items():
                if path in files:
                    keys.add(key)
            for key, folder in self._folders.items():
                if path == folder or folder in path.parents:
                    keys.add(key)
        if keys and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_change, keys, path)
