"""Terminal presentation shared by ``dice complete`` and ``dice generate``: rich progress and the settings
flags both commands take (verdict labels are ``dice.validator.verdict.verdict_label``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress

from dice.assistant.settings import BY_NAME, AssistantSettings
from dice.assistant.types import Progress

if TYPE_CHECKING:
    pass


class ProgressDisplay:
    """A rich progress bar on stderr fed by the service's Progress events; silent when disabled."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        self._enabled = enabled and console.is_terminal and not console.quiet
        self._progress = RichProgress(
            SpinnerColumn(),
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressDisplay:
        if self._enabled:
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._enabled:
            self._progress.stop()

    def __call__(self, event: Progress) -> None:
        if not self._enabled:
            return
        task = self._tasks.get(event.stage)
        description = event.message or event.stage
        if task is None:
            task = self._progress.add_task(description, total=max(event.total, 1))
            self._tasks[event.stage] = task
        self._progress.update(task, completed=event.done, total=max(event.total, 1), description=description)


def add_settings_arguments(parser: argparse.ArgumentParser, *, count_flag: str, count_default: int) -> None:
    """Model selection and decoding flags. Defaults and choices are the settings table's
    (``dice.assistant.settings.SETTINGS``, the editor's too), except: the candidate count (``count_default``:
    ``complete`` 3, ``generate`` 4) and the latency budget (none: a command waits for the whole answer)."""
    d = BY_NAME
    parser.add_argument(
        "--model", metavar="PATH", help="checkpoint folder (default: $DICE_MODEL, else the embedded model)"
    )
    parser.add_argument(
        "--server",
        metavar="URL",
        default=None,
        help="an OpenAI-compatible model server (dice serve, SGLang, LMDeploy) instead of a local model "
        "(default: $DICE_SERVER; its API key is read from $DICE_SERVER_API_KEY); validation stays here",
    )
    parser.add_argument(
        "--server-model",
        metavar="NAME",
        default=BY_NAME["server_model"].default,
        help="which of the server's models (needed when it hosts several)",
    )
    parser.add_argument(
        count_flag,
        type=int,
        default=count_default,
        metavar="N",
        dest="count",
        help=f"candidates per request (default {count_default}; the first is greedy)",
    )
    parser.add_argument(
        "--device", default=d["device"].default, help="auto, cpu, cuda or cuda:N (default auto)"
    )
    parser.add_argument(
        "--validation",
        choices=list(d["validation_level"].choices),
        default=d["validation_level"].default,
        help="compile only, or also run and time against the reference when a GPU exists",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=d["max_new_tokens"].default,
        metavar="N",
        help="most new tokens per candidate (a <MASK:N> budget lowers it for its mask)",
    )
    parser.add_argument("--block-size", type=int, default=d["block_size"].default, metavar="N")
    parser.add_argument("--steps-per-block", type=int, default=d["steps_per_block"].default, metavar="N")
    parser.add_argument("--policy", choices=list(d["policy"].choices), default=d["policy"].default)
    parser.add_argument(
        "--threshold",
        type=float,
        default=d["threshold"].default,
        help="confidence threshold of the dynamic policy, in (0, 1]; the entropy policy's budget in nats",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=d["sample_temperature"].default,
        help="sampling temperature of the candidates after the first (greedy) one",
    )
    parser.add_argument("--seed", type=int, default=d["seed"].default)
    parser.add_argument(
        "--max-latency-ms",
        type=int,
        default=0,
        metavar="MS",
        help="return the best candidate validated within this budget (default: no budget)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress or messages on stderr")


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """How the compile check finds the project's flags (``dice complete``, ``dice validate``)."""
    parser.add_argument(
        "--compile-commands",
        metavar="PATH",
        default=BY_NAME["compile_commands"].default,
        help="compile_commands.json with the file's flags (default: looked for beside the file, in its "
        "ancestors and their build*/ folders, as clangd does)",
    )
    parser.add_argument(
        "-I",
        "--include-path",
        dest="include_paths",
        action="append",
        default=[],
        metavar="DIR",
        help="extra include folder for the compile check (repeatable)",
    )
    parser.add_argument(
        "-D",
        "--define",
        dest="defines",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="extra macro for the compile check (repeatable)",
    )


def check_build_arguments(args: argparse.Namespace) -> None:
    """CliError for a ``--compile-commands`` file that is not a regular file of a sane size (a FIFO or a
    device would hang or flood the validator, which reads it); a folder is looked in, a missing path is the
    validator's to report."""
    from dice import safeio
    from dice.commands.common import check_input_file

    database = vars(args).get("compile_commands")
    if database and os.path.lexists(database) and not os.path.isdir(database):
        check_input_file(Path(database), what="compile database", max_bytes=safeio.CONFIG_LIMIT)


def settings_from_args(args: argparse.Namespace) -> AssistantSettings:
    """AssistantSettings from the flags; raises ValueError naming every bad value."""
    return AssistantSettings(
        model_path=args.model,
        device=args.device,
        server=args.server or "",
        server_model=args.server_model or "",
        candidates=args.count,
        block_size=args.block_size,
        steps_per_block=args.steps_per_block,
        policy=args.policy,
        threshold=args.threshold,
        max_latency_ms=args.max_latency_ms,
        validation_level=args.validation,
        max_new_tokens=args.max_new_tokens,
        sample_temperature=args.temperature,
        seed=args.seed,
        # the build flags exist on commands that compile .cu files (add_build_arguments)
        compile_commands=vars(args).get("compile_commands") or "",
        include_paths=tuple(vars(args).get("include_paths") or ()),
        defines=tuple(vars(args).get("defines") or ()),
        # the user named the file on the command line: its dice-spec (or reference) is theirs to run
        trusted_workspace=True,
    )


def check_model_path(settings: AssistantSettings) -> str | None:
    """A problem with the chosen model folder or server, said before anything is loaded (None when it looks
    usable)."""
    from engine.locate import choose_model
    from engine.remote import normalize_url

    server = settings.server or os.environ.get("DICE_SERVER", "")
    if server.strip():
        if settings.model_path and settings.server:
            return "--model and --server both name a model: give one"
        try:
            normalize_url(server)
        except ValueError as exc:
            return f"{'--server' if settings.server else '$DICE_SERVER'}: {exc}"
        return None
    return choose_model(settings.model_path).problem("--model")


def stderr_console(quiet: bool) -> Console:
    return Console(stderr=True, quiet=quiet, highlight=False, soft_wrap=True)
