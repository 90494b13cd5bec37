"""Assistant benchmark: what ``dice complete`` costs per file, split into model load, generation and
validation, plus the cost of the same request again (document cache).

    python benchmarks/assistant_bench.py [--model PATH] [--candidates 3] [--repeats 3] [--results DIR]
                                         [FILE.cu ...]

Default files: the examples with masks. Each repeat uses a fresh service around the already-loaded engine
(and one shared validator pool), so fills are recomputed; the pool answers a candidate it has already
validated from its own verdict cache, so validation is reported for the first repeat (cold) and for the
later ones (warm) apart. Writes assistant_bench.json and assistant_bench.md to --results (default
benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dice.assistant import AssistantService, AssistantSettings  # noqa: E402
from dice.cuda_source import parse_document  # noqa: E402


def _machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = os.getloadavg()
    return info


def main(argv: list[str] | None = None) -> int:
    """Long on purpose: the whole measurement protocol, read top to bottom in the order it runs (a
    benchmark script, as nanochat's are); split into helpers, the protocol would be scattered."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--model", default=None)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--validation", choices=["none", "compile", "run"], default="run")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    files = args.files or sorted(
        p for p in (ROOT / "examples").glob("*.cu") if parse_document(p.read_text()).masks
    )
    settings = AssistantSettings(
        model_path=args.model,
        candidates=args.candidates,
        max_latency_ms=0,
        validation_level=args.validation,
        trusted_workspace=True,  # the repository's own examples
    )

    from dice.validator import ValidatorPool

    t0 = time.perf_counter()
    loader = AssistantService(settings)
    info = asyncio.run(loader.load())
    load_s = time.perf_counter() - t0
    engine = loader.engine  # one engine for every repeat: the load is measured once, above
    print(f"model: {info.describe()} loaded in {load_s:.2f}s", flush=True)

    rows: list[dict[str, Any]] = []
    with ValidatorPool() as pool:
        for path in files:
            text = path.read_text()
            masks = len(parse_document(text).masks)
            runs = []
            for repeat in range(args.repeats):
                service = AssistantService(settings, engine=engine, validator=pool)
                result = asyncio.run(service.complete_document(text))
                t = time.perf_counter()
                again = asyncio.run(service.complete_document(text))
                cached_s = time.perf_counter() - t
                assert again.from_cache
                tokens = sum(c.tokens or 0 for m in result.masks for c in m.candidates)
                runs.append(
                    {
                        **result.stats,
                        "cached_s": cached_s,
                        "tokens": tokens,
                        "best": None if result.best_verdict is None else result.best_verdict.status,
                    }
                )
                print(
                    f"{path.name} #{repeat}: generate {result.stats['generate_s']:.2f}s, validate "
                    f"{result.stats['validate_s']:.2f}s, total {result.stats['total_s']:.2f}s, "
                    f"{tokens} tokens, cache hit {cached_s * 1000:.2f} ms",
                    flush=True,
                )

            def median(key: str, runs: list[dict[str, Any]] = runs) -> float:
                return statistics.median(r[key] for r in runs)

            rows.append(
                {
                    "file": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                    "masks": masks,
                    "generate_s": median("generate_s"),
                    "validate_cold_s": runs[0]["validate_s"],
                    "validate_warm_s": statistics.median(r["validate_s"] for r in runs[1:])
                    if runs[1:]
                    else None,
                    "total_cold_s": runs[0]["total_s"],
                    "steps": median("steps"),
                    "tokens": median("tokens"),
                    "cached_ms": median("cached_s") * 1000,
                    "best_verdict": runs[-1]["best"],
                    "runs": runs,
                }
            )
    loader.close()

    command = "python benchmarks/assistant_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    payload = {
        "command": command.strip(),
        "machine": _machine(),
        "model": info.to_json(),
        "load_s": load_s,
        "settings": {
            "candidates": args.candidates,
            "validation": args.validation,
            "block_size": settings.block_size,
            "steps_per_block": settings.steps_per_block,
            "policy": settings.policy,
            "max_new_tokens": settings.max_new_tokens,
        },
        "files": rows,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "assistant_bench.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = [
        "# dice complete: cost per file",
        "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {payload['machine']['platform']}, {payload['machine']['cpus']} CPUs, "
        f"GPU: {payload['machine']['cuda'] or 'none'}, torch {payload['machine']['torch']}, load average "
        f"at start {payload['machine'].get('loadavg_at_start', ['?'])[0]:.1f} (shared machine)  ",
        f"Model: {info.describe()}, loaded in {load_s:.2f} s  ",
        f"Settings: {args.candidates} candidates per mask, validation {args.validation}, block "
        f"{settings.block_size}, {settings.steps_per_block} steps/block, {settings.policy}. "
        f"{args.repeats} repeats, each with a fresh service around the loaded engine.",
        "",
        "| file | masks | tokens (kept candidates) | steps | generate s (median) | validate s (cold) "
        "| validate s (warm) | total s (cold) | same request again ms | best verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        warm = "-" if r["validate_warm_s"] is None else f"{r['validate_warm_s']:.2f}"
        best = r["best_verdict"] or "no candidate (blank fills only)"
        lines.append(
            f"| {r['file']} | {r['masks']} | {r['tokens']:.0f} | {r['steps']:.0f} | "
            f"{r['generate_s']:.2f} | {r['validate_cold_s']:.2f} | {warm} | "
            f"{r['total_cold_s']:.2f} | {r['cached_ms']:.2f} | {best} |"
        )
    (args.results / "assistant_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
