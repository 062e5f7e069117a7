"""The tiny LLM fixtures through ``backends=["opencl"]``: the cpu tolerances (tests/llm/test_llm_parity.py), every
node of prefill and decode on opencl, and no host round trip inside a decode step."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import needs_device

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from llm.helpers import FAMILIES, FIXTURES, copy_model, expected, load, reference_logits
from llm.test_llm_parity import dequantized_copy

from hetero.llm.generate import greedy_tokens

pytestmark = needs_device


def opencl(path, **kwargs):
    return load(path, backends=["opencl"], on_fallback="error", **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_logits_and_greedy_tokens_match_transformers(family):
    llm = opencl(FIXTURES / family, all_logits=True)
    ref = reference_logits(family)
    for i, prompt in enumerate(expected(family)["prompts"]):
        llm.reset()
        logits = llm.prefill(prompt["ids"])
        assert np.abs(logits - ref[f"prompt{i}"]).max() < 1e-4
        assert (logits.argmax(-1) == ref[f"prompt{i}"].argmax(-1)).all()
    greedy = opencl(FIXTURES / family)
    for prompt in expected(family)["prompts"]:
        greedy.reset()
        assert greedy_tokens(greedy, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("spec", ["q4", "q8_asym_b64"])
def test_quantized_model_equals_its_dequantized_weights(family, spec, tmp_path):
    quantized = opencl(copy_model(family, tmp_path / "q"), all_logits=True, quant=spec)
    reference = load(dequantized_copy(family, tmp_path / "dq", spec), all_logits=True, backends=["reference"])
    ids = expected(family)["prompts"][1]["ids"]
    np.testing.assert_allclose(quantized.prefill(ids), reference.prefill(ids), atol=1e-4)
    # then a few decode steps (the matrix-vector kernels) against the same model on the reference
    for token in (5, 9, 2):
        np.testing.assert_allclose(quantized.forward([token]), reference.forward([token]), atol=1e-4)


def test_half_precision_weights(tmp_path):
    folder = copy_model("qwen3", tmp_path, "F16")
    ours, ref = opencl(folder, all_logits=True), load(folder, all_logits=True, backends=["reference"])
    ids = expected("qwen3")["prompts"][0]["ids"]
    np.testing.assert_allclose(ours.prefill(ids), ref.prefill(ids), atol=1e-4)


def test_prefill_in_chunks_matches_one_shot():
    one = opencl(FIXTURES / "qwen3", all_logits=True, prefill_chunk=0)
    chunked = opencl(FIXTURES / "qwen3", all_logits=True, prefill_chunk=5)
    ids = expected("qwen3")["prompts"][1]["ids"]
    full = one.prefill(ids)
    last = chunked.prefill(ids)
    np.testing.assert_allclose(last, full[-last.shape[0]:], atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_step_places_every_node_on_opencl(family):
    llm = opencl(FIXTURES / family)
    session = llm.session
    assert set(session.placement.counts()) == {"opencl"}
    assert not session.placement.fallbacks()
    copies = {(c.value, c.src, c.dst) for c in session.placement.copies}
    assert {c[0] for c in copies} == {"input_ids", "past_len", "logits"}  # inputs in, logits out: nothing else
    text = session.explain()
    assert "(fallback)" not in text


def test_decode_downloads_only_the_logits(monkeypatch):
    from hetero_opencl.backend import OpenCLBackend

    llm = opencl(FIXTURES / "qwen3")
    llm.prefill(expected("qwen3")["prompts"][0]["ids"])
    downloads: list[tuple[int, ...]] = []
    original = OpenCLBackend.download

    def counting(self, tensor):
        if tensor.host_copy is None:  # a real device read (host copies of small uploads cost nothing)
            downloads.append(tensor.shape)
        return original(self, tensor)

    monkeypatch.setattr(OpenCLBackend, "download", counting)
    for token in (3, 4, 5):
        llm.forward([token])
    assert downloads == [(1, llm.config.vocab_size)] * 3
