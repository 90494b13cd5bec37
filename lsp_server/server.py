"""``dice-lsp``: registers thin handlers; the work lives in session.py, completion.py and commands.py.

Transports read messages with ``framing.py`` (pygls's reader cannot recover from a bad header) and the
protocol keeps the LSP life cycle (``protocol_states.py``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, BinaryIO

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from lsp_server import __version__
from lsp_server.actions import (
    FILL_ALL_MASKS,
    FILL_MASK,
    GENERATE_KERNEL,
    SOURCE_KIND,
    VALIDATE_KERNEL,
    cuda_actions,
    filter_kinds,
    reference_actions,
)
from lsp_server.auth import serve_tcp_with_token, serve_unix
from lsp_server.commands import execute
from lsp_server.completion import inline_completion
from lsp_server.convert import lsp_position
from lsp_server.documents import open_snapshot
from lsp_server.framing import max_message_bytes_from_env, serve_stdio
from lsp_server.kernelbench import is_generation_target
from lsp_server.protocol import WORK_DONE_TOKEN, DiceProtocol
from lsp_server.protocol_states import LifecycleProtocol
from lsp_server.regions import code_lenses, hover_at
from lsp_server.session import DiceSession

logger = logging.getLogger(__name__)


class DiceLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "dice-lsp",
            __version__,
            protocol_cls=LifecycleProtocol,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
        )
        self.session = DiceSession(self)
        self.max_message_bytes = max_message_bytes_from_env()

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        serve_stdio(self, stdin, stdout, max_message_bytes=self.max_message_bytes)

    def start_tcp(self, host: str, port: int, token: str | None = None) -> None:
        """One client on ``host:port`` that must send ``token`` first (``lsp_server.auth``). A token is
        required: any local process can connect to a TCP port."""
        if not token:
            raise ValueError("dice-lsp over TCP needs a token (lsp_server.auth.load_token)")
        serve_tcp_with_token(self, host, port, token, max_message_bytes=self.max_message_bytes)

    def start_socket(self, path: str) -> None:
        """One client on a 0600 Unix socket at ``path`` (``lsp_server.auth.serve_unix``)."""
        serve_unix(self, path, max_message_bytes=self.max_message_bytes)


STATS_METHOD = "dice/stats"  # request (client -> server): the counters of work done, see DiceSession.stats


def create_server() -> DiceLanguageServer:
    server = DiceLanguageServer()
    _register_lifecycle(server, server.session)
    _register_editing(server, server.session)
    _register_views(server, server.session)
    for name in (FILL_ALL_MASKS, FILL_MASK, GENERATE_KERNEL, VALIDATE_KERNEL):
        _register_command(server, server.session, name)
    return server


def _register_lifecycle(server: DiceLanguageServer, session: DiceSession) -> None:
    @server.feature(types.INITIALIZE)
    def initialize(params: types.InitializeParams) -> None:
        session.apply_settings(params.initialization_options, initial=True)

    @server.feature(types.INITIALIZED)
    def initialized(params: types.InitializedParams) -> None:
        session.start()

    @server.feature(types.SHUTDOWN)
    def shutdown(params: Any) -> None:
        session.close()

    @server.feature(STATS_METHOD)
    def stats(params: Any) -> dict[str, int]:
        return session.stats()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(params: types.DidChangeConfigurationParams) -> None:
        raw = params.settings
        if isinstance(raw, dict) and "dice" in raw:
            session.apply_settings(raw["dice"])
            return
        caps = server.client_capabilities.workspace
        if caps is not None and caps.configuration:
            # Clients that only signal a change expect the server to pull the section.
            result = await server.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="dice")])
            )
            session.apply_settings(result[0] if result else None)
        elif raw is not None:
            session.apply_settings(raw)


def _register_editing(server: DiceLanguageServer, session: DiceSession) -> None:
    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: types.DidOpenTextDocumentParams) -> None:
        session.on_open(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        session.on_change(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        session.on_close(params.text_document.uri)

    @server.feature(
        types.TEXT_DOCUMENT_INLINE_COMPLETION,
        types.InlineCompletionOptions(),
    )
    async def inline(params: types.InlineCompletionParams) -> list[types.InlineCompletionItem]:
        return await inline_completion(session, params)


def _register_views(server: DiceLanguageServer, session: DiceSession) -> None:
    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.RefactorRewrite, types.CodeActionKind.Source, SOURCE_KIND]
        ),
    )
    async def code_action(params: types.CodeActionParams) -> list[types.CodeAction]:
        snap = open_snapshot(server.workspace, params.text_document.uri)
        if snap is None or not snap.analysable:
            return []
        if snap.is_cuda:
            doc = await session.parse_async(snap)  # a big document is parsed off the event loop
            actions = cuda_actions(snap.uri, doc.masks if doc is not None else [], params.range)
        elif snap.path is not None and snap.path.suffix == ".py" and is_generation_target(snap.text):
            actions = reference_actions(snap.uri)
        else:
            actions = []
        return filter_kinds(actions, params.context.only)

    @server.feature(types.TEXT_DOCUMENT_CODE_LENS)
    async def code_lens(params: types.CodeLensParams) -> list[types.CodeLens]:
        snap = open_snapshot(server.workspace, params.text_document.uri)
        state = session.documents.get(params.text_document.uri)
        if snap is None or state is None or not state.regions or not snap.analysable:
            return []
        index = await session.index_of(snap)
        return code_lenses(state.regions, lambda b: lsp_position(index.byte_to_position(b)))

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(params: types.HoverParams) -> types.Hover | None:
        snap = open_snapshot(server.workspace, params.text_document.uri)
        state = session.documents.get(params.text_document.uri)
        if snap is None or state is None or not state.regions or not snap.analysable:
            return None
        from dice.cuda_source import Position

        index = await session.index_of(snap)
        try:
            offset = index.position_to_byte(Position(params.position.line, params.position.character))
        except (ValueError, IndexError):
            return None
        return hover_at(state.regions, offset, lambda b: lsp_position(index.byte_to_position(b)))


def _register_command(server: DiceLanguageServer, session: DiceSession, name: str) -> None:
    # pygls maps command arguments to handler parameters; one *args handler (unannotated, so pygls
    # passes the JSON values through) keeps parsing and its error messages in actions.parse_arguments.
    async def handler(*args) -> dict[str, Any]:  # noqa: ANN002
        protocol = server.protocol
        assert isinstance(protocol, DiceProtocol)
        msg_id = protocol.msg_id
        task = asyncio.current_task()
        if msg_id is not None and task is not None:
            protocol.command_tasks[msg_id] = task
        try:
            return await execute(session, name, list(args), WORK_DONE_TOKEN.get())
        finally:
            protocol.command_tasks.pop(msg_id, None)

    server.command(name)(handler)
