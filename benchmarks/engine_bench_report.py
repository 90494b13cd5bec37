"""The report of ``benchmarks/engine_bench.py``: its JSON and the markdown tables (issues 8 and 17)."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import torch


def decode_cells(r: dict, digits: int) -> str:
    """The report's 'decode only' cells: tok/s | ms/step, or why they are not measured."""
    if r.get("decode_tokens_per_s") is None:
        return f"not measured: {r.get('decode_not_measured', 'older run format')} | -"
    return f"{r['decode_tokens_per_s']:.{digits}f} | {r['decode_ms_per_step']:.2f}"


class Report:
    def __init__(self, out: Path, argv: list[str], dev: str) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        gpu = torch.cuda.get_device_properties(0) if dev == "cuda" else None
        self.data: dict[str, Any] = {
            "machine": {
                "gpu": gpu.name if gpu else "none (CPU smoke run)",
                "gpu_memory_gib": round(gpu.total_memory / 2**30, 1) if gpu else 0,
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "python": platform.python_version(),
                "host": platform.node(),
            },
            "command": "python " + " ".join(argv),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "sections": {},
        }
        try:
            import transformers

            self.data["machine"]["transformers"] = transformers.__version__
        except ImportError:
            pass

    def add(self, key: str, value: Any) -> None:
        self.data["sections"][key] = value
        self.write()

    def write(self) -> None:
        (self.out / "engine_h200.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.out / "engine_h200.md").write_text(self.markdown())

    def markdown(self) -> str:
        """Long on purpose: one report template written out in the order it reads, not logic."""
        d, s = self.data, self.data["sections"]
        m = d["machine"]
        lines = [
            "# Engine benchmark (issues 8 and 17)",
            "",
            f"Machine: {m['gpu']} ({m['gpu_memory_gib']} GiB), torch {m['torch']} (CUDA {m['cuda']}), "
            f"transformers {m.get('transformers', '-')}, Python {m['python']}. Date: {d['date_utc']} UTC.",
            f"Command: `{d['command']}`",
            "",
            "Random bf16 weights at the real shapes, batch 1, 512-token prompt, block 4, CUDA-graph runner.",
            "",
        ]
        if "bandwidth" in s:
            lines += [
                f"Measured copy bandwidth (read + write): **{s['bandwidth']['tb_per_s']:.2f} TB/s**.",
                "",
            ]
        lines += [
            "## (a) ms per denoising step vs roofline",
            "",
            "| model | weights | roofline ms | Triton step ms (4 tok) | x roofline "
            "| Triton first step (8 tok) | torch-kernel graph step ms | x roofline "
            "| its first step (8 tok) | eager step ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name in ("1.7B", "8B", "4B"):
            r = s.get(f"step_{name}")
            if r:
                fast = (
                    f"{r['fast_ms']:.2f} | {r['fast_ms'] / r['roofline_ms']:.2f} | {r['fast_ms_8']:.2f}"
                    if "fast_ms" in r
                    else f"- | - | - ({r.get('fast_skipped')})"
                )
                lines.append(
                    f"| {name} | {r['weight_gb']:.2f} GB | {r['roofline_ms']:.2f} | {fast} | "
                    f"{r['graph_ms']:.2f} | {r['graph_ms'] / r['roofline_ms']:.2f} | {r['graph_ms_8']:.2f} | "
                    f"{r['eager_ms']:.2f} |"
                )
        lines += [
            "",
            "## (b) generated tokens/s, batch 1",
            "",
            "| model | tokens/step | steps/block | new tokens | tok/s (whole call) | tok/s (decode only) "
            "| ms/step (decode only) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name in ("1.7B", "8B"):
            for k in (1, 2):
                r = s.get(f"gen_{name}_{k}")
                if r:
                    lines.append(
                        f"| {name} | {k} | {r['steps_per_block']} | {r['new_tokens']} | "
                        f"{r['tokens_per_s']:.1f} | {decode_cells(r, 1)} |"
                    )
        lines += [
            "",
            "## (c) autoregressive baseline: HF Qwen3ForCausalLM.generate, same weights",
            "",
            "| model | mode | new tokens | tok/s | warm-up s |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key in ("hf_eager", "hf_compiled"):
            r = s.get(key)
            if r and "tokens_per_s" in r:
                lines.append(
                    f"| {r['model']} | {r['mode']} | {r['tokens']} | {r['tokens_per_s']:.1f} | "
                    f"{r['warmup_s']:.1f} |"
                )
            elif r:
                lines.append(f"| {r.get('model', '-')} | {key} | - | not measured: {r.get('skipped')} | - |")
        if "ar_limit" in s:
            a = s["ar_limit"]
            lines += [
                "",
                f"AR physical limit at this shape: {a['weight_gb']:.2f} GB of weights / "
                f"{a['tb_per_s']:.2f} TB/s = **{a['tokens_per_s']:.0f} tok/s**.",
            ]
        lines += [
            "",
            "## (d) batched throughput at the 4B shape (512-token prompts)",
            "",
            "| batch | tokens/step/row | new tokens/row | tok/s, whole call (all rows) | tok/s, decode only "
            "| ms/step, decode only |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for b in sorted({int(k.split("_")[1]) for k in s if k.startswith("batch_")}):
            for k in (1, 2):
                r = s.get(f"batch_{b}_{k}")
                if r:
                    lines.append(
                        f"| {b} | {k} | {r['new_tokens']} | {r['tokens_per_s']:.0f} | {decode_cells(r, 0)} |"
                    )
        compiled = [
            (n, s[f"step_{n}"]) for n in ("1.7B", "8B") if "compiled_graph_ms" in s.get(f"step_{n}", {})
        ]
        if compiled:
            lines += [
                "",
                "torch.compile'd step inside the graph: "
                + ", ".join(
                    f"{n} {r['compiled_graph_ms']:.2f} ms "
                    f"({r['compiled_graph_ms'] / r['roofline_ms']:.2f}x roofline, "
                    f"compile {r['compile_s']:.0f} s)"
                    for n, r in compiled
                ),
            ]
        if s.get("notes"):
            lines += ["", "## Notes", ""] + [f"- {n}" for n in s["notes"]]
        return "\n".join(lines) + "\n"
