"""The int8 KV cache (kv_dtype / kv_cache "q8"): its definition in the numpy reference (hetero.ops.llm.kv_q8_round),
the Attention op over it, and its accuracy loss against the exact float32 cache on the transformers fixtures.

Measured with ``python benchmarks/kv_cache.py accuracy`` (docs/llm.md, "KV cache"): over the fixtures' prompts and
chat (176 positions per family, logits std ~1.5) q8 moves logits by at most 0.16 (mean 0.012-0.019), keeps 98-99%
of top-1 choices and changes the mean NLL by at most +0.003 nats; f16 by at most 0.009 (mean < 1e-3), 100% top-1.
The bounds below leave a factor of 2.5-3 on those, for other ISA paths' rounding.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from hetero.contract import HeteroError
from hetero.llm import cli
from hetero.ops.llm import KV_Q8_BLOCK, kv_q8_round, kv_round

from .helpers import FIXTURES, expected, load
from .test_llm_ops import f32, naive_attention, run


# -- the format ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [8, 32, 80, 128])
def test_q8_round_is_int8_times_a_block_scale(d):
    x = f32(6, 3, d) * 3
    x[..., 0] *= 40  # an outlier channel: its block's scale only
    y = kv_q8_round(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    for lo in range(0, d, KV_Q8_BLOCK):
        xb, yb = x[..., lo:lo + KV_Q8_BLOCK], y[..., lo:lo + KV_Q8_BLOCK]
        scale = np.abs(xb).max(-1, keepdims=True) / np.float32(127)
        q = yb / scale
        np.testing.assert_allclose(q, np.rint(q), atol=1e-3)  # integer multiples of the scale ...
        assert np.abs(q).max() <= 127 + 1e-3  # ... within int8's symmetric range
        assert np.all(np.abs(yb - xb) <= scale * (0.5 + 1e-4))  # round to nearest: at most half a step off
    if d > KV_Q8_BLOCK:  # the outlier's block is coarse, the next block keeps its own fine scale
        assert np.abs(y[..., 32:64] - x[..., 32:64]).max() < np.abs(y[..., :32] - x[..., :32]).max() / 10


def test_q8_round_edge_values():
    x = np.zeros((2, 40), np.float32)
    x[1, 33] = -5.0
    y = kv_q8_round(x)
    assert not np.any(np.isnan(y))
    np.testing.assert_array_equal(y, x)  # zero blocks stay zero, a block's amax is exact (q = ±127)
    np.testing.assert_array_equal(kv_round(x, "f32"), x)
    assert kv_round(np.float32([[1 / 3]]), "f16")[0, 0] == np.float32(np.float16(1 / 3))


# -- the Attention op over it ----------------------------------------------------------------------------------------
def test_attention_q8_cache_attends_over_the_rounded_keys_and_values():
    state: dict = {}
    q, k, v = f32(6, 4, 40), f32(6, 2, 40), f32(6, 2, 40)
    pl = lambda n: np.array(n, dtype=np.int64)  # noqa: E731
    out = run("Attention", [q, k, v, pl(0)], state, max_context=8, kv_dtype="q8")
    np.testing.assert_allclose(out, naive_attention(q, kv_q8_round(k), kv_q8_round(v), np.arange(6)), atol=1e-5)
    assert np.abs(out - naive_attention(q, k, v, np.arange(6))).max() > 1e-4  # it really is quantized
    # roll back to 3 (a chat turn that shares a prefix): positions are quantized one by one, nothing else changes
    q2, k2, v2 = f32(2, 4, 40), f32(2, 2, 40), f32(2, 2, 40)
    out = run("Attention", [q2, k2, v2, pl(3)], state, max_context=8, kv_dtype="q8")
    keys, values = kv_q8_round(np.concatenate([k[:3], k2])), kv_q8_round(np.concatenate([v[:3], v2]))
    np.testing.assert_allclose(out, naive_attention(q2, keys, values, [3, 4]), atol=1e-5)


def test_attention_refuses_unknown_kv_dtype():
    args = [f32(1, 2, 8), f32(1, 2, 8), f32(1, 2, 8), np.array(0, dtype=np.int64)]
    with pytest.raises(HeteroError, match=r"kv_dtype 'i4'.*f16, f32, q8"):
        run("Attention", args, {}, max_context=4, kv_dtype="i4")


def test_load_refuses_unknown_kv_cache():
    with pytest.raises(HeteroError, match="kv_cache='int8'"):
        load(FIXTURES / "qwen3", kv_cache="int8")


# -- accuracy against the float32 cache ------------------------------------------------------------------------------
def _logits(family: str, kv_cache: str) -> tuple[np.ndarray, np.ndarray]:
    """Every position's logits over the fixture's prompts and chat, and each position's next token (-1: none)."""
    exp = expected(family)
    llm = load(FIXTURES / family, kv_cache=kv_cache, all_logits=True, prefill_chunk=0)
    chunks, targets = [], []
    for ids in [p["ids"] for p in exp["prompts"]] + [exp["chat"]["ids"]]:
        llm.reset()
        chunks.append(llm.prefill(ids))
        targets.append(np.array([*ids[1:], -1]))
    return np.concatenate(chunks), np.concatenate(targets)


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    keep = targets >= 0
    z = logits[keep].astype(np.float64)
    z -= z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-logp[np.arange(keep.sum()), targets[keep]].mean())


def test_q8_kv_cache_accuracy_loss_is_bounded(family):
    exact, targets = _logits(family, "f32")
    half, _ = _logits(family, "f16")
    q8, _ = _logits(family, "q8")
    d8, d16 = np.abs(q8 - exact), np.abs(half - exact)
    worst = d8.max(-1)  # per position
    # MoE: a perturbation may flip a token's top-k routing, which moves that position's logits by a lot (seen: 5.8
    # and 2.6 at 2 of 578 positions of text); bound all but the worst tenth of positions there.
    assert (np.quantile(worst, 0.9) if family == "qwen3_moe" else worst.max()) < 0.4
    assert d8.mean() < 0.05
    assert np.mean(q8.argmax(-1) == exact.argmax(-1)) >= 0.95
    assert abs(_nll(q8, targets) - _nll(exact, targets)) < 0.01
    assert d16.max() < 0.03 and np.all(half.argmax(-1) == exact.argmax(-1))
    assert d8.mean() > 5 * d16.mean()  # q8 is the coarser of the two: the comparison measures something


# -- command line ----------------------------------------------------------------------------------------------------
def test_cli_kv_cache_option_reaches_the_model():
    parser = argparse.ArgumentParser(prog="hetero")
    cli.add_llm_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["generate", str(FIXTURES / "qwen3"), "hi", "--kv-cache", "q8", "-c", "64"])
    llm = cli._load(args)
    assert llm.kv_cache == "q8"
    assert {n.attrs["kv_dtype"] for n in llm.session.graph.nodes if n.op_type == "Attention"} == {"q8"}
    assert parser.parse_args(["bench", "--kv-cache", "q8"]).kv_cache == "q8"
    assert parser.parse_args(["chat", "m"]).kv_cache == "f16"  # the default
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--kv-cache", "q4"])
