"""GGUF block formats: hetero's numpy dequantization of every type against the ``gguf`` package's own (an
independent reference), hetero's reference quantizers, and QMatMul / Embedding / MoE on each wtype against float
math on the dequantized weights."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract import HeteroError, ShapeError, registry
from hetero.contract.graph import HETERO_DOMAIN, Node
from hetero.contract.quant import (
    GGML_FORMATS,
    GgmlFormat,
    QuantFormat,
    dequantize,
    format_from_attrs,
    quantize,
    weight_format,
)
from hetero.contract.registry import OpContext
from hetero.runtime.infer import info_of

rng = np.random.default_rng(11)

# GGUF type -> the hetero format it loads as (Q8_0 / Q4_0 / Q4_1 are hetero's own block-32 formats)
TYPES: dict[str, QuantFormat | GgmlFormat] = {
    "Q8_0": QuantFormat(8, 32, True), "Q4_0": QuantFormat(4, 32, True), "Q4_1": QuantFormat(4, 32, False),
    **{f.ggml: f for f in GGML_FORMATS.values()},
}
# byte offsets of the f16 scale fields in each block (set to chosen values so that random blocks stay finite)
SCALES = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2],
          "Q6_K": [208]}
EXTREME = np.array([0.0, 6e-8, 1e-4, 1.0, -1.0, 3.5, 65504.0, -65504.0], dtype=np.float16)


def random_blocks(qtype: str, rows: int, k: int, extreme: bool) -> np.ndarray:
    fmt = TYPES[qtype]
    data = rng.integers(0, 256, (rows, fmt.row_bytes(k)), dtype=np.uint8)
    blocks = data.reshape(rows, -1, fmt.block_bytes)
    for at in SCALES[qtype]:
        if extreme:
            scale = rng.choice(EXTREME, blocks.shape[:2])
        else:
            scale = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[..., at:at + 2] = scale[..., None].view(np.uint8)
    return data


@pytest.mark.parametrize("qtype", list(TYPES))
@pytest.mark.parametrize("extreme", [False, True])
def test_dequantize_matches_the_gguf_package(qtype, extreme):
    quants = pytest.importorskip("gguf.quants", reason="the gguf package (the independent reference) is absent")
    from gguf import GGMLQuantizationType

    k = 512
    data = random_blocks(qtype, 6, k, extreme)
    with np.errstate(over="ignore", invalid="ignore"):
        want = quants.dequantize(data, GGMLQuantizationType[qtype]).astype(np.float32)
        got = dequantize(data, TYPES[qtype], k)
    assert got.shape == (6, k) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)  # bit-exact


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_reference_quantizers(qtype):
    """hetero's quantizer output decodes (by the gguf package) to within a type-sized error of the input."""
    fmt = TYPES[qtype]
    w = (rng.standard_normal((8, 512)) * rng.uniform(1e-3, 10, (8, 1))).astype(np.float32)
    w[0] = 0.0
    w[1, :256] = 3.0  # a constant block
    w[2] = -np.abs(w[2])  # one sign only
    packed = quantize(w, fmt)
    assert packed.shape == (8, fmt.row_bytes(512)) and packed.dtype == np.uint8
    back = dequantize(packed, fmt, 512)
    # one rounding step; Q5_0 / Q6_K (symmetric) may clip the extreme opposite to the block's largest by a step
    bound = {"Q5_0": 1 / 15, "Q5_1": 1 / 30, "Q4_K": 1 / 12, "Q5_K": 1 / 20, "Q6_K": 1 / 30}[qtype]
    amax = np.abs(w).max(axis=1, keepdims=True)
    assert np.all(np.abs(back - w) <= bound * amax + 1e-6), np.abs(back - w).max(axis=1)
    assert np.array_equal(back[0], w[0])
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    np.testing.assert_array_equal(quants.dequantize(packed, GGMLQuantizationType[qtype]), back)


def test_hetero_q4_q8_b32_are_gguf_q8_0_q4_0_q4_1():
    """GGUF's own quantizer output, read as hetero's formats, decodes to what the gguf package says."""
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    w = rng.standard_normal((4, 256)).astype(np.float32)
    for qtype in ("Q8_0", "Q4_0", "Q4_1"):
        packed = quants.quantize(w, GGMLQuantizationType[qtype])
        np.testing.assert_array_equal(dequantize(packed, TYPES[qtype], 256),
                                      quants.dequantize(packed, GGMLQuantizationType[qtype]))


def test_format_attributes():
    assert weight_format("q4_k") is GGML_FORMATS["q4_k"]
    assert weight_format("q6_k", 999, 0) is GGML_FORMATS["q6_k"]  # block_size / symmetric do not apply
    assert GGML_FORMATS["q5_k"].attrs() == {"wtype": "q5_k"}
    assert weight_format("q4", 32, 0) == format_from_attrs("q4", 32, 0) == QuantFormat(4, 32, False)
    assert weight_format("f16") is None
    with pytest.raises(HeteroError, match="q4_k"):
        weight_format("q3_k")
    with pytest.raises(HeteroError):  # unchanged: backends that only know q4 / q8 refuse GGUF's own layouts
        format_from_attrs("q4_k")
    with pytest.raises(HeteroError, match="multiple of 256"):
        dequantize(np.zeros((1, 144), np.uint8), GGML_FORMATS["q4_k"], 200)


# -- ops -------------------------------------------------------------------------------------------------------------
def run(op_type: str, inputs: list[np.ndarray], **attrs) -> np.ndarray:
    schema = registry.get(HETERO_DOMAIN, op_type)
    node = Node(op_type, [f"i{k}" for k in range(len(inputs))], ["y"], attrs, domain=HETERO_DOMAIN)
    infos = [info_of(v) for v in inputs]
    (info,) = schema.infer(OpContext(node, infos, list(inputs), 1))
    (out,) = schema.reference(OpContext(node, infos, list(inputs), 1))
    assert out.shape == info.shape and out.dtype == info.dtype.np_dtype
    return out


@pytest.mark.parametrize("qtype", list(TYPES))
def test_qmatmul_and_embedding_on_each_type(qtype):
    fmt = TYPES[qtype]
    k, n = 512, 24
    w = random_blocks(qtype, n, k, extreme=False)
    dense = dequantize(w, fmt, k)
    x = rng.standard_normal((5, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out = run("QMatMul", [x, w, bias], **fmt.attrs())
    want = x.astype(np.float64) @ dense.T.astype(np.float64) + bias
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ids = np.array([[3, 0], [n - 1, 3]], dtype=np.int64)
    emb = run("Embedding", [ids, w], **fmt.attrs(), dim=k)
    np.testing.assert_array_equal(emb, dense[ids])


def test_qmatmul_rejects_rows_that_are_not_whole_blocks():
    w = np.zeros((4, 144), dtype=np.uint8)
    with pytest.raises(ShapeError, match="multiple of 256"):
        run("QMatMul", [np.zeros((1, 200), np.float32), w], wtype="q4_k")
    with pytest.raises(ShapeError, match="rows hold 144 bytes"):
        run("QMatMul", [np.zeros((1, 512), np.float32), w], wtype="q4_k")


def test_moe_with_a_type_per_expert_tensor():
    """GGUF files mix types inside one MoE layer (q4_k gate/up, q6_k down): per-tensor ``down_wtype`` etc."""
    e, h, inter = 4, 256, 256
    x = rng.standard_normal((6, h)).astype(np.float32)
    router = rng.standard_normal((e, h)).astype(np.float32)
    gate = quantize(rng.standard_normal((e, inter, h)).astype(np.float32) * 0.1, GGML_FORMATS["q4_k"])
    up = quantize(rng.standard_normal((e, inter, h)).astype(np.float32) * 0.1, QuantFormat(4, 32, False))
    down = quantize(rng.standard_normal((e, h, inter)).astype(np.float32) * 0.1, GGML_FORMATS["q6_k"])
    attrs = {"wtype": "q4_k", "up_wtype": "q4", "up_block_size": 32, "up_symmetric": 0, "down_wtype": "q6_k"}
    out = run("MoE", [x, router, gate, up, down], top_k=2, **attrs)
    dense = [dequantize(gate, GGML_FORMATS["q4_k"], h), dequantize(up, QuantFormat(4, 32, False), h),
             dequantize(down, GGML_FORMATS["q6_k"], inter)]
    np.testing.assert_allclose(out, run("MoE", [x, router, *dense], top_k=2), rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="down"):  # without the override, down's rows do not fit q4_k
        run("MoE", [x, router, gate, up, down], top_k=2, wtype="q4_k", up_wtype="q4", up_symmetric=0)
