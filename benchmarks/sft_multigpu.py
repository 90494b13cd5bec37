"""Issue 9: ``dice train sft`` on 1 GPU vs N GPUs (FSDP2 through ``training/launch.sh``): same losses,
tokens/s and MFU, and the N-GPU export loaded by ``engine.checkpoint.load_model``.

Stages, each a subprocess under its own time limit (a hang in a later stage keeps the earlier numbers):
  one    python3 -m dice train sft ... --micro-batch-size 1 --grad-accum N      (one device)
  multi  training/launch.sh CONFIG --num_processes N -- ... --micro-batch-size 1 --grad-accum 1
  check  load both exports with engine.checkpoint.load_model, compare weights and the loss of one step's rows
Same random init (--init-config, fixed seed), same rows, same noise, same global batch (N rows a step).

Step time = difference of the trainer's per-step ``elapsed_s`` (it syncs on the logged loss every step);
the median is taken after --skip warm-up steps (the first one compiles). Model FLOPs per step are counted
as in benchmarks/sft_bench.py, from the actual rows and masks of each step:
  6 * decoder matmul params * 2T tokens per row + 6 * vocab * hidden * masked tokens
  + 12 * layers * heads * head_dim * allowed query-key pairs of the row's [noisy | clean] mask
MFU = FLOPs / step time / (989.4 TFLOP/s x GPUs).

  # 2 H200s (device kind nvidia-h200-x2):
  python3 benchmarks/sft_multigpu.py --out $OUT --preset 1.7b --data runs/dice-tiny-data/train_rows.npz
  # CPU rehearsal of the same launch path (2 gloo processes, tiny model, synthetic rows):
  python3 benchmarks/sft_multigpu.py --out /tmp/r --preset tiny --synthetic-len 256 \\
      --multi-config training/configs/cpu_gloo.yaml
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.sft_bench import PEAK_BF16_TFLOPS, PRESETS  # noqa: E402
from training.config import NCCL_SAFE_ENV  # noqa: E402

SEED = 0


def run_stage(name: str, cmd: list[str], log: Path, timeout: float, env: dict[str, str]) -> dict:
    """Run ``cmd`` in its own process group; on timeout stop that group (TERM, then KILL)."""
    print(f"[{name}] timeout {timeout:.0f}s: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        timed_out = False
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    wall = time.perf_counter() - start
    tail = log.read_text(errors="replace").splitlines()[-6:]
    print(f"[{name}] rc={rc} timed_out={timed_out} wall={wall:.1f}s", flush=True)
    if rc != 0:
        print("\n".join(f"[{name}]   {line[-300:]}" for line in tail), flush=True)
    return {"rc": rc, "timed_out": timed_out, "wall_s": round(wall, 1), "cmd": " ".join(cmd)}


def read_curve(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path) as fh:
        return list(csv.DictReader(fh))


def step_flops(rows_path: str, config, steps: int, global_batch: int) -> list[float]:
    """Model FLOPs of each optimizer step, from the rows the trainer's sampler gives that step."""
    import torch

    from benchmarks.sft_bench import allowed_pairs, decoder_matmul_params
    from training.corpus import PackedRows
    from training.objective import noise_rows
    from training.rows import EpochPermutation

    rows = PackedRows.load(Path(rows_path))
    order = list(iter(EpochPermutation(len(rows), SEED)))  # epoch 0: the runs here stay inside it
    dec = decoder_matmul_params(config)
    out = []
    for k in range(steps):
        idx = torch.tensor(order[k * global_batch : (k + 1) * global_batch])
        ids, doc = rows.input_ids[idx].long(), rows.doc_ids[idx].long()
        noised = noise_rows(
            ids,
            rows.loss_mask[idx].bool(),
            doc,
            idx,
            mask_id=config.mask_token_id,
            eps=1e-3,
            seed=SEED,
            epoch=0,
        )
        t = ids.shape[1]
        pairs = allowed_pairs(doc, config.block_size)
        flops = (
            6 * dec * 2 * t * len(idx)
            + 6 * config.vocab_size * config.hidden_size * int(noised.masked.sum())
            + 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * pairs
        )
        out.append(float(flops))
    return out


def summarize(curve: list[dict], flops: list[float], gpus: int, skip: int, cuda: bool) -> dict:
    if not curve:
        return {}
    elapsed = [float(r["elapsed_s"]) for r in curve]
    steps = [int(r["step"]) for r in curve]
    dts = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]  # time of steps 2, 3, ...
    timed = [(s, dt) for s, dt in zip(steps[1:], dts, strict=True) if s > skip]
    res: dict = {
        "steps": len(curve),
        "losses": [float(r["loss"]) for r in curve],
        "grad_norms": [float(r["grad_norm"]) if r["grad_norm"] else None for r in curve],
        "first_step_s": round(elapsed[0], 2),
    }
    if not timed:
        return res
    step_s = statistics.median(dt for _, dt in timed)
    row_tokens = int(curve[-1]["tokens"]) // len(curve)
    res.update(
        step_s_median=round(step_s, 4),
        step_s_min=round(min(dt for _, dt in timed), 4),
        timed_steps=[s for s, _ in timed],
        tokens_per_s=round(row_tokens / step_s, 1),
        tokens_per_s_per_gpu=round(row_tokens / step_s / gpus, 1),
    )
    if flops:
        mean_flops = statistics.mean(flops[s - 1] for s, _ in timed)
        res["tflop_per_step"] = round(mean_flops / 1e12, 2)
        res["achieved_tflops"] = round(mean_flops / step_s / 1e12, 1)
        if cuda:
            res["mfu"] = round(mean_flops / step_s / (PEAK_BF16_TFLOPS * 1e12 * gpus), 4)
    return res


def check_exports(one: Path, multi: Path, rows_path: str, out: Path) -> None:
    """--check mode: both exports through engine.checkpoint.load_model, weight and loss comparison."""
    import torch

    from engine.checkpoint import load_model
    from training.corpus import PackedRows
    from training.masks import dense_mask
    from training.objective import BlockDiffusionLM, noise_rows
    from training.rows import EpochPermutation

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    res: dict = {"device": dev}
    t = time.perf_counter()
    models = {}
    for name, path in (("multi", multi), ("one", one)):
        if (path / "config.json").is_file():
            models[name] = load_model(path, device=dev, dtype=dtype)
            res[f"{name}_export_gb"] = round(
                sum(f.stat().st_size for f in path.glob("*.safetensors")) / 1e9, 3
            )
    res["load_s"] = round(time.perf_counter() - t, 2)
    res["loaded"] = sorted(models)
    if "multi" not in models:
        raise SystemExit(f"{multi}: no export to load")
    rows = PackedRows.load(Path(rows_path))
    order = list(iter(EpochPermutation(len(rows), SEED)))
    idx = torch.tensor(order[:1])
    ids, doc = rows.input_ids[idx].long(), rows.doc_ids[idx].long()
    cfg = models["multi"].config
    noised = noise_rows(
        ids, rows.loss_mask[idx].bool(), doc, idx, mask_id=cfg.mask_token_id, eps=1e-3, seed=SEED, epoch=0
    )
    args = (
        noised.noisy_ids.to(dev),
        ids.to(dev),
        rows.position_ids[idx].long().to(dev),
        dense_mask(doc.to(dev), cfg.block_size),
        noised.masked.to(dev),
        noised.p_mask.to(dev),
    )
    answer = float(rows.loss_mask[idx].sum())
    for name, model in models.items():
        with torch.no_grad():
            loss_sum, _ = BlockDiffusionLM(model).eval()(*args)
        res[f"{name}_loss_row0"] = float(loss_sum.float()) / answer
        with torch.no_grad():
            logits = model(ids[:, :256].to(dev))  # the engine's own forward (block-causal)
        res[f"{name}_forward_finite"] = bool(torch.isfinite(logits).all())
    if "one" in models:
        a, b = models["one"].state_dict(), models["multi"].state_dict()
        worst, equal, total = 0.0, 0, 0
        for key in a:
            d = (a[key].float() - b[key].float()).abs()
            worst = max(worst, float(d.max()))
            equal += int((d == 0).sum())
            total += d.numel()
        res["weights_max_abs_diff"] = worst
        res["weights_equal_fraction"] = round(equal / total, 6)
        res["loss_row0_rel_diff"] = abs(res["one_loss_row0"] - res["multi_loss_row0"]) / res["one_loss_row0"]
    (out / "check.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res), flush=True)


def main() -> None:
    """Long on purpose: the whole measurement protocol, read top to bottom in the order it runs (a
    benchmark script, as nanochat's are); split into helpers, the protocol would be scattered."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="results folder ($OUT on the device)")
    ap.add_argument("--work", default="/tmp/sft_multigpu", help="run folders (exports: 4 GB each at 1.7B)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="1.7b")
    ap.add_argument("--data", default="runs/dice-tiny-data/train_rows.npz", help="packed rows (.npz)")
    ap.add_argument("--tokenizer", default="engine/models/dice-tiny", help="tokenizer shipped with exports")
    ap.add_argument("--synthetic-len", type=int, default=0, help="synthesize rows of this length instead")
    ap.add_argument("--gpus", type=int, default=2, help="processes of the multi-process stage")
    ap.add_argument("--multi-config", default="training/configs/fsdp.yaml")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the timing")
    ap.add_argument("--compile", default="auto", choices=["auto", "yes", "no"])
    ap.add_argument("--deadline-s", type=float, default=185.0, help="whole script, all stages")
    ap.add_argument("--one-timeout-s", type=float, default=80.0)
    ap.add_argument("--check-reserve-s", type=float, default=30.0, help="kept for the check stage")
    ap.add_argument("--check", nargs=2, metavar=("ONE", "MULTI"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    if a.check:
        check_exports(Path(a.check[0]), Path(a.check[1]), a.data, out)
        return

    t0 = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    import torch

    from engine.model import ModelConfig

    config = ModelConfig(**PRESETS[a.preset])
    config.to_json(work / "init_config.json")
    data = a.data
    if a.synthetic_len:
        from benchmarks.sft_bench import random_rows
        from training.corpus import PackedRows

        gen = torch.Generator().manual_seed(SEED)
        ids, pos, doc, loss = random_rows(64, a.synthetic_len, config.vocab_size, 2, config.block_size, gen)
        data = str(work / "rows.npz")
        PackedRows(ids, pos, doc, loss).save(Path(data))
    # Keep what the caller put on PYTHONPATH (the device's wheel target, /tmp/site, holds tree-sitter).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **NCCL_SAFE_ENV, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    # `dice` builds its parser from every command module (tree-sitter among their imports): fail in a
    # second, with the reason, rather than once per stage.
    pre = subprocess.run(
        [sys.executable, "-c", "from dice.cli import build_parser; build_parser()"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if pre.returncode != 0:
        raise SystemExit(f"`dice` does not start here:\n{pre.stderr[-1500:]}")
    common = [
        "--data",
        data,
        "--init-config",
        str(work / "init_config.json"),
        "--tokenizer",
        a.tokenizer,
        "--seed",
        str(SEED),
        "--max-steps",
        str(a.steps),
        "--log-every",
        "1",
        "--micro-batch-size",
        "1",
        "--no-save-state",
        "--compile",
        a.compile,
    ]
    cuda = torch.cuda.is_available()
    machine = {"python": platform.python_version(), "torch": torch.__version__, "cuda": cuda}
    try:
        import accelerate

        machine["accelerate"] = accelerate.__version__
        machine["gpus"] = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.SubprocessError):
        machine.setdefault("gpus", [])
    for key in NCCL_SAFE_ENV:
        machine[key] = env[key]

    def left() -> float:
        return a.deadline_s - (time.perf_counter() - t0)

    try:
        flops = step_flops(data, config, a.steps, a.gpus)
    except Exception as exc:  # the timing still stands without FLOPs
        print(f"flops: {exc!r}", flush=True)
        flops = []
    stages: dict[str, dict] = {}
    one_out, multi_out = work / "one", work / "multi"
    stages["one"] = run_stage(
        "one",
        [
            sys.executable,
            "-m",
            "dice",
            "train",
            "sft",
            *common,
            "--grad-accum",
            str(a.gpus),
            "--out",
            str(one_out),
        ],
        out / "one.log",
        min(a.one_timeout_s, left() - a.check_reserve_s - 30),
        env,
    )
    stages["multi"] = run_stage(
        "multi",
        [
            "bash",
            "training/launch.sh",
            a.multi_config,
            "--num_processes",
            str(a.gpus),
            "--",
            *common,
            "--grad-accum",
            "1",
            "--out",
            str(multi_out),
        ],
        out / "multi.log",
        left() - a.check_reserve_s,
        env,
    )
    if stages["multi"]["rc"] != 0 and not stages["multi"]["timed_out"] and left() > a.check_reserve_s + 60:
        # A fast failure of the compiled FSDP stage: once more uncompiled (dense SDPA), for the losses.
        stages["multi_first_try"] = stages["multi"]
        common_eager = [*common[: common.index("--compile")], "--compile", "no", "--attention", "dense"]
        stages["multi"] = run_stage(
            "multi",
            [
                "bash",
                "training/launch.sh",
                a.multi_config,
                "--num_processes",
                str(a.gpus),
                "--",
                *common_eager,
                "--grad-accum",
                "1",
                "--out",
                str(multi_out),
            ],
            out / "multi_eager.log",
            left() - a.check_reserve_s,
            env,
        )
    if (multi_out / "final" / "config.json").is_file():
        stages["check"] = run_stage(
            "check",
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--out",
                str(out),
                "--data",
                data,
                "--check",
                str(one_out / "final"),
                str(multi_out / "final"),
            ],
            out / "check.log",
            left() - 2,
            env,
        )
    else:
        stages["check"] = {"rc": None, "skipped": "no multi-process export"}

    curves = {n: read_curve(work / n / "loss_curve.csv") for n in ("one", "multi")}
    for n, c in curves.items():
        if c:
            (out / f"{n}_loss_curve.csv").write_text((work / n / "loss_curve.csv").read_text())
    res = {
        "one": summarize(curves["one"], flops, 1, a.skip, cuda),
        "multi": summarize(curves["multi"], flops, a.gpus, a.skip, cuda),
    }
    check = json.loads((out / "check.json").read_text()) if (out / "check.json").is_file() else {}
    l1, l2 = res["one"].get("losses", []), res["multi"].get("losses", [])
    n = min(len(l1), len(l2))
    rel = [abs(x - y) / abs(x) for x, y in zip(l1[:n], l2[:n], strict=True)]
    report = {
        "machine": machine,
        "preset": a.preset,
        "params": config.num_parameters,
        "data": data,
        "row_len": None,
        "steps": a.steps,
        "global_batch_rows": a.gpus,
        "multi_config": a.multi_config,
        "compile": a.compile,
        "stages": stages,
        "results": res,
        "loss_rel_diff_per_step": [round(r, 6) for r in rel],
        "loss_rel_diff_max": round(max(rel), 6) if rel else None,
        "check": check,
        "total_wall_s": round(time.perf_counter() - t0, 1),
    }
    if curves["one"]:
        report["row_len"] = int(curves["one"][0]["tokens"]) // a.gpus
    (out / "sft_multigpu.json").write_text(json.dumps(report, indent=2) + "\n")

    def cell(d: dict, key: str, fmt: str = "{}") -> str:
        return fmt.format(d[key]) if d.get(key) is not None else "-"

    lines = [
        f"sft 1 vs {a.gpus} ({a.multi_config}), preset {a.preset}, {a.steps} steps, "
        f"global batch {a.gpus} rows, total {report['total_wall_s']}s",
        "| run | rc | steps | step s (median) | tokens/s | tokens/s/process | TFLOP/s | MFU | first step s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, gpus in (("one", 1), ("multi", a.gpus)):
        r = res[name]
        lines.append(
            f"| {gpus} process{'es' if gpus > 1 else ''} | {stages[name]['rc']} | {r.get('steps', 0)} | "
            f"{cell(r, 'step_s_median')} | {cell(r, 'tokens_per_s')} | {cell(r, 'tokens_per_s_per_gpu')} | "
            f"{cell(r, 'achieved_tflops')} | {cell(r, 'mfu', '{:.1%}') if 'mfu' in r else '-'} | "
            f"{cell(r, 'first_step_s')} |"
        )
    lines.append("losses 1:     " + " ".join(f"{x:.5f}" for x in l1))
    lines.append(f"losses {a.gpus}:     " + " ".join(f"{x:.5f}" for x in l2))
    lines.append(f"max rel loss diff: {report['loss_rel_diff_max']}")
    lines.append(
        "export check: "
        + (json.dumps({k: check[k] for k in sorted(check) if not k.endswith("_gb")}) if check else "none")
    )
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
