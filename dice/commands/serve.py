"""``dice serve``: the model behind an OpenAI-compatible HTTP server (``dice.serving``), for a team's editors
and command lines (``--server URL`` / ``dice.server``)."""

from __future__ import annotations

import argparse
import os
import sys

from dice.commands.common import CliError

API_KEY_ENV = "DICE_API_KEY"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from dice.assistant.settings import BY_NAME

    parser = subparsers.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API",
        description=(
            "Serve a DICE checkpoint with OpenAI's /v1/completions and /v1/chat/completions (streaming "
            "included), /v1/models, /health and Prometheus /metrics. Requests that arrive together decode "
            "as one batch. Editors and `dice complete/generate --server URL` then use it; validation stays "
            "on each user's machine."
        ),
    )
    parser.add_argument(
        "--model", metavar="PATH", help="checkpoint folder (default: $DICE_MODEL, else the embedded model)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1 and /tokenize (default: ${API_KEY_ENV}; "
        "none: open to whoever reaches the port)",
    )
    parser.add_argument("--max-batch", type=int, default=32, metavar="N", help="most rows decoded together")
    parser.add_argument("--served-model-name", metavar="NAME", help="the model id clients name")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument(
        "--policy",
        choices=list(BY_NAME["policy"].choices),
        default=BY_NAME["policy"].default,
        help="decoding policy of requests that name none (a request's 'policy' field overrides it)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=BY_NAME["threshold"].default,
        help="confidence threshold of the dynamic policy (1.0: one token per step, DICE's evaluation)",
    )
    parser.add_argument(
        "--steps-per-block", type=int, default=None, metavar="N", help="default: the model's block size"
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dice.commands.console import stderr_console
    from dice.serving.app import ServeConfig
    from dice.serving.launch import bind, is_loopback, serve_forever

    console = stderr_console(False)
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_batch < 1:
        raise CliError(f"--max-batch must be >= 1, got {args.max_batch}")
    if not 0 < args.threshold <= (float("inf") if args.policy == "entropy" else 1.0):
        raise CliError(
            f"--threshold must be in (0, 1] (any positive budget with --policy entropy), got {args.threshold}"
        )
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        sock = bind(args.host, args.port)  # before the model loads: a port in use is said at once
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    if not is_loopback(args.host) and api_key is None:
        console.print(
            f"warning: listening on {args.host} without --api-key: anyone who reaches this port can use "
            "the model"
        )
    engine, name, holes = _load(args, console)
    config = ServeConfig(
        model_name=args.served_model_name or name,
        api_key=api_key,
        max_batch=args.max_batch,
        policy=args.policy,
        threshold=args.threshold,
        steps_per_block=args.steps_per_block,
        infill_holes=holes,
    )
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"Serving {config.model_name} on http://{shown}:{port}/v1 (max batch {config.max_batch}, "
        f"{config.policy} at {config.threshold}{', API key required' if api_key else ''}); Ctrl+C stops."
    )
    sys.stderr.flush()
    serve_forever(engine, config, sock, log_level=args.log_level)
    return 0


def _load(args: argparse.Namespace, console: object) -> tuple[object, str, str | None]:
    from engine.locate import choose_model

    choice = choose_model(args.model)
    problem = choice.problem("--model")
    if problem:
        raise CliError(problem)
    import engine as engine_pkg
    from engine.model_settings import read_hole_cut

    try:
        loaded = engine_pkg.load_engine(args.model, device=None if args.device == "auto" else args.device)
        holes = read_hole_cut(loaded.path)
    except Exception as exc:  # a bad checkpoint is the user's input: say what is wrong, no traceback
        raise CliError(f"cannot load the model: {exc}") from exc
    print(
        f"Model: {loaded.name} ({loaded.num_parameters / 1e6:.1f}M parameters, "
        f"{str(loaded.dtype).removeprefix('torch.')}) on {loaded.device}",
        file=sys.stderr,
    )
    return loaded, loaded.name, holes
