"""Document snapshots: the text and version a request works on, and the limits that keep the server fast.

A snapshot is immutable; work started on one is dropped if the document's version moved on meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pygls.uris import to_fs_path
from pygls.workspace import Workspace

from dice import safeio

# Beyond this the server still tracks the document but runs no model work on it (a 5 MB file is
# parsed for masks; 32 MB of text is not a kernel someone edits by hand).
MAX_ANALYSED_CHARS = 32 * 1024 * 1024
CUDA_SUFFIXES = frozenset({".cu", ".cuh"})


@dataclass(frozen=True)
class DocumentSnapshot:
    uri: str
    version: int | None  # None for a file read from disk (not open in the editor)
    text: str
    language_id: str | None = None

    @property
    def path(self) -> Path | None:
        fs_path = to_fs_path(self.uri)
        return Path(fs_path) if fs_path else None

    @property
    def is_binary(self) -> bool:
        return looks_binary(self.text)

    @property
    def is_cuda(self) -> bool:
        path = self.path
        if path is not None and path.suffix.lower() in CUDA_SUFFIXES:
            return True
        return self.language_id in ("cuda-cpp", "cuda")

    @property
    def analysable(self) -> bool:
        """Whether masks, diagnostics and model work should run on this text at all."""
        return not self.is_binary and len(self.text) <= MAX_ANALYSED_CHARS


def looks_binary(text: str) -> bool:
    """NUL characters (or a mostly undecodable head) mean this is not source text."""
    head = text[:8192]
    if "\x00" in head:
        return True
    replaced = head.count("\ufffd")
    return len(head) > 0 and replaced / len(head) > 0.1


def open_snapshot(workspace: Workspace, uri: str) -> DocumentSnapshot | None:
    """The editor's current copy of an open document, or None when it is not open."""
    doc = workspace.text_documents.get(uri)
    if doc is None:
        # pygls keys documents by the unquoted uri
        from urllib.parse import unquote

        doc = workspace.text_documents.get(unquote(uri))
    if doc is None:
        return None
    return DocumentSnapshot(uri=uri, version=doc.version, text=doc.source, language_id=doc.language_id)


def disk_snapshot(uri: str) -> DocumentSnapshot | None:
    """The file on disk (undecodable bytes replaced); None for a uri that is not a file path. Blocking:
    call it off the event loop. ``dice.safeio.UserFileError`` (its message names the path) for a FIFO, a
    device, a folder, a missing file or one over ``dice.safeio.SOURCE_LIMIT``: refused, never read."""
    fs_path = to_fs_path(uri)
    if not fs_path:
        return None
    text = safeio.read_user_text(fs_path, max_bytes=safeio.SOURCE_LIMIT, what="document", errors="replace")
    return DocumentSnapshot(uri=uri, version=None, text=text)


def current_version(workspace: Workspace, uri: str) -> int | None:
    opened = open_snapshot(workspace, uri)
    return None if opened is None else opened.version
