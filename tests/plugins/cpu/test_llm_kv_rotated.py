"""The cpu Attention kernel's rotated low-bit KV caches (kv_dtype "q4r" / "q3r") against the numpy reference of
hetero.contract.kv_rotated, on every attention ISA path this CPU has (avx512 / avx2 / generic: the decoders differ),
and a fixture model end to end on cpu.

Contract: the kernel stores exactly the codes and float16 scales the reference defines (its exported bytes equal
``pack_codes`` of the reference's codes) and attends in the rotated domain (query rotated, output un-rotated), which
equals attention over the reference's un-rotated values up to float32 rounding: 2e-5 here, as for the other types.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import hetero.llm
from hetero.contract import HeteroError
from hetero.contract import kv_rotated as kr
from hetero.llm import snapshot

from .test_llm_kv_q8 import Pair, _native, qkv

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "llm"
KINDS = ("q4r", "q3r")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (6, 1, 128), (4, 4, 32), (8, 2, 96), (2, 1, 256)])
def test_rotated_cache_matches_reference_prefill_decode_rollback(isa, threads, kind, hq, hkv, d):
    a = Pair(hq, hkv, d, 200, kind)
    # prefill over two key tiles, decode, a short chunk, rollback into the first tile, decode, a long chunk that
    # crosses tiles again (a rolled-back position's codes are overwritten bit by bit)
    schedule = [(70, 0), (1, 70), (1, 71), (5, 72), (3, 40), (1, 43), (130, 44)]
    for step, (t, past) in enumerate(schedule):
        got, ref = a.step(*qkv(t, hq, hkv, d, seed=step, outlier=20.0), past)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_exported_bytes_are_the_reference_codes_and_scales(kind):
    """The native layout is the documented one: V rows = pack_codes(codes), V scales = float16 scales; the K tile's
    rows hold the same codes along positions, then its float16 scales [nb][64]."""
    bits, hkv, d, n = kr.KV_ROTATED_BITS[kind], 2, 64, 70
    cache = _native.LlmAttention(hkv, d, 128, kind)
    q, k, v = qkv(n, 2, hkv, d, seed=5, outlier=20.0)
    cache(q, k, v, 0, d**-0.5, np.empty((n, 2 * d), np.float32))
    kb, vb, sb = cache.export(n)
    m = kr.key_mean(k)  # [hkv, d]: the keys' centre, the first d float32 of each head's K bytes
    np.testing.assert_array_equal(kb[:, :4 * d].view(np.float32), m)
    kb = kb[:, 4 * d:]
    kcodes, kscales = kr.quantize(kr.rotate(k.transpose(1, 0, 2) - m[:, None, :]), bits)  # [hkv, n, d], [.., nb]
    vcodes, vscales = kr.quantize(kr.rotate(v.transpose(1, 0, 2)), bits)
    np.testing.assert_array_equal(vb.reshape(hkv, n, -1), kr.pack_codes(vcodes, bits))
    np.testing.assert_array_equal(sb.view(np.float16).reshape(hkv, n, -1), vscales)
    row = 8 * bits  # one dimension's 64 positions: two packed blocks of 4 * bits bytes
    tile = d * row + (d // 32) * 64 * 2
    assert kb.shape == (hkv, 2 * tile)  # 70 positions: two tiles
    first = kb[:, :tile]
    packed = first[:, :d * row].reshape(hkv, d, row)
    want = kcodes[:, :64, :].transpose(0, 2, 1)  # [hkv, d, positions]
    np.testing.assert_array_equal(packed, kr.pack_codes(want, bits))
    tscales = first[:, d * row:].view(np.float16).reshape(hkv, d // 32, 64)
    np.testing.assert_array_equal(tscales, kscales[:, :64, :].transpose(0, 2, 1))


@pytest.mark.parametrize("kind", KINDS)
def test_export_load_round_trip_continues_identically(kind):
    q, k, v = qkv(90, 4, 2, 64, seed=7)
    a, b = _native.LlmAttention(2, 64, 128, kind), _native.LlmAttention(2, 64, 128, kind)
    out_a, out_b = np.empty((90, 256), np.float32), np.empty((3, 256), np.float32)
    a(q, k, v, 0, 0.125, out_a)
    b.load(70, *a.export(90))
    q2, k2, v2 = qkv(3, 4, 2, 64, seed=8)
    a(q2, k2, v2, 70, 0.125, out_a[:3])
    b(q2, k2, v2, 70, 0.125, out_b)
    np.testing.assert_array_equal(out_a[:3], out_b)
    with pytest.raises(ValueError, match="not an export of 90"):  # shorter than asked for
        b.load(90, *a.export(60))


def test_native_cache_refuses_a_head_dim_it_cannot_rotate():
    with pytest.raises(ValueError, match=r"'q4r' needs head_dim a multiple of 32 \(at most 2048\), got 80"):
        _native.LlmAttention(2, 80, 8, "q4r")
    with pytest.raises(ValueError, match="expected f16, f32, q8, q4r or q3r"):
        _native.LlmAttention(2, 64, 8, "q2r")


def test_rotated_caches_are_lossy_by_their_bits(isa):
    """Against the float32 cache: q3r further off than q4r, q4r further than q8 — each really quantizes."""
    q, k, v = qkv(64, 4, 2, 128, seed=3, outlier=10.0)
    outs = {kind: Pair(4, 2, 128, 64, kind).step(q, k, v, 0)[0] for kind in ("f32", "q8", "q4r", "q3r")}
    err = {kind: np.abs(outs[kind] - outs["f32"]).mean() for kind in ("q8", "q4r", "q3r")}
    assert 0 < err["q8"] < err["q4r"] < err["q3r"] < 0.2, err


@pytest.mark.parametrize("kind", KINDS)
def test_fixture_model_on_cpu_equals_reference_with_rotated_cache(kind):
    """A whole decoder on cpu (nothing falls back) with the rotated cache: prefill, rollback to a common prefix,
    decode — every logit row equals the reference backend's run with the same cache type."""
    exp = json.loads((FIXTURES / "qwen3" / "expected.json").read_text())
    ids = exp["prompts"][1]["ids"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = hetero.llm.load(FIXTURES / "qwen3", backends=["cpu"], on_fallback="error", context=128,
                              kv_cache=kind, all_logits=True)
        ref = hetero.llm.load(FIXTURES / "qwen3", backends=["reference"], context=128, kv_cache=kind,
                              all_logits=True)
    turns = [ids, [*ids[:10], 5, 6, 7], [*ids[:10], 5, 6, 7, 8]]  # the second rolls back, the third decodes
    for turn in turns:
        got, want = cpu.prefill(turn), ref.prefill(turn)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert cpu.stats.cached_tokens == len(turns[1])


@pytest.mark.parametrize("kind", KINDS)
def test_a_restored_prefix_gives_the_logits_of_computing_it(kind):
    """hetero.llm.snapshot over the rotated cache (its state arrays are the kernel's own bytes, the keys' centre
    included): restored into another model at 64+ tokens (a partial K tile too) it continues bit for bit like
    computing the prefix (the centre is the mean of the first 64 keys in both); shorter, it is the source's centre
    and continues close to, not exactly like, computing 5 tokens."""
    def load() -> hetero.llm.Llm:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hetero.llm.load(FIXTURES / "qwen3", backends=["cpu"], context=256, on_fallback="silent",
                                   kv_cache=kind)
    source, fresh, computed = load(), load(), load()
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 200, 90)]
    source.prefill(prompt)
    snap = snapshot.export(source, 0, len(prompt))
    for keep in (70, 64, 5):
        snapshot.restore(fresh, 0, snap, keep)
        fresh.tokens = prompt[:keep]
        computed.reset()
        computed.forward(prompt[:keep])
        got, want = fresh.forward([11, 12, 13]), computed.forward([11, 12, 13])
        if keep >= 64:
            assert np.array_equal(got, want), keep
        else:
            assert not np.array_equal(got, want) and np.abs(got - want).mean() < 1.0  # q3r vs f32: ~0.5
    with pytest.raises(HeteroError, match="does not fit"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other = hetero.llm.load(FIXTURES / "qwen3", backends=["cpu"], context=256, on_fallback="silent",
                                    kv_cache="q8")
        snapshot.restore(other, 0, snap, 10)
