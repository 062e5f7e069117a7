"""Model-based drafters' linears through the target's kernels (hetero.llm.speculative.native_linears): a compiled
Linear against its numpy product per weight type, drafters compiled with float32 weights drafting exactly what the
numpy drafters draft (the plumbing: shapes, row layouts, which linears), and the default q8 drafters keeping the
target's greedy output."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract import HeteroError
from hetero.llm.speculative import Speculation
from hetero.llm.speculative.dflash import DFlashDrafter
from hetero.llm.speculative.drafter_nn import Linear
from hetero.llm.speculative.eagle import Eagle3Drafter
from hetero.llm.speculative.native_linears import compile_linears

from .drafter_fixtures import dflash_folder, eagle_folder
from .helpers import FIXTURES, load

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"


@pytest.fixture(scope="module")
def target():
    return load(FIXTURES / "qwen3", kv_cache="f32")


@pytest.mark.parametrize("wtype,tol", [("f32", 1e-5), ("f16", 2e-3), ("q8", 2e-2)])
def test_compiled_linear_matches_numpy(wtype, tol):
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((72, 100)).astype(np.float32)  # [out, in]; 100: a partial last block of 32
    numpy_linear, native = Linear(dense.T), Linear(dense.T)
    (session,) = compile_linears([native], backends=["cpu"], threads=1, wtype=wtype)
    assert native.weight is None and native.shape == (100, 72)
    for x in (rng.standard_normal((5, 100)), rng.standard_normal((2, 3, 100)), rng.standard_normal((1, 100))):
        x = x.astype(np.float32)
        want, got = x @ numpy_linear, x @ native
        assert got.shape == want.shape == (*x.shape[:-1], 72)
        np.testing.assert_allclose(got, x @ dense.T, rtol=0, atol=tol * np.abs(want).max())
    session.close()
    with pytest.raises(ValueError, match="released"):
        native.dense()


def test_unknown_weight_type_refused():
    with pytest.raises(HeteroError, match=r"wtype 'q3' is not one of q8, q4, f16, f32"):
        compile_linears([Linear(np.zeros((32, 8), np.float32))], backends=["cpu"], threads=1, wtype="q3")


def _drafts(drafter, llm, histories):
    layers = llm.expose_hidden(drafter.hidden_layers)
    out = []
    for history in histories:
        llm.reset()
        llm.prefill(history)
        drafter.begin(history, {layer: llm.hidden(layer, 0, len(history)) for layer in layers})
        out.append(drafter.draft(history, 4))
    return out


def test_float32_native_drafters_draft_what_numpy_drafters_draft(tmp_path, target):
    histories = [target.tokenizer.encode(PROMPT)[:n] for n in (6, 11, 17)]
    eagle, dflash = eagle_folder(tmp_path / "e"), dflash_folder(tmp_path / "d")
    for make in (lambda lin: Eagle3Drafter.for_target(eagle, target, linears=lin, top_k=2),
                 lambda lin: DFlashDrafter.for_target(dflash, target, linears=lin)):
        numpy_drafter, native = make(None), make("f32")
        assert native.w.fc.run is not None and numpy_drafter.w.fc.run is None
        want = _drafts(numpy_drafter, target, histories)
        assert _drafts(native, target, histories) == want and all(want)


def test_q8_drafters_keep_greedy_output(tmp_path, target):
    target.reset()
    target.generate(PROMPT, 24, temperature=0)
    want = list(target.last.tokens)
    for drafter in (Eagle3Drafter.for_target(eagle_folder(tmp_path / "e"), target),
                    DFlashDrafter.for_target(dflash_folder(tmp_path / "d"), target)):
        assert drafter.w.fc.run is not None  # the default: q8 on the target's backends
        target.reset()
        target.generate(PROMPT, 24, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(target.last.tokens) == want and target.stats.drafted_tokens > 0
