"""CuKe augmentation (training.cuke.augment, training.cuke.blocks): shape variants that compile and keep the
constants that must stay, layer blocks that run and compute what they say, and the teachers at their
boundaries (a stub OpenAI-compatible server on the loopback, the tiny checkpoint in process)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from dice.validator.reference import check_reference
from engine.prompts import kernelbench_prompt
from training.cuke.augment import (
    EngineTeacher,
    HttpTeacher,
    TeacherError,
    augmentation_plan,
    chat_user_turn,
    classify_constants,
    shape_variants,
    teacher_candidates,
    teacher_from_arg,
)
from training.cuke.blocks import BLOCK_KINDS, MODELS, layer_block_references
from training.cuke.records import Pair

MATMUL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


M = 16 * 2  # rows
K = 48
N = 4095  # misaligned on purpose


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, N)]


def get_init_inputs():
    return []
"""

CONV = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, groups=groups)

    def forward(self, x):
        return torch.relu(self.conv(x))


batch_size = 4
in_channels = 16
out_channels = 32
kernel_size = 3
stride = 2
padding = 1
groups = 8
(height, width) = (24, 16)


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, groups]
"""

REDUCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim)


batch_size = 8
dim1 = 32
dim2 = dim1 * 2
reduce_dim = 1
input_shape = (16, 24)
unused = 4096


def get_inputs():
    return [torch.rand(batch_size, dim2, *input_shape)]


def get_init_inputs():
    return [reduce_dim]
"""

ATTENTION = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0]


batch_size = 4
seq_len = 12
embed_dim = 24
num_heads = 8


def get_inputs():
    return [torch.rand(batch_size, seq_len, embed_dim)]


def get_init_inputs():
    return [embed_dim, num_heads]
"""


def _pair(code: str, pid: str = "test:0") -> Pair:
    return Pair(id=pid, source="test", pytorch_code=code, cuda_code="class ModelNew: pass\n", problem="L1P1")


def _run(code: str) -> torch.Tensor:
    ns: dict = {}
    exec(compile(code, "<reference>", "exec"), ns)  # noqa: S102 - the test's own references
    torch.manual_seed(0)
    with torch.no_grad():
        return ns["Model"](*ns["get_init_inputs"]())(*ns["get_inputs"]())


def _values(code: str) -> dict[str, int]:
    return {name: c.value for name, c in classify_constants(code).items()}


# ------------------------------------------------------------------------------------------ shape variants
@pytest.mark.parametrize(
    "code", [MATMUL, CONV, REDUCE, ATTENTION], ids=["matmul", "conv", "reduce", "attention"]
)
def test_variants_compile_run_and_keep_the_constants_that_must_stay(code):
    before = classify_constants(code)
    variants = shape_variants(_pair(code))
    assert variants, "every test reference has something to scale"
    assert len({v.id for v in variants}) == len(variants)
    for v in variants:
        assert v.id.startswith("test:0~") and v.meta["variant_of"] == "test:0"
        assert (
            v.cuda_code == "class ModelNew: pass\n" and v.problem == "L1P1"
        )  # the kernel and the split unit
        after = _values(v.pytorch_code)
        assert {k: after[k] for k in v.meta["variant"]} == v.meta["variant"]
        for name, c in before.items():
            if c.role == "fixed":
                assert after[name] == c.value, f"{v.id} changed {name}"
            if c.role in ("batch", "size"):
                assert after[name] >= 2
        _run(v.pytorch_code)  # small enough to run on the CPU: the variant is still a working reference


def test_roles_by_name_and_use():
    conv = classify_constants(CONV)
    assert {n: c.role for n, c in conv.items()} == {
        "batch_size": "batch",
        "in_channels": "size",
        "out_channels": "size",
        "kernel_size": "fixed",
        "stride": "fixed",
        "padding": "fixed",
        "groups": "fixed",
        "height": "size",
        "width": "size",
    }
    reduce = classify_constants(REDUCE)
    assert reduce["reduce_dim"].role == "fixed"  # an axis passed to the constructor
    assert reduce["dim2"].role == "derived" and reduce["input_shape[0]"].role == "size"
    assert reduce["input_shape[1]"].role == "size" and "unused" not in reduce
    assert classify_constants(ATTENTION)["num_heads"].role == "fixed"
    axis = "import torch\nn = 64\naxis_len = 3\nd = 2\nx = torch.softmax(torch.rand(n), dim=d)\n"
    axis += (
        "def get_inputs():\n    return [torch.rand(n, axis_len, d)]\ndef get_init_inputs():\n    return []\n"
    )
    assert classify_constants(axis)["d"].why == "used as a dim/axis argument"


def test_rewrites_only_the_literals():
    variants = {v.meta["variant_tag"]: v for v in shape_variants(_pair(MATMUL))}
    assert set(variants) == {"size_x0.5", "size_x2"}  # no batch-like constant
    half, double = variants["size_x0.5"].pytorch_code, variants["size_x2"].pytorch_code
    assert "M = 16  # rows\nK = 24\nN = 2047  # misaligned on purpose\n" in half  # an odd size stays odd
    assert "M = 64  # rows\nK = 96\nN = 8190  # misaligned on purpose\n" in double
    assert half.replace("M = 16", "M = 16 * 2").replace("K = 24", "K = 48").replace("2047", "4095") == MATMUL
    reduce = {v.meta["variant_tag"]: v for v in shape_variants(_pair(REDUCE))}
    code = reduce["size_x2"].pytorch_code
    assert "dim1 = 64\ndim2 = dim1 * 2\n" in code and "input_shape = (32, 48)" in code
    assert _values(code)["dim2"] == 128 and "unused = 4096" in code


def test_divisibility_and_growth_limits():
    # 8 groups divide 16 and 32 channels; halving gives 8 and 16: still divisible, allowed.
    conv = {v.meta["variant_tag"]: v.meta["variant"] for v in shape_variants(_pair(CONV), max_variants=9)}
    assert conv["size_x0.5"] == {"in_channels": 8, "out_channels": 16, "height": 12, "width": 8}
    # 24 = 3 * 8 heads: 12 is not a multiple of 8, so embed_dim may not be halved (48 may).
    attention = {
        v.meta["variant_tag"]: v.meta["variant"] for v in shape_variants(_pair(ATTENTION), max_variants=9)
    }
    assert "size_x0.5" not in attention and attention["size_x2"] == {"seq_len": 24, "embed_dim": 48}
    assert "all_x0.5" not in attention and attention["batch_x0.5"] == {"batch_size": 2}
    # Doubling four sizes is 16x; a limit of 8 refuses it, and the batch alone is still offered.
    limited = shape_variants(_pair(CONV), max_growth=8.0, max_variants=9)
    assert {v.meta["variant_tag"] for v in limited} == {"batch_x0.5", "batch_x2"}
    assert len(shape_variants(_pair(CONV), max_variants=1)) == 1


def test_what_cannot_vary_gives_nothing():
    assert shape_variants(_pair("def broken(:\n")) == []
    fixed = CONV.replace("batch_size = 4", "batch_size = 4\nbatch_size = 5")  # bound twice: not rewritten
    assert "batch_size" not in classify_constants(fixed)
    nothing = "import torch\ndef get_inputs():\n    return [torch.rand(4, 4)]\n"
    nothing += "def get_init_inputs():\n    return []\n"
    assert shape_variants(_pair(nothing)) == []


def test_kernelbench_level1_variants_compile(shared_data):
    path = shared_data / "kernelbench" / "problems.jsonl"
    if not path.is_file():
        pytest.skip("kernelbench/problems.jsonl is absent")
    problems = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    counts = {}
    for level in (1, 2, 3):
        rows = [r for r in problems if r["level"] == level]
        with_variants = total = 0
        for r in rows:
            pair = _pair(r["code"], f"kb:L{level}P{r['problem_id']}")
            before = classify_constants(r["code"])
            variants = shape_variants(pair)
            with_variants += bool(variants)
            total += len(variants)
            for v in variants:
                compile(v.pytorch_code, v.id, "exec")
                check_reference(v.pytorch_code)
                after = _values(v.pytorch_code)
                assert all(after[n] == c.value for n, c in before.items() if c.role == "fixed"), v.id
        counts[level] = (len(rows), with_variants, total)
    print(f"\nshape variants of KernelBench (problems, with a variant, variants) per level: {counts}")
    rows, with_variants, _ = counts[1]
    assert rows == 0 or with_variants >= 0.9 * rows


# ------------------------------------------------------------------------------------------ layer blocks
def test_the_default_grid_is_36_kernelbench_references():
    refs = layer_block_references()
    assert len(refs) == 36 and len({r.id for r in refs}) == 36
    assert {r.meta["block"] for r in refs} == set(BLOCK_KINDS) and {r.meta["model"] for r in refs} == set(
        MODELS
    )
    for r in refs:
        kind = r.id.split(":")[1]
        assert r.id.startswith(f"block:{kind}:") and r.source == "layer-blocks" and r.cuda_code is None
        assert r.level == (3 if kind in ("attention", "mlp") else 2)
        check_reference(r.pytorch_code)
        assert f"batch_size = {r.meta['batch']}\nseq_len = {r.meta['seq_len']}\n" in r.pytorch_code
    llama = next(r for r in refs if r.id == "block:attention:llama3.1-8b_b1_s2048")
    assert "hidden_size = 4096\nn_heads = 32\nn_kv_heads = 8\nhead_dim = 128\n" in llama.pytorch_code


def _module(ref: Pair):
    ns: dict = {}
    exec(compile(ref.pytorch_code, ref.id, "exec"), ns)  # noqa: S102 - generated here
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]())
    return model, ns["get_inputs"](), ns


def _rope_complex(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as a rotation of (x[i], x[i + d/2]) pairs by position * theta^(-2i/d), in complex numbers."""
    d, s = x.shape[-1], x.shape[-2]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.outer(torch.arange(s, dtype=torch.float64), freqs)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double()) * torch.polar(
        torch.ones_like(angle), angle
    )
    return torch.cat((z.real, z.imag), dim=-1).float()


def _attention_by_hand(model, x: torch.Tensor, theta: float) -> torch.Tensor:
    b, s, _ = x.shape
    h, kv, d = model.n_heads, model.n_kv_heads, model.head_dim
    q = _rope_complex(model.q_proj(x).view(b, s, h, d).transpose(1, 2), theta)
    k = _rope_complex(model.k_proj(x).view(b, s, kv, d).transpose(1, 2), theta)
    v = model.v_proj(x).view(b, s, kv, d).transpose(1, 2)
    out = torch.empty(b, h, s, d)
    for head in range(h):
        group = head // (h // kv)  # query head -> the key/value head it shares
        scores = q[:, head] @ k[:, group].transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        out[:, head] = scores.softmax(-1) @ v[:, group]
    return model.o_proj(out.transpose(1, 2).reshape(b, s, h * d))


def test_every_block_runs_on_the_cpu_and_computes_what_it_says():
    refs = layer_block_references(scale_down=True)
    assert len(refs) == len(BLOCK_KINDS) * len(MODELS)
    for ref in refs:
        model, inputs, ns = _module(ref)
        theta = ns.get("rope_theta")
        with torch.no_grad():
            out = model(*inputs)
            kind = ref.meta["block"]
            if kind == "rmsnorm_residual":
                x, residual, weight = inputs
                h = (x + residual).double()
                want = (h / (h.pow(2).mean(-1, keepdim=True) + ns["eps"]).sqrt() * weight.double()).float()
            elif kind == "mlp":
                x = inputs[0]
                gate, up, down = model.gate_proj.weight, model.up_proj.weight, model.down_proj.weight
                want = (x @ gate.T * torch.sigmoid(x @ gate.T) * (x @ up.T)) @ down.T
            elif kind == "rope":
                want = torch.cat([_rope_complex(t, theta) for t in inputs], dim=1)
            else:
                want = _attention_by_hand(model, inputs[0], theta)
                assert (model.q_proj.bias is not None) == ref.meta["qkv_bias"]
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5, msg=ref.id)


def test_blocks_take_shape_variants_like_any_reference():
    ref = next(r for r in layer_block_references(scale_down=True) if r.meta["block"] == "attention")
    variants = shape_variants(ref)
    assert {v.meta["variant_tag"] for v in variants} >= {"batch_x2"}
    for v in variants:
        assert _values(v.pytorch_code)["n_heads"] == ref.meta["n_heads"]
        model, inputs, _ = _module(v)
        size = _values(v.pytorch_code)
        assert model(*inputs).shape == (size["batch_size"], size["seq_len"], size["hidden_size"])


# ------------------------------------------------------------------------------------------ teachers
GOOD_ANSWER = (
    "The kernel:\n```python\nimport torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
    "    def forward(self, x):\n        return x\n```\nDone."
)
GARBAGE_ANSWER = "I would rather not write a kernel today."


def _answer_for(text: str) -> str:
    return GOOD_ANSWER if "GOOD" in text else GARBAGE_ANSWER


class _Stub(BaseHTTPRequestHandler):
    """An OpenAI-compatible server's surface: models, streamed completions, chat completions; the reference
    text picks the behaviour (GOOD, GARBAGE, SLOW, BROKEN)."""

    protocol_version = "HTTP/1.0"
    requests: list[dict] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "stub-teacher", "max_model_len": 65536}]})
        else:
            self._json(404, {"error": {"message": "no such route"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._json(404, {"error": {"message": "no such route"}})
        type(self).requests.append({"path": self.path, **body})
        text = body.get("prompt") or body["messages"][0]["content"]
        if "SLOW" in text:  # past the client's timeout; the client has gone when it wakes
            time.sleep(3.0)
            return None
        if "BROKEN" in text:
            return self._json(500, {"error": {"message": "the model fell over"}})
        answer, n = _answer_for(text), body.get("n", 1)
        if self.path == "/v1/chat/completions":
            choices = [{"index": i, "message": {"role": "assistant", "content": answer}} for i in range(n)]
            return self._json(200, {"choices": choices})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            for part in (answer[:20], answer[20:]):
                self.wfile.write(
                    f"data: {json.dumps({'choices': [{'index': i, 'text': part}]})}\n\n".encode()
                )
            done = {"choices": [{"index": i, "text": "", "finish_reason": "stop"}]}
            self.wfile.write(f"data: {json.dumps(done)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _ref(word: str, pid: str) -> Pair:
    return Pair(
        id=pid, source="layer-blocks", pytorch_code=MATMUL.replace("# rows", f"# {word}"), cuda_code=None
    )


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_http_teacher_reads_programs_and_none_for_garbage(stub_url, api):
    _Stub.requests.clear()
    teacher = HttpTeacher(stub_url, api=api, concurrency=2)
    try:
        good, bad = _ref("GOOD", "block:x:a"), _ref("GARBAGE", "block:x:b")
        programs = teacher.propose([good, bad], samples=2)
        assert programs[1] == [None, None]
        assert len(programs[0]) == 2 and all(p and p.startswith("import torch") for p in programs[0])
        assert "class ModelNew(nn.Module):" in programs[0][0] and "Done." not in programs[0][0]
        sent = next(r for r in _Stub.requests if "GOOD" in json.dumps(r))
        prompt = kernelbench_prompt(good.pytorch_code)
        if api == "completions":
            assert sent["prompt"] == prompt  # DICE's ChatML prompt as raw text, as RemoteEngine sends it
        else:
            assert sent["messages"] == [{"role": "user", "content": chat_user_turn(prompt)}]
            assert "<|im_start|>" not in sent["messages"][0]["content"]
        assert sent["n"] == 2 and sent["temperature"] > 0 and sent["model"] == "stub-teacher"
        pairs = teacher_candidates([good, bad], teacher, samples=2)
        assert [p.id for p in pairs] == ["block:x:a#t0", "block:x:a#t1"]
        assert pairs[0].meta == {"teacher": f"stub-teacher at {stub_url}", "sample": 0}
        assert pairs[0].pytorch_code == good.pytorch_code and pairs[0].cuda_code == programs[0][0]
    finally:
        teacher.close()


def test_http_teacher_failures_say_what_and_where(stub_url):
    teacher = HttpTeacher(stub_url, timeout=0.5, retries=0)
    try:
        start = time.monotonic()
        with pytest.raises(TeacherError, match=r"failed on block:slow: .*timed out"):
            teacher.propose([_ref("SLOW", "block:slow")], samples=1)
        assert time.monotonic() - start < 2.5
        with pytest.raises(TeacherError, match=r"failed on block:broken: .*500 the model fell over"):
            teacher.propose([_ref("BROKEN", "block:broken")], samples=1)
        with pytest.raises(ValueError, match="samples must be >= 1"):
            teacher.propose([_ref("GOOD", "a")], samples=0)
    finally:
        teacher.close()
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(
        TeacherError, match=r"cannot use the teacher at http://127\.0\.0\.1:\d+: .*connection failed"
    ):
        HttpTeacher(f"http://127.0.0.1:{port}", timeout=1.0, retries=0)
    with pytest.raises(ValueError, match="unknown teacher api"):
        HttpTeacher(stub_url, api="grpc")


def test_teacher_from_arg_picks_by_form(stub_url, tmp_path):
    teacher = teacher_from_arg(f" {stub_url}/v1 ")
    assert isinstance(teacher, HttpTeacher) and teacher.name == f"stub-teacher at {stub_url}"
    teacher.close()
    with pytest.raises(TeacherError, match="cannot load the teacher checkpoint"):
        teacher_from_arg(str(tmp_path))  # a folder, but no checkpoint in it
    with pytest.raises(TeacherError, match=r"neither an http\(s\):// URL .* \(no such folder\)"):
        teacher_from_arg(str(tmp_path / "missing"))
    with pytest.raises(TeacherError, match=r"write http://localhost:8000"):
        teacher_from_arg("localhost:8000")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(TeacherError, match="it is a file"):
        teacher_from_arg(str(tmp_path / "weights.bin"))
    with pytest.raises(TeacherError, match="empty"):
        teacher_from_arg("  ")


def test_engine_teacher_plumbing_on_the_tiny_checkpoint(tmp_path):
    from engine.testing import make_tiny_checkpoint

    folder = make_tiny_checkpoint(tmp_path / "tiny")
    teacher = teacher_from_arg(str(folder), device="cpu", max_new_tokens=8)
    assert isinstance(teacher, EngineTeacher) and "tiny" in teacher.name
    too_long = _ref("GOOD", "block:long").pytorch_code + "# " + "padding " * 6000 + "\n"
    refs = [_ref("GOOD", "block:a"), Pair(id="block:long", source="t", pytorch_code=too_long, cuda_code=None)]
    programs = teacher.propose(refs, samples=2)
    assert len(programs) == 2 and len(programs[0]) == 2  # the random model's junk: a program or None
    assert all(p is None or isinstance(p, str) for p in programs[0])
    assert programs[1] == [None, None]  # no room left in the context: no programs, no failure
    pairs = teacher_candidates(refs, teacher, samples=1)
    assert all(p.id == "block:a#t0" and p.meta["teacher"] == teacher.name for p in pairs)


# ------------------------------------------------------------------------------------------ the plan
class _Scripted:
    name = "scripted"

    def __init__(self, answers: list[list[str | None]]) -> None:
        self.answers = answers

    def propose(self, refs: list[Pair], samples: int) -> list[list[str | None]]:
        return self.answers


def test_augmentation_plan_counts_what_a_teacher_run_would_feed():
    pairs = [_pair(MATMUL, "a"), _pair(CONV, "b"), _pair("def broken(:\n", "c")]
    refs = layer_block_references()
    plan = augmentation_plan(pairs, refs, None)
    want = [len(shape_variants(p)) for p in pairs]
    assert plan["shape_variants"] == {
        "pairs": 3,
        "pairs_with_variants": 2,
        "variants": sum(want),
        "per_pair": {"0": 1, "2": 1, "4": 1},
        "scales": [0.5, 2.0],
    }
    assert plan["layer_blocks"]["references"] == 36
    assert plan["layer_blocks"]["by_kind"] == dict.fromkeys(BLOCK_KINDS, 9)
    assert plan["layer_blocks"]["by_level"] == {"2": 18, "3": 18}
    assert plan["teacher"] == {
        "given": False,
        "name": None,
        "samples_per_reference": 4,
        "requests": 0,
        "would_request": 36,
        "would_propose": 144,
    }
    given = augmentation_plan([], refs[:2], _Scripted([]), samples=3)["teacher"]
    assert given["given"] and given["name"] == "scripted" and given["requests"] == 2


def test_teacher_candidates_checks_the_answer_count():
    refs = [_ref("GOOD", "r1"), _ref("GOOD", "r2")]
    with pytest.raises(TeacherError, match="answered 1 of 2 references"):
        teacher_candidates(refs, _Scripted([["x"]]), samples=1)
    pairs = teacher_candidates(refs, _Scripted([[None, "p"], ["q", None]]), samples=2)
    assert [(p.id, p.cuda_code) for p in pairs] == [("r1#t1", "p"), ("r2#t0", "q")]
