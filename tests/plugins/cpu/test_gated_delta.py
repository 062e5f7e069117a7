"""The CPU plugin's GatedDeltaRule kernel (hetero_cpu/kernels/gated_delta.py on src/gated_delta*.cpp) against the
numpy reference of hetero.ops.gated_delta (float64), on every ISA path this CPU has, with 1 and several threads:
the recurrence and the chunked form, calls crossing chunk boundaries, GQA-style head sharing, rollback through the
snapshots, and the Qwen3.5 fixtures end to end on cpu. Accuracy contract: float32 rounding (1e-4 relative)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)
if not hasattr(_native, "gated_delta"):
    pytest.skip("hetero-cpu was built without the gated delta kernels", allow_module_level=True)

from hetero.contract import (  # noqa: E402
    Device,
    NodeInfo,
    Tensor,
    registry,
)
from hetero.contract.graph import HETERO_DOMAIN, Node  # noqa: E402
from hetero.contract.registry import OpContext  # noqa: E402
from hetero.runtime.infer import info_of  # noqa: E402
from hetero_cpu.backend import CpuBackend  # noqa: E402
from hetero_cpu.kernels import KERNELS  # noqa: E402

from .conftest import thread_counts  # noqa: E402

CPU = CpuBackend(Device("cpu"))  # the backend the kernels under test belong to

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"
CONSTANTS = (1, 5, 6, 7, 9)


threads = thread_counts(1, 3)


class Pair:
    """The cpu kernel and the reference, fed the same calls."""

    def __init__(self, hk, hv, dk, dv, k=4, seed=0, bias=False, norm=True, gate=(0.005, 0.5), **attrs):
        self.hk, self.hv, self.dk, self.dv = hk, hv, dk, dv
        self.c = 2 * hk * dk + hv * dv
        r = np.random.default_rng(seed)
        self.w = (0.5 * r.standard_normal((self.c, k))).astype(np.float32)
        self.bias = (0.1 * r.standard_normal(self.c)).astype(np.float32) if bias else None
        self.a_log = np.log(r.uniform(*gate, hv)).astype(np.float32)  # exp(a_log): the gate's strength
        self.dt = r.standard_normal(hv).astype(np.float32)
        self.nw = (1 + 0.1 * r.standard_normal(dv)).astype(np.float32) if norm else None
        self.attrs = dict(k_heads=hk, v_heads=hv, k_dim=dk, v_dim=dv, **attrs)
        self.rng = r
        self.state: dict = {}
        self.kernel = None

    def inputs(self, t: int, past: int) -> list:
        r = self.rng
        f = (lambda *s: r.standard_normal(s).astype(np.float32))  # noqa: E731
        z = f(t, self.hv * self.dv) if self.nw is not None else None
        return [f(t, self.c), self.w, f(t, self.hv), f(t, self.hv), np.array(past, dtype=np.int64), self.bias,
                self.a_log, self.dt, z, self.nw]

    def __call__(self, t: int, past: int) -> tuple[np.ndarray, np.ndarray]:
        inputs = self.inputs(t, past)
        node = Node("GatedDeltaRule", [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)], ["y"],
                    self.attrs, domain=HETERO_DOMAIN)
        infos = [None if v is None else info_of(v) for v in inputs]
        schema = registry.get(HETERO_DOMAIN, "GatedDeltaRule")
        (out_info,) = schema.infer(OpContext(node, infos, inputs, 1))
        (want,) = schema.reference(OpContext(node, infos, inputs, 1, None, self.state))
        if self.kernel is None:
            info = NodeInfo(node, infos, [out_info], {i: inputs[i] for i in CONSTANTS if inputs[i] is not None}, 1)
            factory = KERNELS[(HETERO_DOMAIN, "GatedDeltaRule")]
            assert factory.accepts(info)
            self.kernel = factory(info, CPU)
        got = np.full(out_info.shape, np.nan, dtype=np.float32)
        self.kernel.prepare(infos, [out_info])
        self.kernel.run([None if v is None else Tensor.from_numpy(v) for v in inputs], [Tensor.from_numpy(got)])
        return got, want


def close(got, want, tol=1e-4):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("mode", ["recurrent", "chunked", "auto"])
@pytest.mark.parametrize("shape", [(2, 4, 16, 16), (1, 1, 32, 24), (2, 2, 128, 128)])
def test_matches_reference(isa, threads, mode, shape):
    pair = Pair(*shape, mode=mode, bias=shape[0] == 1)
    past = 0
    for t in (70, 1, 1, 64, 3, 130):  # crossing 64-position chunks at odd offsets
        if shape[2] == 128 and t > 64:
            t //= 2
        close(*pair(t, past))
        past += t


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_strong_gates(isa, threads, mode):
    # Qwen3.5's A_log range: a chunk's cumulative gate reaches -1000, so e^G and the decayed state underflow
    # through the denormal range (flushed to zero by the kernel) to 0.
    pair = Pair(2, 2, 128, 128, gate=(1.0, 16.0), mode=mode)
    past = 0
    for t in (100, 1, 64, 37):
        close(*pair(t, past))
        past += t


@pytest.mark.parametrize("chunk_size", [5, 24, 37])
def test_odd_chunks_and_head_sizes(isa, chunk_size):
    # sizes that are no multiple of the micro-kernel's tile rows or vector width: every tail path
    pair = Pair(1, 3, 20, 12, bias=True, mode="chunked", chunk_size=chunk_size)
    past = 0
    for t in (41, 2, 19, 60):
        close(*pair(t, past))
        past += t


def test_caller_keeps_denormals(isa, threads):
    # the kernel flushes denormals only while it runs: the caller's (and the pool threads') float mode is restored
    pair = Pair(2, 2, 16, 16, gate=(1.0, 16.0), mode="chunked")
    pair(70, 0)
    tiny = np.float32(1e-38)
    assert tiny / np.float32(16) > 0
    assert np.sum(np.full(4, tiny) / np.float32(16), dtype=np.float32) > 0


def test_without_norm_and_gating_inputs(isa):
    pair = Pair(2, 4, 16, 8, norm=False, mode="chunked")
    close(*pair(90, 0))
    close(*pair(1, 90))


@pytest.mark.parametrize("interval", [0, 64])
def test_rollback(isa, interval):
    pair = Pair(2, 4, 16, 16, snapshot_interval=interval, max_snapshots=2)
    close(*pair(150, 0))
    for p in range(150, 160):
        close(*pair(1, p))
    close(*pair(40, 97))   # into the middle of the prompt: replay from a snapshot
    close(*pair(1, 137))
    close(*pair(20, 5))    # before every snapshot: replay from zero
    close(*pair(5, 25))


def test_refuses_runtime_conv_weight():
    inputs = Pair(1, 1, 8, 8).inputs(3, 0)
    node = Node("GatedDeltaRule", [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)], ["y"],
                dict(k_heads=1, v_heads=1, k_dim=8, v_dim=8), domain=HETERO_DOMAIN)
    infos = [None if v is None else info_of(v) for v in inputs]
    info = NodeInfo(node, infos, [None], {}, 1)
    assert not KERNELS[(HETERO_DOMAIN, "GatedDeltaRule")].accepts(info)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_5_next"])
def test_fixture_models_on_cpu(family):
    import json

    import hetero.llm

    exp = json.loads((FIXTURES / family / "expected.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = hetero.llm.load(FIXTURES / family, backends=["cpu"], on_fallback="error", all_logits=True,
                              context=512, kv_cache="f32")
    with np.load(FIXTURES / family / "logits.npz") as ref:
        prompt = exp["long_prompts"][0]
        logits = llm.prefill(prompt["ids"])
        assert np.abs(logits[prompt["rows"]] - ref["long0"]).max() < 1e-4
    assert llm.session.placement.counts().get("cpu") == len(llm.session.graph.nodes)
