"""Qwen3.5 / Qwen3.5-MoE / Qwen3-Next through ``backends=["opencl"]``: the GatedDeltaRule kernel against the
reference op (gating on and off, conv bias, Dk != Dv, snapshots, rollback), then the three hybrid fixtures with the
cpu tolerances of tests/llm/test_qwen3_5_parity.py (the opencl KV cache is float32), greedy tokens, a rollback into
the previous turn, and every node on opencl."""

from __future__ import annotations

import numpy as np
import pytest

import hetero
from hetero.contract import TensorInfo, dtypes
from hetero.contract.graph import HETERO_DOMAIN, Graph, Node

from .conftest import needs_device

pytestmark = needs_device

HYBRID = ["qwen3_5", "qwen3_5_moe", "qwen3_5_next"]
TOL = 1e-4


# -- the op ----------------------------------------------------------------------------------------------------------
HK, HV, DK, DV, K = 2, 4, 8, 6, 4
C = 2 * HK * DK + HV * DV
FEEDS = ("qkv", "a", "b", "past_len", "z")


def delta_graph(consts: dict[str, np.ndarray], attrs: dict, norm: bool) -> Graph:
    order = ["qkv", "conv_w", "a", "b", "past_len", "conv_b", "a_log", "dt_bias", "z", "norm_w"]
    names = [n if (n in consts or n in FEEDS) and (norm or n not in ("z", "norm_w")) else "" for n in order]
    feeds = [n for n in names if n in FEEDS]
    graph = Graph(inputs=feeds, outputs=["y"], opsets={"": 21, HETERO_DOMAIN: 1}, name="t")
    widths = {"qkv": C, "a": HV, "b": HV, "z": HV * DV}
    for n in feeds:
        graph.values[n] = TensorInfo(dtypes.int64, ()) if n == "past_len" else \
            TensorInfo(dtypes.float32, (None, widths[n]))
    for n, v in consts.items():
        graph.values[n] = TensorInfo(dtypes.float32, v.shape)
    graph.initializers.update(consts)
    graph.nodes.append(Node("GatedDeltaRule", names, ["y"], {"k_heads": HK, "v_heads": HV, "k_dim": DK, "v_dim": DV,
                                                             **attrs}, name="n", domain=HETERO_DOMAIN))
    return graph


def delta_data(t: int, seed: int, gating: bool, bias: bool) -> tuple[dict, dict]:
    r = np.random.default_rng(seed)
    f = (lambda *s: r.standard_normal(s).astype(np.float32))  # noqa: E731
    consts = {"conv_w": 0.5 * f(C, K), "norm_w": 1 + 0.1 * f(DV)}
    if bias:
        consts["conv_b"] = 0.1 * f(C)
    if gating:
        consts["a_log"] = np.log(r.uniform(1, 8, HV)).astype(np.float32)
        consts["dt_bias"] = f(HV)
        feeds = {"a": f(t, HV), "b": f(t, HV)}
    else:  # g and beta given directly
        feeds = {"a": -np.abs(0.3 * f(t, HV)), "b": r.uniform(0, 1, (t, HV)).astype(np.float32)}
    feeds.update(qkv=f(t, C), z=f(t, HV * DV))
    return consts, feeds


def rows(feeds: dict, lo: int, hi: int, past: int, norm: bool) -> dict:
    out = {k: v[lo:hi] for k, v in feeds.items() if norm or k != "z"}
    out["past_len"] = np.array(past, np.int64)
    return out


@pytest.mark.parametrize("gating,bias,norm", [(True, False, True), (False, True, False), (True, True, False)])
def test_gated_delta_rule_matches_reference_across_calls_and_rollback(gating, bias, norm):
    consts, feeds = delta_data(200, 3, gating, bias)
    attrs = {"snapshot_interval": 32, "max_snapshots": 3, "max_context": 256}
    ours = hetero.Session(delta_graph(consts, attrs, norm), backends=["opencl"], on_fallback="error")
    ref = hetero.Session(delta_graph(consts, attrs, norm), backends=["reference"])
    assert {p.backend for p in ours.placement.nodes} == {"opencl"}
    # a prompt crossing snapshot boundaries, decode steps, a second prompt, then rollbacks (to a snapshot, between
    # snapshots, behind the oldest kept snapshot, to 0) and more tokens
    calls = [(0, 70, 0), (70, 71, 70), (71, 72, 71), (72, 130, 72), (130, 131, 130), (100, 110, 40), (110, 111, 50),
             (40, 45, 45), (0, 7, 0), (7, 8, 7)]
    for lo, hi, past in calls:
        step = rows(feeds, lo, hi, past, norm)
        np.testing.assert_allclose(ours.run(step)["y"], ref.run(step)["y"], rtol=1e-4, atol=2e-5,
                                   err_msg=f"rows {lo}:{hi} at {past}")


def test_gated_delta_rule_refuses_bad_positions():
    consts, feeds = delta_data(10, 1, True, False)
    session = hetero.Session(delta_graph(consts, {"max_context": 8}, True), backends=["opencl"], on_fallback="error")
    with pytest.raises(hetero.HeteroError, match="outside"):
        session.run(rows(feeds, 0, 2, 3, True))
    with pytest.raises(hetero.HeteroError, match="context"):
        session.run(rows(feeds, 0, 9, 0, True))


# -- the models -------------------------------------------------------------------------------------------------------
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from llm.helpers import FIXTURES, expected, load, reference_logits  # noqa: E402

from hetero.llm.generate import greedy_tokens  # noqa: E402


def opencl(family: str, **kwargs):
    return load(FIXTURES / family, backends=["opencl"], on_fallback="error", **kwargs)


@pytest.fixture(params=HYBRID)
def hybrid(request) -> str:
    return request.param


def test_short_and_long_prompt_logits_match_transformers(hybrid):
    llm = opencl(hybrid, all_logits=True, prefill_chunk=0)
    ref = reference_logits(hybrid)
    exp = expected(hybrid)
    for i, prompt in enumerate(exp["prompts"]):
        llm.reset()
        logits = llm.prefill(prompt["ids"])
        assert np.abs(logits - ref[f"prompt{i}"]).max() < TOL
        assert (logits.argmax(-1) == ref[f"prompt{i}"].argmax(-1)).all()
    for step in (0, 48):  # one call, or calls of 48 tokens (ending mid-chunk)
        for i, prompt in enumerate(exp["long_prompts"]):
            llm.reset()
            ids = prompt["ids"]
            size = step or len(ids)
            logits = np.concatenate([llm.forward(ids[s:s + size]) for s in range(0, len(ids), size)])
            assert np.abs(logits[prompt["rows"]] - ref[f"long{i}"]).max() < TOL


def test_greedy_tokens_match_transformers(hybrid):
    llm = opencl(hybrid)
    exp = expected(hybrid)
    for prompt in exp["prompts"] + exp["long_prompts"]:
        llm.reset()
        assert greedy_tokens(llm, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]
    chat = exp["chat"]
    llm.reset()
    assert greedy_tokens(llm, chat["ids"], len(chat["greedy"])) == chat["greedy"]
    last = llm.prefill(chat["ids"])
    assert np.abs(last[-1] - reference_logits(hybrid)["chat_last"][0]).max() < TOL


def test_rollback_into_previous_turn_equals_fresh_run(hybrid):
    exp = expected(hybrid)
    long_ids = exp["long_prompts"][0]["ids"]
    llm = opencl(hybrid, all_logits=True)
    assert greedy_tokens(llm, long_ids[:150], 6)
    turn2 = long_ids[:90] + exp["chat"]["ids"]  # diverges at 90: inside turn 1's second chunk
    got = llm.prefill(turn2)
    assert llm.stats.cached_tokens == 90
    fresh = opencl(hybrid, all_logits=True)
    want = fresh.prefill(turn2)
    np.testing.assert_allclose(got, want[-got.shape[0]:], atol=TOL)
    assert greedy_tokens(llm, turn2, 8) == greedy_tokens(fresh, turn2, 8)


def test_every_node_on_opencl(hybrid):
    llm = opencl(hybrid)
    session = llm.session
    assert set(session.placement.counts()) == {"opencl"}
    assert not session.placement.fallbacks()
    copies = {c.value for c in session.placement.copies}
    assert copies == {"input_ids", "past_len", "logits"}  # inputs in, logits out: nothing else crosses
    assert "(fallback)" not in session.explain()
