"""Snapshots of a computed prefix (``hetero.llm.snapshot``) and the prefix cache built on them
(``hetero.llm.prefix_cache``): a prefix restored into another model gives bit for bit the logits of computing it,
on attention-only (Qwen3) and hybrid (Qwen3.5: recurrent GatedDeltaRule state) models; the cache restores a shared
system prompt on another slot, stays within its bytes, and the server counts its hits in /metrics."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.contract.errors import HeteroError
from hetero.llm import snapshot
from hetero.llm.prefix_cache import PrefixCache

from .serve_models import load_family, load_model, token_ids


@pytest.mark.parametrize("kv_cache", ["f16", "f32", "q8"])
def test_a_restored_prefix_gives_the_logits_of_computing_it(kv_cache):
    source, fresh, computed = (load_family("qwen3", kv_cache=kv_cache) for _ in range(3))
    prompt = token_ids(90, 1)  # over a K tile of 64 positions: a partial tile is restored
    source.prefill(prompt)
    snap = snapshot.export(source, 0, len(prompt))
    assert snap.tokens == tuple(prompt) and not snap.recurrent and snap.nbytes > 0
    for keep in (70, 64, 5):
        snapshot.restore(fresh, 0, snap, keep)
        fresh.tokens = prompt[:keep]
        computed.reset()
        computed.forward(prompt[:keep])
        rest = [11, 12, 13]
        assert np.array_equal(fresh.forward(rest), computed.forward(rest)), keep


def test_a_hybrid_models_state_is_restored_whole_only():
    source, fresh, computed = (load_family("qwen3_5") for _ in range(3))
    prompt = token_ids(40, 2)
    source.prefill(prompt)
    snap = snapshot.export(source, 0, len(prompt))
    assert snap.recurrent
    assert snap.usable([*prompt, 5, 6]) == len(prompt) and snap.usable(prompt[:30] + [1] * 20) == 0
    with pytest.raises(HeteroError, match="restores whole"):
        snapshot.restore(fresh, 0, snap, 30)
    snapshot.restore(fresh, 0, snap, len(prompt))
    fresh.tokens = list(prompt)
    computed.forward(prompt)
    for token in (7, 8, 9):  # decode steps from the restored recurrent and conv state
        assert np.array_equal(fresh.forward([token]), computed.forward([token]))
    with pytest.raises(HeteroError, match="no recurrent state at position 3"):
        snapshot.export(source, 0, 3)  # neither where the state stands nor a kept snapshot


def test_snapshots_of_another_model_or_kv_type_are_refused():
    snap_src = load_family("qwen3")
    snap_src.prefill(token_ids(10, 3))
    snap = snapshot.export(snap_src, 0, 10)
    with pytest.raises(HeteroError, match="does not fit"):
        snapshot.restore(load_family("qwen3", kv_cache="q8"), 0, snap, 10)
    with pytest.raises(HeteroError, match="does not fit"):
        snapshot.restore(load_family("qwen2"), 0, snap, 10)
    with pytest.raises(HeteroError, match="cannot snapshot 11 tokens"):
        snapshot.export(snap_src, 0, 11)


def test_a_shared_system_prompt_is_computed_once_across_slots():
    cache = PrefixCache(64 << 20, min_tokens=8)
    a, b = load_model(), load_model()
    alone = load_model()
    a.prefix_cache = b.prefix_cache = cache
    system = {"role": "system", "content": "You are a terse assistant. " * 6}
    first = [system, {"role": "user", "content": "hi"}]
    second = [system, {"role": "user", "content": "name a colour"}]
    a.create_chat_completion(first, max_tokens=4, temperature=0)
    assert cache.stats.stored == 1 and cache.stats.hits == 0
    got = b.create_chat_completion(second, max_tokens=6, temperature=0)
    want = alone.create_chat_completion(second, max_tokens=6, temperature=0)
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert cache.stats.hits == 1 and cache.stats.tokens_saved > 40
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == cache.stats.tokens_saved
    assert want["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_the_cache_keeps_within_its_bytes_least_recently_used_out_first():
    llm = load_family("qwen3")
    one = PrefixCache(1 << 30, min_tokens=4)
    llm.prefix_cache = one
    llm.prefill(token_ids(20, 4))
    size = one.nbytes
    bounded = PrefixCache(2 * size + size // 2, min_tokens=4)  # room for two snapshots of 20 tokens
    llm.prefix_cache = bounded
    prompts = [token_ids(20, seed) for seed in (5, 6, 7)]
    for prompt in prompts:
        llm.reset()
        llm.prefill(prompt)
    assert len(bounded) == 2 and bounded.stats.evicted == 1 and bounded.nbytes <= bounded.max_bytes
    llm.reset()
    llm.prefill([*prompts[0], 9])  # the evicted one: computed again
    assert bounded.stats.hits == 0
    llm.reset()
    llm.prefill([*prompts[2], 9])
    assert bounded.stats.hits == 1 and bounded.stats.tokens_saved == 20


def test_the_server_counts_prefix_cache_hits_in_metrics():
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (pip install 'hetero[serve]')")
    from .serve_harness import running

    system = {"role": "system", "content": "Answer in one word, please, and nothing else. " * 4}
    chat = [{"messages": [system, {"role": "user", "content": q}], "max_tokens": 3, "temperature": 0}
            for q in ("hi", "why")]
    with running([load_model()], prefix_cache_bytes=32 << 20, prefix_min_tokens=8) as server:
        assert server.post("/v1/chat/completions", chat[0])[0] == 200
        # another prompt takes the slot's KV cache: the system prompt is then only in the prefix cache
        assert server.post("/v1/completions", {"prompt": "lorem ipsum dolor " * 12, "max_tokens": 2})[0] == 200
        status, body = server.post("/v1/chat/completions", chat[1])
        metrics = server.request("GET", "/metrics")[2].decode()
    assert status == 200
    saved = _metric(metrics, "hetero_prefix_cache_tokens_saved_total")
    assert _metric(metrics, "hetero_prefix_cache_hits_total") == 1 and saved > 40
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == saved
    assert _metric(metrics, "hetero_prefix_cache_entries") == 3 and _metric(metrics, "hetero_prefix_cache_bytes") > 0


def _metric(text: str, name: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_a_snapshot_file_restores_and_a_bad_file_is_a_hetero_error(tmp_path):
    source, fresh, computed = (load_family("qwen3_5") for _ in range(3))
    prompt = token_ids(30, 8)
    source.prefill(prompt)
    path = tmp_path / "prefix.npz"
    snapshot.save(snapshot.export(source, 0, len(prompt)), path)
    snapshot.restore(fresh, 0, snapshot.load(path), len(prompt))
    fresh.tokens = list(prompt)
    computed.forward(prompt)
    assert np.array_equal(fresh.forward([4]), computed.forward([4]))
    raw = path.read_bytes()
    damaged = [raw[:at] + b"\xa5" * 64 + raw[at + 64:] for at in range(0, len(raw) - 64, len(raw) // 8)]
    for bad in (raw[: len(raw) // 2], b"not a zip", *damaged):
        path.write_bytes(bad)
        with pytest.raises(HeteroError, match=r"prefix\.npz"):
            snapshot.restore(fresh, 0, snapshot.load(path), len(prompt))
    np.savez(path, x=np.zeros(3))
    with pytest.raises(HeteroError, match="not a hetero snapshot"):
        snapshot.load(path)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_prefix_moves_between_the_slots_of_one_model(family):
    batched, alone = load_family(family, slots=2), load_family(family)
    cache = PrefixCache(64 << 20, min_tokens=4)
    first, second = batched.sequence(0), batched.sequence(1)
    first.prefix_cache = second.prefix_cache = cache
    prompt = token_ids(40, 9)
    first.prefill(prompt)
    logits = second.prefill([*prompt, 17])  # slot 1 restores slot 0's prompt, computes one token
    assert cache.stats.hits == 1 and cache.stats.tokens_saved == len(prompt)
    alone.prefill(prompt)  # the same split (a recurrent prompt of 40 then 1 is not bitwise one of 41)
    assert np.array_equal(logits[-1:], alone.prefill([*prompt, 17])[-1:])
    with pytest.raises(HeteroError, match="slot 2 does not exist"):
        snapshot.export(batched, 2, 10)
