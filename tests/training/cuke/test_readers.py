"""CuKe readers: every format from small files written here, detection by name and by the first record's
keys, schema errors that name the file, the record and the reason, on_error, limit and refused paths; then
the real ../shared/data folders (counts a build's funnel starts from), skipped when they are absent."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dice import safeio
from engine.prompts import infill_prompt, kernelbench_prompt
from training.cuke.readers import FORMATS, detect_format, read_source
from training.cuke.records import CuFile, Pair, ReadError

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
"""
PREFIX = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
MIDDLE = '''source = """
__global__ void relu(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
"""'''
SUFFIX = """

ops = load_inline(name="relu", cpp_sources="", cuda_sources=source, functions=["relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ops.relu(x)
"""
NEW = PREFIX + MIDDLE + SUFFIX


def answer(program: str) -> str:
    return f"Here is the kernel.\n```python\n{program}```\n"


def write_json(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


WRITERS = {"json": write_json, "jsonl": write_jsonl, "jsonl.gz": write_jsonl, "parquet": write_parquet}


def write_rows(tmp_path: Path, kind: str, rows: list[dict[str, Any]], stem: str = "pairs") -> Path:
    return WRITERS[kind](tmp_path / f"{stem}.{kind}", rows)


def read_all(path: Path, fmt: str | None = None, **kwargs: Any) -> list[Any]:
    return list(read_source(path, fmt, **kwargs))


def pair_rows() -> list[dict[str, Any]]:
    return [
        {"pytorch_code": REF, "cuda_code": NEW, "level": 1, "problem_id": 19, "name": "19_ReLU.py",
         "kb_version": "current", "speedup": 2.5, "id": "relu-fast"},
        {"pytorch_code": REF, "cuda_code": None, "level": 2, "problem_id": None, "kb_version": None,
         "speedup": None, "name": None, "id": None},
    ]  # fmt: skip


# --------------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("kind", list(WRITERS))
def test_kernelbench_pairs_in_json_jsonl_gzip_and_parquet(tmp_path: Path, kind: str) -> None:
    path = write_rows(tmp_path, kind, pair_rows())
    assert detect_format(path) == "kernelbench-pairs"  # by the first record's keys
    first, second = read_all(path)
    assert first == Pair(
        id=f"{path.name}:relu-fast", source=path.name, pytorch_code=REF, cuda_code=NEW, problem="L1P19",
        kb_version="current", level=1, name="19_ReLU.py", meta={"claimed_speedup": 2.5},
    )  # fmt: skip
    assert first.problem_ref == "current:L1P19"
    assert (second.id, second.cuda_code, second.level, second.problem, second.meta) == (
        f"{path.name}:1",
        None,
        2,
        None,
        {},
    )  # a reference without a candidate; no problem without problem_id


def test_a_json_object_holding_the_list_under_data_or_records(tmp_path: Path) -> None:
    for key in ("data", "records"):
        path = write_json(tmp_path / f"{key}.json", {"version": 1, key: pair_rows()})
        assert detect_format(path) == "kernelbench-pairs"
        assert [p.cuda_code is None for p in read_all(path)] == [False, True]


def test_pr67_folder_takes_the_best_4_parquet_files_and_ranks_rows_per_problem(tmp_path: Path) -> None:
    folder = tmp_path / "pr67"
    question = kernelbench_prompt(REF)
    rows = [
        {"question": question, "answer": answer(NEW), "level": 1, "problem": "19"},
        {"question": question, "answer": answer(REF), "level": 1, "problem": "19"},  # reference echoed
        {"question": question, "answer": answer(NEW), "level": 2, "problem": "5"},
    ]
    write_parquet(folder / "sft_dataset_best_4_train.parquet", rows)
    write_parquet(folder / "sft_dataset_best_4_eval.parquet", [dict(rows[2], problem="7")])
    write_parquet(folder / "sft_dataset_best_1_train.parquet", rows[:1])  # redundant upstream variant
    write_json(folder / "best_k_kernels_level1.json", {"19": [{"runtime": "1.0"}]})  # no code: not read
    assert detect_format(folder) == "pr67"
    pairs = read_all(folder)
    assert [p.id for p in pairs] == [
        "kernelbench-pr67-dsr1:L2P7:0",  # eval file first (sorted by name)
        "kernelbench-pr67-dsr1:L1P19:0",
        "kernelbench-pr67-dsr1:L1P19:1",
        "kernelbench-pr67-dsr1:L2P5:0",
    ]
    best, echoed = pairs[1], pairs[2]
    assert best.pytorch_code.strip() == REF.strip() and best.cuda_code == NEW
    assert (best.kb_version, best.level, best.problem, best.source) == (
        "v0",
        1,
        "L1P19",
        "kernelbench-pr67-dsr1",
    )
    assert best.meta == {"split": "train", "rank": 0} and pairs[0].meta["split"] == "eval"
    assert echoed.cuda_code is None and echoed.meta["rank"] == 1


def test_cuda_l1_folder_of_json_lines_files(tmp_path: Path) -> None:
    folder = tmp_path / "cuda-l1"
    h100 = [
        {"level_id": 1, "task_id": 19, "ref_code": REF, "custom_code": NEW, "score_default": 3.0,
         "score_cudnn": 1.5, "score_cuda_graph": None},
        {"level_id": 2, "task_id": 5, "ref_code": REF, "custom_code": "None", "score_default": 1.2},
        {"level_id": 3, "task_id": 1, "ref_code": REF, "custom_code": None, "score_default": None},
    ]  # fmt: skip
    write_jsonl(folder / "h100.json", h100)  # JSON Lines under a .json name, as upstream
    write_jsonl(folder / "a100.json", h100[:1])
    assert detect_format(folder) == "cuda-l1"
    pairs = read_all(folder)
    assert [p.id for p in pairs] == [
        "cuda-l1/a100:L1P19",
        "cuda-l1/h100:L1P19",
        "cuda-l1/h100:L2P5",
        "cuda-l1/h100:L3P1",
    ]
    fast = pairs[1]
    assert (fast.cuda_code, fast.kb_version, fast.level, fast.source) == (NEW, "v0", 1, "cuda-l1/h100")
    assert fast.meta == {
        "gpu": "H100", "claimed_speedup": 3.0, "claimed": {"score_default": 3.0, "score_cudnn": 1.5}
    }  # fmt: skip
    assert [p.cuda_code for p in pairs[2:]] == [None, None]  # the string "None" and null: no code
    assert pairs[2].meta["claimed_speedup"] == 1.2  # a claim without code stays a claim


def test_dice_cuke_takes_the_reference_from_the_prompt_and_the_program_from_the_response(
    tmp_path: Path,
) -> None:
    infill, _ = infill_prompt(PREFIX, SUFFIX, context=REF)
    rows = [
        {"prompt": kernelbench_prompt(REF), "response": answer(NEW)},
        {"prompt": kernelbench_prompt(REF, variant="rl"), "response": NEW},
        {"prompt": infill, "response": answer(NEW)},
        {"prompt": kernelbench_prompt(REF), "response": "I cannot do that."},
    ]
    path = write_json(tmp_path / "CuKe_dataset.json", rows)
    assert detect_format(path) == "dice-cuke"
    pairs = read_all(path)
    assert [p.id for p in pairs] == [f"CuKe_dataset.json:{i}" for i in range(4)]
    assert all(p.pytorch_code.strip() == REF.strip() for p in pairs)
    assert [p.cuda_code for p in pairs] == [NEW, NEW, NEW, None]
    assert all(p.kb_version is None and p.problem is None for p in pairs)
    bad = write_json(tmp_path / "CuKe_dataset_bad.json", [{"prompt": "write a kernel", "response": NEW}])
    with pytest.raises(ReadError, match=r"\(record 1\): 'prompt' holds no reference architecture"):
        read_all(bad)


def test_dice_infill_keeps_the_split_and_checks_that_it_rebuilds_the_solution(tmp_path: Path) -> None:
    good = {
        "id": 6995,
        "pytorch_code": REF,
        "cuda_code": NEW,
        "prefix": PREFIX,
        "middle": MIDDLE,
        "suffix": SUFFIX,
    }
    path = write_json(tmp_path / "kernel_infilling_evaluation.json", [good, dict(good, id=7, middle="x")])
    assert detect_format(path) == "dice-infill"
    with pytest.raises(ReadError) as err:
        read_all(path)
    reason = f"prefix + middle + suffix is not cuda_code (they differ from character {len(PREFIX)})"
    assert str(err.value) == f"{path} (record 2): {reason}"
    errors: list[ReadError] = []
    (pair,) = read_all(path, on_error=errors.append)
    assert (pair.id, pair.cuda_code, pair.level) == ("kernel_infilling_evaluation.json:6995", NEW, None)
    assert pair.meta == {"prefix": PREFIX, "middle": MIDDLE, "suffix": SUFFIX}
    assert [e.where for e in errors] == ["record 2"]


def test_dice_e2e_reads_string_levels_and_empty_solutions(tmp_path: Path) -> None:
    rows = [
        {"idx": 0, "level": "0", "pytorch_code": REF, "cuda_code": "", "raw_answer": "\\boxed{0}"},
        {"idx": 1, "level": "2", "pytorch_code": REF, "cuda_code": NEW, "raw_answer": "level \\boxed{2}"},
        {"idx": 2, "level": 3, "pytorch_code": REF, "cuda_code": None, "raw_answer": None},
    ]
    path = write_json(tmp_path / "end_to_end_kernel_generation_4000.json", rows)
    assert detect_format(path) == "dice-e2e"
    pairs = read_all(path)
    assert [(p.id, p.level, p.cuda_code) for p in pairs] == [
        ("end_to_end_kernel_generation_4000.json:0", 0, None),
        ("end_to_end_kernel_generation_4000.json:1", 2, NEW),
        ("end_to_end_kernel_generation_4000.json:2", 3, None),
    ]
    assert pairs[1].meta == {"raw_answer": "level \\boxed{2}"} and pairs[2].meta == {}


def corpus_row(repo: str, path: str, text: str) -> dict[str, Any]:
    data = text.encode("utf-8")
    return {"repo": repo, "commit": "a" * 40, "path": path, "license": "MIT",
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "text": text}  # fmt: skip


def test_cuda_corpus_json_lines_check_hash_and_size(tmp_path: Path) -> None:
    rows = [corpus_row("o/a", "k.cu", "__global__ void k() {}\n"), corpus_row("o/b", "h.cuh", "// é\n")]
    path = write_jsonl(tmp_path / "corpus" / "files.jsonl.gz", rows)
    assert detect_format(path) == detect_format(path.parent) == "cuda-corpus"
    files = read_all(path.parent)
    text = "__global__ void k() {}\n"
    assert files[0] == CuFile(
        id="o/a:k.cu", repo="o/a", path="k.cu", text=text, license="MIT", commit="a" * 40, source="corpus"
    )
    assert files[1].text == "// é\n"
    bad = [dict(rows[0], text="changed"), dict(rows[1], bytes=1)]
    bad_path = write_jsonl(tmp_path / "bad" / "files.jsonl", bad)
    errors: list[ReadError] = []
    assert read_all(bad_path, on_error=errors.append) == []
    assert [(e.where, e.reason) for e in errors] == [
        ("line 1", "'sha256' does not match the text"),
        ("line 2", "'bytes' is 1 but the text has 6"),
    ]


def test_a_folder_of_cu_files_is_a_corpus(tmp_path: Path) -> None:
    root = tmp_path / "myproject"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "a.cu").write_text("__global__ void a() {}\n")
    (root / "sub" / "b.cuh").write_text("__device__ int b();\n")
    (root / ".git" / "c.cu").write_text("hidden\n")
    (root / "notes.txt").write_text("not CUDA\n")
    assert detect_format(root) == "cuda-corpus"
    files = read_all(root)
    assert [(f.id, f.repo, f.path, f.license) for f in files] == [
        ("myproject:a.cu", "myproject", "a.cu", None),
        ("myproject:sub/b.cuh", "myproject", "sub/b.cuh", None),
    ]
    (single,) = read_all(root / "a.cu")
    assert single.id == "myproject:a.cu"


def test_kernelbench_problems_are_current_references(tmp_path: Path) -> None:
    rows = [{"level": 1, "problem_id": 19, "name": "19_ReLU.py", "code": REF}]
    path = write_jsonl(tmp_path / "kernelbench" / "problems.jsonl", rows)
    assert detect_format(path) == detect_format(path.parent) == "kernelbench-problems"
    (pair,) = read_all(path.parent)
    assert pair == Pair(
        id="kernelbench:L1P19", source="kernelbench", pytorch_code=REF, cuda_code=None, problem="L1P19",
        kb_version="current", level=1, name="19_ReLU.py",
    )  # fmt: skip


# ------------------------------------------------------------------------------------------- detection


def test_detection_by_first_record_and_forcing_a_format(tmp_path: Path) -> None:
    assert (
        detect_format(write_jsonl(tmp_path / "chat.jsonl", [{"prompt": "p", "response": "r"}])) == "dice-cuke"
    )
    infill = {"pytorch_code": REF, "cuda_code": NEW, "prefix": PREFIX, "middle": MIDDLE, "suffix": SUFFIX}
    assert detect_format(write_json(tmp_path / "tasks.json", [infill])) == "dice-infill"
    odd = write_json(tmp_path / "odd.json", [{"reference": REF}])
    with pytest.raises(ReadError) as err:
        detect_format(odd)
    message = str(err.value)
    assert message.startswith(f"{odd}: cannot tell") and "--format" in message
    assert all(fmt in message for fmt in FORMATS)
    with pytest.raises(ReadError, match=r"\(record 1\): missing field 'pytorch_code'"):
        read_all(odd, "kernelbench-pairs")  # forced: the schema says what is missing
    with pytest.raises(ReadError, match="unknown format 'csv'"):
        read_source(odd, "csv")


def test_a_folder_of_several_formats_asks_for_one_file(tmp_path: Path) -> None:
    write_json(tmp_path / "CuKe_dataset.json", [{"prompt": "p", "response": "r"}])
    write_json(tmp_path / "end_to_end_x.json", [])
    write_json(tmp_path / "build_report.json", {"files": 3})  # sniffs as nothing: ignored
    with pytest.raises(
        ReadError, match=r"several formats \(dice-cuke: CuKe_dataset.json; dice-e2e: end_to_end"
    ):
        detect_format(tmp_path)
    with pytest.raises(ReadError, match=r"holds no dice-infill file \(kernel_infilling_\*\.json\)"):
        read_source(tmp_path, "dice-infill")


# --------------------------------------------------------------------------------------- schema errors


SCHEMA_ERRORS = [
    ("json", {"cuda_code": NEW}, "record 2", "missing field 'pytorch_code'"),
    (
        "json",
        {"pytorch_code": 3, "cuda_code": NEW},
        "record 2",
        "'pytorch_code' is not a string (got a number)",
    ),
    ("jsonl", {"pytorch_code": "x = 1", "cuda_code": NEW}, "line 2", "'pytorch_code' has no class Model"),
    ("parquet", {"pytorch_code": "x = 1", "cuda_code": NEW}, "row 2", "'pytorch_code' has no class Model"),
    ("jsonl.gz", {"pytorch_code": REF, "cuda_code": REF}, "line 2", "'cuda_code' has no ModelNew"),
    ("json", {"pytorch_code": REF, "cuda_code": NEW, "kb_version": "v9"}, "record 2", "'kb_version' must be"),
    (
        "json",
        {"pytorch_code": REF, "cuda_code": NEW, "level": "one"},
        "record 2",
        "'level' is not an integer",
    ),
    (
        "json",
        {"pytorch_code": REF, "cuda_code": NEW, "speedup": "2x"},
        "record 2",
        "'speedup' is not a number",
    ),
    ("json", {"pytorch_code": REF, "cuda_code": NEW, "id": "relu-fast"}, "record 2", "duplicate id"),
]


@pytest.mark.parametrize(("kind", "bad", "where", "reason"), SCHEMA_ERRORS)
def test_a_bad_record_names_file_place_and_reason(
    tmp_path: Path, kind: str, bad: dict[str, Any], where: str, reason: str
) -> None:
    rows = [pair_rows()[0], bad]
    if kind == "parquet":
        rows = [{k: r.get(k) for k in ("pytorch_code", "cuda_code")} for r in rows]
    path = write_rows(tmp_path, kind, rows)
    with pytest.raises(ReadError) as err:
        read_all(path, "kernelbench-pairs")
    assert (err.value.path, err.value.where) == (str(path), where)
    assert err.value.reason.startswith(reason) and str(err.value).startswith(f"{path} ({where}): {reason}")


def test_broken_json_and_records_that_are_not_objects(tmp_path: Path) -> None:
    lines = tmp_path / "pairs.jsonl"
    lines.write_text(json.dumps(pair_rows()[0]) + "\n{not json\n[1, 2]\n")
    errors: list[ReadError] = []
    assert len(read_all(lines, "kernelbench-pairs", on_error=errors.append)) == 1
    assert [(e.where, e.reason.split(":")[0]) for e in errors] == [
        ("line 2", "not valid JSON"),
        ("line 3", "not a JSON object (got a list)"),
    ]
    whole = tmp_path / "pairs.json"
    whole.write_text('[{"pytorch_code": ')
    with pytest.raises(ReadError, match=r"pairs.json: not valid JSON: Expecting value"):
        read_all(whole, "kernelbench-pairs")
    scalar = write_json(tmp_path / "scalar.json", "text")
    with pytest.raises(ReadError, match="expected a list of records"):
        read_all(scalar, "kernelbench-pairs")


def test_on_error_skips_and_limit_caps(tmp_path: Path) -> None:
    good = pair_rows()[0]
    rows = [dict(good, id=i) if i % 3 else {"pytorch_code": "nope"} for i in range(10)]
    path = write_json(tmp_path / "pairs.json", rows)
    errors: list[ReadError] = []
    pairs = read_all(path, on_error=errors.append)
    assert [p.id for p in pairs] == [f"pairs.json:{i}" for i in (1, 2, 4, 5, 7, 8)]
    assert [e.where for e in errors] == ["record 1", "record 4", "record 7", "record 10"]
    assert [p.id for p in read_all(path, limit=3, on_error=lambda e: None)] == [
        f"pairs.json:{i}" for i in (1, 2, 4)
    ]
    assert read_all(path, limit=0) == []
    with pytest.raises(ValueError):
        read_source(path, limit=-1)


# ---------------------------------------------------------------------------------------------- refusals


def test_a_fifo_a_missing_file_and_an_oversize_file_are_refused_unopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "pairs.jsonl"
    os.mkfifo(fifo)  # opening it would block: the check must come first
    for call in (lambda: detect_format(fifo), lambda: read_source(fifo, "kernelbench-pairs")):
        with pytest.raises(ReadError, match=r"is a named pipe \(FIFO\), not a regular file"):
            call()
    with pytest.raises(ReadError, match="no such file"):
        read_source(tmp_path / "missing.json")
    big = write_rows(tmp_path, "json", pair_rows(), stem="big")
    monkeypatch.setattr(safeio, "DATA_LIMIT", 100)
    with pytest.raises(ReadError, match="the data file is too large"):
        read_source(big)


def test_a_fifo_inside_a_cu_folder_is_skipped_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "good.cu").write_text("__global__ void k() {}\n")
    os.mkfifo(tmp_path / "stuck.cu")
    with pytest.raises(ReadError, match="stuck.cu: is a named pipe"):
        read_all(tmp_path, "cuda-corpus")
    errors: list[ReadError] = []
    assert [f.path for f in read_all(tmp_path, on_error=errors.append)] == ["good.cu"]
    assert [Path(e.path).name for e in errors] == ["stuck.cu"]


def test_a_folder_without_data_is_refused_cleanly(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("nothing here\n")
    with pytest.raises(ReadError, match="cannot tell which format"):
        read_source(tmp_path)
    with pytest.raises(ReadError, match="holds no cuda-corpus file"):
        read_source(tmp_path, "cuda-corpus")
    sub = tmp_path / "CuKe_dataset.json"
    sub.mkdir()  # a folder under a data file's name
    with pytest.raises(ReadError, match="holds no dice-cuke file"):
        read_source(sub, "dice-cuke")


# ------------------------------------------------------------------------------------- real shared data


def shared(shared_data: Path, name: str) -> Path:
    path = shared_data / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path


def test_real_pr67_release(shared_data: Path) -> None:
    pairs = read_all(shared(shared_data, "kernelbench-pr67-dsr1"))
    assert len(pairs) == 791 and len({p.id for p in pairs}) == 791  # 711 train + 80 eval rows
    assert sum(p.cuda_code is not None for p in pairs) == 722  # 647 + 75 ModelNew answers (SOURCE.md)
    assert len({p.problem for p in pairs}) == 200 and {p.kb_version for p in pairs} == {"v0"}
    assert Counter(p.meta["split"] for p in pairs) == {"train": 711, "eval": 80}
    assert all("class Model" in p.pytorch_code for p in pairs)


def test_real_cuda_l1_release(shared_data: Path) -> None:
    pairs = read_all(shared(shared_data, "cuda-l1"))
    assert Counter(p.source for p in pairs) == {"cuda-l1/h100": 250, "cuda-l1/a100": 250}
    with_code = Counter(p.source for p in pairs if p.cuda_code is not None)
    assert with_code == {"cuda-l1/h100": 210, "cuda-l1/a100": 225}  # SOURCE.md's "records with real code"
    assert Counter(p.level for p in pairs) == {1: 200, 2: 200, 3: 100}
    fast = [
        p
        for p in pairs
        if p.source == "cuda-l1/h100" and p.cuda_code and (p.meta["claimed_speedup"] or 0) >= 2.0
    ]
    assert len(fast) == 49  # SOURCE.md: 49 H100 records at >= 2.0x with code


def test_real_kernelbench_problems(shared_data: Path) -> None:
    pairs = {p.id: p for p in read_all(shared(shared_data, "kernelbench"))}
    assert len(pairs) == 270 and {p.kb_version for p in pairs.values()} == {"current"}
    relu = pairs["kernelbench:L1P19"]
    assert (relu.name, relu.level, relu.cuda_code, relu.problem_ref) == (
        "19_ReLU.py",
        1,
        None,
        "current:L1P19",
    )


def test_real_cuda_corpus(shared_data: Path) -> None:
    files = read_all(shared(shared_data, "cuda-corpus"))
    assert len(files) == 3804 and len({f.id for f in files}) == 3804
    assert len({f.repo for f in files}) == 33 and {f.source for f in files} == {"cuda-corpus"}
    assert sum(len(f.text.encode("utf-8")) for f in files) == 46_060_673
    assert files[0].id == "ggml-org/ggml:src/ggml-cuda/acc.cu" and files[0].license == "MIT"


def test_a_pair_file_without_cuda_code_is_reference_only(tmp_path):
    """DICE's RL task files (kernelbench_level1.json) carry pytorch_code alone: references, not errors."""
    path = tmp_path / "kernelbench_level1.json"
    path.write_text(json.dumps([{"pytorch_code": REF, "level": 1, "problem_id": 3}]))
    (rec,) = list(read_source(path, "kernelbench-pairs"))
    assert rec.cuda_code is None and rec.problem == "L1P3"
