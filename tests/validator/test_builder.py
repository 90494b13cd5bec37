"""The build cache only the builder writes: keys computed from the call, content-hash manifests, runners
that ask instead of building (:mod:`dice.validator.builder`, :mod:`dice.validator.builds`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dice.validator import fastbuild, sandbox
from dice.validator.batchbuild import Call, call_from_json, call_to_json
from dice.validator.builds import (
    build_into_cache,
    cached_load_inline,
    call_payload,
    extension_key,
    extension_name,
)

from .conftest import RELU_REF, EmulatedJudge, judged


class FakeTorchBuild:
    """``load_inline``'s signature; "builds" by writing ``<build_directory>/<name>.so``."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def __call__(
        self,
        name,
        cpp_sources,
        cuda_sources=None,
        functions=None,
        extra_cflags=None,
        extra_cuda_cflags=None,
        extra_ldflags=None,
        extra_include_paths=None,
        build_directory=None,
        verbose=False,
        with_cuda=None,
        is_python_module=True,
        with_pytorch_error_handling=True,
        keep_intermediates=True,
        use_pch=False,
    ):
        self.calls.append(name)
        if self.fail:
            raise RuntimeError(self.fail)
        (Path(build_directory) / f"{name}.so").write_bytes(f"built {len(self.calls)}".encode())
        return None


def test_keys_are_computed_on_the_json_form() -> None:
    a = extension_key("ext", "int f();", None, (), {"functions": ("f",), "extra_cflags": ("-O3",)})
    b = extension_key(
        "ext", "int f();", None, [], {"functions": ["f"], "extra_cflags": ["-O3"], "verbose": True}
    )
    assert a == b
    assert a != extension_key("ext", "int f();", None, (), {"functions": ["f"], "extra_cflags": ["-O2"]})
    payload = call_payload("ext", ["int f();"], None, (), {"functions": ("f",), "build_directory": "/x"})
    assert payload == {
        "name": "ext",
        "cpp_sources": ["int f();"],
        "cuda_sources": None,
        "args": [],
        "kwargs": {"functions": ["f"]},
    }
    assert call_payload("ext", "int f();", None, (), {"functions": ["f"], "extra_cflags": [object()]}) is None


def test_a_discovered_call_gets_its_key_from_the_builder_not_the_runner() -> None:
    call = Call(0, "ext", "int f();", None, (), {"functions": ["f"]}, key="f" * 64)  # a key that lies
    data = call_to_json(call)
    assert data is not None and "key" not in data
    again = call_from_json(data)
    assert again.key == extension_key("ext", "int f();", None, (), {"functions": ["f"]}) != call.key
    assert call_to_json(Call(0, "ext", "int f();", None, (), {"functions": [object()]})) is None


def test_a_so_is_trusted_only_with_the_builders_manifest(tmp_path: Path) -> None:
    so = tmp_path / "ext_abc.so"
    so.write_bytes(b"\x7fELF built")
    assert fastbuild.verified_so(tmp_path, "ext_abc") is None  # no manifest: an older cache, or planted
    fastbuild.write_manifest(tmp_path, so)
    assert fastbuild.verified_so(tmp_path, "ext_abc") == so
    assert fastbuild.verified_so(tmp_path, "other") is None
    so.write_bytes(b"\x7fELF poisoned")
    assert fastbuild.verified_so(tmp_path, "ext_abc") is None


def test_build_into_cache_builds_once_and_replaces_a_planted_so(tmp_path: Path) -> None:
    fake = FakeTorchBuild()
    kwargs = {"functions": ["f"]}
    key = extension_key("ext", "int f();", None, (), kwargs)
    folder = tmp_path / "torch_ext" / key
    folder.mkdir(parents=True)
    name = extension_name("ext", key, "int f();", None)
    (folder / f"{name}.so").write_bytes(b"planted")
    outcome = build_into_cache(tmp_path, fake, "ext", "int f();", None, [], kwargs)
    assert outcome["ok"] and outcome["key"] == key and fake.calls == [name]
    assert (folder / f"{name}.so").read_bytes() == b"built 1"
    assert fastbuild.verified_so(folder, name) == folder / f"{name}.so"
    assert (
        build_into_cache(tmp_path, fake, "ext", "int f();", None, [], kwargs)["ok"] and len(fake.calls) == 1
    )
    failing = FakeTorchBuild(fail="Error building extension 'bad': error: boom")
    outcome = build_into_cache(tmp_path, failing, "bad", "int g(", None, [], {"functions": ["g"]})
    assert not outcome["ok"] and outcome["message"] == "Error building extension 'bad': error: boom"
    bad = build_into_cache(tmp_path, fake, "ext", "int f();", None, [], {"no_such_flag": 1})
    assert not bad["ok"] and "signature" in bad["message"]


def test_a_runner_asks_the_builder_on_a_miss_and_loads_only_verified_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTorchBuild()
    asked: list[dict] = []

    def builder(call: dict) -> dict:
        asked.append(call)
        return build_into_cache(
            tmp_path,
            fake,
            call["name"],
            call["cpp_sources"],
            call["cuda_sources"],
            call["args"],
            call["kwargs"],
        )

    imported: list[Path] = []
    monkeypatch.setattr(
        fastbuild, "import_extension", lambda name, so, python_module=True: imported.append(so) or name
    )
    records: list[dict] = []

    def load() -> object:
        return cached_load_inline(
            tmp_path,
            records,
            fake,
            "ext",
            "int f();",
            None,
            (),
            {"functions": ("f",)},
            builder,
            tmp_path / "private",
        )

    load()
    assert len(asked) == 1 and asked[0]["kwargs"] == {"functions": ["f"]} and not records[0]["cached"]
    load()
    assert len(asked) == 1 and records[1]["cached"] and len(fake.calls) == 1
    imported[-1].write_bytes(b"changed after the build")
    load()  # fails its hash check: asked again, built again
    assert len(asked) == 2 and len(fake.calls) == 2 and not records[2]["cached"]
    assert len(imported) == 3

    def lying_builder(call: dict) -> dict:
        return {"ok": True}

    with pytest.raises(RuntimeError, match="content-hash check"):
        cached_load_inline(tmp_path, records, fake, "other", "int g();", None, (), {}, lying_builder, None)
    with pytest.raises(RuntimeError, match="boom"):
        cached_load_inline(
            tmp_path,
            records,
            fake,
            "x",
            "int h();",
            None,
            (),
            {},
            lambda call: {"ok": False, "message": "boom"},
            None,
        )


def test_a_call_that_is_not_plain_data_builds_privately(tmp_path: Path) -> None:
    fake = FakeTorchBuild()
    records: list[dict] = []
    odd = {"functions": ["f"], "extra_cflags": [Path("-O3")]}  # a Path: not JSON

    def builder(call: dict) -> dict:
        raise AssertionError("not plain data: never sent")

    cached_load_inline(
        tmp_path / "cache", records, fake, "ext", "int f();", None, (), odd, builder, tmp_path / "private"
    )
    assert fake.calls and records[0]["fallback"].startswith("arguments that are not plain data")
    assert list((tmp_path / "private").glob("*/*.so")) and not (tmp_path / "cache" / "torch_ext").exists()


# ---------------------------------------------------------------------------------- a real build, judged
CPP_RELU = """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_src = "torch::Tensor relu_forward(torch::Tensor x) { return torch::clamp_min(x, 0.0); }"
ext = load_inline("relu_cpp", _src, functions=["relu_forward"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_forward(x)
"""


@pytest.fixture
def building_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An emulated judge without stand-ins: the candidate's C++ extension is really built, by a builder."""
    monkeypatch.setenv("DICE_VALIDATOR_EMULATE", "cpu")
    monkeypatch.delenv("DICE_EMULATED_EXTENSIONS", raising=False)
    monkeypatch.setenv("DICE_PCH_DIR", str(tmp_path.parent / "dice-pch"))  # test_fastbuild's
    j = EmulatedJudge(tmp_path)
    try:
        yield j
    finally:
        j.zygote.close()


@pytest.mark.slow
@pytest.mark.skipif(sandbox.landlock_abi() < 1, reason="the read-only cache is the runner's Landlock layer")
def test_the_builder_builds_what_a_runner_cannot_write(building_judge: EmulatedJudge) -> None:
    cache = building_judge.cache_dir / "torch_ext"
    probe = (
        CPP_RELU
        + f"""
try:
    open({str(cache / "planted.so")!r}, "w").write("poison")
    raise SystemExit("the runner wrote the extension cache")
except PermissionError:
    pass
"""
    )
    v = judged(building_judge, probe, ref=RELU_REF, timing=False)
    assert "builds: relu_cpp (built" in v.log, v.message + v.log
    assert v.status not in ("compile_error", "runtime_error"), v.message + v.log[-3000:]
    manifests = list(cache.glob("*/" + fastbuild.MANIFEST_FILE))
    assert len(manifests) == 1 and not (cache / "planted.so").exists()
    so = manifests[0].parent / json.loads(manifests[0].read_text())["so"]
    assert fastbuild.verified_so(so.parent, so.stem) == so
    again = judged(building_judge, CPP_RELU, ref=RELU_REF, timing=False)
    assert "builds: relu_cpp (cached" in again.log and again.status == v.status, again.log
    broken = CPP_RELU.replace("0.0); }", "0.0) }")
    bad = judged(building_judge, broken, ref=RELU_REF, timing=False)
    assert bad.status == "compile_error" and "relu_cpp" in bad.message + bad.log, bad.message
    assert os.stat(so).st_mtime > 0
