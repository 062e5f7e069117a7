"""The native ``fused_attention`` kernel (``hetero::FusedAttention``) on every ISA path: K^T read where it lies (a
[B, H, d, T] tensor in memory, as khmer_segmenter's graph transposes K before the product: its rows copied whole;
or K [B, H, T, d] through strides), the scores' divisor and mask applied in the softmax row's pass
(``scores_softmax_rows``), rows of scores that end in a ragged vector (T = 66 = 4 x 16 + 2) through the masked tails,
rows of up to 8 vectors softmaxed in registers (two at a time up to 5: an odd S leaves a last row alone; T = 129:
the pass over memory).
Against the same ISA's unfused native calls (MatMul, Mul / Div / Add, Softmax, MatMul) bit for bit, and a float64
numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

_native = pytest.importorskip(
    "hetero_cpu._native",
    reason="the hetero-cpu native extension is not built (pip install --no-build-isolation ./plugins/cpu)",
)

f32 = np.float32


def _unfused(q, kt, v, mask, scale: float, divisor: float) -> np.ndarray:
    """The written-out nodes on the native kernels: [B*H] batched products, the binary ops, the row softmax."""
    b, h, s, d = q.shape
    t, dv = kt.shape[3], v.shape[3]
    scores = np.empty((b * h, s, t), f32)
    _native.matmul(np.ascontiguousarray(q).reshape(b * h, s, d), np.ascontiguousarray(kt).reshape(b * h, d, t),
                   scores)
    if scale != 1.0:
        _native.binary("mul", scores, np.broadcast_to(np.array(scale, f32), scores.shape), scores)
    if divisor != 1.0:
        _native.binary("div", scores, np.broadcast_to(np.array(divisor, f32), scores.shape), scores)
    if mask is not None:
        full = np.ascontiguousarray(np.broadcast_to(mask, (b, h, s, t))).reshape(b * h, s, t)
        _native.binary("add", scores, full, scores)
    probs = np.empty_like(scores)
    _native.softmax(scores.reshape(-1, t), probs.reshape(-1, t))
    out = np.empty((b * h, s, dv), f32)
    _native.matmul(probs, np.ascontiguousarray(v).reshape(b * h, t, dv), out)
    return out.reshape(b, h, s, dv)


def _reference(q, kt, v, mask, scale: float, divisor: float) -> np.ndarray:
    scores = q.astype(np.float64) @ kt.astype(np.float64) * scale / divisor
    if mask is not None:  # in float32, as the graph adds it: -10000 + a score keeps 2^-10 of the score's bits
        scores = (scores.astype(f32) + mask).astype(np.float64)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v.astype(np.float64)


MASKS = ("none", "row", "per_query", "per_head")


def _mask(kind: str, b: int, h: int, s: int, t: int, rng: np.random.Generator) -> np.ndarray | None:
    """A mask as the kernel is handed one: a broadcast view (padding [B, 1, 1, T], one value per query [B, 1, S, 1])
    or a whole [B, H, S, T] tensor, with -10000 at a third of its places (not for one value a query: a whole row
    at -10000 keeps 2^-10 of each score's bits, which the float64 reference cannot follow)."""
    shape = {"none": None, "row": (b, 1, 1, t), "per_query": (b, 1, s, 1), "per_head": (b, h, s, t)}[kind]
    if shape is None:
        return None
    masked = rng.random(shape) < (0.0 if kind == "per_query" else 0.3)
    m = np.where(masked, -10000.0, rng.normal(size=shape)).astype(f32)
    return np.broadcast_to(m, (b, h, s, t))


@pytest.mark.parametrize("seq, width", [(66, 32), (19, 20), (16, 64), (70, 64), (1, 8), (7, 24), (128, 32), (129, 16)])
@pytest.mark.parametrize("k_transposed", [True, False])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("scale, divisor", [(1.0, 1.0), (1.0, 8.0), (0.125, 1.0), (0.5, 2.0)])
def test_fused_attention_matches_the_unfused_calls(isa, seq, width, k_transposed, mask_kind, scale, divisor):
    rng = np.random.default_rng(seq * 7 + width)
    b, h, s, d = 1, 2, seq, width
    q = rng.normal(size=(b, h, s, d)).astype(f32)
    if k_transposed:  # K^T contiguous: kt's rows (one per d) are whole runs of T values
        kt = rng.normal(size=(b, h, d, s)).astype(f32)
    else:  # K [B, H, T, d] read through strides as K^T
        kt = rng.normal(size=(b, h, s, d)).astype(f32).transpose(0, 1, 3, 2)
    v = rng.normal(size=(b, h, s, d)).astype(f32)
    mask = _mask(mask_kind, b, h, s, s, rng)
    out = np.empty((b, h, s, d), f32)
    _native.fused_attention(q, kt, v, mask, out, scale, divisor, False)
    np.testing.assert_allclose(out, _reference(q, kt, v, mask, scale, divisor), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out, _unfused(q, kt, v, mask, scale, divisor))


def _native_times(x: np.ndarray, s: float) -> np.ndarray:
    """x * s on the native Mul (the graph's Mul of Q or K by a scalar)."""
    out = np.empty(x.shape, f32)
    _native.binary("mul", np.ascontiguousarray(x), np.broadcast_to(np.array(s, f32), x.shape), out)
    return out


@pytest.mark.parametrize("seq, width", [(66, 32), (19, 20), (70, 64)])
@pytest.mark.parametrize("k_transposed", [True, False])
@pytest.mark.parametrize("q_scale, k_scale", [(0.42044820762685725, 0.42044820762685725), (0.5, 1.0), (1.0, -3.0)])
def test_operand_scales_round_as_the_graphs_muls(isa, seq, width, k_transposed, q_scale, k_scale):
    """q_scale / k_scale (PyTorch's d^-1/4 on Q and on K, folded by fuse_attention): the same bits as multiplying Q
    and K by them on the native Mul first, on the tiles (K^T copied, Q's panels) and on the fallback's copies."""
    rng = np.random.default_rng(seq * 5 + width)
    b, h, s, d = 2, 3, seq, width
    q = rng.normal(size=(b, h, s, d)).astype(f32)
    kt = (rng.normal(size=(b, h, d, s)).astype(f32) if k_transposed
          else rng.normal(size=(b, h, s, d)).astype(f32).transpose(0, 1, 3, 2))
    v = rng.normal(size=(b, h, s, d)).astype(f32)
    mask = _mask("row", b, h, s, s, rng)
    out = np.empty((b, h, s, d), f32)
    _native.fused_attention(q, kt, v, mask, out, 1.0, 8.0, False, q_scale, k_scale)
    qs, kts = _native_times(q, q_scale), _native_times(kt, k_scale)
    expected = np.empty_like(out)
    _native.fused_attention(qs, kts, v, mask, expected, 1.0, 8.0, False)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out, _unfused(qs, kts, v, mask, 1.0, 8.0))
    np.testing.assert_allclose(out, _reference(qs, kts, v, mask, 1.0, 8.0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seq", [1, 7, 70, 129])
def test_t5_shapes_on_one_and_two_threads(isa, threads, seq):
    """T5's heads (6 x 64, a per-head position bias as the mask, Q / K / V read through the [S, H * d] rows the
    projections wrote): the unfused calls' bits and float64's values at 1 and 2 threads."""
    rng = np.random.default_rng(seq)
    h, d = 6, 64
    rows = rng.normal(size=(3, seq, h * d)).astype(f32)
    q = rows[0].reshape(1, seq, h, d).transpose(0, 2, 1, 3)
    kt = rows[1].reshape(1, seq, h, d).transpose(0, 2, 3, 1)
    v = rows[2].reshape(1, seq, h, d).transpose(0, 2, 1, 3)
    mask = rng.normal(size=(1, h, seq, seq)).astype(f32)
    out = np.empty((1, seq, h * d), f32).reshape(1, seq, h, d).transpose(0, 2, 1, 3)
    _native.fused_attention(q, kt, v, mask, out, 1.0, 1.0, False)
    np.testing.assert_allclose(out, _reference(q, kt, v, mask, 1.0, 1.0), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out, _unfused(q, kt, v, mask, 1.0, 1.0))


@pytest.mark.parametrize("seq", [1, 2, 7, 13, 257, 300])
@pytest.mark.parametrize("width", [32, 64, 80, 24])
def test_vit_shapes_on_one_and_two_threads(isa, threads, seq, width):
    """A ViT's heads (DINOv2: Q and K each scaled by d^-1/4, no mask; Q / K / V read through the [S, 3, H, d] rows
    of the qkv projection): 257 tokens = 21 x 12 + 5 rows (the probabilities read in place by a 6-row tile whose
    last row repeats), 300 = 25 x 12, 1 / 2 / 7 / 13 rows; d = 80 = 2 x 32 + 16 columns of V, 24 (V padded, not
    in place). The unfused calls' bits and float64's values at 1 and 2 threads."""
    rng = np.random.default_rng(seq * 3 + width)
    h = 3
    qkv = rng.normal(size=(1, seq, 3, h, width)).astype(f32)
    q = qkv[:, :, 0].transpose(0, 2, 1, 3)
    kt = qkv[:, :, 1].transpose(0, 2, 3, 1)
    v = qkv[:, :, 2].transpose(0, 2, 1, 3)
    out = np.empty((1, seq, h, width), f32).transpose(0, 2, 1, 3)
    by = float(width) ** -0.25
    _native.fused_attention(q, kt, v, None, out, 1.0, 1.0, False, by, by)
    qs, kts = _native_times(q, by), _native_times(kt, by)
    np.testing.assert_allclose(out, _reference(qs, kts, v, None, 1.0, 1.0), rtol=1e-4, atol=1e-5)
    if seq != 2:  # the unfused MatMul of 2 rows takes another path with another rounding (on the base build too)
        np.testing.assert_array_equal(out, _unfused(qs, kts, v, None, 1.0, 1.0))


@pytest.mark.parametrize("seq", [1, 5, 39, 70, 71, 128])
@pytest.mark.parametrize("width", [32, 64, 80])
def test_infinite_masks_and_fully_masked_rows(isa, threads, seq, width):
    """A padding mask of -inf (PyTorch's bool mask exported as -inf, not -10000) over a batch of 2, the second
    sequence padded to 3 tokens, plus one query of the first whose every key is -inf: the masked keys' weights are
    exactly 0 (no 2^-10 of a score kept, as -10000 keeps), the fully masked row's probabilities NaN (0 - -inf's
    max - -inf: what the unfused Softmax gives too) and, with nan_to_zero (torch.export's Where(IsNaN)), an output
    row of zeros. Heads of 32 / 64 / 80 (80 = 2 x 32 + 16 columns of V); T = 39 / 70 / 71 end past the 32-wide tiles
    in 7 / 6 / 7 columns (T5's tails). The unfused calls' bits and float64's values on the rows that have keys."""
    rng = np.random.default_rng(seq * 11 + width)
    b, h = 2, 3
    q = rng.normal(size=(b, h, seq, width)).astype(f32)
    kt = rng.normal(size=(b, h, seq, width)).astype(f32).transpose(0, 1, 3, 2)
    v = rng.normal(size=(b, h, seq, width)).astype(f32)
    mask = rng.normal(size=(b, 1, seq, seq)).astype(f32)
    mask[1, :, :, min(3, seq):] = -np.inf
    if seq > 1:
        mask[0, :, seq // 2, :] = -np.inf  # one query of the first sequence sees no key
    mask = np.broadcast_to(mask, (b, h, seq, seq))
    dead = np.zeros((b, h, seq, 1), bool)
    if seq > 1:
        dead[0, :, seq // 2] = True
    for nan_to_zero in (False, True):
        out = np.full((b, h, seq, width), 7.0, f32)
        _native.fused_attention(q, kt, v, mask, out, 1.0, 8.0, nan_to_zero)
        expected = _unfused(q, kt, v, mask, 1.0, 8.0)
        live = np.broadcast_to(~dead, out.shape)
        np.testing.assert_array_equal(out[live], expected[live])
        finite = np.where(np.isinf(mask), f32(-1e30), mask)  # float64's exp(-1e30 - max) is 0 as exp(-inf) is
        np.testing.assert_allclose(out[live], _reference(q, kt, v, finite, 1.0, 8.0)[live], rtol=1e-4, atol=1e-5)
        dead_rows = out[np.broadcast_to(dead, out.shape)]
        if nan_to_zero:
            np.testing.assert_array_equal(dead_rows, np.zeros_like(dead_rows))
        else:
            assert np.isnan(dead_rows).all()
