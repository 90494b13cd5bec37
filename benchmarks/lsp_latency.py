"""Latency of dice-lsp inline completion: request -> response over stdio, p50/p95.

The server is the real ``dice-lsp`` in a subprocess; the client (pygls) opens a .cu file with one
``/* <MASK:32> */`` in a kernel body and sends ``textDocument/inlineCompletion`` (invoked trigger) at the
mask. Every request sees the same text; before each timed one the ``threshold`` setting moves by 1e-9 (part
of the service's cache key, no effect on the tokens chosen), so none is answered from the cache (the cached
path is reported separately). Changing the text instead would also change what the small model writes
(it derails on some comments), and so the work measured. Results (JSON, Markdown and a latency plot, with
the machine and command) go to ``benchmarks/results/lsp_latency_<label>.*``.

    python benchmarks/lsp_latency.py --label cpu-dice-tiny                   # the embedded model on CPU
    python benchmarks/lsp_latency.py --random-model 1.7b --tokenizer DIR --device cuda --label h200-1.7b

``--random-model 1.7b`` first writes a random checkpoint with the SDAR-1.7B shape (hidden 2048, 28 layers,
16 q / 8 kv heads, head_dim 128, MLP 6144, the Qwen vocabulary of ``--tokenizer``) in bf16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import LanguageClient

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

KERNEL = """\
#include <cuda_runtime.h>

// y[row] = softmax(x[row]) for a row-major (rows, cols) matrix, one block per row
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {{
    extern __shared__ float shared[];
    int row = blockIdx.x;
    if (row >= rows) return;
    const float* in = x + (size_t)row * cols;
    float* out = y + (size_t)row * cols;
    float max_val = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) max_val = fmaxf(max_val, in[c]);
    shared[threadIdx.x] = max_val;
    __syncthreads();
    /* <MASK:{budget}> */
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(in[c] - shared[0]);
}}
"""

# --typing: typed into the hole one character per request, as a user writing the statement would
TYPED = "float max_row = shared[0]; __syncthreads(); float total = 0.0f; // running sum"

SHAPES: dict[str, dict[str, int]] = {
    # SDAR-1.7B-Chat (Qwen3-1.7B body: hidden 2048, 28 layers, 16/8 heads, MLP 6144)
    "1.7b": dict(
        hidden_size=2048,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=6144,
    ),
    # the same code path at a size that builds in a second (checks the script, measures nothing useful)
    "smoke": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
    ),
}


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def make_random_checkpoint(out: Path, shape: str, tokenizer_dir: Path, device: str) -> Path:
    """A random bf16 checkpoint of a real model shape with a real tokenizer (for latency: it writes noise)."""
    import shutil

    import torch

    from engine.checkpoint import save_model
    from engine.model import DiceModel, ModelConfig
    from engine.tokenizer import load_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    for name in (
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "added_tokens.json",
        "special_tokens_map.json",
    ):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    tokenizer = load_tokenizer(out)
    config = ModelConfig(
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        block_size=4,
        mask_token_id=tokenizer.mask_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
        torch_dtype="bfloat16",
        **SHAPES[shape],
    )
    with torch.device(device):
        model = DiceModel(config).to(torch.bfloat16)
    model.init_weights(std=0.02, seed=0)
    save_model(model, out, dtype=torch.bfloat16)
    del model
    return out


class BenchClient(LanguageClient):
    def __init__(self) -> None:
        super().__init__("dice-lsp-latency", "1")
        self.status: list[dict[str, Any]] = []
        self.status_changed = asyncio.Event()

        self.logs: list[str] = []

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: Any) -> None:
            pass

        self.log_changed = asyncio.Event()

        @self.feature(types.WINDOW_LOG_MESSAGE)
        def on_log(params: types.LogMessageParams) -> None:
            self.logs.append(params.message)
            self.log_changed.set()

        @self.feature("dice/status")
        def on_status(params: Any) -> None:
            self.status.append(params if isinstance(params, dict) else dict(params._asdict()))
            self.status_changed.set()

    async def wait_log(self, prefix: str, *, after: int, timeout: float = 60.0) -> None:
        async def wait() -> None:
            while not any(m.startswith(prefix) for m in self.logs[after:]):
                self.log_changed.clear()
                await self.log_changed.wait()

        await asyncio.wait_for(wait(), timeout)

    async def wait_state(self, *states: str, timeout: float = 900.0) -> dict[str, Any]:
        async def wait() -> dict[str, Any]:
            while True:
                if self.status and self.status[-1].get("state") in states:
                    return self.status[-1]
                self.status_changed.clear()
                await self.status_changed.wait()

        return await asyncio.wait_for(wait(), timeout)


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Long on purpose: the whole measurement protocol, read top to bottom in the order it runs (a
    benchmark script, as nanochat's are); split into helpers, the protocol would be scattered."""
    settings = {
        "modelPath": str(args.model) if args.model else "",
        "device": args.device,
        "candidates": args.candidates,
        "maxNewTokens": args.budget,
        "validationLevel": args.validation,
        "maxLatencyMs": 600_000,
        "automaticTrigger": True,
        "trustedWorkspace": True,  # the repository's own examples: their dice-spec may run
    }
    client = BenchClient()
    await client.start_io(sys.executable, "-m", "lsp_server")
    started = time.perf_counter()
    await client.initialize_async(
        types.InitializeParams(capabilities=types.ClientCapabilities(), initialization_options=settings)
    )
    client.initialized(types.InitializedParams())
    ready = await client.wait_state("ready", "error")
    if ready["state"] == "error":
        raise SystemExit(f"the server could not load the model: {ready['message']}")
    load_s = time.perf_counter() - started

    folder = Path(tempfile.mkdtemp(prefix="dice-lsp-bench-"))
    uri = (folder / "softmax.cu").as_uri()
    text = KERNEL.format(budget=args.budget)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="cuda-cpp", version=0, text=text)
        )
    )
    lines = text.splitlines(keepends=True)
    mask_line = lines.index(f"    /* <MASK:{args.budget}> */\n")

    def request_at(typed: int) -> types.InlineCompletionParams:
        return types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=mask_line, character=4 + typed),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )

    params = request_at(0)

    latencies: list[float] = []
    first_ms = float("nan")
    cached: list[float] = []
    empty = 0
    first_item = None
    lengths: list[int] = []
    deadline = time.perf_counter() + args.time_limit if args.time_limit else float("inf")
    for n in range(1, args.warmup + args.requests + 1):
        if time.perf_counter() > deadline and len(latencies) >= 3:
            print(f"--time-limit reached after {len(latencies)} timed requests", flush=True)
            break
        if args.typing:  # one more character typed into the hole, right before the mask
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=n),
                    content_changes=[
                        types.TextDocumentContentChangePartial(
                            range=types.Range(
                                start=types.Position(line=mask_line, character=4 + n - 1),
                                end=types.Position(line=mask_line, character=4 + n - 1),
                            ),
                            text=TYPED[n - 1],
                        )
                    ],
                )
            )
            params = request_at(n)
        else:
            mark = len(client.logs)
            client.workspace_did_change_configuration(
                types.DidChangeConfigurationParams(
                    settings={"dice": {**settings, "threshold": 0.9 - n * 1e-9}}
                )
            )
            await client.wait_log("settings applied", after=mark)
        t0 = time.perf_counter()
        items = await client.text_document_inline_completion_async(params)
        elapsed = (time.perf_counter() - t0) * 1000
        if n == 1:
            first_ms = elapsed
        if n > args.warmup:
            latencies.append(elapsed)
            empty += not items
            if items:
                lengths.append(len(items[0].insert_text))
                first_item = first_item or items[0].insert_text
        t0 = time.perf_counter()
        await client.text_document_inline_completion_async(params)  # same text again: the cache
        if n > args.warmup:
            cached.append((time.perf_counter() - t0) * 1000)

    # the assistant's own time per uncached request (from the server's log), to separate it from LSP overhead
    totals = [
        float(m.split("'total_s': ")[1].split(",")[0].rstrip("}")) * 1000
        for m in client.logs
        if m.startswith("inline #") and "cached=False" in m and "'total_s': " in m
    ][args.warmup :]
    service_p50 = round(percentile(totals, 50), 1) if totals else None
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {
        "label": args.label,
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "model": {
            "name": ready.get("model"),
            "device": ready.get("device"),
            "description": ready.get("message"),
        },
        "settings": settings,
        "mask_budget_tokens": args.budget,
        "typing": args.typing,
        "requests": len(latencies),
        "warmup": args.warmup,
        "server_start_and_model_load_s": round(load_s, 2),
        "first_request_ms": round(first_ms, 1),  # the first after loading (a warm-up, not in the figures)
        "latency_ms": {
            "p50": round(percentile(latencies, 50), 1),
            "p95": round(percentile(latencies, 95), 1),
            "mean": round(statistics.fmean(latencies), 1),
            "min": round(min(latencies), 1),
            "max": round(max(latencies), 1),
        },
        "cached_latency_ms": {
            "p50": round(percentile(cached, 50), 2),
            "p95": round(percentile(cached, 95), 2),
        },
        "empty_responses": empty,
        "suggestion_chars_mean": round(statistics.fmean(lengths), 1) if lengths else 0,
        "first_suggestion": first_item,
        "service_total_ms_p50": service_p50,
        "server_log": [m for m in client.logs if not m.startswith(("settings applied", "inline #"))][:20],
        "samples_ms": [round(x, 1) for x in latencies],
        "target": "p50 <= 300 ms (embedded model, CPU, 32-token mask)",
    }


def write_results(result: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"lsp_latency_{result['label']}"
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    lat = result["latency_ms"]
    m = result["machine"]
    settings = result["settings"]
    example = ((result.get("first_suggestion") or "").strip().splitlines() or [""])[0]
    lines = [
        f"# dice-lsp inline completion latency: {result['label']}",
        "",
        f"- model: {result['model']['description']} (device {result['model']['device']})",
        f"- mask: `/* <MASK:{result['mask_budget_tokens']}> */` in a kernel body, invoked trigger, "
        f"{settings['candidates']} candidate(s), validation `{settings['validationLevel']}`",
        f"- {result['requests']} timed requests after {result['warmup']} warm-up, "
        + (
            "each after one more character typed into the hole (right before the mask), as a user writing"
            " a statement: the engine's prefix cache holds the file up to the hole, the rest is prefilled"
            if result.get("typing")
            else "same text, none served from the cache (threshold moved by 1e-9 before each): the engine's"
            " prefix cache holds the whole prompt"
        ),
        f"- suggestion: {result.get('suggestion_chars_mean')} characters on average, first line of one:"
        f" `{example}`; {result['empty_responses']} of {result['requests']} requests got no suggestion"
        " (the model stopped at once or wrote only blanks)",
        f"- **p50 {lat['p50']} ms, p95 {lat['p95']} ms** (mean {lat['mean']}, min {lat['min']},"
        f" max {lat['max']});"
        f" cached repeat p50 {result['cached_latency_ms']['p50']} ms; the assistant's own time p50"
        f" {result['service_total_ms_p50']} ms",
        f"- server start and model load {result['server_start_and_model_load_s']} s; the first request after"
        f" it (a warm-up, not in the figures) {result.get('first_request_ms')} ms",
        f"- target: {result['target']}",
        f"- machine: {m['platform']}, {m['cpus_usable']} of {m['cpu_count']} CPUs usable, torch {m['torch']}"
        + (f", {m['gpu']}" if m.get("gpu") else "")
        + f"; 1-min load average at start {m['load_average_1m_at_start']}",
        f"- command: `{result['command']}`",
    ]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        samples = sorted(result["samples_ms"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(samples, [(i + 1) / len(samples) for i in range(len(samples))], drawstyle="steps-post")
        ax.axvline(lat["p50"], linestyle="--", color="tab:green", label=f"p50 {lat['p50']} ms")
        ax.axvline(lat["p95"], linestyle=":", color="tab:red", label=f"p95 {lat['p95']} ms")
        ax.set_xlabel("request -> response (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"dice-lsp inline completion, {result['label']}")
        ax.legend()
        fig.tight_layout()
        png = stem.with_suffix(".png")
        fig.savefig(png, dpi=120)
        paths.append(png)
        lines.append(f"\n![latency CDF]({png.name})")
    except ImportError:
        pass
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget", type=int, default=32, help="mask budget in tokens")
    parser.add_argument("--candidates", type=int, default=1)
    parser.add_argument("--validation", default="none", choices=["none", "compile", "run"])
    parser.add_argument(
        "--time-limit",
        type=float,
        help="stop sending requests after this many seconds (results still written)",
    )
    parser.add_argument(
        "--typing",
        action="store_true",
        help="type one more character into the hole before each request (default: same text each time)",
    )
    parser.add_argument("--label", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--random-model", choices=sorted(SHAPES), help="write and use a random model of this shape"
    )
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder for --random-model (Qwen2 vocab)")
    args = parser.parse_args(argv)
    if args.typing and args.warmup + args.requests > len(TYPED):
        parser.error(f"--typing: --warmup + --requests must be at most {len(TYPED)} (one character each)")
    if args.random_model:
        if args.tokenizer is None:
            parser.error("--random-model needs --tokenizer")
        target = args.model or Path(tempfile.mkdtemp(prefix=f"dice-random-{args.random_model}-"))
        t0 = time.perf_counter()
        args.model = make_random_checkpoint(
            target, args.random_model, args.tokenizer, "cuda" if args.device != "cpu" else "cpu"
        )
        print(
            f"wrote a random {args.random_model} checkpoint to {args.model}"
            f" in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    result = asyncio.run(run(args))
    for path in write_results(result, args.out):
        print(path)
    print(json.dumps({k: result[k] for k in ("label", "latency_ms", "cached_latency_ms", "empty_responses")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
