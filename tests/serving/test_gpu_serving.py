"""``dice serve`` on a GPU: the embedded model on CUDA, batched answers against one-by-one ones, and the
remote backend against the in-process engine on the same device.

The engine is loaded in float32 here: these tests check the server (a request in a batch is answered as if
alone, a remote fill equals the in-process one), and only in float32 do one request and sixteen run the same
kernels. In bf16 (CUDA's default) one request's 4 rows per step take the Triton skinny products and sixteen
requests' 64 rows take cuBLAS (``engine.triton_kernels.MAX_ROWS`` = 16): two roundings, either of which can
flip a greedy near-tie, as with any server that batches (docs/SERVING.md). Those two bf16 paths are
checked against each other at the logits level in ``tests/engine/test_gpu_engine.py``."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)"),
]

PROMPTS = [f"__global__ void k{i}(const float* x, float* y, int n) {{\n    int i = " for i in range(16)]


@pytest.fixture(scope="module")
def gpu_served():
    import engine
    from dice.serving import ServeConfig, start_in_thread

    eng = engine.load_engine(None, device="cuda", dtype=torch.float32)
    with start_in_thread(eng, ServeConfig(model_name="dice-tiny")) as running:
        yield eng, running


def _complete(url: str, prompt: str) -> str:
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "policy": "dynamic", "threshold": 0.9}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def test_batched_answers_equal_one_by_one_on_the_gpu(gpu_served):
    _, running = gpu_served
    alone = [_complete(running.url, p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: _complete(running.url, p), PROMPTS))
    assert together == alone


def test_remote_fills_equal_the_engine_on_the_gpu(gpu_served):
    from engine.remote import RemoteEngine

    eng, running = gpu_served
    prefix = "__global__ void saxpy(int n, float a, const float* x, float* y) {\n    int i = "
    kw = {"n": 1, "max_new_tokens": 48, "shape": "statement", "temperature": 0.0, "policy": "dynamic"}
    remote = RemoteEngine(running.url)
    # Both prefill the whole prompt: K/V reused from the prefix cache equal a full prefill only up to bf16
    # rounding (GEMMs of other shapes), which can flip a near-tie, in process as well as served.
    eng.clear_prefix_cache()
    far = [c.text for c in remote.infill(prefix, "\n}\n", **kw)]
    eng.clear_prefix_cache()
    here = [c.text for c in eng.infill(prefix, "\n}\n", **kw)]
    again = [c.text for c in eng.infill(prefix, "\n}\n", **kw)]  # with the prefix reused
    print({"remote": far, "local": here, "local_reused_prefix": again})
    assert far == here
