"""``hetero bench`` on hybrid (GatedDeltaRule) models: prefill tests measured in the chunked and the recurrent form
on the same loaded session, the forms really switched in the cpu kernel, the nodes' mode restored afterwards."""

from __future__ import annotations

import warnings

import pytest

from hetero.contract import HeteroError
from hetero.llm import bench as bench_mod
from hetero.llm.synthetic import load_synthetic

_native = pytest.importorskip("hetero_cpu._native", reason="the hetero-cpu native extension is not built")


def tiny_hybrid(mode: str = "auto"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_synthetic("qwen3.5-tiny", context=64, backends=["cpu"], on_fallback="error", progress=False,
                              threads=1, linear_attention_mode=mode)


def modes(llm) -> set[str]:
    return {n.attrs.get("mode") for n in llm.session.graph.nodes if n.op_type == "GatedDeltaRule"}


@pytest.fixture
def chunk_args(monkeypatch):
    """The chunk argument of every native gated_delta call (a recording wrapper around the real function)."""
    seen: list[int] = []
    real = _native.gated_delta

    def recording(*args, **kwargs):
        seen.append(args[15])  # chunk: 0 = the recurrence
        return real(*args, **kwargs)

    monkeypatch.setattr(_native, "gated_delta", recording)
    return seen


def test_prefill_compared_in_both_forms(chunk_args):
    llm = tiny_hybrid()
    results = bench_mod.bench(llm, [(16, 0), (0, 2)], repetitions=2, warmup=False)
    assert [(r.test, r.linear_attention) for r in results] == [
        ("pp16", "chunked"), ("pp16 (recurrent)", "recurrent"), ("tg2", "auto")]
    chunked, recurrent, decode = results
    assert len(chunked.samples_ts) == len(recurrent.samples_ts) == 2
    assert chunked.chunked_gain is not None and chunked.chunked_gain > 0
    assert recurrent.chunked_gain is None and decode.chunked_gain is None
    # 3 linear-attention layers per forward; prefill alternates chunked / recurrent, decode is recurrent
    layers = 3
    prefill = chunk_args[:4 * layers]
    assert prefill == [64] * layers + [0] * layers + [64] * layers + [0] * layers
    assert set(chunk_args[4 * layers:]) == {0}
    assert modes(llm) == {"auto"}  # restored
    table = bench_mod.markdown(results)
    assert [c.strip() for c in table.splitlines()[0].strip("|").split("|")][6] == "linear attn"
    assert "chunked / recurrent prefill" in table and f"pp16 {chunked.chunked_gain:.2f}x" in table


def test_explicit_form_is_not_compared(chunk_args):
    llm = tiny_hybrid("chunked")
    (result,) = bench_mod.bench(llm, [(16, 0)], repetitions=1, warmup=False)
    assert result.linear_attention == "chunked" and result.chunked_gain is None
    assert set(chunk_args) == {64}
    chunked, recurrent = bench_mod.bench(llm, [(16, 0)], repetitions=1, warmup=False, compare_linear_attention=True)
    assert chunked.chunked_gain is not None and recurrent.linear_attention == "recurrent"
    assert modes(llm) == {"chunked"}


def test_models_without_linear_attention_are_unchanged():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = load_synthetic("tiny", context=64, progress=False, threads=1)
    (result,) = bench_mod.bench(llm, [(8, 0)], repetitions=1, warmup=False)
    assert result.linear_attention == "" and result.chunked_gain is None
    assert "linear attn" not in bench_mod.markdown([result])


def test_kernel_rejects_an_unknown_mode():
    llm = tiny_hybrid()
    with bench_mod.linear_attention_mode(llm, "sideways"), pytest.raises(HeteroError, match="mode 'sideways'"):
        llm.prefill([1, 2, 3])
    assert modes(llm) == {"auto"}
