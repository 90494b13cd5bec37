r"""One full BiC-RL step (``dice train rl``, phase ``infill``) at a real shape with its time split (issue 20,
item 6): random weights at the 1.7B / 4B / 8B shape, so a user can size a real run.

A random model at the shape (``engine_bench.CONFIGS`` / ``random_model``, bf16) is saved as an engine
checkpoint folder with the given tokenizer (``engine.checkpoint.save_model``); then ``dice train rl`` runs in
this process through the command line's own ``main`` (``dice.cli.main(["train", "rl", ...])``) and its
``metrics.csv`` is read back. ``--out`` gets ``rl_step_shape.json`` (first written, status "running", once
the model is made; rewritten at ``--deadline-s`` with what ran so far if the run is still going),
``rl_step_shape.md`` and the run's ``metrics.csv`` and ``summary.json``. The model and the run (its 3.4 GB
export) live in ``--work``, a temporary folder removed at the end. Device run (one H200, one call; ``.whl``
and ``.devdata`` are git-ignored). Here::

    bash scripts/device_wheels.sh                      # .whl/: the packages the H200 image lacks
    mkdir -p .devdata && cp -r ../shared/data/sdar-tokenizer .devdata/sdar-tokenizer
    dice cuke build --source ../shared/data/cuda-corpus --no-gpu --out /tmp/cuke-cu
    cp /tmp/cuke-cu/cu_infill.jsonl .devdata/cu_infill.jsonl

then the call, carry [".whl", ".devdata"] (install lines as benchmarks/dice_tiny_h200.sh), timeout 600::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && \
    python3 benchmarks/rl_step_shape.py --shape 1.7B --tokenizer .devdata/sdar-tokenizer \
        --tasks .devdata/cu_infill.jsonl --out $OUT/rl17

Checks here: ``--smoke-cpu --out /tmp/rls`` (the same pipeline on the CPU, tiny shape, ~10 s) and ``--shape
1.7B --tokenizer ../shared/data/sdar-tokenizer --dry-build --out /tmp/d`` (makes and loads the folder).

The trainer's flags (what a real run on one GPU would use), and why:

- DICE's stage-1 sizes, 64 tasks x 16 samples, its rollout settings (T 1, dynamic 0.9, block 4) and its KL to
  the old log-probs (``--kl-mode old``, the default: no reference model to hold).
- ``--mixed-precision bf16`` over fp32 master weights and AdamW states (1.7B: 27.5 GB with the gradients):
  DICE's lr 1e-6 is far below a bf16 weight's rounding step, so bf16 weights would not move.
  ``--rollout-dtype bfloat16`` (a synced 3.4 GB copy) and ``--compile yes`` (flex attention fused; uncompiled
  it materialises the scores): the trainer's CUDA defaults, given explicitly.
- ``--no-rollout-cuda-graphs``: at 256 rows a decode step is bound by reading the K/V, where graphs gain
  little (``--rollout-cuda-graphs`` to try). Either runner now gives its K/V caches back before the update
  (``Engine.release_buffers``), and the trainer's ``--rollout-kv-gb`` (auto: 40 % of the free GPU memory)
  lowers the rows per chunk so that one chunk's cache fits: 256 rows x ~3.3k slots would be ~98 GB at 1.7B.
- ``--packed`` (the trainer's own departure): a sample's masked copies in one sequence, its prompt computed
  once. DICE's rows layout runs 4 x (prompt + 2 x response) tokens a sample: ~3.5x the update's compute at
  2.4k-token prompts, 5+ minutes of update alone (``--layout rows`` to measure it).
- ``--cu-window-bytes 5000`` (as the dice-tiny H200 run): whole CUDA-corpus files reach 30k tokens, and 256
  rows x 30k slots of K/V fit no GPU. ``--no-save-state``: the resumable state (27 GB) is not what is timed.
- The reward: the validator's (NVRTC, the match reward) with a tie-break (``--reward tiebreak``, the one
  change to the trainer, in this process): at random weights a group's samples all earn the same, so every
  group would be dropped and the step skipped. An all-equal group gets +0.001 on its odd samples: the update
  is the full one (an upper bound: a real step drops some groups).

The cap, ``--max-new-tokens 256``, for a step of ~4-5 minutes (estimated; random weights never reach the 0.9
threshold: one token per denoising step, every sample to the cap unless a shaped hole's end is met).
CUDA-corpus ``.cu`` tasks at a 5,000-byte window: 2.4k prompt tokens on average (max 2.9k; SDAR tokenizer,
first 64 tasks). Rollouts: 4 chunks of 256 rows x 256 steps; a step reads the whole K/V cache (256 x 3,328
slots x 112 KiB = 98 GB, ~25-30 ms) plus ~7 ms of matmuls (1,024 tokens x 2.8 GFLOP): ~40 ms, ~40-50 s.
Rewards: NVRTC on ~1,000 files takes 30-76 s on 16 cores (the dice-tiny H200 run), partly overlapped with the
rollouts (KernelBench ``infill.jsonl`` tasks build a torch extension per sample instead: far longer). Update
(packed): 1,024 x (2.4k + 5 x 256) = 3.8M model tokens, one forward without grad and one with backward each:
~120 s at the 42k tokens/s forward + backward measured at 1.7B (``results/sft_h200.md``), plus ~60-120 s of
``torch.compile`` (dice-tiny: step 1's update 63.7 s, step 2's 9.4 s). With model creation, setup and export
(~80 s): ~5-6 minutes. 4B: 71 GB of training state leaves room for ~64 rollout rows and micro-batches of 1-2.
8B: 131 GB of training state, more than one H200 holds (FSDP over several GPUs; not this script).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.engine_bench as eb  # noqa: E402

STARTED = time.perf_counter()
TIE = 1e-3  # the tie-break added to odd samples of an all-equal group (z-scores: +-1, the group kept)
GIB = 1 << 30
JSON_NAME, MD_NAME = "rl_step_shape.json", "rl_step_shape.md"
TIME_KEYS = ("rollout_s", "reward_s", "update_s", "step_s")
# --smoke-cpu: three small .cu files, each with one hole (the cu_infill.jsonl schema of `dice cuke build`).
SMOKE_KERNEL = (
    "__global__ void {}({}) {{\n    int i = blockIdx.x * 256 + threadIdx.x;\n    /* <MASK> */\n}}\n"
)
SMOKE_TASKS = {  # name: (parameters, the hole's original statement)
    "scale": ("float* x, float a, int n", "if (i < n) x[i] *= a;"),
    "add": ("const float* a, const float* b, float* c, int n", "if (i < n) c[i] = a[i] + b[i];"),
    "relu": ("float* x, int n", "if (i < n) x[i] = fmaxf(x[i], 0.0f);"),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] rl_step_shape: {msg}", flush=True)


class TieBreak:
    """A reward whose all-equal groups are split: ``+TIE`` on the odd samples (``Rollout.sample``), so the
    group's z-scores are +-1 and no group is dropped. Everything else is the wrapped reward's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.broken = 0  # groups (or pieces of one) whose rewards were all equal

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def split(self, rollouts: Any, scores: list) -> list:
        out = []
        for group, scored in zip(rollouts, scores, strict=True):
            if len(scored) > 1 and len({s.reward for s in scored}) == 1:
                self.broken += 1
                scored = [
                    dataclasses.replace(s, reward=s.reward + TIE * (r.sample % 2))
                    for r, s in zip(group, scored, strict=True)
                ]
            out.append(scored)
        return out

    def __call__(self, tasks: Any, rollouts: Any) -> list:
        return self.split(rollouts, self.inner(tasks, rollouts))

    def submit(self, tasks: Any, rollouts: Any) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()

        def done(inner: concurrent.futures.Future) -> None:
            try:
                out.set_result(self.split(rollouts, inner.result()))
            except BaseException as exc:  # noqa: BLE001 - delivered through the future, as the inner one's
                out.set_exception(exc)

        self.inner.submit(tasks, rollouts).add_done_callback(done)
        return out


@dataclasses.dataclass
class Probe:
    """What the trainer's own metrics do not say: per-phase wall time and CUDA peak memory, exact token
    counts of the rollouts and of the update's layouts, the tie-break count."""

    cuda: bool
    phases: dict = dataclasses.field(default_factory=dict)  # name -> {"s": [...], "peak_gib": max}
    generated: list = dataclasses.field(default_factory=list)  # response tokens per rollouts() call
    finished: list = dataclasses.field(default_factory=list)
    layout_tokens: int = 0  # tokens the update's model ran (padding included), over every trace batch
    reward: Any = None

    def record(self, name: str, seconds: float) -> None:
        entry = self.phases.setdefault(name, {"s": [], "peak_gib": None, "peak_reserved_gib": None})
        entry["s"].append(round(seconds, 3))
        if self.cuda:
            for key, value in (
                ("peak_gib", torch.cuda.max_memory_allocated()),
                ("peak_reserved_gib", torch.cuda.max_memory_reserved()),
            ):
                entry[key] = round(max(entry[key] or 0.0, value / GIB), 3)
        log(f"{name}: {seconds:.1f} s" + (f", peak {entry['peak_gib']} GiB allocated" if self.cuda else ""))

    def wrap(self, name: str, fn: Any, after: Any = None) -> Any:
        def wrapper(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            if self.cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            out = fn(trainer, *args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            self.record(name, time.perf_counter() - t0)
            if after is not None:
                after(trainer, out)
            return out

        return wrapper

    @contextlib.contextmanager
    def installed(self, tiebreak: bool):
        """The trainer's methods wrapped (timing, memory, counts; the tie-break reward) while inside."""
        import training.rl.trace as trace
        from training.rl.trainer import RLTrainer

        def rolled(trainer: Any, data: Any) -> None:
            flat = [r for g in data.groups for r in g]
            self.generated.append(sum(len(r.response_ids) for r in flat))
            self.finished.append(sum(r.finished for r in flat))

        setup_reward = RLTrainer._setup_reward

        def reward_set(trainer: Any) -> None:
            setup_reward(trainer)
            if tiebreak:
                trainer.reward = TieBreak(trainer.reward)
            self.reward = trainer.reward

        build = trace.build_trace_batch

        def counted(*args: Any, **kwargs: Any) -> Any:
            batch = build(*args, **kwargs)
            self.layout_tokens += int(batch.input_ids.numel())
            return batch

        patches = [
            mock.patch.object(RLTrainer, "setup", self.wrap("setup", RLTrainer.setup)),
            mock.patch.object(RLTrainer, "rollouts", self.wrap("rollouts", RLTrainer.rollouts, rolled)),
            mock.patch.object(RLTrainer, "update", self.wrap("update", RLTrainer.update)),
            mock.patch.object(RLTrainer, "export_final", self.wrap("export", RLTrainer.export_final)),
            mock.patch.object(RLTrainer, "_setup_reward", reward_set),
            mock.patch.object(trace, "build_trace_batch", counted),
        ]
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            yield self


def shape_config(args: argparse.Namespace, work: Path) -> tuple[Any, Path]:
    """The model config and the tokenizer folder: the real shape and ``--tokenizer``, or (smoke) the tiny
    test checkpoint's shape and byte-level BPE (``engine.testing``)."""
    from engine.model import ModelConfig

    if not args.smoke_cpu:
        if args.tokenizer is None:
            raise SystemExit("--tokenizer DIR is needed (the SDAR tokenizer, e.g. .devdata/sdar-tokenizer)")
        return ModelConfig.from_dict(eb.CONFIGS[args.shape]), Path(args.tokenizer)
    from engine.testing import make_tiny_checkpoint

    if args.tokenizer is not None:
        raise SystemExit("--smoke-cpu uses the tiny test tokenizer; leave out --tokenizer")
    tiny = make_tiny_checkpoint(work / "tiny-tokenizer")
    for stale in tiny.glob("model*.safetensors"):
        stale.unlink()  # only its tokenizer and config are used: the weights come from random_model
    return ModelConfig.from_json(tiny), tiny


def make_model(args: argparse.Namespace, work: Path) -> dict:
    """The random model at the shape, saved (bf16) with its tokenizer as ``work/model``; its load checked
    (config and tokenizer; with ``--dry-build`` the whole checkpoint through ``engine.load_engine``)."""
    from engine.checkpoint import save_model
    from engine.model import ModelConfig
    from engine.tokenizer import load_tokenizer

    cfg, tok_dir = shape_config(args, work)
    eb.DEV = "cuda" if args.device == "cuda" else "cpu"
    folder = work / "model"
    t0 = time.perf_counter()
    model = eb.random_model(cfg, seed=args.seed)
    if eb.DEV == "cuda":
        torch.cuda.synchronize()
    built = time.perf_counter() - t0
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    t1 = time.perf_counter()
    save_model(model, folder, tokenizer_dir=tok_dir, dtype=torch.bfloat16)
    saved = time.perf_counter() - t1
    del model
    if eb.DEV == "cuda":
        torch.cuda.empty_cache()
    back = ModelConfig.from_json(folder)
    tok = load_tokenizer(folder, mask_id=back.mask_token_id)
    if tok.vocab_size > back.vocab_size:
        raise RuntimeError(f"{folder}: {tok.vocab_size} tokens for {back.vocab_size} embedding rows")
    info = {
        "folder": str(folder),
        "parameters": params,
        "config": {k: v for k, v in back.to_dict().items() if not isinstance(v, (list, dict))},
        "tokenizer_vocab": tok.vocab_size,
        "weights_gb": round(sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1e9, 3),
        "build_s": round(built, 3),
        "save_s": round(saved, 3),
        "create_s": round(built + saved, 3),
    }
    if args.dry_build:
        from engine.engine import load_engine

        t2 = time.perf_counter()
        engine = load_engine(folder, device="cpu", dtype="bfloat16", cuda_graphs=False)
        info["load_engine_s"] = round(time.perf_counter() - t2, 3)
        info["load_engine_parameters"] = engine.num_parameters
        del engine
    return info


def make_tasks(args: argparse.Namespace, work: Path) -> Path:
    """The task file of the run: ``--tasks`` cut to the records the run's steps can take (with slack for a
    task the context drops; a task file is read whole, tree-sitter parses each ``.cu`` task), or (smoke,
    no ``--tasks``) the three small ``.cu`` tasks."""
    path = work / "tasks.jsonl"
    if args.tasks is None:
        if not args.smoke_cpu:
            raise SystemExit("--tasks FILE is needed (CuKe's cu_infill.jsonl or infill.jsonl)")
        records = [
            {"id": f"smoke-{name}", "text": SMOKE_KERNEL.format(name, params), "target": target,
             "origin": "rl_step_shape smoke", "has_spec": False, "kind": "statement"}
            for name, (params, target) in SMOKE_TASKS.items()
        ]  # fmt: skip
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path
    keep = (args.steps + 1) * args.tasks_per_step
    lines = [line for line in Path(args.tasks).read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("\n".join(lines[:keep]) + "\n", encoding="utf-8")
    return path


def trainer_argv(args: argparse.Namespace, model: str, tasks: Path, run: Path) -> list[str]:
    """``dice train rl`` as this benchmark runs it (module docstring: the flags and why)."""
    argv = ["train", "rl", "--phase", "infill", "--model", model, "--tasks", str(tasks), "--out", str(run)]
    argv += ["--steps", str(args.steps), "--tasks-per-step", str(args.tasks_per_step)]
    argv += ["--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens)]
    argv += ["--rollout-rows", str(args.rollout_rows), "--micro-batch-size", str(args.micro_batch_size)]
    argv += ["--cu-window-bytes", str(args.cu_window_bytes), "--seed", str(args.seed), "--no-save-state"]
    argv += ["--packed" if args.layout == "packed" else "--no-packed", "--device", args.device]
    argv += ["--reward", "validator" if args.reward == "tiebreak" else args.reward]
    if args.device == "cuda":
        argv += ["--mixed-precision", "bf16", "--rollout-dtype", "bfloat16", "--compile", "yes"]
        argv += ["--rollout-cuda-graphs" if args.rollout_cuda_graphs else "--no-rollout-cuda-graphs"]
    return argv + args.extra


def prompt_stats(args: argparse.Namespace, model: str, tasks: Path, run: Path) -> dict:
    """Prompt lengths (tokens) of the tasks the run's steps took (``schedule.jsonl``), as the trainer
    prompts them."""
    from engine.model_settings import read_hole_cut
    from engine.tokenizer import load_tokenizer
    from training.rl.tasks import CuPrompting, load_tasks

    schedule = run / "schedule.jsonl"
    if not schedule.is_file():
        return {}
    rows = [json.loads(line) for line in schedule.read_text().splitlines() if line.strip()]
    ids = {i for r in rows if r["step"] <= args.steps for i in r["tasks"]}
    cu = CuPrompting(read_hole_cut(model), args.cu_window_bytes or None)
    tok = load_tokenizer(model)
    taken = [t for t in load_tasks([tasks], "infill", cu=cu) if t.id in ids]
    lengths = sorted(len(tok.encode(t.prompt)) for t in taken)
    if not lengths:
        return {}
    return {
        "task_kinds": sorted({t.kind for t in taken}),
        "prompt_tokens_mean": round(sum(lengths) / len(lengths), 1),
        "prompt_tokens_median": lengths[len(lengths) // 2],
        "prompt_tokens_max": lengths[-1],
    }


def read_metrics(run: Path) -> list[dict]:
    from training.curves import read_curve

    path = run / "metrics.csv"
    return read_curve(path) if path.is_file() else []


def compile_seconds() -> float | None:
    """Seconds torch.compile spent in this process (dynamo's own counter; None where it is missing)."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        spent = calculate_time_spent()
    except Exception:  # noqa: BLE001 - a private API: the number is a bonus
        return None
    value = spent.get("entire_frame_compile", spent.get("total_wall_time"))
    return round(float(value), 2) if value is not None else None


def _rate(n: float, seconds: float) -> float | None:
    return round(n / seconds, 1) if seconds else None


def summarize(result: dict, rows: list[dict], probe: Probe, compile_s: float | None) -> None:
    """The first step's time split, tokens, memory and rewards into ``result`` (the last step's split too
    when there are several: its update has no compile in it)."""
    result["probe"] = {"phases": probe.phases, "generated": probe.generated, "finished": probe.finished}
    split = result.setdefault("time_split", {})
    phases = {k: v["s"][0] for k, v in probe.phases.items()}
    split |= {"trainer_setup_s": phases.get("setup"), "export_s": phases.get("export")}
    split["compile_s"] = compile_s
    if rows:
        first = rows[0]
        split |= {k: first[k] for k in TIME_KEYS[:3]} | {"total_s": first["step_s"]}
        if compile_s is not None:
            split["update_s_minus_compile"] = round(first["update_s"] - compile_s, 3)
        if len(rows) > 1:
            split["last_step"] = {k: rows[-1][k] for k in TIME_KEYS}
        generated = probe.generated[0] if probe.generated else round(first["samples"] * first["response_len"])
        result["tokens"] = {
            "generated": generated,
            "generated_per_sample": round(generated / max(first["samples"], 1), 1),
            "rollout_tokens_per_s": _rate(generated, first["rollout_s"]),
            "finished_samples": probe.finished[0] if probe.finished else None,
            "trained": first["trained_tokens"],
            "update_model_tokens": probe.layout_tokens,  # over every step
            "update_model_tokens_per_s": _rate(probe.layout_tokens, first["update_s"])
            if len(rows) == 1
            else None,
        }
        keys = ("samples", "kept_groups", "dropped_groups", "skipped", "reward_mean", "pass_rate")
        result["rewards"] = {k: first.get(k) for k in (*keys, "compile_rate")}
    result.setdefault("rewards", {})["tie_broken_groups"] = getattr(probe.reward, "broken", None)
    if probe.cuda:
        peaks = probe.phases
        result["memory"] = {f"{k}_peak_allocated_gib": v["peak_gib"] for k, v in peaks.items()}
        result["memory"] |= {f"{k}_peak_reserved_gib": v["peak_reserved_gib"] for k, v in peaks.items()}
        allocated = [v["peak_gib"] or 0.0 for v in peaks.values()]
        reserved = [v["peak_reserved_gib"] or 0.0 for v in peaks.values()]
        result["memory"]["peak_allocated_gib"] = max(allocated, default=None)
        result["memory"]["peak_reserved_gib"] = max(reserved, default=None)


def machine() -> dict:
    info = {"torch": torch.__version__, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / GIB, 1)}
    return info


def write_report(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_NAME).write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / MD_NAME).write_text(markdown(result))


def markdown(r: dict) -> str:
    """The report as a markdown page: sizes, the time split per step, the measures."""
    lines = [
        f"# One BiC-RL step at the {r['shape']} shape (random weights)",
        "",
        f"Status: **{r['status']}**" + (f" ({r['error']})" if r.get("error") else ""),
        "",
        f"Machine: {r.get('machine')}. Command: `{r['command']}`",
        "",
        "| size | value |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in r.get("sizes", {}).items()]
    lines += ["", "| step | rollout s | reward s | update s | step s |", "| --- | --- | --- | --- | --- |"]
    for row in r.get("metrics", []):
        lines.append(f"| {row['step']} | " + " | ".join(str(row[k]) for k in TIME_KEYS) + " |")
    for section in ("time_split", "tokens", "memory", "rewards"):
        items = [(k, v) for k, v in r.get(section, {}).items() if not isinstance(v, dict)]
        if items:
            lines += ["", f"| {section} | value |", "| --- | --- |"]
            lines += [f"| {k} | {v} |" for k, v in items]
    if r.get("trainer_argv"):
        lines += ["", "Trainer: `dice " + " ".join(r["trainer_argv"]) + "`"]
    return "\n".join(lines) + "\n"


def run_trainer(args: argparse.Namespace, argv: list[str], probe: Probe) -> int:
    """``dice train rl`` in this process, through the command line's own main; its exit code."""
    from dice.cli import main as dice_main

    if probe.cuda:
        torch.cuda.reset_peak_memory_stats()
    with probe.installed(tiebreak=args.reward == "tiebreak"):
        return dice_main(argv)


def collect(args: argparse.Namespace, result: dict, probe: Probe, work: Path, run: Path) -> None:
    """The run's metrics and the probe's numbers into ``result``; the small files into ``--out``."""
    rows = read_metrics(run)
    result["metrics"] = rows
    summarize(result, rows, probe, compile_seconds() if args.device == "cuda" else 0.0)
    try:
        result["sizes"] |= prompt_stats(args, str(work / "model"), work / "tasks.jsonl", run)
    except Exception as exc:  # noqa: BLE001 - a statistic, never the reason a report is lost
        result["sizes"]["prompt_stats_error"] = f"{type(exc).__name__}: {exc}"
    for name in ("metrics.csv", "summary.json"):
        if (run / name).is_file():
            shutil.copyfile(run / name, Path(args.out) / name)


def arm_deadline(args: argparse.Namespace, result: dict, probe: Probe, run: Path) -> threading.Timer | None:
    """At ``--deadline-s`` after the start, the run still going: the report of what ran so far, then exit 3
    (a device call's time limit would kill the process with nothing written)."""
    if args.deadline_s <= 0:
        return None

    def fire() -> None:
        result["status"] = f"deadline: still running after {args.deadline_s:.0f} s"
        try:
            with contextlib.suppress(Exception):  # the trainer's thread may be changing the probe
                summarize(result, read_metrics(run), probe, None)
            write_report(Path(args.out), result)
            print(markdown(result), flush=True)
        finally:
            os._exit(3)

    timer = threading.Timer(max(0.0, args.deadline_s - (time.perf_counter() - STARTED)), fire)
    timer.daemon = True
    timer.start()
    return timer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="after --: more trainer flags")
    p.add_argument("--shape", choices=sorted(eb.CONFIGS), default="1.7B")
    p.add_argument("--tokenizer", help="tokenizer folder (the SDAR one: vocab.json + merges.txt)")
    p.add_argument("--tasks", help="cu_infill.jsonl or infill.jsonl of `dice cuke build` (phase infill)")
    p.add_argument("--out", required=True, help="folder for the JSON, the table and the run's metrics")
    p.add_argument("--work", help="folder for the model and the run (default: a temporary folder)")
    p.add_argument("--keep-work", action="store_true", help="keep --work (the model and the run's export)")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--tasks-per-step", type=int, default=64)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=256, help="the rollouts' cap (docstring: why)")
    p.add_argument("--rollout-rows", type=int, default=256)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--layout", choices=("packed", "rows"), default="packed")
    p.add_argument("--rollout-cuda-graphs", action="store_true", help="the graph runner (see docstring)")
    p.add_argument("--cu-window-bytes", type=int, default=5000)
    p.add_argument("--reward", default="tiebreak", help="tiebreak | validator | toy:<text>")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-s", type=float, default=560, help="report and exit 3 past this (0: never)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda (cpu for smoke)")
    p.add_argument("--smoke-cpu", action="store_true", help="tiny shape on the CPU: checks the script")
    p.add_argument("--dry-build", action="store_true", help="make and reload the model folder; no step")
    args = p.parse_args(argv)
    args.extra = extra
    if args.smoke_cpu:
        args.device = args.device or "cpu"
        for name, value in (("tasks_per_step", 2), ("group_size", 2), ("max_new_tokens", 8)):
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
        args.rollout_rows = min(args.rollout_rows, 4)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() or not args.dry_build else "cpu"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rl_step_shape-"))
    work.mkdir(parents=True, exist_ok=True)
    shape = "smoke-tiny" if args.smoke_cpu else args.shape
    command = " ".join(["python benchmarks/rl_step_shape.py", *(sys.argv[1:] if argv is None else argv)])
    result: dict[str, Any] = {"status": "running", "shape": shape, "command": command, "machine": machine()}
    probe = Probe(cuda=args.device == "cuda")
    code = 1
    try:
        log(f"making the {shape} model in {work / 'model'}")
        made = make_model(args, work)
        result["model"] = made
        result["time_split"] = {f"model_{k}": made[k] for k in ("create_s", "build_s", "save_s")}
        result["sizes"] = {"shape": shape, "parameters": made["parameters"]}
        log(f"model: {made['parameters']:,} parameters in {made['create_s']} s")
        if args.dry_build:
            result["status"] = "dry-build"
            return 0
        tasks = make_tasks(args, work)
        run = work / "run"
        argv_t = trainer_argv(args, made["folder"], tasks, run)
        result["trainer_argv"] = argv_t
        result["sizes"] |= {
            "tasks_per_step": args.tasks_per_step, "group_size": args.group_size,
            "samples": args.tasks_per_step * args.group_size,
            "max_new_tokens": args.max_new_tokens, "rollout_rows": args.rollout_rows,
            "micro_batch_size": args.micro_batch_size, "layout": args.layout, "steps": args.steps,
            "cu_window_bytes": args.cu_window_bytes, "reward": args.reward,
        }  # fmt: skip
        write_report(out, result)
        timer = arm_deadline(args, result, probe, run)
        log("dice " + " ".join(argv_t))
        t0 = time.perf_counter()
        try:
            code = run_trainer(args, argv_t, probe)
        except Exception as exc:  # an OOM, say: what ran so far is still worth writing down
            import traceback

            result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            result["traceback_tail"] = traceback.format_exc()[-3000:]
        if timer is not None:
            timer.cancel()
        result["time_split"]["trainer_wall_s"] = round(time.perf_counter() - t0, 3)
        collect(args, result, probe, work, run)
        ok = code == 0 and result["metrics"] and "error" not in result
        result["status"] = "ok" if ok else f"failed (trainer exit {code})"
        return 0 if ok else 1
    except BaseException as exc:
        result["status"] = "failed"
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        write_report(out, result)
        log(f"{result['status']}: {out / JSON_NAME}")
        print(markdown(result), flush=True)
        if not args.keep_work and not args.work:
            shutil.rmtree(work, ignore_errors=True)
        elif not args.keep_work:
            shutil.rmtree(work / "model", ignore_errors=True)
            shutil.rmtree(work / "run" / "final", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
