"""Hostile LLM files and API misuse (issue 19's findings): each a clean HeteroError naming the file / field or
parameter, or a documented bounded behaviour — never a raw exception, a hang, a memory bomb or a crash."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import hetero.llm
from concurrency import run_in_threads
from hetero.contract.errors import HeteroError, ModelFormatError
from hetero.llm import files, gguf, loader
from hetero.llm.config import load_config
from hetero.llm.generate import StopMatcher, emit_end
from hetero.llm.sampler import LLAMA_CPP_DEFAULTS, from_generation_config, from_gguf
from hetero.llm.template import ChatTemplate, TemplateLimitError
from hetero.llm.tokenizer import Tokenizer, TokenizerPanic

from .helpers import FIXTURES, load

GGUF = FIXTURES.parent / "gguf" / "qwen3-q8_0.gguf"


def _config() -> dict:
    return json.loads((FIXTURES / "qwen3" / "config.json").read_text())


def _folder_with(tmp_path: Path, **files_: str | bytes) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    for name, text in files_.items():
        name = name.replace("__", ".")
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


# -- limits on what a model file may ask for --------------------------------------------------------------------------
@pytest.mark.parametrize("key, value, match", [
    ("num_hidden_layers", 10**9, "'num_hidden_layers' = 1000000000 is above hetero's limit"),
    ("num_attention_heads", 2**63, "'num_attention_heads' = 9223372036854775808 is above"),
    ("num_key_value_heads", 2**63, "'num_key_value_heads'"),
    ("head_dim", 2**40, "'head_dim'"),
    ("hidden_size", 2**40, "'hidden_size'"),
    ("vocab_size", 2**40, "'vocab_size'"),
    ("intermediate_size", 2**40, "'intermediate_size'"),
    ("max_position_embeddings", 2**40, "'max_position_embeddings'"),
    ("rope_theta", math.nan, "'rope_theta' must be a finite number above 1"),
    ("rope_theta", math.inf, "'rope_theta'"),
    ("rms_norm_eps", math.nan, "'rms_norm_eps' must be a finite number"),
    ("architectures", [{}], r"architecture '\[\{\}\]' is not supported"),
    ("model_type", ["qwen3"], "is not supported"),
])
def test_config_values_are_bounded(tmp_path, key, value, match):
    data = _config()
    data[key] = value
    if key == "rope_theta":  # where transformers 5 writes it
        data["rope_parameters"]["rope_theta"] = value
    if key in ("architectures", "model_type"):
        data.pop("architectures" if key == "model_type" else "model_type", None)
    folder = _folder_with(tmp_path, config__json=json.dumps(data))
    with pytest.raises(ModelFormatError, match=match) as info:
        load_config(folder)
    assert "config.json" in str(info.value)


def test_hybrid_layer_count_is_bounded_before_the_layer_list(tmp_path):
    data = json.loads((FIXTURES / "qwen3_5" / "config.json").read_text())
    data.get("text_config", data)["num_hidden_layers"] = 10**9
    data.get("text_config", data).pop("layer_types", None)
    folder = _folder_with(tmp_path, config__json=json.dumps(data))
    started = time.perf_counter()
    with pytest.raises(ModelFormatError, match="num_hidden_layers"):
        load_config(folder)
    assert time.perf_counter() - started < 5  # refused before a 10**9-entry list is built


@pytest.mark.parametrize("text, match", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply|not valid JSON"),
    ('{"a":' * 80 + "1" + "}" * 80, "nested more than 64 levels deep"),
    ('{"num_hidden_layers": ' + "9" * 5000 + "}", "not valid JSON"),
])
def test_json_nesting_and_huge_integers(tmp_path, text, match):
    folder = _folder_with(tmp_path, config__json=text)
    with pytest.raises(ModelFormatError, match=match):
        load_config(folder)


def test_gguf_context_metadata_is_bounded(tmp_path):
    from hetero.llm.fields import Fields

    meta = Fields({"qwen3.context_length": 2**40}, "m.gguf", noun="metadata", arch="qwen3")
    with pytest.raises(ModelFormatError, match=r"metadata 'qwen3\.context_length' = 1099511627776 is above"):
        meta.int("{arch}.context_length", bound="positions")


# -- no FIFO, device, unbounded file or file outside the folder -------------------------------------------------------
def _alarm(seconds: int):
    def fail(*_):
        raise AssertionError(f"blocked for {seconds} s")
    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


def test_config_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    _alarm(20)
    try:
        with pytest.raises(ModelFormatError, match="not a regular file"):
            load_config(folder)
        with pytest.raises(ModelFormatError, match="not a regular file"):
            gguf.GgufFile(folder / "config.json")
    finally:
        signal.alarm(0)


def test_config_linked_to_dev_zero_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").symlink_to("/dev/zero")
    with pytest.raises(ModelFormatError, match=r"outside the model folder|not a regular file"):
        load_config(folder)
    assert files.checked_file  # the same check without the folder bound:
    with pytest.raises(ModelFormatError, match="not a regular file"):
        files.read_json(folder / "config.json")


def test_files_outside_the_folder_are_not_read(tmp_path):
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps(_config()))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").symlink_to(outside)
    with pytest.raises(ModelFormatError, match="outside the model folder"):
        load_config(folder)


def test_oversized_json_is_refused_before_reading(tmp_path):
    folder = _folder_with(tmp_path, config__json=b" " * 64 + b"{}")
    with pytest.raises(ModelFormatError, match="hetero reads at most 16"):
        files.read_json(folder / "config.json", max_bytes=16)


def test_hugging_face_cache_links_into_blobs_are_allowed(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--Qwen--Tiny"
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    for item in (FIXTURES / "qwen3").iterdir():
        shutil.copy(item, repo / "blobs" / item.name)
        (snapshot / item.name).symlink_to(Path("../../blobs") / item.name)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    llm = load("Qwen/Tiny")
    assert llm.path == snapshot and llm.config.family == "qwen3"
    with pytest.raises(ModelFormatError, match=r"'Qwen/Absent' is neither a path nor in the Hugging Face cache "
                                               r"\(looked for .*models--Qwen--Absent"):
        hetero.llm.load("Qwen/Absent")


def test_overlong_shard_name_in_the_index(tmp_path):
    folder = shutil.copytree(FIXTURES / "qwen3", tmp_path / "model")
    index = {"weight_map": {"model.embed_tokens.weight": "x" * 5000 + ".safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFormatError, match="too long"):
        load(folder)


# -- the context is checked against memory at load --------------------------------------------------------------------
def test_context_beyond_the_limit_is_refused():
    with pytest.raises(ModelFormatError, match="context = 1099511627776 is above"):
        hetero.llm.load(FIXTURES / "qwen3", context=2**40)


def test_context_whose_kv_cache_exceeds_memory_is_refused_before_allocating(monkeypatch):
    cfg = load_config(FIXTURES / "qwen3")
    need = loader.kv_cache_bytes(cfg, 1 << 20, "f16")
    assert need == cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2 * (1 << 20)
    monkeypatch.setattr(loader, "physical_memory", lambda: need - 1)
    with pytest.raises(HeteroError, match=r"context=1048576 needs .* GiB of f16 KV cache; this machine has"):
        hetero.llm.load(FIXTURES / "qwen3", context=1 << 20)


# -- chat templates: bounded time and memory --------------------------------------------------------------------------
BOMBS = {
    "nested range": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "silent loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "doubling ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                  "{{ ns.s }}",
    "doubling +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "repetition": "{{ 'x' * 10**10 }}",
    "list repetition": "{{ (messages * 100000000) | length }}",
    "padding": "{{ 'x'.ljust(10**10) }}",
    "center filter": "{{ 'x' | center(10**10) }}",
    "power": "{{ 2 ** 1000000000 }}",
    "replace": "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}"
               "{% set ns.s = ns.s.replace('x', 'xx') %}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_template_bombs_are_refused_quickly(name):
    started = time.perf_counter()
    with pytest.raises(TemplateLimitError):
        ChatTemplate(BOMBS[name], "bomb").render([{"role": "user", "content": "hi"}])
    assert time.perf_counter() - started < 10


def test_a_bomb_template_fails_the_load_unless_plain_is_asked_for(tmp_path):
    folder = shutil.copytree(FIXTURES / "qwen3", tmp_path / "model")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = BOMBS["nested range"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    bound = r"the chat template: (more than 1000000 steps|rendering took more than 5 s)"  # whichever comes first
    with pytest.raises(TemplateLimitError, match=bound) as info:
        load(folder)
    assert "chat_template='plain'" in str(info.value)
    llm = load(folder, chat_template="plain")
    assert llm.template.is_plain
    assert isinstance(llm.chat([{"role": "user", "content": "hi"}], max_new_tokens=2, temperature=0), str)


def test_real_templates_render_as_before():
    llm = load(FIXTURES / "qwen3")
    chat = json.loads((FIXTURES / "qwen3" / "expected.json").read_text())["chat"]
    assert llm.template.render(chat["messages"]) == chat["rendered"]


# -- tokenizers -------------------------------------------------------------------------------------------------------
def test_tokenizer_panic_is_a_hetero_error(tmp_path):
    data = json.loads((FIXTURES / "qwen3" / "tokenizer.json").read_text())
    data["normalizer"] = {"type": "Replace", "pattern": {"String": ""}, "content": "x"}
    folder = _folder_with(tmp_path, tokenizer__json=json.dumps(data))
    with pytest.raises(TokenizerPanic, match="tokenizers library panicked"):
        Tokenizer(folder)


def test_prompt_longer_than_the_context_can_hold_is_refused_before_encoding(qwen3_llm):
    bound = qwen3_llm.context * qwen3_llm.tokenizer.max_token_chars
    with pytest.raises(HeteroError, match=f"at most {bound} can fit the context"):
        qwen3_llm.tokenize("a" * (bound + 1))


# -- GGUF metadata amplification --------------------------------------------------------------------------------------
def _gguf_with(tmp_path: Path, key: str, vtype: int, payload: bytes) -> Path:
    import struct

    name = key.encode()
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(name)) + name + struct.pack("<I", vtype)
    path = tmp_path / "meta.gguf"
    path.write_bytes(body + payload)
    return path


def test_gguf_string_arrays_are_bounded(tmp_path, monkeypatch):
    import struct

    monkeypatch.setattr(gguf, "MAX_STRINGS", 1000)
    payload = struct.pack("<IQ", gguf.STRING, 1001) + struct.pack("<Q", 1) * 1001 + b"x" * 1001
    path = _gguf_with(tmp_path, "tokenizer.ggml.tokens", gguf.ARRAY, payload)
    with pytest.raises(ModelFormatError, match=r"metadata 'tokenizer.ggml.tokens' holds 1001 strings; at most 1000"):
        gguf.GgufFile(path)


def test_gguf_long_strings_are_bounded(tmp_path, monkeypatch):
    import struct

    monkeypatch.setattr(gguf, "MAX_STRING", 100)
    path = _gguf_with(tmp_path, "tokenizer.chat_template", gguf.STRING, struct.pack("<Q", 101) + b"x" * 101)
    with pytest.raises(ModelFormatError, match=r"'tokenizer\.chat_template' is 101 bytes long; at most 100"):
        gguf.GgufFile(path)


def test_gguf_string_array_memory_is_a_small_multiple_of_the_file(tmp_path):
    """100k two-byte strings: the Python list and str objects stay within ~8x the file (no raw bytes copies)."""
    import struct
    import tracemalloc

    n = 100_000
    payload = struct.pack("<IQ", gguf.STRING, n) + (struct.pack("<Q", 2) + b"ab") * n
    path = _gguf_with(tmp_path, "tokenizer.ggml.merges", gguf.ARRAY, payload)
    tracemalloc.start()
    gf = gguf.GgufFile(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    gf.close()
    assert peak < 8 * path.stat().st_size, (peak, path.stat().st_size)


# -- SIGBUS: a mapped file truncated under a live model ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_truncated_mapped_file_is_an_error_not_sigbus(tmp_path, kind):
    """Run in a child: if the guard failed, SIGBUS would kill it, not the test run."""
    if kind == "gguf":
        model = truncated = tmp_path / "m.gguf"
        shutil.copy(GGUF, model)
    else:
        model = shutil.copytree(FIXTURES / "qwen3", tmp_path / "model")
        truncated = model / "model.safetensors"
    script = textwrap.dedent(f"""
        import os, warnings
        warnings.simplefilter("ignore")
        import hetero.llm
        from hetero.contract.errors import HeteroError
        llm = hetero.llm.load({str(model)!r}, context=32, on_fallback="silent")
        llm.generate([1, 2, 3], max_new_tokens=2, temperature=0)
        os.truncate({str(truncated)!r}, os.path.getsize({str(truncated)!r}) // 2)
        try:
            llm.generate([1, 2, 3, 4], max_new_tokens=2, temperature=0)
        except HeteroError as exc:
            print("refused:", exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert f"{truncated.name} was truncated after loading" in result.stdout


# -- generation state -------------------------------------------------------------------------------------------------
def test_two_threads_on_one_llm_both_work(qwen3_llm):
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    want = [qwen3_llm.generate(p, max_new_tokens=12, temperature=0) for p in prompts]

    def run(i: int) -> list[str]:  # streamed generations of one Llm from two threads take turns: each its own text
        return ["".join(qwen3_llm.generate(prompts[i], max_new_tokens=12, temperature=0, stream=True))
                for _ in range(3)]

    assert run_in_threads(run, 2) == [[want[0]] * 3, [want[1]] * 3]
    assert all(want)


def test_paused_stream_resumed_after_another_generate_continues_correctly(qwen3_llm):
    qwen3_llm.generate([1, 2, 3, 4, 5], max_new_tokens=10, temperature=0)
    want = list(qwen3_llm.last.tokens)
    stream = qwen3_llm.generate([1, 2, 3, 4, 5], max_new_tokens=10, temperature=0, stream=True)
    next(stream, None)
    record = qwen3_llm.last
    qwen3_llm.generate([7, 7, 7, 7, 7, 7, 7, 7], max_new_tokens=6, temperature=0)  # replaces the cache
    for _ in stream:
        pass
    assert record.tokens == want


def test_a_stop_string_is_not_leaked_when_its_next_character_is_incomplete():
    matcher = StopMatcher(["aé"])
    assert emit_end("xa\ufffd", matcher) == 1  # "a" may begin "aé": held back although "é" is still incomplete
    assert emit_end("xab", matcher) == 3
    assert emit_end("x\ufffd", StopMatcher([])) == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"seed": -1}, "seed=-1"),
    ({"seed": 1.5}, "seed=1.5"),
    ({"max_new_tokens": 1.5}, "max_new_tokens=1.5"),
    ({"temperature": "0.5"}, "temperature='0.5'"),
    ({"stop": [5]}, r"stop=\[5\]"),
    ({"presence_penalty": math.nan}, "presence_penalty=nan"),
    ({"repetition_penalty": math.nan}, "repetition_penalty=nan"),
    ({"top_k": 2.5}, "top_k=2.5"),
])
def test_generation_parameters_are_checked(qwen3_llm, kwargs, match):
    with pytest.raises(HeteroError, match=match):
        qwen3_llm.generate("hello", **{"max_new_tokens": 2, **kwargs})


def test_chat_requires_a_list_of_messages(qwen3_llm):
    with pytest.raises(HeteroError, match=r"chat\(\) takes a list of messages, got str"):
        qwen3_llm.chat("hello")
    with pytest.raises(HeteroError, match="message #0 must be a dict with a 'role'"):
        qwen3_llm.chat([{"content": "hello"}])


# -- sampling defaults ------------------------------------------------------------------------------------------------
def test_sampling_defaults_and_their_source(tmp_path):
    llm = load(GGUF, context=32)
    assert llm.sampling_defaults.settings == LLAMA_CPP_DEFAULTS
    assert llm.sampling_defaults.source == "llama.cpp defaults"
    assert llm.sampling_params().temperature == 0.8
    assert str(llm.sampling_defaults) == "temperature 0.8, top-k 40, top-p 0.95, min-p 0.05 (llama.cpp defaults)"
    own = from_gguf({"general.sampling.temp": 0.6, "general.sampling.top_k": 20}, Path("m.gguf"))
    assert own.settings == {**LLAMA_CPP_DEFAULTS, "temperature": 0.6, "top_k": 20}
    assert own.source.startswith("m.gguf general.sampling.*")
    hf = load(FIXTURES / "qwen3")
    gen = json.loads((FIXTURES / "qwen3" / "generation_config.json").read_text())
    assert hf.sampling_defaults.source in ("generation_config.json", "greedy: generation_config.json does not sample")
    assert hf.sampling_defaults.settings.get("temperature", 0.0) == (gen.get("temperature", 1.0)
                                                                      if gen.get("do_sample") else 0.0)


@pytest.mark.parametrize("gen, match", [
    ({"do_sample": True, "temperature": "0.5"}, "'temperature' must be a finite number"),
    ({"do_sample": True, "temperature": 10**4000}, "'temperature' must be a finite number"),
    ({"do_sample": True, "top_k": 2.5}, "'top_k'"),
    ({"do_sample": True, "temperature": -1}, "temperature must be >= 0"),
])
def test_generation_config_values_are_checked(gen, match):
    with pytest.raises(ModelFormatError, match=match):
        from_generation_config(gen, Path("generation_config.json"))
