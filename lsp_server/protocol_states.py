"""The LSP life cycle (not initialized -> running -> shut down) and error responses without tracebacks.

pygls 2.1.1 keeps no "initialized" state: a request before ``initialize`` runs its handler, which fails on the
missing workspace, and the client gets InternalError (-32603) with the Python traceback in ``error.data``.
After ``shutdown`` it drops every message but ``exit`` without an answer (so a second ``shutdown`` waits
forever), and it accepts ``shutdown`` before ``initialize``, after which it answers nothing. The LSP
specification asks for:

- before ``initialize``: every request but ``initialize`` gets ServerNotInitialized (-32002); notifications
  are dropped, except ``exit``;
- after ``shutdown``: every request gets InvalidRequest (-32600); notifications but ``exit`` are dropped;
- ``exit``: the process ends with status 0 after ``shutdown``, 1 otherwise (pygls's ``lsp_exit`` and
  ``lsp_server.__main__`` already do that).

``initialize`` a second time gets InvalidRequest too (pygls would build a new workspace and lose the open
documents). Internal errors go out with a one-line message and no ``data``: the traceback is in the server
log (pygls logs it where it catches the exception), never sent to the client.
"""

from __future__ import annotations

import logging
from typing import Any

from lsprotocol import types
from pygls.exceptions import (
    JsonRpcException,
    JsonRpcInternalError,
    JsonRpcInvalidRequest,
    JsonRpcServerNotInitialized,
)
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCProtocol, JsonRPCRequestMessage, RPCRequest

from lsp_server.protocol import DiceProtocol

logger = logging.getLogger(__name__)

MAX_ERROR_MESSAGE = 300  # characters of an internal error's message sent to the client


class LifecycleProtocol(DiceProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initialize_received = False

    def refusal(self, method: str) -> JsonRpcException | None:
        """Why a message with this method is refused in the current state; None when it is handled."""
        if method == types.EXIT:
            return None
        if self._shutdown:
            return JsonRpcInvalidRequest(f"the server is shut down: {method} refused (only exit is accepted)")
        if not self.initialize_received:
            if method == types.INITIALIZE:
                return None
            return JsonRpcServerNotInitialized(f"the server is not initialized: {method} came first")
        if method == types.INITIALIZE:
            return JsonRpcInvalidRequest("initialize was already received")
        return None

    def structure_message(self, data: dict[str, Any]):  # type: ignore[override]
        """A message that will be refused is not converted to its lsprotocol type: its params may not even
        fit (the refusal, not InvalidParams, is the answer) and may be large."""
        method = data.get("method")
        if (
            data.get("jsonrpc") == JsonRPCProtocol.VERSION
            and isinstance(method, str)
            and self.refusal(method)
        ):
            if "id" in data:
                return JsonRPCRequestMessage(
                    id=data["id"], method=method, jsonrpc=data["jsonrpc"], params=None
                )
            return JsonRPCNotification(method=method, jsonrpc=data["jsonrpc"], params=None)
        return super().structure_message(data)

    def handle_message(self, message: Any) -> None:  # type: ignore[override]
        method = getattr(message, "method", None)
        if getattr(message, "jsonrpc", None) != JsonRPCProtocol.VERSION or not isinstance(method, str):
            super().handle_message(message)  # responses, and what pygls itself ignores
            return
        refusal = self.refusal(method)
        if refusal is None:
            if method == types.INITIALIZE:
                self.initialize_received = True
            super().handle_message(message)
        elif isinstance(message, RPCRequest):
            logger.warning("refused request %r (id %r): %s", method, message.id, refusal.message)
            self._send_response(message.id, error=refusal.to_response_error())
        else:
            logger.info("dropped notification %r: %s", method, refusal.message)

    def _send_response(
        self, msg_id: Any, result: Any | None = None, error: types.ResponseError | None = None
    ):
        """Every response goes through here: an internal error loses its ``data`` (pygls puts the traceback
        there) and keeps the first line of its message."""
        if error is not None and (error.code == JsonRpcInternalError.CODE or _holds_traceback(error.data)):
            lines = (error.message or "internal error").strip().splitlines() or ["internal error"]
            short = lines[0][:MAX_ERROR_MESSAGE]
            if error.data is not None and not _holds_traceback(error.data):
                # (pygls logged its tracebacks where it caught the exception)
                logger.warning("error response %r: data kept out of the response: %r", msg_id, error.data)
            error = types.ResponseError(code=error.code, message=short, data=None)
        super()._send_response(msg_id, result=result, error=error)


def _holds_traceback(data: Any) -> bool:
    return isinstance(data, dict) and "traceback" in data
