"""A corpus file's project headers: resolution against the in-memory corpus (relative, include root from the
spelled suffix, nearest of several, transitive, cycles, bounds, includes left to the compiler), the tree
written under the build's output folder, and a build whose kernel compiles under real NVRTC only with its
repository's headers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.cuke import headers
from training.cuke.build import BuildConfig, build
from training.cuke.cu_tasks import MASK, CuTaskStats, cu_infill_tasks, nvrtc_compiles
from training.cuke.headers import HeaderIndex, HeaderTree, includes_of, sees_any
from training.cuke.records import CuFile

REPO = "acme/kern"


def _files(tree: dict[str, str], repo: str = REPO) -> list[CuFile]:
    return [CuFile(f"{repo}:{path}", repo, path, text) for path, text in tree.items()]


def _resolve(tree: dict[str, str], path: str, repo: str = REPO) -> headers.Resolution:
    return HeaderIndex(_files(tree, repo)).resolve(repo, path, tree[path])


def test_includes_are_read_in_order_outside_block_comments() -> None:
    text = '#include "a.h"\n/* #include "hidden.h"\n*/  #  include <b/c.cuh>\n'
    text += '#include MACRO\n#include "w\\x.h"\n'
    assert includes_of(text) == [
        headers.Include("a.h", False),
        headers.Include("b/c.cuh", True),
        headers.Include("w/x.h", False),
    ]


def test_a_quoted_include_resolves_beside_its_includer_first() -> None:
    tree = {
        "src/k.cu": '#include "util.cuh"\n#include "../common/defs.h"\n',
        "src/util.cuh": "",
        "other/util.cuh": "",
        "common/defs.h": "",
    }
    res = _resolve(tree, "src/k.cu")
    assert res.files == ("common/defs.h", "src/util.cuh") and res.roots == () and res.complete


def test_a_suffix_match_puts_its_include_root_on_the_path() -> None:
    tree = {
        "src/k.cu": '#include "lib/math.cuh"\n#include <top.h>\n',
        "include/lib/math.cuh": "",
        "top.h": "",
    }
    res = _resolve(tree, "src/k.cu")
    assert res.files == ("include/lib/math.cuh", "top.h")
    assert res.roots == ("include", "")  # "" is the repository root


def test_the_nearest_of_two_candidates_wins() -> None:
    tree = {
        "a/x/k.cu": '#include "cfg.h"\n',
        "a/x/inc/cfg.h": "",  # shares a/x with the includer
        "b/inc/cfg.h": "",
    }
    res = _resolve(tree, "a/x/k.cu")
    assert res.files == ("a/x/inc/cfg.h",) and res.roots == ("a/x/inc",)


def test_resolution_is_transitive_and_relative_to_each_header() -> None:
    tree = {
        "src/k.cu": '#include "lib/a.cuh"\n',
        "include/lib/a.cuh": '#include "detail/b.cuh"\n#include <lib/c.cuh>\n',
        "include/lib/detail/b.cuh": '#include "../c.cuh"\n',
        "include/lib/c.cuh": '#include <cuda_fp16.h>\n#include "not_in_corpus.h"\n',
    }
    res = _resolve(tree, "src/k.cu")
    assert res.files == ("include/lib/a.cuh", "include/lib/c.cuh", "include/lib/detail/b.cuh")
    assert res.roots == ("include",)
    # the toolkit's header and the project header the corpus lacks are the compiler's to find (or not)
    assert res.unresolved == ("cuda_fp16.h", "not_in_corpus.h") and res.complete


def test_a_cycle_between_headers_ends() -> None:
    tree = {"k.cu": '#include "a.h"\n', "a.h": '#include "b.h"\n', "b.h": '#include "a.h"\n'}
    res = _resolve(tree, "k.cu")
    assert res.files == ("a.h", "b.h") and res.complete


def test_a_file_included_back_by_its_headers_is_incomplete() -> None:
    tree = {"k.cuh": '#include "impl.h"\n', "impl.h": '#include "k.cuh"\n'}
    res = _resolve(tree, "k.cuh")
    assert not res.complete and "itself" in (res.reason or "")


def test_missing_headers_are_left_alone() -> None:
    tree = {"k.cu": '#include <cuda_runtime.h>\n#include "gone.h"\n#include "../../outside.h"\n'}
    res = _resolve(tree, "k.cu")
    assert res.files == () and res.unresolved == ("cuda_runtime.h", "gone.h", "../../outside.h")
    assert HeaderTree(HeaderIndex(_files(tree)), "/nonexistent").context(REPO, "k.cu", tree["k.cu"]) is None


def test_bounds_make_a_resolution_incomplete(monkeypatch) -> None:
    chain = {f"h{i}.h": f'#include "h{i + 1}.h"\n' for i in range(6)} | {"k.cu": '#include "h0.h"\n'}
    assert _resolve(chain, "k.cu").complete
    monkeypatch.setattr(headers, "MAX_DEPTH", 3)
    res = _resolve(chain, "k.cu")
    assert not res.complete and "deeper" in (res.reason or "")
    monkeypatch.setattr(headers, "MAX_DEPTH", 32)
    monkeypatch.setattr(headers, "MAX_FILES", 2)
    assert not _resolve(chain, "k.cu").complete


def test_the_tree_writes_needed_headers_once_and_prunes_the_rest(tmp_path: Path) -> None:
    tree_files = {
        "src/k.cu": '#include "lib/a.cuh"\n__global__ void k() {}\n',
        "src/j.cu": '#include "lib/b.cuh"\n__global__ void j() {}\n',
        "include/lib/a.cuh": '#include "shared.cuh"\n',
        "include/lib/b.cuh": '#include "shared.cuh"\n',
        "include/lib/shared.cuh": "#define SHARED 1\r\n",  # CRLF kept
        "include/lib/unused.cuh": "",
    }
    tree = HeaderTree(HeaderIndex(_files(tree_files)), tmp_path)
    contexts = tree.stage(_files(tree_files))
    k = contexts[f"{REPO}:src/k.cu"]
    assert k.folder == "cu_projects/acme+kern/src"
    assert k.include_paths == ("cu_projects/acme+kern/include",)
    assert k.include_dirs(tmp_path) == (str(tmp_path / k.folder), str(tmp_path / k.include_paths[0]))
    base = tmp_path / "cu_projects" / "acme+kern"
    assert (base / "include/lib/shared.cuh").read_bytes() == b"#define SHARED 1\r\n"
    assert tree.stats.written == 3 and not (base / "include/lib/unused.cuh").exists()
    removed = tree.prune({f"{REPO}:src/k.cu": k})
    assert removed == {"cu_projects/acme+kern/include/lib/b.cuh"}
    assert sees_any(k, removed) and not sees_any(k, {"cu_projects/other+repo/include/lib/b.cuh"})
    assert (base / "include/lib/a.cuh").is_file() and (base / "src").is_dir()
    assert (tree.stats.kept, tree.stats.pruned) == (2, 1)


# ------------------------------------------------------------------------------------------ real NVRTC

SCALE_CU = """#include "common.cuh"
#include "acme/math.cuh"

__global__ void scale(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = acme_twice(SCALE * x[i]);
    }
}
"""
PLAIN_CU = """__global__ void add(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = y[i] + x[i];
    }
}
"""
BROKEN_CU = """#include "acme/only_broken.cuh"

__global__ void broken(float* y, int n) {
    int i = threadIdx.x;
    if (i < n) {
        y[i] = ONLY_BROKEN + undefined_name;
    }
}
"""
CORPUS = {
    "src/ops/scale.cu": SCALE_CU,
    "src/ops/common.cuh": "#pragma once\n#define SCALE 3.0f\n",
    "include/acme/math.cuh": '#pragma once\n#include "detail/impl.cuh"\n'
    "__device__ inline float acme_twice(float v) { return acme_impl_twice(v); }\n",
    "include/acme/detail/impl.cuh": "#pragma once\n"
    "__device__ inline float acme_impl_twice(float v) { return 2.0f * v; }\n",
    "include/acme/only_broken.cuh": "#pragma once\n#define ONLY_BROKEN 1.0f\n",
    "include/acme/unused.cuh": "#pragma once\n",
    "src/plain.cu": PLAIN_CU,
    "src/broken.cu": BROKEN_CU,
}


@pytest.fixture(scope="module")
def nvrtc() -> None:
    pytest.importorskip("cupy", reason="NVRTC comes through CuPy, which is not installed")
    if not nvrtc_compiles(PLAIN_CU):
        pytest.skip("NVRTC is unavailable here (CuPy is installed but could not compile a trivial kernel)")


def test_a_kernel_compiles_only_with_its_repository_headers(nvrtc, tmp_path: Path) -> None:
    files = _files(CORPUS)
    tree = HeaderTree(HeaderIndex(files), tmp_path)
    ctx = tree.stage(files)[f"{REPO}:src/ops/scale.cu"]
    assert not nvrtc_compiles(SCALE_CU)
    assert nvrtc_compiles(SCALE_CU, ctx.include_dirs(tmp_path))
    broken = SCALE_CU.replace("SCALE * x[i]", "SCALE * missing[i]")
    assert not nvrtc_compiles(broken, ctx.include_dirs(tmp_path))  # the headers do not make anything pass
    stats = CuTaskStats()
    tasks = list(
        cu_infill_tasks(
            [files[0]], per_file=3, headers={files[0].id: ctx}, headers_base=tmp_path, stats=stats
        )
    )
    assert tasks and all(t["folder"] == "cu_projects/acme+kern/src/ops" for t in tasks)
    assert all(t["include_paths"] == ["cu_projects/acme+kern/include"] for t in tasks)
    assert (stats.compiled_standalone, stats.headers_tried, stats.compiled_with_headers) == (0, 1, 1)


def test_the_build_carries_headers_with_the_tasks_that_need_them(nvrtc, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = [{"repo": REPO, "path": p, "text": t, "license": "MIT"} for p, t in CORPUS.items()]
    (corpus / "files.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    cfg = BuildConfig(sources=[corpus], out=out, no_gpu=True, cu_holdout_fraction=0.0, cu_holes_per_file=2)
    rep = build(cfg, compile_check=nvrtc_compiles)
    rows = [json.loads(line) for line in (out / "cu_infill.jsonl").read_text().splitlines()]
    by_origin: dict[str, list[dict]] = {}
    for row in rows:
        by_origin.setdefault(row["origin"], []).append(row)
    scale, math, impl, plain = (
        f"{REPO}:{p}"
        for p in ("src/ops/scale.cu", "include/acme/math.cuh", "include/acme/detail/impl.cuh", "src/plain.cu")
    )
    assert set(by_origin) == {scale, math, impl, plain}  # a header with device functions is a file too
    for origin in (plain, impl):  # compile alone: the schema is unchanged
        assert all(
            set(row) == {"id", "text", "target", "origin", "has_spec", "kind"} for row in by_origin[origin]
        )
    for row in by_origin[scale]:
        assert row["folder"] == "cu_projects/acme+kern/src/ops"
        assert row["include_paths"] == ["cu_projects/acme+kern/include"]
        assert row["text"].replace(MASK, row["target"], 1) == SCALE_CU
        assert "SCALE 3.0f" not in row["text"]  # headers never enter the prompt text
    for row in by_origin[math]:  # its own header is found beside it: no include root
        assert (row["folder"], row["include_paths"]) == ("cu_projects/acme+kern/include/acme", [])
    written = sorted(p.relative_to(out).as_posix() for p in (out / "cu_projects").rglob("*") if p.is_file())
    assert written == [
        "cu_projects/acme+kern/include/acme/detail/impl.cuh",
        "cu_projects/acme+kern/include/acme/math.cuh",
        "cu_projects/acme+kern/src/ops/common.cuh",
    ]  # not only_broken.cuh (its file failed), not unused.cuh (nothing includes it)
    c = rep.cu_tasks
    assert (c["compiled_standalone"], c["headers_tried"], c["compiled_with_headers"]) == (2, 3, 2)
    assert c["compiled"] == 4 and c["headers"]["kept"] == 3 and c["headers"]["pruned"] == 1
    assert "2 more with their project's headers" in (out / "card.md").read_text()
