"""The JSON-RPC protocol as pygls provides it, with two corrections this server relies on.

1. Positions are always UTF-16: ``dice.cuda_source.PositionIndex`` (the one place that converts) works in
   UTF-16 code units, so a client offering ``utf-8`` first (Neovim does) must not switch the encoding.
2. ``workspace/executeCommand`` keeps the client's ``workDoneToken`` for the command (see WORK_DONE_TOKEN).
3. ``$/cancelRequest`` of an executeCommand cancels the command's task (pygls alone does not).
4. A request whose params do not fit the method's type gets an ``InvalidParams`` error response instead of
   being dropped silently (pygls would log it and the client would wait forever).
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from types import SimpleNamespace
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

logger = logging.getLogger(__name__)

# A message object that ``handle_message`` ignores (its jsonrpc version is not "2.0").
_IGNORED = SimpleNamespace(jsonrpc="ignored")

# The ``workDoneToken`` of the executeCommand request being handled: pygls passes command handlers only
# the arguments, and the handler's task inherits this context.
WORK_DONE_TOKEN: ContextVar[types.ProgressToken | None] = ContextVar("dice_work_done_token", default=None)


class DiceProtocol(LanguageServerProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # executeCommand request id -> the task running the command. pygls runs commands inside its
        # builtin executeCommand generator, so $/cancelRequest would only cancel the generator's
        # result future and the command would run on; this map lets the cancel reach the command.
        self.command_tasks: dict[Any, asyncio.Task] = {}

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        task = self.command_tasks.pop(msg_id, None)
        super()._handle_cancel_notification(msg_id)
        if task is not None:
            task.cancel()

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):  # type: ignore[override]
        general = params.capabilities.general
        if general is not None and general.position_encodings:
            general.position_encodings = [types.PositionEncodingKind.Utf16]
        return (yield from super().lsp_initialize(params))

    @lsp_method(types.WORKSPACE_EXECUTE_COMMAND)
    def lsp_workspace__execute_command(self, params: types.ExecuteCommandParams):  # type: ignore[override]
        WORK_DONE_TOKEN.set(params.work_done_token)
        return (yield from super().lsp_workspace__execute_command(params))

    def structure_message(self, data: dict[str, Any]):  # type: ignore[override]
        try:
            return super().structure_message(data)
        except Exception as exc:
            if "jsonrpc" in data and "id" in data and "method" in data:
                logger.warning("invalid params for %r (id %r): %s", data.get("method"), data.get("id"), exc)
                error = JsonRpcInvalidParams(f"invalid params for {data.get('method')!r}")
                self._send_response(data["id"], error=error.to_response_error())
                return _IGNORED
            raise
