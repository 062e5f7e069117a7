"""The cpu Attention kernel's int8 KV cache (kv_dtype "q8") against the numpy reference of hetero.ops.llm, on every
attention ISA path this CPU has (avx512 / avx2 / generic; VNNI plays no part in attention), and a fixture model end
to end on cpu.

Contract: the kernel stores exactly the values ``hetero.ops.llm.kv_q8_round`` defines (int8 times a float32 scale
per block of 32 values of a (position, head) row) and dequantizes them inside the tile kernels, so it matches the
reference up to float32 rounding — the same 2e-5 as the float32 cache; the accuracy loss of q8 itself is measured
against the float32 cache in tests/llm/test_kv_cache_q8.py.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

import hetero.llm  # noqa: E402
from hetero.contract import (  # noqa: E402
    Device,
    HeteroError,
    NodeInfo,
    Tensor,
    registry,
)
from hetero.contract.graph import HETERO_DOMAIN, Node  # noqa: E402
from hetero.contract.registry import OpContext  # noqa: E402
from hetero.runtime.infer import info_of  # noqa: E402
from hetero_cpu.backend import CpuBackend  # noqa: E402
from hetero_cpu.kernels import KERNELS  # noqa: E402

CPU = CpuBackend(Device("cpu"))  # the backend the kernels under test belong to

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"


class Pair:
    """The cpu Attention kernel and the reference (with its own state), fed the same inputs."""

    def __init__(self, hq: int, hkv: int, d: int, max_context: int, kv_dtype: str = "q8") -> None:
        self.hq, self.hkv, self.d = hq, hkv, d
        self.attrs = {"max_context": max_context, "kv_dtype": kv_dtype}
        self.node = Node("Attention", ["q", "k", "v", "p"], ["y"], self.attrs, domain=HETERO_DOMAIN)
        self.schema = registry.get(HETERO_DOMAIN, "Attention")
        q, k, p = np.zeros((1, hq, d), np.float32), np.zeros((1, hkv, d), np.float32), np.array(0, np.int64)
        infos = [info_of(a) for a in (q, k, k, p)]
        (out,) = self.schema.infer(OpContext(self.node, infos, [q, k, k, p], 1))
        factory = KERNELS[(HETERO_DOMAIN, "Attention")]
        info = NodeInfo(self.node, infos, [out], {}, 1)
        assert factory.accepts(info)
        self.kernel = factory(info, CPU)
        self.state: dict = {}

    def step(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, past: int) -> tuple[np.ndarray, np.ndarray]:
        p = np.array(past, dtype=np.int64)
        inputs = [q, k, v, p]
        ctx = OpContext(self.node, [info_of(a) for a in inputs], inputs, 1, None, self.state)
        (ref,) = self.schema.reference(ctx)
        out = np.full((q.shape[0], self.hq * self.d), np.nan, np.float32)
        self.kernel.run([Tensor.from_numpy(a) for a in inputs], [Tensor.from_numpy(out)])
        return out, ref


def qkv(t: int, hq: int, hkv: int, d: int, seed: int, outlier: float = 1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    k = rng.standard_normal((t, hkv, d)).astype(np.float32)
    v = rng.standard_normal((t, hkv, d)).astype(np.float32)
    k[..., 1] *= outlier  # one large key channel, as real models have: only its own block's scale grows
    return q, k, v


@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 16), (4, 2, 64), (8, 2, 80), (6, 1, 128), (2, 1, 20), (16, 8, 128)])
def test_q8_cache_matches_reference_prefill_decode_rollback(isa, threads, hq, hkv, d):
    a = Pair(hq, hkv, d, 200)
    # (T, past): prefill over two key tiles, decode, a short chunk, rollback into the first tile, decode, a long
    # chunk that crosses tiles again
    schedule = [(70, 0), (1, 70), (1, 71), (5, 72), (3, 40), (1, 43), (130, 44)]
    for step, (t, past) in enumerate(schedule):
        got, ref = a.step(*qkv(t, hq, hkv, d, seed=step, outlier=20.0), past)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5)
    with pytest.raises(HeteroError, match="exceed the context"):
        a.step(*qkv(27, hq, hkv, d, seed=99), 174)


def test_q8_cache_really_is_int8(isa):
    """The q8 output differs from the float32 cache's by a quantization-sized amount, not by nothing."""
    q, k, v = qkv(40, 4, 2, 64, seed=3)
    q8, f32 = Pair(4, 2, 64, 64, "q8"), Pair(4, 2, 64, 64, "f32")
    got8, _ = q8.step(q, k, v, 0)
    got32, _ = f32.step(q, k, v, 0)
    diff = np.abs(got8 - got32).max()
    assert 1e-4 < diff < 5e-2


def test_native_cache_refuses_unknown_kind():
    with pytest.raises(ValueError, match="kv_dtype 'q4'"):
        _native.LlmAttention(2, 16, 8, "q4")
    assert _native.LlmAttention(2, 16, 8, True).max_context == 8  # the older bool form (f16) still works


def test_fixture_model_on_cpu_equals_reference_with_q8_cache():
    """A whole decoder on cpu (nothing falls back) with the q8 cache: prefill, rollback to a common prefix (as a
    chat turn does), decode — every logit row equals the reference backend's q8 run."""
    exp = json.loads((FIXTURES / "qwen3" / "expected.json").read_text())
    ids = exp["prompts"][1]["ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = hetero.llm.load(FIXTURES / "qwen3", backends=["cpu"], on_fallback="error", context=128,
                              kv_cache="q8", all_logits=True)
        ref = hetero.llm.load(FIXTURES / "qwen3", backends=["reference"], context=128, kv_cache="q8",
                              all_logits=True)
    turns = [ids, [*ids[:10], 5, 6, 7], [*ids[:10], 5, 6, 7, 8]]  # the second rolls back, the third decodes
    for turn in turns:
        got, want = cpu.prefill(turn), ref.prefill(turn)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert cpu.stats.cached_tokens == len(turns[1])  # the last turn reused the cache
