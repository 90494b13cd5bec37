"""Block-diffusion SFT throughput: tokens/s, MFU and peak memory of the training step of ``dice train sft``.

The step is the real one (``training.sft.BlockDiffusionLM``: [noisy | clean] copies, flex_attention
BlockMask, compiled decoder layers, bf16 autocast over fp32 master weights, fused AdamW), on random weights
and random packed rows.

Model FLOPs per step (MFU counts these, not recomputation under gradient checkpointing):
  6 * (decoder matmul parameters) * (B * 2T tokens)             noisy and clean copies both run the stack
+ 6 * (vocab * hidden) * (masked tokens)                         lm_head only on the masked positions
+ 12 * layers * heads * head_dim * (query-key pairs the mask allows)   QK^T and PV, forward + backward
MFU = FLOPs / step time / peak; peak = 989.4 TFLOP/s dense bf16 (H100/H200 SXM datasheet).

  python benchmarks/sft_bench.py --preset 1.7b --seq-len 4096 --batch 1 2 --checkpointing 0 1 --out DIR
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

PEAK_BF16_TFLOPS = 989.4

PRESETS = {
    # SDAR-1.7B as inferred from Qwen3-1.7B (its base) and the SDAR configs; vocab of the SDAR tokenizer.
    "1.7b": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        mask_token_id=151669,
        max_position_embeddings=32768,
    ),
    "tiny": dict(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        mask_token_id=4095,
        max_position_embeddings=8192,
    ),
}


def decoder_matmul_params(cfg) -> int:
    d, h, g, hd, ff = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    )
    return cfg.num_hidden_layers * (2 * d * h * hd + 2 * d * g * hd + 3 * d * ff)


def allowed_pairs(doc_ids: torch.Tensor, block_size: int) -> int:
    """Query-key pairs the [noisy | clean] mask allows, counted per block_size x block_size cell."""
    from training.masks import make_mask_mod

    b, t = doc_ids.shape
    mask_mod = make_mask_mod(doc_ids, block_size)
    first = torch.arange(0, 2 * t, block_size, device=doc_ids.device)
    total = 0
    for bi in range(b):
        bb = torch.tensor(bi, device=doc_ids.device)
        for q0 in range(0, len(first), 1024):
            cells = mask_mod(bb, None, first[q0 : q0 + 1024, None], first[None, :])
            total += int(cells.sum()) * block_size * block_size
    return total


def random_rows(batch: int, seq_len: int, vocab: int, docs_per_row: int, block: int, gen: torch.Generator):
    """Packed rows: ``docs_per_row`` block-aligned documents, the second half of each one trainable."""
    ids = torch.randint(0, vocab - 8, (batch, seq_len), generator=gen)
    doc = torch.zeros(batch, seq_len, dtype=torch.long)
    pos = torch.zeros(batch, seq_len, dtype=torch.long)
    loss = torch.zeros(batch, seq_len, dtype=torch.bool)
    size = seq_len // docs_per_row // block * block
    for d in range(docs_per_row):
        start = d * size
        end = seq_len if d == docs_per_row - 1 else start + size
        doc[:, start:end] = d
        pos[:, start:end] = torch.arange(end - start)
        loss[:, start + (end - start) // 2 : end] = True
    return ids, pos, doc, loss


def bench_one(preset: str, seq_len: int, batch: int, checkpointing: bool, steps: int, warmup: int) -> dict:
    from engine.model import DiceModel, ModelConfig
    from training.masks import build_block_mask
    from training.objective import BlockDiffusionLM, compile_layers, noise_rows

    dev = torch.device("cuda")
    torch.cuda.empty_cache()  # the previous configuration's model and optimizer are gone by now
    cfg = ModelConfig(**PRESETS[preset])
    torch.manual_seed(0)
    with torch.device(dev):
        model = DiceModel(cfg)
    model.init_weights(std=0.02, seed=0)
    model.gradient_checkpointing = checkpointing
    compile_layers(model)
    objective = BlockDiffusionLM(model).train()
    opt = torch.optim.AdamW(objective.parameters(), lr=1e-5, betas=(0.9, 0.95), fused=True)
    gen = torch.Generator().manual_seed(0)
    ids, pos, doc, loss_mask = random_rows(batch, seq_len, cfg.vocab_size, 2, cfg.block_size, gen)
    noised = noise_rows(
        ids, loss_mask, doc, torch.arange(batch), mask_id=cfg.mask_token_id, eps=1e-3, seed=0, epoch=0
    )
    noisy, clean, pos = noised.noisy_ids.to(dev), ids.to(dev), pos.to(dev)
    masked, p_mask = noised.masked.to(dev), noised.p_mask.to(dev)
    answer = float(loss_mask.sum())

    def step() -> None:
        mask = build_block_mask(doc.to(dev), cfg.block_size)  # built every step, as in training
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_sum, _ = objective(noisy, clean, pos, mask, masked, p_mask)
        (loss_sum / answer).backward()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    median = times[len(times) // 2]
    pairs = allowed_pairs(doc.to(dev), cfg.block_size)
    masked = int(noised.masked.sum())
    flops = (
        6 * decoder_matmul_params(cfg) * batch * 2 * seq_len
        + 6 * cfg.vocab_size * cfg.hidden_size * masked
        + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * pairs
    )
    result = {
        "preset": preset,
        "params": cfg.num_parameters,
        "seq_len": seq_len,
        "batch": batch,
        "gradient_checkpointing": checkpointing,
        "step_s_median": round(median, 4),
        "step_s_min": round(times[0], 4),
        "tokens_per_s": round(batch * seq_len / median),
        "model_tokens_per_s": round(batch * 2 * seq_len / median),
        "tflops_per_step": round(flops / 1e12, 2),
        "achieved_tflops": round(flops / median / 1e12, 1),
        "mfu": round(flops / median / 1e12 / PEAK_BF16_TFLOPS, 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "mask_density": round(pairs / (batch * (2 * seq_len) ** 2), 4),
        "warmup_s": round(warm_s, 1),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="1.7b")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--checkpointing", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="folder for sft_bench.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sft_bench needs a CUDA GPU")
    results = []
    for ckpt in args.checkpointing:
        for batch in args.batch:
            try:
                r = bench_one(args.preset, args.seq_len, batch, bool(ckpt), args.steps, args.warmup)
            except torch.OutOfMemoryError as exc:
                r = {
                    "preset": args.preset,
                    "batch": batch,
                    "gradient_checkpointing": bool(ckpt),
                    "error": f"OOM: {exc}"[:200],
                }
                torch.cuda.empty_cache()
            results.append(r)
            print(json.dumps(r), flush=True)
    machine = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "peak_bf16_tflops": PEAK_BF16_TFLOPS,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {"machine": machine, "results": results}
        (args.out / "sft_bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    head = ("preset", "B", "ckpt", "step s", "tok/s", "TFLOP/s", "MFU", "peak GiB")
    print("{:6} {:>2} {:>4} {:>7} {:>9} {:>8} {:>6} {:>8}".format(*head))
    for r in results:
        if "error" in r:
            print(f"{r['preset']:6} {r['batch']:>2} {int(r['gradient_checkpointing']):>4} {r['error'][:60]}")
            continue
        print(
            f"{r['preset']:6} {r['batch']:>2} {int(r['gradient_checkpointing']):>4} "
            f"{r['step_s_median']:>7.3f} "
            f"{r['tokens_per_s']:>9} {r['achieved_tflops']:>8} {r['mfu']:>6.1%} {r['peak_mem_gib']:>8}"
        )


if __name__ == "__main__":
    main()
