"""``dice serve`` under load: p50/p95 latency, time to first token and throughput at 1..32 concurrent clients.

The server runs in its own process (this script started with ``--serve``), the clients in this one
(asyncio + httpx, streaming, so time to first token is measured too). Every client sends its own prompts;
a response whose text differs from the same prompt's answer at concurrency 1 is counted as a mismatch
(at temperature 0; on a GPU in bf16 a different batch can round differently, so mismatches are reported,
not asserted), and lost or duplicated responses are counted. The server's resident memory is read from
``/metrics`` before and after.

    python benchmarks/serve_bench.py --shape tiny --out benchmarks/results        # the embedded model, CPU
    python benchmarks/serve_bench.py --shape 8B --out benchmarks/results          # random bf16 weights, GPU
    python benchmarks/serve_bench.py --smoke-cpu --out /tmp/serve                  # checks the script

Shapes other than ``tiny`` are random weights at the real shapes (``engine_bench.CONFIGS``) with the SDAR
tokenizer from ``$DICE_SHARED_DATA/sdar-tokenizer``; prompts are then token ids and decoding is ``static``
at one token per step (random weights have no meaningful confidences).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402


def build_engine(shape: str, device: str | None) -> Any:
    import engine

    if shape == "tiny":
        return engine.load_engine(None, device=device or "cpu")
    import torch

    import benchmarks.engine_bench as eb
    from engine.engine import Engine
    from engine.model import ModelConfig
    from engine.tokenizer import load_tokenizer

    eb.DEV = device or ("cuda" if torch.cuda.is_available() else "cpu")
    layers = {"num_hidden_layers": 2} if shape.startswith("smoke") else {}
    name = shape.removeprefix("smoke-") or "1.7B"
    cfg = ModelConfig.from_dict(eb.CONFIGS[name] | layers)
    if shape.startswith("smoke"):
        cfg = ModelConfig.from_dict(
            eb.CONFIGS[name]
            | {
                "num_hidden_layers": 1,
                "hidden_size": 128,
                "intermediate_size": 256,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 64,
            }
        )
    shared = Path(os.environ.get("DICE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    tok = load_tokenizer(shared / "sdar-tokenizer", mask_id=cfg.mask_token_id)
    model = eb.random_model(cfg)
    return Engine(model, tok, name=f"random-{name}", cuda_graphs=eb.DEV == "cuda", fuse_projections=True)


def serve(args: argparse.Namespace) -> None:
    from dice.serving.app import ServeConfig
    from dice.serving.launch import bind, serve_forever

    eng = build_engine(args.shape, args.device)
    sock = bind("127.0.0.1", 0)
    print(json.dumps({"port": sock.getsockname()[1], "device": str(eng.device)}), flush=True)
    cfg = ServeConfig(model_name="bench", max_batch=args.max_batch, policy="static", steps_per_block=None)
    serve_forever(eng, cfg, sock, log_level="warning")


def prompts_for(args: argparse.Namespace, count: int) -> list[Any]:
    if args.shape == "tiny":
        return [
            f"__global__ void k{i}(const float* x, float* y, int n) {{\n    int i = " for i in range(count)
        ]
    import random

    rng = random.Random(0)
    return [[rng.randrange(1000, 150000) for _ in range(args.prompt_len)] for _ in range(count)]


async def one(http: httpx.AsyncClient, prompt: Any, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stop_token_ids": [],
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = None
    text, tokens, ids = [], 0, set()
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            ids.add(chunk["id"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk["choices"]:
                if first is None and c["dice"]["token_ids"]:
                    first = time.perf_counter() - started
                text.append(c["text"])
    return {
        "latency": time.perf_counter() - started,
        "ttft": first,
        "tokens": tokens,
        "text": "".join(text),
        "ids": ids,
    }


async def level(url: str, prompts: list[Any], clients: int, per_client: int, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def client(c: int) -> list[tuple[int, dict]]:
            out = []
            for k in range(per_client):
                i = (c * per_client + k) % len(prompts)
                out.append((i, await one(http, prompts[i], max_tokens)))
            return out

        started = time.perf_counter()
        results = [x for xs in await asyncio.gather(*(client(c) for c in range(clients))) for x in xs]
        wall = time.perf_counter() - started
    lat = sorted(r["latency"] for _, r in results)
    ttft = sorted(r["ttft"] for _, r in results if r["ttft"] is not None)
    tokens = sum(r["tokens"] for _, r in results)
    ids = [i for _, r in results for i in r["ids"]]

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")

    return {
        "clients": clients,
        "requests": len(results),
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "requests_per_s": len(results) / wall,
        "p50_ms": pct(lat, 0.5),
        "p95_ms": pct(lat, 0.95),
        "ttft_p50_ms": pct(ttft, 0.5),
        "ttft_p95_ms": pct(ttft, 0.95),
        "duplicated_ids": len(ids) - len(set(ids)),
        "results": results,
    }


def rss(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("process_resident_memory_bytes"):
            return float(line.split()[-1]) / 2**20
    return float("nan")


def batch_mean(url: str) -> tuple[float, float]:
    s = c = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("dice_batch_rows_sum"):
            s = float(line.split()[-1])
        elif line.startswith("dice_batch_rows_count"):
            c = float(line.split()[-1])
    return s, c


def main() -> None:
    """Long on purpose: one linear script (start the server, run every level, write the report)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="tiny", help="tiny (embedded model), 1.7B, 4B, 8B (random weights)")
    p.add_argument("--device", default=None)
    p.add_argument("--clients", default="1,2,4,8,16,32")
    p.add_argument("--per-client", type=int, default=4, help="requests each client sends, one after another")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--smoke-cpu", action="store_true", help="a 1-layer random model with the SDAR vocab, CPU")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.smoke_cpu:
        args.shape, args.device, args.prompt_len, args.per_client = "smoke-1.7B", "cpu", 16, 2
        args.clients = "1,4"
    if args.serve:
        serve(args)
        return
    argv = [sys.executable, __file__, "--serve", "--shape", args.shape, "--max-batch", str(args.max_batch)]
    if args.device:
        argv += ["--device", args.device]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        hello = json.loads(proc.stdout.readline())
        url = f"http://127.0.0.1:{hello['port']}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        levels = [int(x) for x in args.clients.split(",")]
        prompts = prompts_for(args, max(levels) * args.per_client)
        # the reference answers: each prompt alone (also warms the server up)
        ref = asyncio.run(level(url, prompts, 1, len(prompts), args.max_tokens))
        expected = {i: r["text"] for i, r in ref["results"]}
        rss_before = rss(url)
        rows = []
        for c in levels:
            s0, c0 = batch_mean(url)
            r = asyncio.run(level(url, prompts, c, args.per_client, args.max_tokens))
            s1, c1 = batch_mean(url)
            r["mean_batch_rows"] = (s1 - s0) / max(c1 - c0, 1)
            r["mismatches"] = sum(res["text"] != expected[i] for i, res in r.pop("results"))
            rows.append(r)
            print(
                json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}), flush=True
            )
        report = {
            "shape": args.shape,
            "device": hello["device"],
            "machine": platform.node(),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "command": " ".join(sys.argv),
            "max_tokens": args.max_tokens,
            "prompt": "code text" if args.shape == "tiny" else f"{args.prompt_len} random token ids",
            "rss_mib_before": rss_before,
            "rss_mib_after": rss(url),
            "levels": rows,
        }
    finally:
        proc.terminate()
        proc.wait(30)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"serve_{args.shape}_{'gpu' if 'cuda' in hello['device'] else 'cpu'}"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"# dice serve under load: {args.shape} on {hello['device']}",
        "",
        f"{report['date']}, `{report['command']}`; {args.max_tokens} new tokens per request, prompts: "
        f"{report['prompt']}; streamed; server RSS {rss_before:.0f} MiB before the load, "
        f"{report['rss_mib_after']:.0f} MiB after.",
        "",
        "| clients | requests | tok/s | req/s | p50 ms | p95 ms | TTFT p50 ms | TTFT p95 ms | mean batch "
        "rows | mismatches | duplicated ids |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['requests']} | {r['tokens_per_s']:.0f} | {r['requests_per_s']:.1f} | "
            f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} | "
            f"{r['mean_batch_rows']:.1f} | {r['mismatches']} | {r['duplicated_ids']} |"
        )
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
