"""Prefix-cache files (``hetero.llm.prompt_cache_file`` / ``prompt_cache``; llama.cpp's ``--prompt-cache``): a prompt
saved by one process and loaded by another gives the output and logits of computing it, on attention-only (Qwen3)
and hybrid (Qwen3.5: recurrent and conv state) models; a stale (model file changed), foreign (another model,
backend, KV type), truncated, damaged or garbage file is ignored with one warning and the prompt is computed; a
prompt that does not start with the file's tokens computes from 0; writes are atomic under concurrent use."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import hetero.llm
from concurrency import run_in_threads
from hetero.contract.errors import HeteroError
from hetero.llm import model_hash, snapshot
from hetero.llm import prompt_cache_file as pcf
from hetero.llm.prompt_cache import model_key
from hetero.llm.prompt_cache_file import PromptCacheWarning

from .helpers import FIXTURES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _hash_index(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_CACHE_DIR", str(tmp_path / "hetero-cache"))  # the memoized hashes: per test


def _load(path: Path | str, **options) -> hetero.llm.Llm:
    options.setdefault("kv_cache", "f16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hetero.llm.load(path, backends=["cpu"], context=256, on_fallback="silent", **options)


def _ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 200, n)]


def _greedy(llm: hetero.llm.Llm, prompt: list[int], **options) -> tuple[list[int], int]:
    """8 greedy tokens after ``prompt`` from an empty cache, and how many prompt tokens were not computed."""
    llm.reset()
    llm.generate(prompt, 8, temperature=0, **options)
    return list(llm.last.tokens), llm.stats.cached_tokens


def _quiet(fn, *args, **kwargs):
    """``fn``'s result and the PromptCacheWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, PromptCacheWarning)]


_CHILD = """
import json, sys, warnings
import numpy as np
import hetero.llm
family, mode, path, prompt = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    llm = hetero.llm.load(family, backends=["cpu"], context=256, on_fallback="silent")
from hetero.llm.prompt_cache_file import PromptCacheWarning
warnings.simplefilter("error", PromptCacheWarning)  # a file not used fails the test
if mode == "write":
    llm.generate(prompt, 1, temperature=0, prompt_cache=path)
    print(json.dumps({"cached": llm.stats.cached_tokens}))
else:
    llm.generate(prompt + [11, 12, 13, 14], 8, temperature=0, prompt_cache=path, prompt_cache_ro=True)
    tokens, cached = llm.last.tokens, llm.stats.cached_tokens
    llm.reset()
    restored = llm.load_prompt_cache(path)
    np.save(path + ".logits.npy", llm.forward([11, 12, 13]))
    print(json.dumps({"restored": restored, "tokens": tokens, "cached": cached}))
"""


def _child(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_a_file_written_by_one_process_gives_another_the_computed_output_and_logits(family, tmp_path):
    path = str(tmp_path / "prompt.hpc")
    prompt = _ids(70, 1)  # over a K tile of 64 positions
    assert _child(str(FIXTURES / family), "write", path, json.dumps(prompt)) == {"cached": 0}
    got = _child(str(FIXTURES / family), "read", path, json.dumps(prompt))
    fresh = _load(FIXTURES / family)
    fresh.forward(prompt)
    want_logits = fresh.forward([11, 12, 13])
    want_tokens, _ = _greedy(fresh, [*prompt, 11, 12, 13, 14])
    assert got["restored"] == len(prompt)
    assert np.array_equal(np.load(path + ".logits.npy"), want_logits)  # bit for bit
    assert got["tokens"] == want_tokens and got["cached"] == len(prompt)


def test_the_whole_prompt_from_a_file_computes_nothing(tmp_path):
    for family in ("qwen3", "qwen3_5"):  # the logits of the last token are in the file
        path = tmp_path / f"{family}.hpc"
        prompt = _ids(50, 2)
        writer, reader, fresh = (_load(FIXTURES / family) for _ in range(3))
        _greedy(writer, prompt, prompt_cache=path)
        got, cached = _greedy(reader, prompt, prompt_cache=path)
        assert cached == len(prompt) and reader.stats.prefill_tokens == 0
        assert got == _greedy(fresh, prompt)[0]


def test_save_and_load_prompt_cache_after_a_generation(tmp_path):
    path = tmp_path / "chat.hpc"
    llm, other, fresh = (_load(FIXTURES / "qwen3_5") for _ in range(3))
    prompt = _ids(40, 3)
    llm.generate(prompt, 6, temperature=0)
    held = list(llm.tokens)  # the prompt and the reply but its last token
    assert llm.save_prompt_cache(path) == path.stat().st_size
    assert other.load_prompt_cache(path) == len(held) and other.tokens == held
    follow = [*held, 21, 22]
    assert _greedy(other, follow)[0] == _greedy(fresh, follow)[0]
    # the same tokens as the file: a recurrent state cannot step back, so the last one is recomputed from history
    other.load_prompt_cache(path)
    assert _greedy(other, held)[0] == _greedy(fresh, held)[0]
    with pytest.raises(HeteroError, match="empty"):
        _load(FIXTURES / "qwen3").save_prompt_cache(tmp_path / "none.hpc")


def _saved(tmp_path: Path, family: str = "qwen3", prompt: list[int] | None = None, **options) -> tuple[Path, list]:
    path = tmp_path / "prompt.hpc"
    prompt = prompt or _ids(60, 4)
    _greedy(_load(FIXTURES / family, **options), prompt, prompt_cache=path)
    return path, prompt


def _ignored(path: Path, prompt: list[int], family: str = "qwen3", model: Path | None = None, **options) -> str:
    """Use ``path`` for ``prompt``: it must be ignored (nothing restored, the computed output, one warning)."""
    llm = _load(model or FIXTURES / family, **options)
    (got, cached), warned = _quiet(_greedy, llm, prompt, prompt_cache=path, prompt_cache_ro=True)
    assert cached == 0 and len(warned) == 1, warned
    assert got == _greedy(_load(model or FIXTURES / family, **options), prompt)[0]
    return warned[0]


def test_a_file_of_a_changed_model_file_is_ignored(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURES / "qwen3", model)
    path, prompt = tmp_path / "p.hpc", _ids(60, 5)
    before = _load(model)
    _greedy(before, prompt, prompt_cache=path)
    weights = model / "model.safetensors"
    with open(weights, "r+b") as f:  # one byte of the last weight, in place (same size, new mtime)
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x01]))
    assert "model file (content hash)" in _ignored(path, prompt, model=model)
    # the model loaded before the change cannot key a file any more: its weights are not the file's
    (_, cached), warned = _quiet(_greedy, before, prompt, prompt_cache=path)
    assert cached == 0 and "changed on disk since the model was loaded" in warned[0]
    with pytest.raises(HeteroError, match="changed on disk"):
        before.save_prompt_cache(tmp_path / "q.hpc")


def test_a_truncated_file_is_ignored(tmp_path):
    path, prompt = _saved(tmp_path)
    data = path.read_bytes()
    for size in (len(data) - 1, 4096 + 10, 40, 0):
        path.write_bytes(data[:size])
        warned = _ignored(path, prompt)
        assert "truncated" in warned or "not a hetero prefix-cache file" in warned, warned


def test_a_flipped_byte_is_detected(tmp_path):
    path, prompt = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    for where in (len(data) - 7, 4096 + 3, 100):  # the payload's end and start, and the JSON metadata
        damaged = bytearray(data)
        damaged[where] ^= 0x10
        path.write_bytes(bytes(damaged))
        warned = _ignored(path, prompt)
        assert "checksum mismatch" in warned, warned


def test_garbage_and_other_files_are_ignored(tmp_path):
    prompt = _ids(60, 6)
    path = tmp_path / "junk.hpc"
    for junk in (os.urandom(10000), b"HTPCACHE" + os.urandom(100), b"", b"PK\x03\x04"):
        path.write_bytes(junk)
        warned = _ignored(path, prompt)
        assert str(path) in warned
    np.savez(path.with_suffix(".npz"), a=np.zeros(3))  # a numpy file of the right name
    shutil.move(path.with_suffix(".npz"), path)
    assert "not a hetero prefix-cache file" in _ignored(path, prompt)


def test_a_file_of_another_model_precision_or_backend_is_ignored(tmp_path):
    path, prompt = _saved(tmp_path)
    assert "KV cache type: the file has f16, the model q8" in _ignored(path, prompt, kv_cache="q8")
    assert "model file (content hash)" in _ignored(path, prompt, family="qwen2")
    llm = _load(FIXTURES / "qwen3")
    llm.prefill(prompt)
    key = {**model_key(llm), "backend": "opencl"}  # a file with a valid checksum, written for another backend
    pcf.write(path, key, snapshot.export(llm, 0, len(prompt)))
    assert "backend: the file has opencl, the model cpu" in _ignored(path, prompt)


def test_an_array_outside_the_payload_is_refused_before_reading(tmp_path):
    path, prompt = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    meta_len = int.from_bytes(data[12:16], "little")
    meta = json.loads(data[64:64 + meta_len])
    payload = int.from_bytes(data[24:32], "little")
    meta["arrays"][-1]["offset"] = payload  # its bytes would lie past the end of the file
    raw = json.dumps(meta, separators=(",", ":")).encode()
    assert len(raw) < 4096 - 64
    data[64:4096] = raw + b"\0" * (4096 - 64 - len(raw))
    data[12:16] = len(raw).to_bytes(4, "little")
    data[32:48] = hashlib.blake2b(bytes(data[:32] + data[64:4096]), digest_size=16).digest()  # a crafted file
    path.write_bytes(bytes(data))
    assert "does not fit its shape or the payload" in _ignored(path, prompt)


def test_a_prompt_that_does_not_start_with_the_files_tokens(tmp_path):
    path, prompt = _saved(tmp_path)
    other = [7, *prompt[1:]]  # differs at the first token
    llm, fresh = _load(FIXTURES / "qwen3"), _load(FIXTURES / "qwen3")
    before = path.read_bytes()
    (got, cached), warned = _quiet(_greedy, llm, other, prompt_cache=path, prompt_cache_ro=True)
    assert cached == 0 and not warned and got == _greedy(fresh, other)[0]
    assert path.read_bytes() == before  # read-only: not rewritten
    # a shared beginning is reused on an attention-only model, and the file then holds the new prompt
    shared = [*prompt[:40], *_ids(30, 7)]
    got, cached = _greedy(llm, shared, prompt_cache=path)
    assert cached == 40 and got == _greedy(fresh, shared)[0]
    assert pcf.read_meta(path)["tokens"] == shared


def test_a_hybrid_models_file_is_used_only_for_prompts_that_extend_it(tmp_path):
    path, prompt = _saved(tmp_path, "qwen3_5", _ids(40, 8))
    partial = [*prompt[:30], *_ids(20, 9)]  # its recurrent state stands at 40 tokens, not at 30
    llm, fresh = _load(FIXTURES / "qwen3_5"), _load(FIXTURES / "qwen3_5")
    (got, cached), warned = _quiet(_greedy, llm, partial, prompt_cache=path, prompt_cache_ro=True)
    assert cached == 0 and not warned and got == _greedy(fresh, partial)[0]
    longer = [*prompt, *_ids(10, 10)]
    got, cached = _greedy(llm, longer, prompt_cache=path, prompt_cache_ro=True)
    assert cached == len(prompt) and got == _greedy(fresh, longer)[0]
    meta = pcf.read_meta(path)
    assert meta["recurrent"] and {a["name"] for a in meta["arrays"]} >= {"state", "hist_x", "k", "v", "logits"}


def test_concurrent_writers_and_readers_of_one_file(tmp_path):
    path = tmp_path / "shared.hpc"
    prompts = [_ids(60, 11), _ids(60, 12)]
    fresh = _load(FIXTURES / "qwen3")
    want = [_greedy(fresh, p)[0] for p in prompts]
    models = [_load(FIXTURES / "qwen3") for _ in range(2)]

    def work(i: int) -> list[tuple[int, list[int]]]:
        got = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(6):
                which = (i + step) % 2
                got.append((which, _greedy(models[i], prompts[which], prompt_cache=path)[0]))
        assert not [w for w in caught if issubclass(w.category, PromptCacheWarning)]
        return got

    results = [result for got in run_in_threads(work, 2) for result in got]
    assert len(results) == 12 and all(tokens == want[which] for which, tokens in results)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind


def test_the_content_hash_is_memoized_by_path_size_mtime_and_inode(tmp_path):
    target = tmp_path / "weights.bin"
    target.write_bytes(b"a" * 1000)
    first = model_hash.file_sha256(target)
    index = json.loads(model_hash.index_path().read_text())
    assert index[str(target.resolve())][4] == first
    index[str(target.resolve())][4] = "0" * 64  # a memoized value is used as long as the stat matches
    model_hash.index_path().write_text(json.dumps(index))
    assert model_hash.file_sha256(target) == "0" * 64
    os.utime(target, ns=(1, 1))  # touched: hashed again
    assert model_hash.file_sha256(target) == first
    model_hash.index_path().write_text("{not json")  # a damaged index is rebuilt
    assert model_hash.file_sha256(target) == first


def test_generate_refuses_a_prompt_cache_that_is_not_a_path():
    with pytest.raises(HeteroError, match="expected a file path"):
        _load(FIXTURES / "qwen3").generate([1, 2, 3], 1, prompt_cache=3)


def test_generate_and_chat_commands_take_a_prompt_cache(tmp_path, capsys):
    from hetero.cli import build_parser
    from hetero.llm import cli

    path = tmp_path / "prompt.hpc"
    command = ["generate", str(FIXTURES / "qwen3"), "The quick brown fox jumps over the lazy dog. " * 4, "-n", "6",
               "--temp", "0", "-b", "cpu", "--prompt-cache", str(path)]
    outputs = []
    for _ in range(2):
        args = build_parser().parse_args(command)
        assert args.func(args) == 0
        outputs.append(capsys.readouterr())
    assert path.is_file() and outputs[0].out == outputs[1].out
    assert "(0 cached)" in outputs[0].err and "(0 cached)" not in outputs[1].err
    chat = tmp_path / "chat.hpc"
    errs = []
    for _ in range(2):
        args = build_parser().parse_args(["chat", str(FIXTURES / "qwen3"), "-n", "4", "--temp", "0", "--system",
                                          "Be brief. " * 8, "-b", "cpu", "--prompt-cache", str(chat),
                                          "--prompt-cache-ro"])
        assert cli._cmd_chat(args, stdin=io.StringIO("Hello!\n/exit\n")) == 0
        errs.append(capsys.readouterr().err)
    assert not chat.exists() and "(0 cached)" in errs[0]  # read-only: never written
    args = build_parser().parse_args(["generate", str(FIXTURES / "qwen3"), "hi", "--prompt-cache-ro"])
    with pytest.raises(HeteroError, match="--prompt-cache-ro needs --prompt-cache"):
        args.func(args)
