"""Model files: the safetensors reader (offsets, truncation, shards, paths), config.json and the quant cache."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from hetero.contract import HeteroError, ModelFormatError
from hetero.llm import safetensors, weights
from hetero.llm.config import load_config, parse_config

from .helpers import FIXTURES, copy_model, expected, load


def write_raw(path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_write_read_round_trip(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(4, dtype=np.float16),
              "c": np.array([1, 2], dtype=np.int64), "empty": np.zeros((0, 3), dtype=np.float32)}
    bits = np.array([0x3F80, 0xC020], dtype=np.uint16)  # 1.0, -2.5 in bf16
    safetensors.write(tmp_path / "x.safetensors", {**arrays, "h": bits}, {"k": "v"}, bf16=frozenset({"h"}))
    f = safetensors.SafetensorsFile(tmp_path / "x.safetensors")
    assert f.metadata == {"k": "v"}
    for name, array in arrays.items():
        np.testing.assert_array_equal(f.raw(name), array)
    assert f.entries["h"].dtype == "BF16"
    model = safetensors.SafetensorsModel(tmp_path)
    np.testing.assert_array_equal(model.float32("h"), [1.0, -2.5])
    assert isinstance(model.raw("a"), np.memmap) or isinstance(model.raw("a").base, np.memmap)


@pytest.mark.parametrize("case,match", [
    ("truncated_data", "truncated"),
    ("bad_span", "span 8 bytes but F32"),
    ("bad_dtype", "dtype 'F8' is not supported"),
    ("bad_shape", "shape"),
    ("reversed", "ordered pair"),
    ("header_too_long", "does not fit"),
    ("not_json", "not valid JSON"),
])
def test_malformed_files_name_the_tensor_and_file(tmp_path, case, match):
    path = tmp_path / "model.safetensors"
    good = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    if case == "truncated_data":
        write_raw(path, {"w": good}, b"\0" * 10)
    elif case == "bad_span":
        write_raw(path, {"w": {**good, "data_offsets": [0, 8]}}, b"\0" * 16)
    elif case == "bad_dtype":
        write_raw(path, {"w": {**good, "dtype": "F8"}}, b"\0" * 16)
    elif case == "bad_shape":
        write_raw(path, {"w": {**good, "shape": [-4]}}, b"\0" * 16)
    elif case == "reversed":
        write_raw(path, {"w": {**good, "data_offsets": [16, 0]}}, b"\0" * 16)
    elif case == "header_too_long":
        path.write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    else:
        path.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(ModelFormatError, match=match) as info:
        safetensors.SafetensorsFile(path)
    assert str(path) in str(info.value)
    if case not in ("header_too_long", "not_json"):
        assert "'w'" in str(info.value)


def test_truncated_fixture_copy(tmp_path):
    folder = copy_model("qwen3", tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(ModelFormatError, match="truncated"):
        load(folder)


def test_wrong_shape_names_tensor(tmp_path):
    folder = copy_model("qwen2", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 100
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match=r"gate_proj.weight' has shape \[96, 64\]; the config implies"):
        load(folder)


def test_missing_tensor(tmp_path):
    folder = copy_model("qwen2", tmp_path)
    st = safetensors.SafetensorsModel(folder)
    tensors = {n: st.raw(n) for n in st if n != "model.layers.1.self_attn.k_proj.bias"}
    del st
    safetensors.write(folder / "model.safetensors", tensors)
    with pytest.raises(ModelFormatError, match=r"k_proj\.bias' is missing"):
        load(folder)


def shard(folder, weight_map_override=None):
    """Split a model.safetensors into two shards with an index."""
    st = safetensors.SafetensorsModel(folder)
    names = sorted(st)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for filename, part in halves.items():
        safetensors.write(folder / filename, {n: np.array(st.raw(n)) for n in part})
        weight_map.update({n: filename for n in part})
    del st
    (folder / "model.safetensors").unlink()
    weight_map.update(weight_map_override or {})
    (folder / safetensors.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_model_loads(tmp_path):
    folder = copy_model("qwen3_moe", tmp_path)
    shard(folder)
    llm = load(folder)
    prompt = expected("qwen3_moe")["prompts"][0]
    from hetero.llm.generate import greedy_tokens

    assert greedy_tokens(llm, prompt["ids"], 4) == prompt["greedy"][:4]


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_index_cannot_point_outside_the_folder(tmp_path, target):
    folder = copy_model("qwen3", tmp_path)
    shard(folder, {"model.norm.weight": target})
    with pytest.raises(ModelFormatError, match=r"outside the model folder|relative path"):
        load(folder)


def test_index_missing_shard(tmp_path):
    folder = copy_model("qwen3", tmp_path)
    shard(folder, {"model.norm.weight": "model-00003-of-00003.safetensors"})
    with pytest.raises(ModelFormatError, match="shard file is missing"):
        load(folder)


# -- config.json ---------------------------------------------------------------------------------------------------
def base_config(family="qwen3"):
    return json.loads((FIXTURES / family / "config.json").read_text())


def test_config_reads_fixture():
    cfg = load_config(FIXTURES / "qwen3_moe")
    assert (cfg.family, cfg.num_experts, cfg.num_experts_per_tok, cfg.head_dim) == ("qwen3_moe", 4, 2, 16)
    assert cfg.rope.scaling == "linear" and cfg.rope.factor == 2.0
    assert not cfg.is_moe_layer(1) and cfg.is_moe_layer(0)
    yarn = load_config(FIXTURES / "qwen2").rope
    assert yarn.scaling == "yarn" and yarn.original_max_position == 16
    assert yarn.attention_factor == pytest.approx(0.1 * np.log(4) + 1)


def test_config_old_style_rope_keys():
    data = base_config()
    data.pop("rope_parameters")
    data["rope_theta"] = 5e5
    data["rope_scaling"] = {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024}
    cfg = parse_config(data)
    assert cfg.rope.theta == 5e5 and cfg.rope.scaling == "yarn" and cfg.rope.factor == 2.0


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(architectures=["LlamaForCausalLM"], model_type="llama"), "not supported"),
    (lambda d: d.pop("hidden_size"), "required key 'hidden_size'"),
    (lambda d: d.update(num_hidden_layers="two"), "'num_hidden_layers' must be a positive integer"),
    (lambda d: d.update(num_key_value_heads=3), "'num_key_value_heads' must be a divisor"),
    (lambda d: d.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope_type 'dynamic'"),
    (lambda d: d.update(rms_norm_eps=None, vocab_size=0), "'vocab_size' must be a positive integer"),
])
def test_bad_configs_name_the_key_and_file(tmp_path, edit, match):
    data = base_config()
    edit(data)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ModelFormatError, match=match) as info:
        load_config(tmp_path)
    assert "config.json" in str(info.value)


def test_not_a_folder(tmp_path):
    with pytest.raises(HeteroError, match="not a model folder"):
        load(tmp_path / "nope")
    with pytest.raises(ModelFormatError, match=r"config\.json does not exist"):
        load(tmp_path)


# -- the quantization cache ------------------------------------------------------------------------------------------
@pytest.fixture
def cache_next_to_model():
    """These tests check the default cache location (the suite moves caches out of the repo with
    HETERO_CACHE_DIR); separate from the tests' own monkeypatch, which they undo midway."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("HETERO_CACHE_DIR", raising=False)
        yield


def test_quant_cache_is_written_then_reused(tmp_path, monkeypatch, cache_next_to_model):
    folder = copy_model("qwen3", tmp_path)
    first = load(folder, quant="q4_b64", all_logits=True)
    caches = list((folder / weights.CACHE_DIR).glob("*.safetensors"))
    assert len(caches) == 1 and caches[0].name.startswith("q4_sym_b64-")

    def no_quantize(*args, **kwargs):
        raise AssertionError("quantized again although the cache is there")

    monkeypatch.setattr(weights, "quantize", no_quantize)
    second = load(folder, quant="q4_b64", all_logits=True)
    ids = expected("qwen3")["prompts"][0]["ids"]
    np.testing.assert_array_equal(first.prefill(ids), second.prefill(ids))
    # another format, or a changed source file, is a cache miss
    monkeypatch.undo()
    load(folder, quant="q8")
    assert len(list((folder / weights.CACHE_DIR).glob("*.safetensors"))) == 2


def test_quant_cache_key_follows_source_files(tmp_path, cache_next_to_model):
    folder = copy_model("qwen3", tmp_path)
    load(folder, quant="q8")
    shutil.copy(folder / "model.safetensors", tmp_path / "m")
    (folder / "model.safetensors").unlink()
    shutil.copy(tmp_path / "m", folder / "model.safetensors")  # same bytes, new mtime
    load(folder, quant="q8")
    assert len(list((folder / weights.CACHE_DIR).glob("q8*.safetensors"))) == 2


def test_damaged_cache_is_rebuilt(tmp_path, cache_next_to_model):
    folder = copy_model("qwen3", tmp_path)
    load(folder, quant="q8")
    (cache,) = (folder / weights.CACHE_DIR).glob("*.safetensors")
    cache.write_bytes(cache.read_bytes()[:100])
    llm = load(folder, quant="q8")
    assert llm.prefill([1, 2, 3]).shape == (1, expected("qwen3")["vocab_size"])
