"""The numpy Eagle-3 and DFlash drafters against PyTorch references of the same networks (scripts/drafter_torch.py)
on random weights: layer outputs, tree attention masks, drafted tokens, and the training unroll's agreement with
what inference drafts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0 for the "
                                            "drafter reference tests)")

from hetero.llm.speculative.dflash import DFlashDrafter, load_dflash  # noqa: E402
from hetero.llm.speculative.eagle import Eagle3Drafter, load_eagle3  # noqa: E402

from .drafter_fixtures import dflash_config, dflash_folder, eagle_config, eagle_folder  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import drafter_torch  # noqa: E402

VOCAB, H = 320, 64
torch.set_num_threads(1)


def _torch_model(cls, config: dict, folder: Path):
    from hetero.llm import safetensors

    model = cls(config)
    st = safetensors.SafetensorsModel(folder)
    model.load_state_dict({name: torch.from_numpy(np.array(st.raw(name))) for name in st})
    return model.eval()


@pytest.fixture
def eagle(tmp_path):
    config = eagle_config(aux=[1, 2, 3])
    folder = eagle_folder(tmp_path / "eagle", aux=[1, 2, 3])
    rng = np.random.default_rng(1)
    table = rng.standard_normal((VOCAB, H)).astype(np.float32)
    return load_eagle3(folder), _torch_model(drafter_torch.Eagle3, config, folder), table


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def test_eagle_step_matches_torch_under_a_tree_mask(eagle):
    weights, ref, table = eagle
    drafter = Eagle3Drafter(weights, lambda ids: table[np.asarray(ids)], num_layers=4)
    rng = np.random.default_rng(2)
    past, rows = 7, 5
    feats = rng.standard_normal((past + rows, H)).astype(np.float32)
    emb = table[rng.integers(0, VOCAB, past + rows)]
    pos = np.arange(past + rows)
    out0, k0, v0 = drafter.head.step(feats[:past], emb[:past], pos[:past], np.tril(np.ones((past, past), bool)))
    drafter.head.keys, drafter.head.values = k0, v0
    visible = rng.random((rows, past + rows)) < 0.6
    visible[np.arange(rows), past + np.arange(rows)] = True  # every row sees itself
    out, _, _ = drafter.head.step(feats[past:], emb[past:], pos[past:], visible)
    with torch.no_grad():
        r0, rk, rv = ref.step(_t(feats[:past]), _t(emb[:past]), _t(pos[:past]), torch.zeros(0, 2, 16),
                              torch.zeros(0, 2, 16), _t(np.tril(np.ones((past, past), bool))))
        r, _, _ = ref.step(_t(feats[past:]), _t(emb[past:]), _t(pos[past:]), rk, rv, _t(visible))
        logits = ref.logits(r)
    np.testing.assert_allclose(out0, r0.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, r.numpy(), rtol=1e-4, atol=1e-4)
    lp = drafter.head.log_probs(out)
    np.testing.assert_allclose(lp, torch.log_softmax(logits, -1).numpy(), rtol=1e-4, atol=1e-4)


def _torch_chain(ref, table, hidden, tokens, chain):
    """Torch log-probs after running pairs 0..n-1 (causal) and then ``chain`` (drafted tokens) as a causal chain:
    the distribution from which the token after the chain is drawn."""
    n = len(tokens) - 1
    with torch.no_grad():
        feat = ref.fc(_t(hidden[:n]))
        out, k, v = ref.step(feat, _t(table[tokens[1:]]), torch.arange(n), torch.zeros(0, 2, 16),
                             torch.zeros(0, 2, 16), torch.tril(torch.ones(n, n, dtype=torch.bool)))
        last = out[-1:]
        for i, tok in enumerate(chain):
            mask = torch.ones(1, n + i + 1, dtype=torch.bool)
            last, k1, v1 = ref.step(last, _t(table[[tok]]), torch.tensor([n + i]), k, v, mask)
            k, v = torch.cat([k, k1]), torch.cat([v, v1])
        return torch.log_softmax(ref.logits(last)[0], -1).numpy()


def test_eagle_tree_nodes_follow_the_torch_chain_of_their_path(eagle):
    weights, ref, table = eagle
    rng = np.random.default_rng(3)
    n = 9
    tokens = rng.integers(0, VOCAB, n + 1).tolist()
    hidden = rng.standard_normal((n, 3 * H)).astype(np.float32)
    drafter = Eagle3Drafter(weights, lambda ids: table[np.asarray(ids)], num_layers=4, top_k=3)
    assert drafter.hidden_layers == (0, 1, 2)  # eagle_aux_hidden_state_layer_ids [1, 2, 3]: inputs of those layers
    drafter.begin(tokens[:n], {0: hidden[:, :H], 1: hidden[:, H:2 * H], 2: hidden[:, 2 * H:]})
    chain = drafter.draft(tokens, 4)
    tree = drafter.tree
    assert 1 <= len(chain) <= 4 and len(tree.tokens) == 3 * 4
    assert chain in [[tree.tokens[i] for i in tree.path(node)] for node in range(len(tree.tokens))]
    d2t = weights.d2t
    assert d2t is not None
    for node in range(len(tree.tokens)):
        path = tree.path(node)
        lp = _torch_chain(ref, table, hidden, tokens, [tree.tokens[i] for i in path[:-1]])
        draft_id = int(np.flatnonzero(np.arange(len(d2t)) + d2t == tree.tokens[node])[0])
        parent_score = tree.scores[path[-2]] if len(path) > 1 else 0.0
        assert tree.scores[node] == pytest.approx(parent_score + lp[draft_id], abs=1e-4)
    mask = tree.mask()
    assert mask[np.arange(12), np.arange(12)].all() and mask.sum() == 3 * (1 + 2 + 3 + 4)


def test_eagle_catch_up_after_a_pause_runs_the_window_over_the_cached_rows(eagle):
    """Rows handed over while drafting was off: a draft runs the head over the last ``catch_up`` of them only,
    attending to the rows cached before the pause and to those, at their own positions (torch: the same rows run
    with the gap's keys left out)."""
    weights, ref, table = eagle
    rng = np.random.default_rng(6)
    prompt_rows, gap, window = 6, 9, 3
    n = prompt_rows + gap + window
    tokens = rng.integers(0, VOCAB, n + 1).tolist()
    hidden = rng.standard_normal((n, 3 * H)).astype(np.float32)

    def layers(rows: np.ndarray) -> dict[int, np.ndarray]:
        return {0: rows[:, :H], 1: rows[:, H:2 * H], 2: rows[:, 2 * H:]}

    drafter = Eagle3Drafter(weights, lambda ids: table[np.asarray(ids)], num_layers=4, top_k=1, catch_up=window)
    drafter.begin(tokens[:prompt_rows], layers(hidden[:prompt_rows]))
    drafter.accept(0, tokens[prompt_rows:], layers(hidden[prompt_rows:]))  # the pause's rows, in one call
    first = drafter.draft(tokens, 1)
    kept = [*range(prompt_rows - 1), *range(n - window, n)]  # the prompt's pairs, then the window's
    assert drafter.positions == kept and len(drafter.head.keys) == len(kept)
    with torch.no_grad():
        feat = ref.fc(_t(hidden))
        p = prompt_rows - 1
        _, k, v = ref.step(feat[:p], _t(table[tokens[1:prompt_rows]]), torch.arange(p), torch.zeros(0, 2, 16),
                           torch.zeros(0, 2, 16), torch.tril(torch.ones(p, p, dtype=torch.bool)))
        mask = torch.cat([torch.ones(window, p, dtype=torch.bool),
                          torch.tril(torch.ones(window, window, dtype=torch.bool))], dim=1)
        out, _, _ = ref.step(feat[n - window:], _t(table[tokens[n - window + 1:]]), torch.arange(n - window, n),
                             k, v, mask)
        lp = torch.log_softmax(ref.logits(out[-1:])[0], -1).numpy()
    assert first == [int(weights.draft_to_target(np.asarray(int(np.argmax(lp)))))]


def test_eagle_greedy_chain_and_training_unroll_agree(eagle):
    """top_k=1 drafts the argmax chain; the training unroll (teacher-forced on those tokens) predicts the same."""
    weights, ref, table = eagle
    rng = np.random.default_rng(4)
    n = 12
    hidden = rng.standard_normal((n + 4, 3 * H)).astype(np.float32)
    prompt = rng.integers(0, VOCAB, n + 1).tolist()
    drafter = Eagle3Drafter(weights, lambda ids: table[np.asarray(ids)], num_layers=4, top_k=1)
    drafter.begin(prompt[:n], {0: hidden[:n, :H], 1: hidden[:n, H:2 * H], 2: hidden[:n, 2 * H:]})
    chain = drafter.draft(prompt, 4)
    lp = _torch_chain(ref, table, hidden, prompt, [])
    assert weights.draft_to_target(np.asarray(int(np.argmax(lp)))) == chain[0]
    seq = prompt + chain
    with torch.no_grad():
        # unroll rows j = n - 1 + s (step s) predict token seq[j + 2] = chain[s + 1]
        logits = ref.unrolled(_t(hidden[:len(seq) - 1]), _t(table[seq[1:]]), steps=3)
    for s in range(3):
        pred = int(weights.draft_to_target(np.asarray(int(logits[s][n - 1 + s].argmax()))))
        assert pred == chain[s]


@pytest.fixture
def dflash(tmp_path):
    config = dflash_config()
    folder = dflash_folder(tmp_path / "dflash")
    rng = np.random.default_rng(5)
    table = rng.standard_normal((VOCAB, H)).astype(np.float32)
    head = (rng.standard_normal((VOCAB, H)) / 8).astype(np.float32)
    return load_dflash(folder), _torch_model(drafter_torch.DFlash, config, folder), table, head


def test_dflash_block_matches_torch(dflash):
    weights, ref, table, head = dflash
    drafter = DFlashDrafter(weights, lambda ids: table[np.asarray(ids)], lambda h: h @ head.T, num_layers=2)
    rng = np.random.default_rng(6)
    n = 11
    hidden = rng.standard_normal((n, 2 * H)).astype(np.float32)
    tokens = rng.integers(0, VOCAB, n + 1).tolist()
    drafter.begin(tokens[:n], {0: hidden[:, :H], 1: hidden[:, H:]})
    rows = drafter.block_hidden(tokens[-1])
    block = [tokens[-1]] + [weights.mask_token_id] * (weights.block_size - 1)
    with torch.no_grad():
        ref_rows = ref(_t(hidden), torch.arange(n), _t(table[block]), torch.arange(n, n + weights.block_size))
    np.testing.assert_allclose(rows, ref_rows.numpy(), rtol=1e-4, atol=1e-4)
    drafted = drafter.draft(tokens, 8)
    assert len(drafted) == weights.block_size - 1
    assert drafted == np.argmax(ref_rows.numpy()[1:] @ head.T, axis=-1).tolist()


def test_dflash_context_built_in_steps_equals_one_pass(dflash):
    weights, _, table, head = dflash
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((10, 2 * H)).astype(np.float32)
    tokens = rng.integers(0, VOCAB, 11).tolist()
    one = DFlashDrafter(weights, lambda ids: table[np.asarray(ids)], lambda h: h @ head.T, num_layers=2)
    one.begin(tokens[:10], {0: hidden[:, :H], 1: hidden[:, H:]})
    steps = DFlashDrafter(weights, lambda ids: table[np.asarray(ids)], lambda h: h @ head.T, num_layers=2)
    steps.begin(tokens[:6], {0: hidden[:6, :H], 1: hidden[:6, H:]})
    steps.accept(0, tokens[6:7], {0: hidden[:0, :H], 1: hidden[:0, H:]})
    steps.accept(3, tokens[7:11], {0: hidden[6:10, :H], 1: hidden[6:10, H:]})
    np.testing.assert_allclose(one.block_hidden(tokens[10]), steps.block_hidden(tokens[10]), rtol=1e-5, atol=1e-5)


def test_dflash_started_from_the_targets_last_layer_is_that_layer():
    """train_drafter's --init-from-target on the Qwen3 fixture (full MLP width, fc passing the second-last layer's
    output through): fed the target's own hidden states before its last layer, under a causal mask, the drafter's
    rows through the target's LM head are the target's logits (hetero's run of the model is the reference)."""
    import train_drafter as td

    from .helpers import FIXTURES, load

    folder = FIXTURES / "qwen3"
    llm = load(folder, all_logits=True, hidden_layers=[0])
    cfg = llm.config
    ids = [5, 17, 99, 3, 250, 41, 7, 7, 64, 12, 300]
    logits = np.array(llm.forward(ids))
    before_last = np.array(llm.hidden(0, 0, len(ids)))
    llm.close()
    _, head, norm = td.target_matrices(folder, cfg)
    c = {**td.layer_config(cfg, cfg.intermediate_size), "num_hidden_layers": 1,
         "dflash_config": {"block_size": 4, "mask_token_id": 0, "target_layer_ids": [0]}}
    model = drafter_torch.DFlash(c)
    rows = _t(before_last)
    td.init_from_target(model.layers[0], td.target_layer(folder, cfg.num_layers - 1), rows, cfg.rms_norm_eps,
                        slice(0, cfg.hidden_size))
    with torch.no_grad():
        model.fc.weight.copy_(torch.eye(cfg.hidden_size))
        model.hidden_norm.weight.copy_(model.layers[0].input_layernorm.weight)
        model.norm.weight.copy_(norm)
        ctx, n = 6, len(ids)
        mask = torch.zeros(n - ctx, n, dtype=torch.bool)
        mask[:, :ctx] = True
        mask[:, ctx:] = torch.tril(torch.ones(n - ctx, n - ctx, dtype=torch.bool))
        out = model(rows[:ctx], torch.arange(ctx), rows[ctx:], torch.arange(ctx, n), mask)
    np.testing.assert_allclose((out @ head.T).numpy(), logits[ctx:], rtol=1e-3, atol=1e-3)


def test_top_k_soft_labels_are_the_targets_most_likely_tokens():
    import train_drafter as td

    logits = np.random.default_rng(3).standard_normal((7, 500)).astype(np.float32) * 4
    ids, logp = td.top_k(logits, 5)
    want = np.argsort(-logits, -1, kind="stable")[:, :5]
    np.testing.assert_array_equal(ids, want)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(logp.astype(np.float32), np.take_along_axis(log_softmax, want, -1), atol=2e-2)


def test_data_cache_round_trip_keeps_soft_labels_and_picks_layers_and_tokens(tmp_path):
    """save_data writes whole files only (a training run may read the cache while a data run extends it);
    load_data keeps the layers asked for and the first training sequences up to --max-train-tokens."""
    import train_drafter as td

    rng = np.random.default_rng(0)

    def seq(n: int, soft: bool) -> td.Sequence:
        return td.Sequence(rng.integers(0, 99, n), {1: rng.standard_normal((n, 4)).astype(np.float16),
                                                    5: rng.standard_normal((n, 4)).astype(np.float16)},
                           rng.integers(0, 99, n), n // 2, rng.integers(0, 99, (n, 3)).astype(np.int32) if soft
                           else None, rng.standard_normal((n, 3)).astype(np.float16) if soft else None)

    held, train = [seq(10, False)], [seq(20, True), seq(30, True), seq(40, True)]
    path = tmp_path / "data.npz"
    td.save_data(path, held, train)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.npz"]
    got_held, got_train = td.load_data(path)
    assert len(got_held) == 1 and [len(s.tokens) for s in got_train] == [20, 30, 40]
    assert got_held[0].top_ids is None
    for a, b in zip(train, got_train, strict=True):
        np.testing.assert_array_equal(a.top_ids, b.top_ids)
        np.testing.assert_array_equal(a.top_logp, b.top_logp)
        np.testing.assert_array_equal(a.hidden[5], b.hidden[5])
        assert b.generated_from == a.generated_from
    got_held, got_train = td.load_data(path, {5}, max_train_tokens=45)
    assert [len(s.tokens) for s in got_train] == [20, 30]  # stops once 45 tokens are reached
    assert set(got_held[0].hidden) == {5} and all(set(s.hidden) == {5} for s in got_train)


def test_train_drafter_two_layers_distilled_from_soft_labels(tmp_path):
    """The whole script on the Qwen3 fixture: a data cache with soft labels, then a two-layer DFlash drafter started
    from the target's layers (--init-layers), distilled from them for a CPU-time budget, on that cache's training
    sequences and (--more-data) those of a second cache; hetero loads what it wrote, the curve starts at step 0 and
    says how many drafts had their first 1, 2, 3 tokens accepted."""
    import json

    import train_drafter as td

    from hetero.llm.speculative.dflash import load_dflash

    from .helpers import FIXTURES

    target, data, out = FIXTURES / "qwen3", tmp_path / "data.npz", tmp_path / "out"
    corpus = Path(__file__).resolve().parents[2] / "core" / "hetero" / "llm"
    common = [str(target), "--out", str(out), "--kind", "dflash", "--data", str(data), "--corpus", str(corpus),
              "--corpus-patterns", "*.py", "--prompt-tokens", "24", "--gen-tokens", "8", "--train-tokens", "48",
              "--train-gen-tokens", "0", "--held-out", "2", "--record-layers", "0", "1", "--seed", "1"]
    assert td.main([*common, "--minutes", "0.15", "--data-share", "1", "--data-only", "--soft-labels", "4"]) == 0
    _, train = td.load_data(data)
    assert train and all(s.top_ids.shape == (len(s.tokens), 4) for s in train)
    assert all((s.top_ids[:, 0] == s.predicted).all() for s in train)  # the argmax is the most likely token
    assert td.main([*common, "--minutes", "5", "--data-share", "0", "--train-cpu-minutes", "0.02", "--block-size",
                    "4", "--dflash-layers", "2", "--dflash-layer-ids", "0", "--init-from-target", "--init-layers",
                    "0", "1", "--intermediate", "32", "--distill", "0.5", "--soft-k", "3", "--anchors", "4",
                    "--more-data", str(data)]) == 0
    drafter = load_dflash(out / "dflash")
    assert len(drafter.layers) == 2 and drafter.target_layers == (0,) and drafter.block_size == 4
    log = json.loads((out / "training_log.json").read_text())
    assert log["train_sequences"] == 2 * len(train)  # --more-data's training sequences too (here: the same cache)
    assert len(td.load_data(data)[1]) == len(train)  # and the cache itself is left as it was
    curve = log["curves"]["dflash"]
    assert curve[0]["steps"] == 0 and curve[-1]["steps"] > 0
    for point in curve:
        reach = point["first_k_accepted"]
        assert len(reach) == 3 and reach == sorted(reach, reverse=True)
        assert abs(sum(reach) - point["accepted_per_step"]) < 5e-3  # mean accepted = sum over k of P(>= k)
