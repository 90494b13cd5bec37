"""The inline-completion flow: plan, debounce, call the assistant, drop stale or superseded results."""

from __future__ import annotations

import asyncio
import logging

from lsprotocol import types

from dice.assistant import AssistantService
from dice.assistant.rules import usable
from dice.assistant.types import Candidate, DocumentCompletion
from dice.validator.verdict import verdict_label
from lsp_server.documents import DocumentSnapshot, current_version, open_snapshot
from lsp_server.inline import (
    ACCEPTED_COMMAND,
    InlinePlan,
    Shown,
    Ticket,
    completion_items,
    plan_inline,
    suggestion_status,
)
from lsp_server.session import DiceSession, Offer, ServiceUnavailable

logger = logging.getLogger(__name__)

# No inline suggestions for longer texts: the assistant parses the whole text again, on the event loop
# (``AssistantService.complete_at``/``complete_document``), which for 2 MiB already takes ~0.3 s.
MAX_INLINE_CHARS = 2 * 1024 * 1024


async def inline_completion(
    session: DiceSession, params: types.InlineCompletionParams
) -> list[types.InlineCompletionItem]:
    uri = params.text_document.uri
    snap = open_snapshot(session.ls.workspace, uri)
    if snap is None or not snap.analysable or not snap.is_cuda:
        return []
    context = params.context
    automatic = context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
    if automatic and not session.settings.suggestions.automatic_trigger:
        return []
    if len(snap.text) > MAX_INLINE_CHARS:
        size = f"{len(snap.text) / 2**20:.0f} MiB"
        session.tell_once(uri, "inline", f"inline suggestions are off in files over 2 MiB (this one: {size})")
        return []

    ticket = session.tracker.start(uri)
    try:
        typed = await _typed_through(session, uri, snap, params.position, limit=1 if automatic else None)
        if typed is not None:
            return typed
        if automatic:
            # Adaptive debounce; a newer request for the document ends the wait (and this request) early.
            try:
                await asyncio.wait_for(ticket.cancel.wait(), timeout=session.debounce.delay(uri))
                return []
            except asyncio.TimeoutError:
                pass
        doc = await session.parse_async(snap)  # a big document is parsed off the event loop
        if doc is None:
            return []
        plan = plan_inline(snap.text, doc, params.position, context.selected_completion_info)
        if plan is None:
            return []
        try:
            service = await session.get_service()
        except ServiceUnavailable as exc:
            session.log(f"no suggestion: {exc}", types.MessageType.Warning)
            return []
        if ticket.cancel.is_set():
            return []

        result = await _complete(session, service, plan, snap, ticket)
        if ticket.cancel.is_set():
            logger.info("inline %s #%d: superseded", uri, ticket.seq)
            return []
        if current_version(session.ls.workspace, uri) != snap.version:
            session.log(f"dropped suggestions for a stale version of {uri}")
            return []
        stats = {k: round(v, 3) for k, v in result.stats.items()}
        session.log(f"inline #{ticket.seq}: cached={result.from_cache} {stats}", types.MessageType.Log)
        return _items(session, snap, plan, result, automatic=automatic)
    except asyncio.CancelledError:
        # $/cancelRequest (or shutdown): stop the model between denoising steps, then let pygls answer
        # "request cancelled". A request we superseded ourselves answers with no items instead.
        ticket.cancel.set()
        task = asyncio.current_task()
        if task is not None and getattr(task, "cancelling", lambda: 1)() == 0:
            logger.info("inline %s #%d: superseded while generating", uri, ticket.seq)
            return []
        logger.info("inline %s #%d: cancelled by the client", uri, ticket.seq)
        raise
    except Exception as exc:
        if ticket.cancel.is_set():
            return []  # the engine's own cancellation error after we asked it to stop
        logger.exception("inline completion failed")
        session.log(f"inline completion failed: {exc}", types.MessageType.Error)
        return []
    finally:
        session.tracker.finish(ticket)


async def _complete(
    session: DiceSession, service: AssistantService, plan: InlinePlan, snap: DocumentSnapshot, ticket: Ticket
) -> DocumentCompletion:
    """Ask the assistant for the plan's mask (or the implicit one at the cursor)."""
    n = session.settings.decoding.candidates
    filename = snap.path  # compiler logs name the user's file; a dice-spec imports from its folder
    async with session.busy("busy", "suggesting"):
        if plan.mask_index is not None:
            return await service.complete_document(
                plan.text,
                mask_indices=[plan.mask_index],
                candidates=n,
                cancel=ticket.cancel,
                filename=filename,
            )
        return await service.complete_at(
            plan.text, plan.byte_offset, candidates=n, cancel=ticket.cancel, filename=filename
        )


def _items(
    session: DiceSession,
    snap: DocumentSnapshot,
    plan: InlinePlan,
    result: DocumentCompletion,
    *,
    automatic: bool,
) -> list[types.InlineCompletionItem]:
    """The usable candidates as items (one for an automatic request), remembered as offered (an accepted
    one becomes a region) and, at a cursor, as shown (typing their start keeps their rest)."""
    level = session.settings.validation.level
    candidates = _mask_candidates(result, plan.mask_index)
    shown = [c for c in candidates if usable(c.verdict, level)]
    n = session.settings.decoding.candidates
    limit = 1 if automatic else n
    items = completion_items(shown, plan.range, limit=limit, prefix=plan.prefix, uri=snap.uri)
    if not shown and candidates and session.settings.suggestions.show_failing:
        # nothing passed: the best attempt is still shown, marked with its verdict and first error
        items = completion_items(
            candidates[:1], plan.range, limit=1, prefix=plan.prefix, uri=snap.uri, usable=False
        )
    session.notify_suggestion_status(
        snap.uri,
        plan.range.start,
        candidates=len(candidates),
        usable=len(shown),
        shown=len(items),
        message=suggestion_status(candidates, len(shown), len(items)),
    )
    state = session.state_of(snap.uri)
    state.shown = None
    if items:
        by_text = {plan.prefix + c.text: c.verdict for c in candidates}
        texts = [item.insert_text for item in items if isinstance(item.insert_text, str)]
        verdicts = [by_text.get(t) for t in texts]
        start = plan.byte_offset - len(plan.prefix.encode("utf-8"))
        session.remember_offer(snap.uri, Offer(start, texts, verdicts))
        if plan.mask_index is None and not plan.prefix:  # at the cursor: typing through them works
            data = snap.text.encode("utf-8", errors="surrogatepass")
            state.shown = Shown.at(data, plan.byte_offset, texts, verdicts)
    return items


async def _typed_through(
    session: DiceSession,
    uri: str,
    snap: DocumentSnapshot,
    position: types.Position,
    *,
    limit: int | None,
) -> list[types.InlineCompletionItem] | None:
    """The rest of the suggestions shown at this spot when the user typed their beginning; None otherwise."""
    shown = session.state_of(uri).shown
    if shown is None:
        return None
    from dice.cuda_source import Position

    index = await session.index_of(snap)
    try:
        cursor = index.position_to_byte(Position(position.line, position.character))
    except (ValueError, IndexError):
        return None
    found = shown.typed_through(index.data, cursor)
    if found is None:
        return None
    typed, rests, verdicts = found
    session.typed_through += 1
    if limit:
        rests, verdicts = rests[:limit], verdicts[:limit]
    session.remember_offer(uri, Offer(shown.start_byte, [typed + r for r in rests], verdicts))
    logger.info("inline %s: typed %d characters of the shown suggestion, serving the rest", uri, len(typed))
    here = types.Range(start=position, end=position)
    level = session.settings.validation.level
    items: list[types.InlineCompletionItem] = []
    for rest, verdict in zip(rests, verdicts, strict=True):
        ok = usable(verdict, level)
        label = verdict_label(verdict)
        arguments = [{"uri": uri, "label": label, "usable": ok}]
        command = types.Command(title=label, command=ACCEPTED_COMMAND, arguments=arguments)
        items.append(types.InlineCompletionItem(insert_text=rest, range=here, command=command))
    return items


def _mask_candidates(result: DocumentCompletion, mask_index: int | None) -> list[Candidate]:
    for mc in result.masks:
        if mask_index is None or mc.mask.index == mask_index:
            return list(mc.candidates)
    return []
