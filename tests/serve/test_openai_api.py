"""The OpenAI-shaped Python API on a real (tiny, random-weight) model: objects, streaming, sampling options,
log-probabilities checked against the model's own logits, logit_bias, JSON-schema constrained output, tool calls."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from hetero.contract.errors import HeteroError
from hetero.llm.openai_api import ContextLengthError, parse_tool_calls
from hetero.llm.sampler import Sampler

HI = [{"role": "user", "content": "hi"}]
needs_llguidance = pytest.mark.skipif(importlib.util.find_spec("llguidance") is None,
                                      reason="llguidance is not installed (pip install 'hetero[serve]')")


def test_a_chat_completion_is_an_openai_object(llm):
    r = llm.create_chat_completion(HI, max_tokens=5, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-") and r["model"] == llm.name
    (choice,) = r["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    usage = r["usage"]
    prompt = llm.tokenize(llm.template.render(HI, add_generation_prompt=True), add_special_tokens=False)
    assert usage["prompt_tokens"] == len(prompt) and usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    timings = r["timings"]  # the first token's time splits prefill from decode
    assert timings["predicted_n"] == 5 and timings["prompt_ms"] > 0 and timings["predicted_ms"] > 0


def test_streamed_chunks_add_up_to_the_whole_reply(llm):
    whole = llm.create_chat_completion(HI, max_tokens=12, temperature=0.9, seed=5)
    chunks = list(llm.create_chat_completion(HI, max_tokens=12, temperature=0.9, seed=5, stream=True,
                                             stream_options={"include_usage": True}))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_seed_repeats_and_stop_ends_the_text(llm):
    a = llm.create_completion("the sky", max_tokens=20, temperature=1.0, seed=11)
    b = llm.create_completion("the sky", max_tokens=20, temperature=1.0, seed=11)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    text = a["choices"][0]["text"]
    stop = text[3:5]
    c = llm.create_completion("the sky", max_tokens=20, temperature=1.0, seed=11, stop=[stop])
    assert c["choices"][0]["finish_reason"] == "stop" and c["choices"][0]["text"] == text[:text.index(stop)]


def test_logprobs_are_the_models_log_softmax(llm):
    ids = llm.tokenize("one two")
    llm.reset()
    logits = np.asarray(llm.prefill(ids)[-1], dtype=np.float64)
    want = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    r = llm.create_completion(ids, max_tokens=3, temperature=0, logprobs=3)
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == 3
    first = int(np.argmax(want))
    assert lp["token_logprobs"][0] == pytest.approx(want[first], abs=1e-9)
    prompt = llm.tokenize(llm.template.render(HI, add_generation_prompt=True), add_special_tokens=False)
    llm.reset()
    logits = np.asarray(llm.prefill(prompt)[-1], dtype=np.float64)
    want = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    chat = llm.create_chat_completion(HI, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = chat["choices"][0]["logprobs"]["content"]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == pytest.approx(sorted(want)[::-1][:2], abs=1e-9)
    assert len(content) == 4
    for entry in content:  # greedy: the chosen token is the most likely one
        assert entry["logprob"] <= 0 and entry["logprob"] == entry["top_logprobs"][0]["logprob"]
        assert len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][1]["logprob"] <= entry["logprob"]


def test_logit_bias_forces_and_bans_tokens(llm):
    forced = 65
    r = llm.create_completion("hello", max_tokens=6, temperature=0, logit_bias={str(forced): 100}, logprobs=0)
    assert r["choices"][0]["logprobs"]["tokens"] == [llm.detokenize([forced])] * 6
    llm.reset()
    logits = llm.prefill(llm.tokenize("hello"))[-1]
    best, second = np.argsort(-logits)[:2]
    assert Sampler(logit_bias={int(best): -100})(logits) == second
    with pytest.raises(HeteroError, match=r"logit_bias: the bias of token 3 is 500"):
        llm.create_completion("hello", logit_bias={"3": 500})


@needs_llguidance
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_json_schema_output_is_valid_json_of_that_schema(llm, seed):
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
              "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
                             "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}}
    r = llm.create_chat_completion(HI, max_tokens=120, temperature=1.0, seed=seed, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop", choice  # the grammar completed, then only EOS was allowed
    value = json.loads(choice["message"]["content"])
    assert set(value) == {"name", "age", "tags"} and isinstance(value["age"], int)
    assert isinstance(value["name"], str) and len(value["name"]) <= 6
    assert set(value["tags"]) <= {"a", "b"} and len(value["tags"]) <= 3


@needs_llguidance
def test_json_object_mode_and_a_bad_schema(llm):
    r = llm.create_completion("x", max_tokens=80, temperature=0.8, seed=4, response_format={"type": "json_object"})
    assert isinstance(json.loads(r["choices"][0]["text"]), dict)
    with pytest.raises(HeteroError, match=r"response_format\.type='xml'"):
        llm.create_completion("x", response_format={"type": "xml"})


def test_tool_calls_are_parsed_from_the_template_format():
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            "<tool_call>not json</tool_call>")
    (call,) = parse_tool_calls(text)
    assert call["type"] == "function" and call["id"].startswith("call-")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_a_conversation_with_tool_results_renders_and_runs(llm):
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call-1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call-1", "content": "sunny"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    r = llm.create_chat_completion(messages, tools=tools, max_tokens=3, temperature=0)
    assert r["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls")


def test_bad_requests_are_hetero_errors(llm):
    with pytest.raises(ContextLengthError, match="context holds 256"):
        llm.create_completion(list(range(1, 257)))
    with pytest.raises(HeteroError, match="max_tokens=0"):
        llm.create_completion("x", max_tokens=0)
    with pytest.raises(HeteroError, match="unknown option"):
        llm.create_completion("x", best_of=3)
    with pytest.raises(HeteroError, match=r"messages\[0\]"):
        llm.create_chat_completion([{"content": "no role"}])
    with pytest.raises(HeteroError, match="top_logprobs=21"):
        llm.create_chat_completion(HI, logprobs=True, top_logprobs=21)


def test_embed_is_the_hidden_state_the_lm_head_reads(llm):
    from hetero.llm import safetensors

    from .serve_models import MODEL

    table = safetensors.SafetensorsModel(MODEL).float32("model.embed_tokens.weight")  # tied LM head
    ids = llm.tokenize("a short text")
    vector = llm.embed(ids)
    assert vector.shape == (llm.config.hidden_size,) and np.linalg.norm(vector) == pytest.approx(1, abs=1e-6)
    llm.reset()
    logits = np.asarray(llm.prefill(ids)[-1], dtype=np.float64)
    projected = table.astype(np.float64) @ vector  # the logits, divided by the hidden state's norm
    scale = float(projected @ logits / (projected @ projected))
    np.testing.assert_allclose(projected * scale, logits, rtol=1e-4, atol=1e-4 * np.abs(logits).max())


def test_embed_needs_a_model_loaded_for_it():
    from .serve_models import load_model

    with pytest.raises(HeteroError, match="not loaded for embeddings"):
        load_model(context=32).embed("x")
