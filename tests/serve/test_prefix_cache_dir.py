"""The prefix cache's directory (``PrefixCache(directory=...)``, ``hetero serve --prefix-cache-dir``): computed
prompts written as prefix-cache files and found again by a new cache (a restarted server), on attention-only and
hybrid models; files of another KV type passed over, a damaged one ignored with a warning and deleted, the folder
kept within its bytes."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from hetero.llm import prompt_cache_file as pcf
from hetero.llm.prefix_cache import SUFFIX, PrefixCache
from hetero.llm.prompt_cache_file import PromptCacheWarning

from .serve_models import load_family, load_model, token_ids


@pytest.fixture(autouse=True)
def _hash_index(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "hetero-cache"))


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + SUFFIX))


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_new_cache_finds_the_prompts_an_earlier_one_wrote(family, tmp_path):
    folder = tmp_path / "prefixes"
    first = load_family(family)
    first.prefix_cache = PrefixCache(64 << 20, min_tokens=8, directory=folder)
    prompt = token_ids(40, 1)
    first.prefill(prompt)
    assert first.prefix_cache.stats.files_written == 1 and len(_files(folder)) == 1
    restarted, computed = load_family(family), load_family(family)
    cache = restarted.prefix_cache = PrefixCache(64 << 20, min_tokens=8, directory=folder)
    longer = [*prompt, 5, 6, 7]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromptCacheWarning)
        got = restarted.prefill(longer)
    assert cache.stats.file_hits == 1 and cache.stats.tokens_saved == len(prompt)
    assert restarted.stats.cached_tokens == len(prompt)
    computed.forward(prompt)  # the same steps: the prompt, then the rest (a chunked recurrence rounds otherwise)
    assert np.array_equal(got, computed.forward([5, 6, 7]))
    assert len(_files(folder)) == 2  # the longer prompt was kept too


def test_files_of_another_kv_type_are_passed_over_and_a_damaged_one_is_deleted(tmp_path):
    folder = tmp_path / "prefixes"
    writer = load_family("qwen3")
    writer.prefix_cache = PrefixCache(64 << 20, min_tokens=8, directory=folder)
    prompt = token_ids(40, 2)
    writer.prefill(prompt)
    other = load_family("qwen3", kv_cache="q8")
    other.prefix_cache = PrefixCache(64 << 20, min_tokens=8, directory=folder)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromptCacheWarning)
        other.prefill([*prompt, 9])
    assert other.prefix_cache.stats.file_hits == 0 and len(_files(folder)) == 2  # its own file beside the f16 one
    f16 = next(p for p in _files(folder) if pcf.read_meta(p)["key"]["kv_cache"] == "f16")
    data = bytearray(f16.read_bytes())
    data[-3] ^= 0xFF
    f16.write_bytes(bytes(data))
    reader, computed = load_family("qwen3"), load_family("qwen3")
    reader.prefix_cache = PrefixCache(64 << 20, min_tokens=8, directory=folder)
    with pytest.warns(PromptCacheWarning, match="payload checksum mismatch"):
        got = reader.prefill([*prompt, 9])
    assert reader.stats.cached_tokens == 0 and np.array_equal(got, computed.prefill([*prompt, 9]))
    assert not f16.exists()


def test_a_link_in_the_folder_is_not_followed(tmp_path):
    """Only the folder's own files are read: a link (to a valid file elsewhere) is passed over."""
    elsewhere, folder = tmp_path / "elsewhere", tmp_path / "prefixes"
    writer = load_family("qwen3")
    writer.prefix_cache = PrefixCache(0, min_tokens=8, directory=elsewhere)
    prompt = token_ids(40, 7)
    writer.prefill(prompt)
    folder.mkdir()
    (folder / ("link" + SUFFIX)).symlink_to(_files(elsewhere)[0])
    reader = load_family("qwen3")
    reader.prefix_cache = PrefixCache(0, min_tokens=8, directory=folder)
    reader.prefill([*prompt, 9])
    assert reader.prefix_cache.stats.file_hits == 0 and reader.stats.cached_tokens == 0


def test_the_folder_is_kept_within_its_bytes(tmp_path):
    folder = tmp_path / "prefixes"
    llm = load_family("qwen3")
    llm.prefix_cache = PrefixCache(0, min_tokens=8, directory=folder)  # files only, nothing in memory
    llm.prefill(token_ids(40, 3))
    size = _files(folder)[0].stat().st_size
    llm.prefix_cache = cache = PrefixCache(0, min_tokens=8, directory=folder, directory_bytes=2 * size + size // 2)
    for seed in (4, 5, 6):
        llm.reset()
        llm.prefill(token_ids(40, seed))
    assert len(cache) == 0 and len(_files(folder)) == 2
    assert sum(p.stat().st_size for p in _files(folder)) <= cache.directory_bytes


def test_a_restarted_server_reuses_the_prompts_of_the_last_one(tmp_path):
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (pip install 'hetero[serve]')")
    from .serve_harness import running

    folder = tmp_path / "prefixes"
    system = {"role": "system", "content": "Answer in one word, please, and nothing else. " * 4}
    body = {"messages": [system, {"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    with running([load_model()], prefix_cache_bytes=32 << 20, prefix_min_tokens=8,
                 prefix_cache_dir=str(folder)) as server:
        status, first = server.post("/v1/chat/completions", body)
    assert status == 200 and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(_files(folder)) == 1
    with running([load_model()], prefix_cache_bytes=0, prefix_cache_dir=str(folder)) as server:
        status, again = server.post("/v1/chat/completions", body)
        metrics = server.request("GET", "/metrics")[2].decode()
    assert status == 200 and again["choices"][0]["message"] == first["choices"][0]["message"]
    # the whole prompt but its last token came from the file
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"] - 1
    assert "hetero_prefix_cache_hits_total 1.0" in metrics and "hetero_prefix_cache_file_hits_total 1.0" in metrics
