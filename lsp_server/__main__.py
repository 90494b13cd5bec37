"""``dice-lsp`` entry point: stdio by default; ``--tcp HOST:PORT`` (loopback, token required) or ``--socket
PATH`` (a 0600 Unix socket) to listen instead. Who may connect: :mod:`lsp_server.auth`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dice-lsp", description="The DICE language server for CUDA files.")
    parser.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)")
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument(
        "--tcp",
        type=_host_port,
        metavar="HOST:PORT",
        help="listen on a loopback TCP socket instead; clients must send the token in "
        "initialize's initializationOptions.token",
    )
    transport.add_argument(
        "--socket", metavar="PATH", help="listen on a Unix socket (mode 0600, in a 0700 folder) instead"
    )
    parser.add_argument(
        "--allow-remote", action="store_true", help="let --tcp bind to a non-loopback address (unsafe)"
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="--tcp: read the token from this file (mode 0600); else $DICE_LSP_TOKEN, else a new "
        "token is written to a 0600 file whose path is printed on stderr",
    )
    parser.add_argument("--log-file", help="write the server log here (stderr otherwise)")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="server log level",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from lsp_server import __version__

    if args.version:
        print(f"dice-lsp {__version__}")
        return 0
    logging.basicConfig(
        filename=args.log_file,
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # pygls logs every message at INFO; keep its chatter out unless asked for.
    logging.getLogger("pygls").setLevel(max(logging.getLogger().level, logging.WARNING))
    if args.tcp or args.socket:
        # "Serving on HOST:PORT" tells the user (and tests) when the socket accepts connections.
        logging.getLogger("pygls.server").setLevel(logging.INFO)

    from lsp_server.auth import AuthSetupError, check_bind_host, load_token
    from lsp_server.server import create_server

    token = None
    try:
        if args.tcp:
            check_bind_host(args.tcp[0], allow_remote=args.allow_remote)
            token = load_token(args.token_file)
    except AuthSetupError as exc:
        print(f"dice-lsp: {exc}", file=sys.stderr)
        return 2
    server = create_server()
    try:
        if args.tcp:
            server.start_tcp(*args.tcp, token=token.value if token else None)
        elif args.socket:
            server.start_socket(args.socket)
        else:
            server.start_io()
    except AuthSetupError as exc:
        print(f"dice-lsp: {exc}", file=sys.stderr)
        return 2
    finally:
        server.session.close()
        if token is not None and token.generated is not None:
            token.generated.unlink(missing_ok=True)
    # LSP: exit code 0 after shutdown, 1 when the client exits (or vanishes) without it.
    return 0 if server.protocol._shutdown else 1


if __name__ == "__main__":
    sys.exit(main())
