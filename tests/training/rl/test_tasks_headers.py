"""``.cu`` tasks that compile with their project's headers: ``folder`` / ``include_paths`` read from
``cu_infill.jsonl`` relative to the task file, checked, and never part of the prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.rl.tasks import MASK, CuHeaders, TaskFileError, make_task, read_task_file

CU = '#include "common.cuh"\n__global__ void k(float* x, int n) {\n    if (threadIdx.x < n) {\n        '
CU += MASK + "\n    }\n}\n"
RECORD = {"id": "cu0", "text": CU, "target": "x[threadIdx.x] = SCALE;", "kind": "statement"}


def _task_file(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "out" / "cu_infill.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _tree(tmp_path: Path) -> None:
    (tmp_path / "out/cu_projects/o+r/src").mkdir(parents=True)
    (tmp_path / "out/cu_projects/o+r/include").mkdir(parents=True)


def test_folders_resolve_against_the_task_files_folder(tmp_path: Path, monkeypatch) -> None:
    _tree(tmp_path)
    with_headers = RECORD | {
        "id": "cu1",
        "folder": "cu_projects/o+r/src",
        "include_paths": ["cu_projects/o+r/include"],
    }
    path = _task_file(tmp_path, [RECORD, with_headers])
    monkeypatch.chdir(tmp_path)  # not the task file's folder: the paths must not depend on it
    plain, task = read_task_file(path)
    out = tmp_path / "out"
    assert plain.headers is None
    assert task.headers == CuHeaders(
        str(out / "cu_projects/o+r/src"), (str(out / "cu_projects/o+r/include"),)
    )
    assert task.prompt == plain.prompt and "cu_projects" not in task.prompt  # the prompt is the file's text
    assert task.record["folder"] == "cu_projects/o+r/src"  # the record stays as read


def test_a_folder_alone_is_enough(tmp_path: Path) -> None:
    _tree(tmp_path)
    task = make_task(RECORD | {"folder": "out/cu_projects/o+r/src"}, base_dir=tmp_path)
    assert task.headers == CuHeaders(str(tmp_path / "out/cu_projects/o+r/src"), ())


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"folder": "cu_projects/o+r/missing"}, "folder 'cu_projects/o+r/missing' is not a folder"),
        (
            {"folder": "cu_projects/o+r/src", "include_paths": ["nope"]},
            "include_paths 'nope' is not a folder",
        ),
        ({"folder": 3}, "field 'folder' must be a non-empty string"),
        ({"folder": ""}, "field 'folder' must be a non-empty string"),
        ({"include_paths": ["cu_projects/o+r/include"]}, "field 'folder' must be a non-empty string"),
        ({"folder": "cu_projects/o+r/src", "include_paths": "cu_projects"}, "list of non-empty strings"),
        ({"folder": "cu_projects/o+r/src", "include_paths": [1]}, "list of non-empty strings"),
    ],
)
def test_malformed_or_missing_folders_name_the_file_and_line(
    tmp_path: Path, fields: dict, words: str
) -> None:
    _tree(tmp_path)
    path = _task_file(tmp_path, [RECORD, RECORD | {"id": "bad"} | fields])
    with pytest.raises(TaskFileError) as err:
        read_task_file(path)
    assert f"{path}:2 (id 'bad')" in str(err.value) and words in str(err.value)
