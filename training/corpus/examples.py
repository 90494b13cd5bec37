"""The corpus record: one chat example, and the ``.jsonl(.gz)`` files that hold them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

TASKS = ("kernelbench", "dice_infill", "cu_infill")


@dataclass(frozen=True)
class Example:
    """One chat example. ``prompt`` is the rendered ChatML prompt up to and including the assistant header
    (and the template's response prefix); ``response`` is the text the model must produce."""

    id: str
    group: str  # unit of the held-out split: problem key "L{level}P{id}", or "<repo>:<path>" of a real file
    task: str  # one of TASKS
    source: str  # data folder (and kind for generated examples)
    prompt: str
    response: str
    meta: dict | None = None  # for evaluation: prefix/middle/suffix of infill examples

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Example:
        """One record: this class's own JSON, or a CuKe ``sft.jsonl`` record (``dice cuke build``: DICE's
        ``{prompt, response}`` form, the prompt being the user's text, plus ``id``, ``level``, ``source``,
        ``speedup``, ``group``), whose prompt gets the chat template the engine prompts with."""
        data = json.loads(line)
        if not isinstance(data, dict) or "prompt" not in data or "response" not in data:
            raise ValueError("an example needs 'prompt' and 'response'")
        known = {f for f in cls.__dataclass_fields__}
        if known.issuperset(data) and {"id", "group", "task", "source"} <= data.keys():
            return cls(**data)
        from engine.prompts import chat

        prompt = data["prompt"]
        if "<|im_start|>" not in prompt:
            prompt = chat(prompt)
        extra = {k: v for k, v in data.items() if k not in known}
        rid = str(data.get("id", ""))
        return cls(
            id=rid,
            group=str(data.get("group") or rid),
            task=str(data.get("task") or "kernelbench"),
            source=str(data.get("source") or "cuke"),
            prompt=prompt,
            response=data["response"],
            meta={**(data.get("meta") or {}), **extra} or None,
        )


def open_text(path: Path, mode: str = "rt"):
    """A text file, gzip-compressed when the name ends in ``.gz``."""
    if str(path).endswith(".gz"):
        import gzip

        return gzip.open(path, mode, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def read_examples(path: Path) -> list[Example]:
    """Examples from a .jsonl (or .jsonl.gz) file."""
    with open_text(Path(path)) as fh:
        return [Example.from_json(line) for line in fh if line.strip()]


def read_code_texts(path: Path) -> list[str]:
    """The ``text`` of every record of a .jsonl(.gz) of files (the cuda-corpus schema, as
    ``dice train corpus`` writes ``train_files.jsonl.gz``)."""
    out = []
    with open_text(Path(path)) as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{n}: a file record needs a 'text' string")
            out.append(record["text"])
    return out
