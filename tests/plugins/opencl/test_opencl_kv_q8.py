"""The OpenCL Attention kernel has no int8 or rotated low-bit KV cache: a q8 / q4r / q3r model must place its
Attention nodes elsewhere with the reason stated (and still compute that cache's semantics there), never accept it and
silently run another cache type."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import needs_device

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from llm.helpers import FIXTURES, expected, load

pytestmark = needs_device


@pytest.mark.parametrize("kind", ["q8", "q4r", "q3r"])
def test_quantized_kv_cache_attention_is_refused_with_its_reason(kind):
    llm = load(FIXTURES / "qwen3", backends=["opencl", "cpu"], kv_cache=kind, all_logits=True)
    attention = [p for p in llm.session.placement.nodes if p.op_type == "Attention"]
    assert attention and all(p.backend == "cpu" for p in attention)
    assert all(p.refusals["opencl"] == f"Attention with kv_dtype '{kind}'" for p in attention)
    assert {p.backend for p in llm.session.placement.nodes if p.op_type == "QMatMul"} == {"opencl"}
    ids = expected("qwen3")["prompts"][1]["ids"]
    reference = load(FIXTURES / "qwen3", backends=["reference"], kv_cache=kind, all_logits=True)
    np.testing.assert_allclose(llm.prefill(ids), reference.prefill(ids), rtol=0, atol=1e-4)
