"""The ``workspace/executeCommand`` flows: fill masks, generate a kernel, validate a kernel.

Each long command reports work-done progress (cancellable) and edits documents only through
``workspace/applyEdit``, versioned, so an edit computed for an older text is refused by the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path

from dice import safeio
from dice.assistant.rules import program_with_header, usable
from dice.assistant.types import Progress
from dice.cuda_source import Mask
from dice.validator import Verdict
from dice.validator.verdict import verdict_label
from lsp_server.actions import (
    FILL_MASK,
    CommandArgumentError,
    CommandTarget,
    parse_arguments,
)
from lsp_server.convert import lsp_edit
from lsp_server.documents import DocumentSnapshot, current_version, disk_snapshot, open_snapshot
from lsp_server.inline import mask_at
from lsp_server.kernelbench import output_path
from lsp_server.regions import FilledRegion, make_region, relocate
from lsp_server.session import DiceSession, ServiceUnavailable
from lsp_server.verdicts import verdict_json

logger = logging.getLogger(__name__)


class CommandFailed(Exception):
    """A command cannot go on; the message is shown to the user and returned."""


@dataclass
class ProgressReporter:
    """Forwards assistant ``Progress`` events to a work-done progress token (from any thread)."""

    session: DiceSession
    token: types.ProgressToken | None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, event: Progress) -> None:
        if self.token is None:
            return
        total = max(event.total, 1)
        done = min(event.done, total)
        text = event.message or f"{event.stage} {done}/{total}"
        report = types.WorkDoneProgressReport(
            message=text, percentage=int(100 * done / total), cancellable=True
        )
        self.session._on_loop(self.session.ls.work_done_progress.report, self.token, report)


@contextlib.asynccontextmanager
async def work_done_progress(
    session: DiceSession, title: str, client_token: types.ProgressToken | None
) -> AsyncIterator[ProgressReporter]:
    """A cancellable work-done progress: the client's token when it sent one, else one we create."""
    ls = session.ls
    token = client_token
    window = ls.client_capabilities.window
    if token is None and window is not None and window.work_done_progress:
        token = f"dice-{uuid.uuid4()}"
        try:
            await ls.work_done_progress.create_async(token)
        except Exception as exc:  # the client refused: run without a progress bar
            session.log(f"no progress bar: {exc}")
            token = None
    reporter = ProgressReporter(session, token)
    loop = asyncio.get_running_loop()
    if token is not None:
        ls.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title=title, cancellable=True, percentage=0)
        )
        future = ls.work_done_progress.tokens.get(token)
        if future is not None:
            # window/workDoneProgress/cancel cancels this (concurrent) future.
            future.add_done_callback(
                lambda f: loop.call_soon_threadsafe(reporter.cancel.set) if f.cancelled() else None
            )
    try:
        yield reporter
    except asyncio.CancelledError:
        reporter.cancel.set()
        raise
    finally:
        if token is not None:
            message = "cancelled" if reporter.cancel.is_set() else "done"
            ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
            ls.work_done_progress.tokens.pop(token, None)


async def execute(
    session: DiceSession, command: str, arguments: list[Any] | None, token: types.ProgressToken | None
) -> dict[str, Any]:
    """Run one server command; errors become a window message and an ``{"ok": false}`` result. Results are
    strict JSON (``dice.safeio.strict_json``: a NaN or infinite number is null, named in ``non_finite``):
    VS Code's ``JSON.parse`` rejects ``NaN`` and ``Infinity``."""
    return safeio.strict_json(await _execute(session, command, arguments, token))


async def _execute(
    session: DiceSession, command: str, arguments: list[Any] | None, token: types.ProgressToken | None
) -> dict[str, Any]:
    from lsp_server.actions import FILL_ALL_MASKS, GENERATE_KERNEL, VALIDATE_KERNEL

    try:
        target = parse_arguments(command, arguments)
        if command in (FILL_ALL_MASKS, FILL_MASK):
            return await fill_masks(session, target, token, single=command == FILL_MASK)
        if command == GENERATE_KERNEL:
            return await generate_kernel(session, target, token)
        if command == VALIDATE_KERNEL:
            return await validate_kernel(session, target, token)
        raise CommandFailed(f"unknown command {command!r}")
    except (CommandArgumentError, CommandFailed, ServiceUnavailable) as exc:
        session.show(str(exc), types.MessageType.Error)
        return {"ok": False, "message": str(exc)}
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and getattr(task, "cancelling", lambda: 1)() == 0:
            # the user cancelled the progress (window/workDoneProgress/cancel), not the request
            return {"ok": False, "message": "cancelled"}
        raise
    except Exception as exc:
        logger.exception("command %s failed", command)
        session.show(f"{command} failed: {exc}", types.MessageType.Error)
        return {"ok": False, "message": str(exc)}


async def target_snapshot(session: DiceSession, uri: str) -> DocumentSnapshot:
    """The editor's copy of ``uri``, else the file on disk, read off the event loop (a slow disk or a big
    file never stalls other requests); CommandFailed for a FIFO, a device, a folder, a missing file or one
    over the size cap (``dice.safeio.read_user_file``: refused before anything is read)."""
    opened = open_snapshot(session.ls.workspace, uri)
    if opened is not None:
        return opened
    try:
        snap = await asyncio.to_thread(disk_snapshot, uri)
    except safeio.UserFileError as exc:
        raise CommandFailed(f"cannot read {exc}") from exc
    if snap is None:
        raise CommandFailed(f"cannot read {uri}")
    return snap


async def fill_masks(
    session: DiceSession, target: CommandTarget, token: types.ProgressToken | None, *, single: bool
) -> dict[str, Any]:
    from dice.cuda_source import splice

    snap = await target_snapshot(session, target.uri)
    doc = await session.parse_async(snap)
    if doc is None:
        raise CommandFailed("this document is binary or too large for DICE")
    masks = list(doc.masks)
    if single:
        assert target.position is not None
        mask = mask_at(masks, target.position)
        if mask is None:
            raise CommandFailed(f"no mask at line {target.position.line + 1}")
        masks = [mask]
    if not masks:
        session.show("DICE: no masks in this file", types.MessageType.Info)
        return {"ok": True, "applied": False, "filled": [], "skipped": [], "message": "no masks"}

    service = await session.get_service()
    title = "DICE: filling a mask" if single else f"DICE: filling {len(masks)} mask(s)"
    async with work_done_progress(session, title, token) as progress, session.busy("busy", title):
        completion = await service.complete_document(
            snap.text,
            mask_indices=[m.index for m in masks],
            progress=progress,
            cancel=progress.cancel,
            filename=snap.path,
        )
    if progress.cancel.is_set():
        return {"ok": False, "applied": False, "message": "cancelled"}

    level = session.settings.validation.level
    fills: dict[int, str] = {}
    verdicts: dict[int, Verdict | None] = {}
    skipped: list[dict[str, Any]] = []
    for mc in completion.masks:
        best = mc.candidates[0] if mc.candidates else None
        if best is not None and usable(best.verdict, level):
            fills[mc.mask.index] = best.text
            verdicts[mc.mask.index] = best.verdict
        else:
            reason = verdict_label(best.verdict) if best is not None else "no candidate"
            skipped.append({"mask": mc.mask.index, "reason": reason})
    if skipped:
        session.show(
            "DICE: left unfilled (no usable candidate): "
            + ", ".join(f"mask #{s['mask']} ({s['reason']})" for s in skipped),
            types.MessageType.Warning,
        )
    if not fills:
        return {"ok": True, "applied": False, "filled": [], "skipped": skipped}
    if snap.version is not None and current_version(session.ls.workspace, snap.uri) != snap.version:
        raise CommandFailed("the document changed while DICE was working; nothing was applied (run it again)")

    result = splice(snap.text, fills)
    edits = [lsp_edit(e) for e in result.edits]
    applied = await _apply_text_edits(session, snap.uri, snap.version, edits, "DICE: fill masks")
    filled = [
        {"mask": index, "text": text, "verdict": verdict_json(verdicts[index]) or None}
        for index, text in sorted(fills.items())
    ]
    if applied:
        new_data = result.text.encode("utf-8", errors="surrogatepass")
        regions = _regions_after_splice(doc.masks, fills, verdicts, new_data)
        session.add_regions(snap.uri, regions)
        session.refresh_code_lenses()
    return {"ok": applied, "applied": applied, "filled": filled, "skipped": skipped}


def _regions_after_splice(
    masks: list[Mask], fills: dict[int, str], verdicts: dict[int, Verdict | None], new_data: bytes
) -> list[FilledRegion]:
    """Where each fill sits in the new text: masks shift by the size change of the fills before them."""
    shift = 0
    estimated: list[FilledRegion] = []
    for mask in sorted(masks, key=lambda m: m.start_byte):
        if mask.index not in fills:
            continue
        text = fills[mask.index]
        estimated.append(make_region(mask.start_byte + shift, text, verdicts.get(mask.index)))
        shift += len(text.encode("utf-8")) - (mask.end_byte - mask.start_byte)
    return relocate(estimated, new_data)


async def _apply_text_edits(
    session: DiceSession, uri: str, version: int | None, edits: list[types.TextEdit], label: str
) -> bool:
    ls = session.ls
    ws_caps = ls.client_capabilities.workspace
    document_changes = bool(ws_caps and ws_caps.workspace_edit and ws_caps.workspace_edit.document_changes)
    if document_changes:
        edit = types.WorkspaceEdit(
            document_changes=[
                types.TextDocumentEdit(
                    text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
                    edits=edits,
                )
            ]
        )
    else:
        edit = types.WorkspaceEdit(changes={uri: edits})
    response = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=label))
    if not response.applied:
        session.show(
            f"{label}: the editor did not apply the edit ({response.failure_reason or 'no reason'})",
            types.MessageType.Warning,
        )
    return bool(response.applied)


async def generate_kernel(
    session: DiceSession, target: CommandTarget, token: types.ProgressToken | None
) -> dict[str, Any]:
    snap = await target_snapshot(session, target.uri)
    if snap.path is None:
        raise CommandFailed(f"cannot read {target.uri}")
    from dice.validator.reference import InvalidReference, check_reference

    try:
        check_reference(snap.text)
    except InvalidReference as exc:
        raise CommandFailed(f"{snap.path.name}: {exc}") from exc
    service = await session.get_service()
    title = f"DICE: generating a CUDA kernel for {snap.path.name}"
    async with work_done_progress(session, title, token) as progress, session.busy("busy", title):
        programs = await service.generate_kernel(snap.text, progress=progress, cancel=progress.cancel)
    if progress.cancel.is_set():
        return {"ok": False, "message": "cancelled"}
    level = session.settings.validation.level
    best = next((p for p in programs if usable(p.verdict, level)), None)
    if best is None:
        labels = ", ".join(verdict_label(p.verdict) for p in programs) or "no sample"
        raise CommandFailed(f"DICE: no generated program is usable ({labels}); nothing written")

    out = output_path(snap.path)
    model = session.model_info.name if session.model_info is not None else None
    content = program_with_header(best.source, best.verdict, reference_name=snap.path.name, model=model)
    new_uri = from_fs_path(str(out)) or out.as_uri()
    await _create_file(session, out, new_uri, content)
    label = verdict_label(best.verdict)
    session.show(f"DICE: wrote {out.name} ({label})", types.MessageType.Info)
    window = session.ls.client_capabilities.window
    if window is not None and window.show_document is not None and window.show_document.support:
        with contextlib.suppress(Exception):
            await session.ls.window_show_document_async(
                types.ShowDocumentParams(uri=new_uri, take_focus=True)
            )
    return {
        "ok": True,
        "uri": new_uri,
        "path": str(out),
        "verdict": verdict_json(best.verdict) or None,
        "label": label,
    }


async def _create_file(session: DiceSession, path: Path, uri: str, content: str) -> None:
    """A new file through the client when it can create files (it lands in its undo history), else on disk."""
    ws_caps = session.ls.client_capabilities.workspace
    edit_caps = ws_caps.workspace_edit if ws_caps else None
    operations = set(edit_caps.resource_operations or []) if edit_caps else set()
    if (
        edit_caps is not None
        and edit_caps.document_changes
        and types.ResourceOperationKind.Create in operations
    ):
        end = types.Position(line=0, character=0)
        edit = types.WorkspaceEdit(
            document_changes=[
                types.CreateFile(
                    uri=uri, options=types.CreateFileOptions(overwrite=False, ignore_if_exists=False)
                ),
                types.TextDocumentEdit(
                    text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=None),
                    edits=[types.TextEdit(range=types.Range(start=end, end=end), new_text=content)],
                ),
            ]
        )
        response = await session.ls.workspace_apply_edit_async(
            types.ApplyWorkspaceEditParams(edit=edit, label="DICE: generate kernel")
        )
        if response.applied:
            return
        session.log(f"the client did not create {path.name} ({response.failure_reason}); writing it directly")
    try:  # a unique temporary file, fsynced, published only if nothing took the name meanwhile
        await asyncio.to_thread(safeio.write_user_file, path, content, exclusive=True)
    except safeio.UserFileError as exc:
        raise CommandFailed(f"DICE: cannot write the generated kernel: {exc}") from exc


async def validate_kernel(
    session: DiceSession, target: CommandTarget, token: types.ProgressToken | None
) -> dict[str, Any]:
    snap = await target_snapshot(session, target.uri)
    if not snap.analysable:
        raise CommandFailed("this document is binary or too large for DICE")
    service = await session.get_service(model=False)
    name = snap.path.name if snap.path else target.uri
    title = f"DICE: validating {name}"
    async with work_done_progress(session, title, token) as progress, session.busy("validating", title):
        verdict = await service.validate_document(snap.text, filename=snap.path)
    if progress.cancel.is_set():
        return {"ok": False, "message": "cancelled"}
    session.record_validation(snap, verdict)
    label = verdict_label(verdict)
    level = types.MessageType.Info if verdict.compiled else types.MessageType.Warning
    session.show(f"DICE: {name}: {label}", level)
    return {"ok": True, "verdict": verdict_json(verdict), "label": label}
