"""Models saved after onnxruntime's own optimizers (issue 17), made from paraphrase-MiniLM-L3-v2 by
scripts/ort_optimize_models.py: ``minilm_l3_ort_fused`` (onnxruntime.transformers' BERT fusions:
EmbedLayerNormalization, packed-QKV Attention with a 1-D mask_index, SkipLayerNormalization, BiasGelu) and
``minilm_l3_ort_extended`` (a session at ORT_ENABLE_EXTENDED: FusedMatMul, BiasGelu). On cpu, lower_contrib_ops
rewrites every contrib node into standard nodes, so the model runs on the same fused kernels as the exported one
(FusedAttention, the MatMul + bias kernels, LayerNormalization, Gelu); against onnxruntime on the same file, within
the real-model tolerance.
"""

from __future__ import annotations

import pytest

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import token_batch


@pytest.mark.parametrize("name", ["minilm_l3_ort_fused", "minilm_l3_ort_extended"])
def test_ort_optimized_minilm(agreement: Agreement, name: str) -> None:
    path = model_path(name)
    ort_run, session = ort_runner(path), hetero_session(path, agreement, "cpu")
    assert not agreement.placement, f"fell back: {agreement.placement}"
    ops = {(n.domain, n.op_type) for n in session.graph.nodes}
    assert not {op for op in ops if op[0] == "com.microsoft"}, f"contrib nodes left: {ops}"
    assert ("hetero", "FusedAttention") in ops and ("", "LayerNormalization") in ops and ("", "Gelu") in ops, ops
    for feeds in (token_batch([62, 30, 7], seed=0), token_batch([20, 5], seed=1), token_batch([1], seed=2)):
        agreement.check_all(session.run(feeds), ort_run(feeds))
