"""Eagle-3 and DFlash drafters on the tiny Qwen3 fixture: their folder layouts (and the errors for missing or
misshapen tensors and bad config keys), the target's shared embedding and LM head, and drafters trained here
(tests/fixtures/drafters, made by scripts/train_drafter.py) accepted by the verify loop with greedy output
identical to plain decoding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import backend_ok
from hetero.contract import HeteroError
from hetero.contract.errors import ModelFormatError
from hetero.llm import safetensors
from hetero.llm.speculative import Speculation, make_drafter
from hetero.llm.speculative.dflash import DFlashDrafter, load_dflash
from hetero.llm.speculative.drafter_files import write_folder
from hetero.llm.speculative.eagle import Eagle3Drafter, load_eagle3
from hetero.llm.speculative.target_head import TargetHead

from .drafter_fixtures import dflash_config, dflash_folder, dflash_tensors, eagle_config, eagle_folder, eagle_tensors
from .helpers import FIXTURES, load

TRAINED = Path(__file__).resolve().parents[1] / "fixtures" / "drafters" / "qwen3"
PROMPTS = ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "import os\nimport sys\n\n\nclass Path:\n",
           "The quick brown fox jumps over the lazy dog. A small model"]


@pytest.fixture(scope="module")
def target():
    return load(FIXTURES / "qwen3", kv_cache="f32")


def _rewrite(folder: Path, config: dict, tensors: dict) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    return write_folder(folder, config, tensors)


# -- layouts ------------------------------------------------------------------------------------------------------
def test_eagle_layout_loads(tmp_path):
    w = load_eagle3(eagle_folder(tmp_path / "e", aux=[1, 2, 3]))
    assert w.fc.shape == (3 * 64, 64) and w.lm_head.shape == (64, 96) and w.aux_layers == (0, 1, 2)
    assert w.layer.q.shape == (128, 64) and w.layer.q_norm is None
    ids = w.draft_to_target(np.arange(96))
    assert (np.diff(ids) > 0).all() and ids.max() < 320  # d2t: draft id i -> target id i + d2t[i]


def test_dflash_layout_loads(tmp_path):
    w = load_dflash(dflash_folder(tmp_path / "d"), target_layers=2)
    assert len(w.layers) == 2 and w.fc.shape == (128, 64) and w.target_layers == (0, 1)
    assert w.block_size == 6 and w.mask_token_id == 319 and w.layers[0].q_norm is not None


@pytest.mark.parametrize("kind", ["eagle", "dflash"])
def test_missing_tensor_names_file_and_tensor(tmp_path, kind):
    config = eagle_config() if kind == "eagle" else dflash_config()
    tensors = eagle_tensors(config) if kind == "eagle" else dflash_tensors(config)
    name = "midlayer.self_attn.q_proj.weight" if kind == "eagle" else "layers.1.mlp.down_proj.weight"
    del tensors[name]
    folder = _rewrite(tmp_path / kind, config, tensors)
    with pytest.raises(ModelFormatError, match=rf"{tmp_path / kind}.*{name.replace('.', '[.]')}.*missing"):
        load_eagle3(folder) if kind == "eagle" else load_dflash(folder)


@pytest.mark.parametrize("kind", ["eagle", "dflash"])
def test_misshapen_tensor_names_file_tensor_and_shapes(tmp_path, kind):
    config = eagle_config() if kind == "eagle" else dflash_config()
    tensors = eagle_tensors(config) if kind == "eagle" else dflash_tensors(config)
    tensors["fc.weight"] = tensors["fc.weight"][:, :-1]
    folder = _rewrite(tmp_path / kind, config, tensors)
    with pytest.raises(ModelFormatError, match=r"model\.safetensors: tensor 'fc\.weight' has shape \[64, \d+\]; "
                                               r"the config implies \[64, \d+\]"):
        load_eagle3(folder) if kind == "eagle" else load_dflash(folder)


def test_bad_config_keys_are_named(tmp_path):
    config = dflash_config()
    del config["dflash_config"]["mask_token_id"]
    folder = _rewrite(tmp_path / "d", config, dflash_tensors(dflash_config()))
    with pytest.raises(ModelFormatError, match=r"config\.json \(dflash_config\).*'mask_token_id' is missing"):
        load_dflash(folder)
    config = eagle_config()
    config["num_hidden_layers"] = 2
    folder = _rewrite(tmp_path / "e", config, eagle_tensors(eagle_config()))
    with pytest.raises(ModelFormatError, match=r"config\.json: key 'num_hidden_layers' must be 1"):
        load_eagle3(folder)
    config = eagle_config(aux=[1, 2])
    folder = _rewrite(tmp_path / "e", config, eagle_tensors(eagle_config()))
    with pytest.raises(ModelFormatError, match="eagle_aux_hidden_state_layer_ids"):
        load_eagle3(folder)
    tensors = eagle_tensors(eagle_config())
    tensors["d2t"] = tensors["d2t"] + 1000
    folder = _rewrite(tmp_path / "e", eagle_config(), tensors)
    with pytest.raises(ModelFormatError, match="'d2t' maps draft ids outside the target vocabulary"):
        load_eagle3(folder)
    with pytest.raises(ModelFormatError, match="is not a folder"):
        load_eagle3(tmp_path / "nowhere")


def test_dflash_refuses_its_own_vocabulary_matrix(tmp_path):
    config = dflash_config()
    tensors = dflash_tensors(config)
    tensors["lm_head.weight"] = np.zeros((320, 64), np.float32)
    with pytest.raises(HeteroError, match=r"'lm_head\.weight'.*shares the target's"):
        load_dflash(_rewrite(tmp_path / "d", config, tensors))


def test_drafter_for_another_target_is_refused(tmp_path, target):
    with pytest.raises(HeteroError, match=r"vocab_size 1000"):
        Eagle3Drafter.for_target(eagle_folder(tmp_path / "e", vocab=1000), target)
    with pytest.raises(HeteroError, match=r"'target_layer_ids' must be a list of target layer indices in "
                                          r"\[0, 2\), got \[0, 5\]"):
        DFlashDrafter.for_target(dflash_folder(tmp_path / "d", target_layers=(0, 5)), target)
    with pytest.raises(HeteroError, match=r"made for a target of 4 layers \(key 'num_target_layers'\); this "
                                          r"target has 2"):
        DFlashDrafter.for_target(dflash_folder(tmp_path / "d4", target_depth=4), target)
    with pytest.raises(HeteroError, match="needs the DFlash drafter's folder"):
        make_drafter("dflash", target)


# -- the target's shared embedding and LM head ---------------------------------------------------------------------
def test_target_head_is_the_targets_own(target):
    head = TargetHead(target)
    table = safetensors.SafetensorsModel(FIXTURES / "qwen3").float32("model.embed_tokens.weight")
    np.testing.assert_array_equal(head.embed([3, 7, 3]), table[[3, 7, 3]])
    hidden = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(head.logits(hidden), hidden @ table.T, rtol=1e-5, atol=1e-5)
    # no second copy: the one-node sessions hold the very arrays of the target's graph (tied embeddings)
    ours = head._head.graph.initializers["model.embed_tokens.weight"]
    assert np.shares_memory(ours, target.session.graph.initializers["model.embed_tokens.weight"])


# -- drafters trained here, in the verify loop ---------------------------------------------------------------------
def _plain(llm, prompt, n):
    llm.reset()
    llm.generate(prompt, n, temperature=0)
    return list(llm.last.tokens)


@pytest.mark.parametrize("kind", ["eagle", "dflash"])
def test_trained_drafters_keep_greedy_output_and_get_accepted(target, kind):
    folder = TRAINED / ("eagle3" if kind == "eagle" else "dflash")
    accepted = drafted = steps = 0
    for prompt in PROMPTS:
        want = _plain(target, prompt, 40)
        target.reset()
        spec = Speculation(make_drafter(f"{kind}:{folder}", target), max_draft=2, adaptive=False)
        target.generate(prompt, 40, temperature=0, spec=spec)
        assert list(target.last.tokens) == want, prompt
        accepted, drafted = accepted + target.stats.accepted_tokens, drafted + target.stats.drafted_tokens
        steps += target.stats.verify_steps
    # random weights accept ~nothing (1.0 tokens per verify step); these were trained for 1.4 minutes each
    assert drafted > 0 and accepted / drafted > 0.1 and (accepted + steps) / steps > 1.2, (accepted, drafted, steps)


def test_eagle_runs_its_head_over_the_prompt_in_begin(target):
    """The prompt's rows are cached by ``begin`` (with the target's prefill), so a generation's first draft runs
    the head over its newest row only, and drafts what a drafter extending its cache at that draft drafts."""
    folder = TRAINED / "eagle3"
    history = target.tokenizer.encode(PROMPTS[0])
    target.reset()
    target.prefill(history)
    rows = {layer: target.hidden(layer, 0, len(history))
            for layer in Eagle3Drafter.for_target(folder, target).hidden_layers}
    early, lazy = Eagle3Drafter.for_target(folder, target), Eagle3Drafter.for_target(folder, target, catch_up=1 << 20)
    early.begin(history, rows)
    lazy.begin(history, rows)
    lazy._truncate(0)  # as before: no head rows until the first draft
    assert len(early.head.keys) == len(early.pairs) == len(history) - 1
    assert early.draft(history, 4) == lazy.draft(history, 4)
    assert len(early.head.keys) == len(lazy.head.keys) == len(history) - 1


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_next"])
def test_random_drafters_keep_greedy_output(tmp_path, family):
    """Dense, MoE and hybrid targets; drafts that are almost never right: every step rejects, rolls back (the
    hybrids' recurrent state too), and the output stays exact."""
    llm = load(FIXTURES / family)
    depth = llm.config.num_layers
    for drafter in (Eagle3Drafter.for_target(eagle_folder(tmp_path / "e"), llm, top_k=3),
                    DFlashDrafter.for_target(dflash_folder(tmp_path / "d", target_layers=(0, depth - 1),
                                                           target_depth=depth), llm)):
        want = _plain(llm, PROMPTS[0], 30)
        llm.reset()
        llm.generate(PROMPTS[0], 30, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(llm.last.tokens) == want
        assert llm.stats.drafted_tokens > 0


def test_trained_drafters_on_opencl_keep_greedy_output():
    """The shared embedding and LM head run on the target's backend (here OpenCL) too."""
    ok, why = backend_ok("opencl")
    if not ok:
        pytest.skip(why)
    llm = load(FIXTURES / "qwen3", backends=["opencl"])
    want = _plain(llm, PROMPTS[0], 30)
    for kind, folder in (("eagle", "eagle3"), ("dflash", "dflash")):
        drafter = make_drafter(f"{kind}:{TRAINED / folder}", llm)
        assert TargetHead(llm)._head.placement.counts() == {"opencl": 1}
        llm.reset()
        llm.generate(PROMPTS[0], 30, temperature=0, spec=Speculation(drafter, adaptive=False))
        assert list(llm.last.tokens) == want and llm.stats.drafted_tokens > 0


def test_trained_drafters_on_a_quantized_gguf_target():
    """A GGUF target (Q8_0 embedding table, tied LM head): the drafters read its quantized table through hetero's
    kernels, and greedy output stays that of plain decoding."""
    llm = load(FIXTURES.parent / "gguf" / "qwen3-q8_0.gguf")
    want = _plain(llm, PROMPTS[1], 30)
    for kind, folder in (("eagle", "eagle3"), ("dflash", "dflash")):
        llm.reset()
        llm.generate(PROMPTS[1], 30, temperature=0, spec=Speculation(make_drafter(f"{kind}:{TRAINED / folder}", llm),
                                                                     adaptive=False))
        assert list(llm.last.tokens) == want and llm.stats.drafted_tokens > 0


def test_training_log_records_acceptance_against_minutes():
    log = json.loads((TRAINED / "training_log.json").read_text(encoding="utf-8"))
    for kind in ("eagle3", "dflash"):
        points = log["curves"][kind]
        assert points and all(p["minutes"] >= 0 and 0 <= p["acceptance_rate"] <= 1 for p in points)


def test_top_indices_are_argsorts_first_k():
    """The tree's partial selection picks what a full stable sort picks, ties included."""
    from hetero.llm.speculative.eagle import top_indices

    rng = np.random.default_rng(0)
    for n in (1, 5, 100):
        for k in (1, 3, 7, 400):
            x = rng.standard_normal((3, n)).astype(np.float32)
            x[0, :2] = 1.5  # a tie
            np.testing.assert_array_equal(top_indices(x, k), np.argsort(-x, axis=None, kind="stable")[:k])


def test_eagle_catches_up_over_its_window_after_drafting_was_off(target, monkeypatch):
    """Drafting off for the generation's first 20 tokens (a policy pause): the first draft runs the head over at
    most ``catch_up`` rows, not over every token decoded since the prompt, and greedy output stays plain."""
    want = _plain(target, PROMPTS[0], 40)
    drafter = Eagle3Drafter.for_target(TRAINED / "eagle3", target, catch_up=4)
    spec = Speculation(drafter)
    make_policy = spec._policy

    def paused(previous=None):
        policy = make_policy(previous)
        policy.off_until = 20
        return policy

    monkeypatch.setattr(spec, "_policy", paused)
    rows: list[int] = []
    step = drafter.head.step

    def counted(features, *args, **kwargs):
        rows.append(len(features))
        return step(features, *args, **kwargs)

    target.reset()
    target.generate(PROMPTS[0], 40, temperature=0, spec=spec)
    assert list(target.last.tokens) == want
    monkeypatch.setattr(drafter.head, "step", counted)
    kept: list[int] = []  # rows of the target's hidden states the drafter stored, per store
    put = drafter.raw.put
    monkeypatch.setattr(drafter.raw, "put", lambda start, new: kept.append(len(new)) or put(start, new))
    target.reset()
    target.generate(PROMPTS[0], 40, temperature=0, spec=spec)
    assert list(target.last.tokens) == want and len(rows) > 1  # it drafted after the pause (verified or shadowed)
    prompt = len(target.tokenizer.encode(PROMPTS[0]))
    assert rows[0] == prompt - 1 and 1 <= max(rows[1:]) <= 4, rows  # begin: the prompt's pairs; then the window
    # the pause's ~20 rows: only the window's were stacked and stored (the prompt's all, in begin)
    assert kept[0] == prompt and 1 <= max(kept[1:]) <= 4, kept
    assert drafter.known == len(drafter.raw)  # every position counted, stored or not
