"""Terminal presentation shared by ``dice complete`` and ``dice generate``: verdict labels, rich progress,
and the settings flags both commands take."""

from __future__ import annotations

import argparse
import os
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

from dice.assistant.types import AssistantSettings, Progress

if TYPE_CHECKING:
    from dice.validator import Verdict


def verdict_label(verdict: Verdict | None) -> str:
    """ "compiled ✓ · correct ✓ · 2.3× vs PyTorch" and friends: the one-line summary users see."""
    if verdict is None:
        return "not validated"
    label = verdict.summary()
    if verdict.status == "rejected" and verdict.message:
        label += f": {first_line(verdict.message)}"
    return label


def first_line(message: str, limit: int = 100) -> str:
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


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
    """Model selection and decoding flags; defaults are AssistantSettings' (the LSP's) except where noted."""
    d = AssistantSettings()
    parser.add_argument(
        "--model", metavar="PATH", help="checkpoint folder (default: $DICE_MODEL, else the embedded model)"
    )
    parser.add_argument(
        count_flag,
        type=int,
        default=count_default,
        metavar="N",
        dest="count",
        help=f"candidates per request (default {count_default}; the first is greedy)",
    )
    parser.add_argument("--device", default=d.device, help="auto, cpu, cuda or cuda:N (default auto)")
    parser.add_argument(
        "--validation",
        choices=["none", "compile", "run"],
        default=d.validation_level,
        help="compile only, or also run and time against the reference when a GPU exists",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=d.max_new_tokens,
        metavar="N",
        help="most new tokens per candidate (a <MASK:N> budget lowers it for its mask)",
    )
    parser.add_argument("--block-size", type=int, default=d.block_size, metavar="N")
    parser.add_argument("--steps-per-block", type=int, default=d.steps_per_block, metavar="N")
    parser.add_argument("--policy", choices=["static", "dynamic", "entropy"], default=d.policy)
    parser.add_argument("--threshold", type=float, default=d.threshold)
    parser.add_argument(
        "--temperature",
        type=float,
        default=d.sample_temperature,
        help="sampling temperature of the candidates after the first (greedy) one",
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--max-latency-ms",
        type=int,
        default=0,
        metavar="MS",
        help="return the best candidate validated within this budget (default: no budget)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress or messages on stderr")


def settings_from_args(args: argparse.Namespace) -> AssistantSettings:
    """AssistantSettings from the flags; raises ValueError naming every bad value."""
    return AssistantSettings(
        model_path=args.model,
        device=args.device,
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
    )


def check_model_path(path: str | None) -> str | None:
    """A problem with the chosen model folder, said before anything is loaded (None when it looks usable)."""
    chosen = path or os.environ.get("DICE_MODEL") or None
    if chosen is None:
        return None
    origin = "--model" if path else "$DICE_MODEL"
    if not os.path.exists(chosen):
        return f"{origin} {chosen}: no such folder"
    if not os.path.isdir(chosen):
        return f"{origin} {chosen}: not a folder (a checkpoint is a folder with config.json)"
    if not os.path.isfile(os.path.join(chosen, "config.json")):
        return f"{origin} {chosen}: no config.json in it (not a checkpoint folder)"
    return None


def stderr_console(quiet: bool) -> Console:
    return Console(stderr=True, quiet=quiet, highlight=False, soft_wrap=True)
