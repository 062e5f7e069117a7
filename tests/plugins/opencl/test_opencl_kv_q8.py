"""The OpenCL Attention kernel has no int8 KV cache: a q8 model must place its Attention nodes elsewhere with the
reason stated (and still compute the q8 semantics there), never accept q8 and silently run another cache type."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import needs_device

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from llm.helpers import FIXTURES, expected, load

pytestmark = needs_device


def test_q8_kv_cache_attention_is_refused_with_its_reason():
    llm = load(FIXTURES / "qwen3", backends=["opencl", "cpu"], kv_cache="q8", all_logits=True)
    attention = [p for p in llm.session.placement.nodes if p.op_type == "Attention"]
    assert attention and all(p.backend == "cpu" for p in attention)
    assert all(p.refusals["opencl"] == "Attention with kv_dtype 'q8'" for p in attention)
    assert {p.backend for p in llm.session.placement.nodes if p.op_type == "QMatMul"} == {"opencl"}
    ids = expected("qwen3")["prompts"][1]["ids"]
    reference = load(FIXTURES / "qwen3", backends=["reference"], kv_cache="q8", all_logits=True)
    np.testing.assert_allclose(llm.prefill(ids), reference.prefill(ids), rtol=0, atol=1e-4)
