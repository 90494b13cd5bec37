"""Engine speed on one GPU, all four measurements of issue 8 in one run.

(a) ms per denoising step at batch 1 (512-token prompt, block 4) against the roofline, weight bytes over
    the measured device copy bandwidth (bytes read + bytes written), at the 1.7B and 8B shapes;
(b) generated tokens/s at 1 and 2 committed tokens per step (static policy, 4 and 2 steps per block);
(c) the autoregressive baseline: transformers ``Qwen3ForCausalLM.generate`` at the 8B shape, eager and with a
    static cache + ``torch.compile``, on the very same weights;
(d) batch 64 and 128 throughput at the 4B shape.

Weights are random bf16, built directly on the GPU (speed does not depend on their values). The configs are
the SDAR release's config.json values (4B/8B; 1.7B inferred from Qwen3-1.7B), embedded below so the script
needs no data files. Results: ``<out>/engine_h200.json`` and ``engine_h200.md``, written after every section.

    python benchmarks/engine_bench.py --out benchmarks/results        # full run (~4-5 min on an H200)
    python benchmarks/engine_bench.py --quick --out /tmp/bench         # every code path, small shapes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_bench_report import Report  # noqa: E402
from engine.decode import BlockEvent  # noqa: E402
from engine.engine import Engine, fast_kernels_unavailable  # noqa: E402
from engine.model import DiceModel, ModelConfig, param_bytes  # noqa: E402
from engine.tokenizer import Tokenizer  # noqa: E402

BASE = {
    "model_type": "sdar",
    "architectures": ["SDARForCausalLM"],
    "vocab_size": 151936,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000,
    "max_position_embeddings": 32768,
    "block_size": 4,
    "mask_token_id": 151669,
    "eos_token_id": 151643,
    "torch_dtype": "bfloat16",
}
CONFIGS = {
    "1.7B": BASE
    | {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "4B": BASE
    | {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
    "8B": BASE
    | {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
}
PROMPT_LEN = 512
# Every timed call repeats the same prompts: prompt-prefix reuse would skip their prefill after the first.
NO_REUSE = {"prefix_cache_entries": 0}
DEV = "cuda"  # --smoke-cpu switches everything to the CPU (tiny shapes) to check the script itself
EOS, PAD, MASK, IM_START, IM_END = 151643, 151643, 151669, 151644, 151645
# A decode step faster than this share of (weight bytes / copy bandwidth) is a timing error, not a result:
# every step reads all the weights, and reading alone beats the copy rate by ~10-15 % at most.
FLOOR = 0.8


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def bench_tokenizer() -> Tokenizer:
    """The engine needs only the special ids here; prompts are random ids."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    return Tokenizer(
        Backend(models.BPE()), eos_id=EOS, pad_id=PAD, mask_id=MASK, im_start_id=IM_START, im_end_id=IM_END
    )


def random_model(cfg: ModelConfig, seed: int = 0) -> DiceModel:
    with torch.device(DEV):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = DiceModel(cfg)
        finally:
            torch.set_default_dtype(prev)
    model.init_weights(std=0.02, seed=seed)
    return model.eval()


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def cuda_time(fn, repeats: int) -> list[float]:
    """Seconds per call, each timed with CUDA events (a host clock on the CPU smoke run)."""
    out = []
    for _ in range(repeats):
        if DEV != "cuda":
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s, bytes read plus bytes written (median of 20 4-GiB copies)."""
    n = 4 << 30 if DEV == "cuda" else 64 << 20
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = cuda_time(lambda: dst.copy_(src), 20)
    return 2 * n / statistics.median(times)


def random_prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 150000, (batch, length), generator=g).tolist()


def step_ms(eng: Engine, runner, block: int, length: int, repeats: int, inner: int = 20) -> float:
    """Median ms of one denoising-step forward (length = block, or 2*block for a block's first step)."""
    cache = runner.new_cache(1, PROMPT_LEN + 64, block)
    cache.reset([0])
    runner.prepare(cache, (block, 2 * block), block)
    ids = torch.tensor(random_prompts(1, PROMPT_LEN, 1), device=DEV)
    runner.prefill(cache, ids, torch.arange(PROMPT_LEN, device=DEV)[None])
    x = torch.full((1, length), MASK, dtype=torch.long, device=DEV)
    pos = torch.arange(PROMPT_LEN, PROMPT_LEN + length, device=DEV)[None]
    start = torch.full((1,), PROMPT_LEN, dtype=torch.long, device=DEV)
    for _ in range(3):
        runner.step(cache, x, pos, start, block)

    def run() -> None:
        for _ in range(inner):
            runner.step(cache, x, pos, start, block)

    return statistics.median(cuda_time(run, repeats)) / inner * 1e3


def generate_rate(
    eng: Engine, prompts: list[list[int]], new_tokens: int, steps: int, repeats: int, floor_ms: float = 0.0
) -> dict:
    """Whole generate() calls (prefill + decode + host work), and the decode-only rate timed inside the
    same calls: the host clock at the end of the first block (``on_block``, called after the block's host
    sync, so its GPU work is done: the prefill and the first block's steps) and at the end of the call.
    Decode-only = the blocks after the first: their tokens, steps and time, the median over the calls.

    No difference of separately timed calls (the whole call minus a one-block call, timed apart, went
    negative at batch 128 on the H200: -8.59 ms/step). A figure that still cannot be right (no blocks
    after the first, a non-positive time, or steps faster than ``floor_ms``, about the time to read the
    weights once) is reported as not measured, with why.
    """
    calls = []
    for i in range(repeats + 1):  # the first call captures the graphs: not timed
        mark: dict[str, Any] = {}

        def first_block(ev: BlockEvent, mark=mark) -> None:
            if ev.block == 0:
                mark["t"] = time.perf_counter()
                mark["tokens"] = sum(len(r) for r in ev.ids)
                mark["steps"] = max((max(s) for s in ev.step_map if s), default=0)  # the block's forwards

        sync()
        t = time.perf_counter()
        out = eng.generate(
            prompts, max_new_tokens=new_tokens, steps_per_block=steps, stop_ids=[], on_block=first_block
        )
        sync()
        end = time.perf_counter()
        if i:
            calls.append((end - t, mark["t"] - t, end - mark["t"], mark["tokens"], mark["steps"], out))
    sec = statistics.median(c[0] for c in calls)
    first_sec = statistics.median(c[1] for c in calls)
    decode_sec = statistics.median(c[2] for c in calls)
    out, first_tokens, first_steps = calls[-1][5], calls[-1][3], calls[-1][4]
    made = sum(len(r) for r in out.ids)
    decode_tokens, decode_steps = made - first_tokens, out.steps - first_steps
    r: dict[str, Any] = {
        "seconds": sec,
        "tokens": made,
        "tokens_per_s": made / sec,
        "denoising_steps": out.steps,
        "ms_per_step_overall": sec / out.steps * 1e3,
        "batch": len(prompts),
        "new_tokens": new_tokens,
        "steps_per_block": steps,
        "prompt_len": len(prompts[0]),
        "timed_calls": len(calls),
        "first_block_seconds": first_sec,
        "decode_seconds": decode_sec,
        "decode_seconds_per_call": [c[2] for c in calls],
        "decode_tokens": decode_tokens,
        "decode_steps": decode_steps,
        "decode_method": "inside each call: end of call - end of the first block (prefill + its steps)",
    }
    why = None
    if decode_steps <= 0 or decode_tokens <= 0:
        why = f"all {made} tokens came in the first block: no decode-only blocks to time"
    elif decode_sec <= 0:
        why = f"non-positive decode time ({decode_sec * 1e3:.2f} ms)"
    elif decode_sec / decode_steps * 1e3 < floor_ms:
        why = (
            f"{decode_sec / decode_steps * 1e3:.2f} ms/step is under {floor_ms:.2f} ms, faster than the "
            "weights can be read once: a timing error"
        )
    if why is None:
        r["decode_tokens_per_s"] = decode_tokens / decode_sec
        r["decode_ms_per_step"] = decode_sec / decode_steps * 1e3
    else:
        r["decode_tokens_per_s"] = r["decode_ms_per_step"] = None
        r["decode_not_measured"] = why
    return r


def decode_log(r: dict) -> str:
    if r.get("decode_tokens_per_s") is None:
        return f"decode not measured ({r.get('decode_not_measured')})"
    return f"{r['decode_tokens_per_s']:.1f} tok/s decode, {r['decode_ms_per_step']:.2f} ms/step"


def hf_model(model: DiceModel, device: str | None = None):
    """transformers Qwen3ForCausalLM sharing the DiceModel's weight tensors (same key names)."""
    import transformers
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    c = model.config
    hf_cfg = transformers.Qwen3Config(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        torch_dtype="bfloat16",
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    with torch.device("meta"):
        hf = transformers.Qwen3ForCausalLM(hf_cfg)
    hf.load_state_dict(model.state_dict(), strict=False, assign=True)
    with torch.device(device or DEV):  # the rotary buffers are not in the state dict
        hf.model.rotary_emb = Qwen3RotaryEmbedding(config=hf_cfg)
    if c.tie_word_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    leftover = [n for n, p in list(hf.named_parameters()) + list(hf.named_buffers()) if p.is_meta]
    assert not leftover, leftover
    return hf.eval()


def hf_rate(hf, new_tokens: int, repeats: int, compiled: bool) -> dict:
    """HF generate at batch 1; the eager warm-up is short, the compiled one uses the timed shape twice."""
    ids = torch.tensor(random_prompts(1, PROMPT_LEN, 1), device=DEV)
    kwargs: dict[str, Any] = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD
    )
    if compiled:
        hf.generation_config.cache_implementation = "static"
        if hasattr(hf.generation_config, "disable_compile"):
            hf.generation_config.disable_compile = True  # compile explicitly below, once
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
    t = time.perf_counter()
    with torch.inference_mode():
        for _ in range(2 if compiled else 1):
            hf.generate(ids, **(kwargs if compiled else kwargs | {"max_new_tokens": 4, "min_new_tokens": 4}))
    warm = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(ids, **kwargs)
        sync()
        times.append(time.perf_counter() - t)
    made = out.shape[1] - ids.shape[1]
    sec = statistics.median(times)
    return {
        "seconds": sec,
        "tokens": made,
        "tokens_per_s": made / sec,
        "warmup_s": warm,
        "mode": "static cache + torch.compile(reduce-overhead)" if compiled else "eager, dynamic cache",
    }


def run_batches(
    rep: Report, tok: Tokenizer, layers: dict, batches: tuple[int, ...], new: int, bw: float
) -> None:
    """(d): batched decoding throughput at the 4B shape."""
    model = random_model(ModelConfig.from_dict(CONFIGS["4B"] | layers))
    floor_ms = FLOOR * param_bytes(model) / bw * 1e3  # no step is faster than one read of the weights
    eng = Engine(model, tok, name="4B", cuda_graphs=DEV == "cuda", fuse_projections=True, **NO_REUSE)
    for b in batches:
        prompts = random_prompts(b, PROMPT_LEN, 3)
        for k, steps in ((1, 4), (2, 2)):
            g = generate_rate(eng, prompts, new, steps, 2, floor_ms)
            rep.add(f"batch_{b}_{k}", g)
            log(f"4B batch {b}, {k} tok/step -> {g['tokens_per_s']:.0f} tok/s whole call, {decode_log(g)}")
    del eng, model
    if DEV == "cuda":
        torch.cuda.empty_cache()


def run_single(
    rep: Report,
    tok: Tokenizer,
    name: str,
    layers: dict,
    bw: float,
    new: int,
    repeats: int,
    compile: bool = False,
    run_rates: bool = True,
) -> DiceModel:
    """(a) and (b) for one shape at batch 1; returns the model (the HF baseline reuses the 8B weights)."""
    model = random_model(ModelConfig.from_dict(CONFIGS[name] | layers))
    wbytes = param_bytes(model)
    graphs = DEV == "cuda"
    torch_graph = Engine(model, tok, name=name, cuda_graphs=graphs, fuse_projections=True, kernels=False,
                         **NO_REUSE)  # fmt: skip
    eager = Engine(model, tok, name=name, cuda_graphs=False, **NO_REUSE)
    r = {
        "weight_gb": wbytes / 1e9,
        "roofline_ms": wbytes / bw * 1e3,
        "graph_ms": step_ms(torch_graph, torch_graph.runner, 4, 4, repeats + 2),
        "graph_ms_8": step_ms(torch_graph, torch_graph.runner, 4, 8, repeats + 2),
        "eager_ms": step_ms(eager, eager.runner, 4, 4, 1, inner=10),
    }
    eng = torch_graph
    why = fast_kernels_unavailable(model)
    if graphs and why is None:
        eng = Engine(model, tok, name=name, cuda_graphs=True, kernels=True, **NO_REUSE)
        r["fast_ms"] = step_ms(eng, eng.runner, 4, 4, repeats + 2)
        r["fast_ms_8"] = step_ms(eng, eng.runner, 4, 8, repeats + 2)
    else:
        r["fast_skipped"] = why or "no CUDA graphs"
    if compile and DEV == "cuda":
        t = time.perf_counter()
        compiled = Engine(model, tok, name=name, cuda_graphs=True, compile=True, kernels=False, **NO_REUSE)
        r["compiled_graph_ms"] = step_ms(compiled, compiled.runner, 4, 4, repeats + 2)
        r["compile_s"] = time.perf_counter() - t
        del compiled
    rep.add(f"step_{name}", r)
    fast_ms = r.get("fast_ms", float("nan"))
    log(
        f"{name}: step {r['graph_ms']:.2f} ms (torch graph), {fast_ms:.2f} ms (Triton), "
        f"roofline {r['roofline_ms']:.2f}, eager {r['eager_ms']:.2f}"
    )
    if not run_rates:
        return model
    prompt = random_prompts(1, PROMPT_LEN, 2)
    for k, steps in ((1, 4), (2, 2)):
        g = generate_rate(eng, prompt, new, steps, repeats, FLOOR * r["roofline_ms"])
        rep.add(f"gen_{name}_{k}", g)
        log(f"{name}: {k} tok/step: {g['tokens_per_s']:.1f} tok/s whole call, {decode_log(g)}")
    return model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--quick", action="store_true", help="4-layer shapes, few tokens: checks every path fast")
    p.add_argument("--budget-s", type=float, default=200.0, help="start the HF compile only before this")
    p.add_argument("--new-tokens", type=int, default=256, help="new tokens per batch-1 generation")
    p.add_argument("--hf-new-tokens", type=int, default=64, help="new tokens per HF generation")
    p.add_argument("--smoke-cpu", action="store_true", help="check the script on a CPU (tiny shapes)")
    p.add_argument("--compile", action="store_true", help="also time the torch.compile'd graph step (a,b)")
    p.add_argument("--steps-only", action="store_true", help="only (a): the step times, both shapes")
    args = p.parse_args(argv)
    global DEV, PROMPT_LEN
    batches = (64, 128)
    shrink: dict[str, Any] = {}
    if args.smoke_cpu:
        DEV, PROMPT_LEN, batches = "cpu", 32, (2, 3)
        shrink = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 8, "head_dim": 16}
        args.quick = True
    t0 = time.perf_counter()
    rep = Report(args.out, sys.argv if argv is None else ["benchmarks/engine_bench.py", *argv], DEV)
    layers = ({"num_hidden_layers": 4} if args.quick else {}) | shrink
    new = 32 if args.quick else args.new_tokens
    hf_new = 16 if args.quick else args.hf_new_tokens
    repeats = 2 if args.quick else 3

    bw = copy_bandwidth()
    rep.add(
        "bandwidth", {"bytes_per_s": bw, "tb_per_s": bw / 1e12, "method": "4 GiB uint8 copy_, median of 20"}
    )
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    tok = bench_tokenizer()

    if args.steps_only:
        for name in ("1.7B", "8B"):
            run_single(rep, tok, name, layers, bw, new, repeats, args.compile, run_rates=False)
            if DEV == "cuda":
                torch.cuda.empty_cache()
        print(rep.markdown())
        return
    model8 = run_single(rep, tok, "8B", layers, bw, new, repeats, args.compile)
    w8 = param_bytes(model8)
    rep.add("ar_limit", {"weight_gb": w8 / 1e9, "tb_per_s": bw / 1e12, "tokens_per_s": bw / w8})
    try:
        hf = hf_model(model8)
    except ImportError as exc:  # the CPU smoke run on a machine without transformers
        hf, why = None, f"{type(exc).__name__}: {exc}"
    if hf is None:
        r = {"model": "8B", "skipped": why}
    else:
        r = hf_rate(hf, hf_new, 1, compiled=False) | {"model": "8B"}
    rep.add("hf_eager", r)
    log(f"HF eager {r.get('tokens_per_s', r.get('skipped'))}")

    run_batches(rep, tok, layers, batches, 16 if args.quick else 64, bw)
    run_single(rep, tok, "1.7B", layers, bw, new, repeats, args.compile)
    if DEV == "cuda":
        torch.cuda.empty_cache()

    if hf is None:
        r = {"model": "8B", "skipped": "no transformers"}
    elif DEV == "cuda" and time.perf_counter() - t0 < args.budget_s:
        try:
            r = hf_rate(hf, hf_new, 2, compiled=True) | {"model": "8B"}
        except Exception as exc:  # report it, keep the results so far
            r = {"model": "8B", "skipped": f"{type(exc).__name__}: {str(exc)[:300]}"}
    elif args.budget_s <= 0:
        r = {"model": "8B", "skipped": "not run (--budget-s 0)"}
    else:
        r = {"model": "8B", "skipped": f"time budget ({args.budget_s:.0f} s) spent before it"}
    rep.add("hf_compiled", r)
    log(f"HF compiled: {r.get('tokens_per_s', r.get('skipped'))}")
    rep.add(
        "notes",
        [
            f"total wall time {time.perf_counter() - t0:.0f} s",
            "decode only, (b) and (d): the blocks after the first, timed inside the same generate() calls "
            "(host clock at the end of the first block, after its host sync, and at the end of the call); "
            "the first block (prefill + its steps) is `first_block_seconds` in the JSON",
        ],
    )
    print(rep.markdown())


if __name__ == "__main__":
    main()
