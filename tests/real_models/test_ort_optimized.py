"""Models saved after onnxruntime's own optimizers (issue 17), made from paraphrase-MiniLM-L3-v2 by
scripts/ort_optimize_models.py: ``minilm_l3_ort_fused`` (onnxruntime.transformers' BERT fusions:
EmbedLayerNormalization, packed-QKV Attention with a 1-D mask_index, SkipLayerNormalization, BiasGelu) and
``minilm_l3_ort_extended`` (a session at ORT_ENABLE_EXTENDED: FusedMatMul, BiasGelu). On cpu, lower_contrib_ops
rewrites every contrib node into standard nodes, so the model runs on the same fused kernels as the exported one
(FusedAttention, the MatMul + bias kernels, LayerNormalization, MatMulGelu); against onnxruntime on the same file,
within the real-model tolerance. ``t5_encoder_int8_ort_extended`` (the dynamically quantized T5 encoder at
ORT_ENABLE_EXTENDED: 40 MatMulIntegerToFloat, 16 DynamicQuantizeMatMul, 8 FastGelu, SimplifiedLayerNormalization)
runs as the quantize_dynamic export does: every 8-bit product one MatMulIntegerScaled, FusedAttention, GeluMul.
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import MODELS, token_batch


@pytest.mark.parametrize("name", ["minilm_l3_ort_fused", "minilm_l3_ort_extended"])
def test_ort_optimized_minilm(agreement: Agreement, name: str) -> None:
    path = model_path(name)
    ort_run, session = ort_runner(path), hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    ops = {(n.domain, n.op_type) for n in session.graph.nodes}
    assert not {op for op in ops if op[0] == "com.microsoft"}, f"contrib nodes left: {ops}"
    # a LayerNormalization after a residual Add runs as hetero's AddLayerNorm (fuse_add_layer_norm)
    norms = {("", "LayerNormalization"), ("hetero", "AddLayerNorm")}
    # BiasGelu's lowered Gelu after its MatMul + bias runs in that product's epilogue (fuse_matmul_gelu)
    assert ("hetero", "FusedAttention") in ops and ops & norms and ("hetero", "MatMulGelu") in ops, ops
    for feeds in (token_batch([62, 30, 7], seed=0), token_batch([20, 5], seed=1), token_batch([1], seed=2)):
        agreement.check_all(session.run(feeds), ort_run(feeds))


def test_ort_optimized_t5_int8(agreement: Agreement) -> None:
    """Dynamic quantization rounds each activation to 8 bits from its own range, so a last-bit difference can move
    a value one step (tests/real_models/test_quantized.py): the bound is 1 % of the largest output and a cosine of
    0.999 per token, as for the quantize_dynamic export itself."""
    name = "t5_encoder_int8_ort_extended"
    path = model_path(name)
    ort_run, session = ort_runner(path), hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    ops = [(n.domain, n.op_type) for n in session.graph.nodes]
    assert not [op for op in ops if op[0] == "com.microsoft" or op[1] == "SimplifiedLayerNormalization"], ops
    assert ops.count(("hetero", "MatMulIntegerScaled")) == 56 and ("hetero", "FusedAttention") in ops
    model = MODELS[name]
    feeds = model.feeds(model)
    got, want = session.run(feeds), ort_run(feeds)
    for output, w in want.items():
        g = got[output]
        err = float(np.abs(g - w).max())
        agreement.worst, agreement.calls = max(agreement.worst, err), agreement.calls + 1
        assert g.shape == w.shape and err <= 0.01 * float(np.abs(w).max()), err
        a, b = g.reshape(-1, g.shape[-1]).astype(np.float64), w.reshape(-1, w.shape[-1]).astype(np.float64)
        cosines = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cosines.min() >= 0.999
