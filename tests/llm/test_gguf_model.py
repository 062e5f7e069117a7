"""GGUF files as LLMs: the tiny transformers-made fixtures converted to GGUF (by scripts/make_gguf_fixtures.py with
the ``gguf`` package's writer) against transformers and against hetero's Hugging Face load; the tokenizer and chat
template from the file's own vocabulary; the committed files of tests/fixtures/gguf (they need no ``gguf``).

Tolerances (max |logit difference|, logits span about ±7):
* F32: 1e-4 against transformers and the same greedy tokens; F16 5e-2; BF16 0.25 (dense families);
* every quantized type: a GGUF load must equal a float model that holds the weights as the ``gguf`` package
  dequantizes them (1e-4), and the committed Q4_K_M-like file must match transformers run on those weights.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from hetero.contract import HeteroError, ModelFormatError
from hetero.llm.generate import greedy_tokens
from hetero.llm.gguf import GgufFile
from hetero.llm.gguf_model import gguf_config, gguf_name

from .helpers import FIXTURES, expected, gguf_writer, load, reference_logits

# The file formats' exactness is checked on the numpy reference; native kernels (int8 activations) are held to
# their own bounds against it in tests/plugins/cpu/test_llm_kernels.py.
EXACT = ["reference"]

ROOT = Path(__file__).resolve().parents[2]
GGUF_FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
TEXTS = [
    "Hello world", "  multiple   spaces\n\n\ttabs\r\n and trailing   ", "numbers 1234567 3.14159 -42 2024",
    "Über café naïve résumé 你好，世界 こんにちは 😀🚀", "<|im_start|>user\nhi<|im_end|>\n<think>x</think>",
    "don't I'll we've THEY'RE", "a\u0301 e\u0301 (combining marks, NFC)", "", " ", "\n", "x" * 50,
    "<|endoftext|><|endoftext|>", "def f(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.",
]


def max_logit_error(llm, family: str) -> float:
    ref = reference_logits(family)
    errors = []
    for i, prompt in enumerate(expected(family)["prompts"]):
        llm.reset()
        errors.append(float(np.abs(llm.prefill(prompt["ids"]) - ref[f"prompt{i}"]).max()))
    return max(errors)


# -- against transformers ---------------------------------------------------------------------------------------------
def test_f32_logits_and_greedy_tokens_match_transformers(family, converted):
    path = converted(family, "F32")
    llm = load(path, all_logits=True)
    assert max_logit_error(llm, family) < 1e-4
    llm = load(path)
    exp = expected(family)
    for prompt in exp["prompts"]:
        llm.reset()
        assert greedy_tokens(llm, prompt["ids"], len(prompt["greedy"])) == prompt["greedy"]
    assert greedy_tokens(llm, exp["chat"]["ids"], len(exp["chat"]["greedy"])) == exp["chat"]["greedy"]


@pytest.mark.parametrize("qtype,tolerance", [("F16", 5e-2), ("BF16", 0.25)])
def test_half_precision_files(family, converted, qtype, tolerance):
    llm = load(converted(family, qtype), all_logits=True)
    wtypes = {n.attrs.get("wtype") for n in llm.session.graph.nodes if n.op_type in ("QMatMul", "MoE")}
    assert wtypes == {qtype.lower()}  # kept as stored
    if family == "qwen3_moe":
        return  # half-precision rounding flips routing choices of this tiny model (exactness is checked below)
    assert max_logit_error(llm, family) < tolerance


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_quantized_files_equal_their_dequantized_weights(family, converted, qtype, tmp_path):
    path = converted(family, qtype)
    deq = gguf_writer().dequantized_folder(path, tmp_path / "deq", FIXTURES / family)
    llm = load(path, all_logits=True, backends=EXACT)
    wtypes = {n.attrs.get("wtype") for n in llm.session.graph.nodes if n.op_type == "QMatMul"}
    assert wtypes == {"Q8_0": {"q8"}, "Q4_0": {"q4"}, "Q4_1": {"q4"}}.get(qtype, {qtype.lower()})  # as stored
    ids = expected(family)["prompts"][1]["ids"]
    np.testing.assert_allclose(llm.prefill(ids), load(deq, all_logits=True, backends=EXACT).prefill(ids), atol=1e-4)


@pytest.mark.parametrize("moe", [False, True], ids=["qwen3", "qwen3_moe"])
@pytest.mark.parametrize("mix", ["Q4_K", "Q5_K", "Q6_K", "q4_k_m"])
def test_k_quant_files_equal_their_dequantized_weights(tmp_path, moe, mix):
    """A 256-wide model (k-quants need rows of 256): pure k-quant files and a Q4_K_M-like mix, which puts a q6_k
    down projection beside q4_k gate/up experts (the MoE node's per-tensor wtypes)."""
    w = gguf_writer()
    src = w.write_random_folder(tmp_path / "src", moe=moe)
    path = tmp_path / "model.gguf"
    types = w.convert(src, path, w.q4_k_m if mix == "q4_k_m" else mix)
    assert (mix if mix != "q4_k_m" else "Q4_K") in types.values()
    deq = w.dequantized_folder(path, tmp_path / "deq", src)
    llm = load(path, all_logits=True, backends=EXACT)
    if moe and mix == "q4_k_m":
        node = next(n for n in llm.session.graph.nodes if n.op_type == "MoE")
        assert node.attrs["wtype"] == "q4_k" and node.attrs["down_wtype"] == "q6_k"
    ids = llm.tokenize(w.PROMPT)
    np.testing.assert_allclose(llm.prefill(ids), load(deq, all_logits=True, backends=EXACT).prefill(ids), atol=1e-4)


def test_committed_k_quant_file_matches_transformers():
    """tests/fixtures/gguf/qwen3k-q4_k_m.gguf (Q4_K / Q5_K / Q6_K / Q8_0) against transformers run on the weights
    as the gguf package dequantizes them; and how far quantization moved it from the float model."""
    ref = np.load(GGUF_FIXTURES / "qwen3k-q4_k_m.npz")
    llm = load(GGUF_FIXTURES / "qwen3k-q4_k_m.gguf", all_logits=True, backends=EXACT)
    types = {info.type.name for info in GgufFile(GGUF_FIXTURES / "qwen3k-q4_k_m.gguf").tensors.values()}
    assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0"} <= types
    ids = ref["ids"].tolist()
    logits = llm.prefill(ids)
    assert np.abs(logits - ref["dequantized"]).max() < 1e-4
    assert np.abs(logits - ref["original"]).max() < 4.0  # 4-bit noise on a random model: measured 1.8
    assert llm.quant == "Q4_K_M"


# -- tokenizer and chat template ---------------------------------------------------------------------------------------
@pytest.fixture
def q8_llm():
    return load(GGUF_FIXTURES / "qwen3-q8_0.gguf")


def test_tokenizer_from_the_file_matches_tokenizer_json(q8_llm):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(FIXTURES / "qwen3" / "tokenizer.json"))
    for text in TEXTS:
        ids = q8_llm.tokenize(text)
        assert ids == hf.encode(text).ids, text
        for skip in (False, True):
            assert q8_llm.detokenize(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    for prompt in expected("qwen3")["prompts"]:
        assert q8_llm.tokenize(prompt["text"]) == prompt["ids"]
    assert q8_llm.tokenizer.vocab_size == hf.get_vocab_size()
    assert set(expected("qwen3")["eos_ids"]) == set(q8_llm.eos_ids)


def test_chat_template_from_the_file(q8_llm):
    chat = expected("qwen3")["chat"]
    assert q8_llm.tokenizer.render_chat(chat["messages"]) == chat["rendered"]
    assert q8_llm.tokenizer.render_chat(chat["messages"], enable_thinking=False) == chat["rendered_no_thinking"]
    assert q8_llm.tokenize(chat["rendered"], add_special_tokens=False) == chat["ids"]


def test_committed_q8_file_runs_chat(q8_llm):
    reply = q8_llm.chat(expected("qwen3")["chat"]["messages"], max_new_tokens=4, temperature=0)
    assert isinstance(reply, str) and q8_llm.stats.generated_tokens <= 4
    assert q8_llm.config.family == "qwen3" and q8_llm.config.tie_word_embeddings


# -- config mapping and errors ---------------------------------------------------------------------------------------
def test_config_mapping(family, converted):
    from hetero.llm.config import load_config

    hf = load_config(FIXTURES / family)
    cfg = gguf_config(GgufFile(converted(family, "F32")))
    for field in ("family", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "qkv_bias",
                  "o_bias", "qk_norm", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                  "norm_topk_prob", "mlp_only_layers"):
        got, want = getattr(cfg, field), getattr(hf, field)
        assert got == pytest.approx(want, rel=1e-6) if isinstance(want, float) else got == want, field
    assert cfg.rope.scaling == hf.rope.scaling and cfg.rope.theta == pytest.approx(hf.rope.theta)
    assert cfg.rope.attrs().keys() == hf.rope.attrs().keys()


def test_names():
    assert gguf_name("model.layers.3.self_attn.o_proj.weight") == "blk.3.attn_output.weight"
    assert gguf_name("model.layers.0.mlp.experts.7.down_proj.weight") == "blk.0.ffn_down_exps.weight"
    assert gguf_name("model.layers.1.post_attention_layernorm.weight") == "blk.1.ffn_norm.weight"
    assert gguf_name("something.else") is None


def rewrite(src: Path, dest: Path, *, drop_keys=(), set_keys=None, drop_tensors=(), retype=None) -> Path:
    """A copy of ``src`` with metadata / tensors changed, written by the gguf package."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dest), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", *drop_keys):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    for name, (value, vtype) in (set_keys or {}).items():
        w.add_key_value(name, value, vtype)
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        if retype and t.name in retype:
            data = data.astype(np.float32)[..., : retype[t.name]]
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type if t.tensor_type not in (0, 1) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dest


def test_bad_files_name_the_field(converted, tmp_path):
    gguf = pytest.importorskip("gguf")
    src = converted("qwen3", "F32")
    cases = [
        (dict(set_keys={"general.architecture": ("llama", gguf.GGUFValueType.STRING)}), "llama"),
        (dict(drop_keys=("qwen3.block_count",)), "qwen3.block_count"),
        (dict(set_keys={"qwen3.attention.head_count_kv": (3, gguf.GGUFValueType.UINT32)}), "head_count_kv"),
        (dict(set_keys={"qwen3.attention.layer_norm_rms_epsilon": ("x", gguf.GGUFValueType.STRING)}),
         "layer_norm_rms_epsilon"),
        (dict(drop_tensors=("blk.1.ffn_down.weight",)), "blk.1.ffn_down.weight"),
        (dict(retype={"blk.0.attn_q.weight": 32}), "blk.0.attn_q.weight"),
        (dict(set_keys={"tokenizer.ggml.pre": ("mystery", gguf.GGUFValueType.STRING)}), "tokenizer.ggml.pre"),
    ]
    for i, (change, field) in enumerate(cases):
        if "general.architecture" in change.get("set_keys", {}):
            change = {**change, "drop_keys": ("general.architecture",)}
        path = rewrite(src, tmp_path / f"bad{i}.gguf", **change)
        with pytest.raises(ModelFormatError, match=field.replace(".", r"\.")):
            load(path)


def test_unsupported_tensor_type(tmp_path):
    """A type hetero does not run (Q2_K) is refused with the tensor's name and a hint."""
    from hetero.llm.gguf_model import GgufWeights

    gguf = pytest.importorskip("gguf")
    path = tmp_path / "q2k.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 84), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFormatError, match=r"blk\.0\.attn_q\.weight.*Q2_K") as err:
        GgufWeights(GgufFile(path)).linear("model.layers.0.self_attn.q_proj.weight", 4, 256)
    assert "Q4_K" in (err.value.hint or "")


def test_requantize_float_file_at_load(converted):
    """quant="q4" on an F32 file quantizes like the Hugging Face path does."""
    ids = expected("qwen3")["prompts"][0]["ids"]
    a = load(converted("qwen3", "F32"), all_logits=True, quant="q4").prefill(ids)
    b = load(FIXTURES / "qwen3", all_logits=True, quant="q4", cache=False).prefill(ids)
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_loader_errors(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\0" * 4)
    with pytest.raises(ModelFormatError, match="too short"):
        load(tmp_path / "x.gguf")
    with pytest.raises(HeteroError, match="context"):
        load(GGUF_FIXTURES / "qwen3-q8_0.gguf", context=0)


# -- command line ----------------------------------------------------------------------------------------------------
def test_cli_generate_chat_and_bench_on_a_gguf_file(capsys, monkeypatch):
    import argparse

    from hetero.llm.cli import add_llm_commands

    def parse(argv):
        parser = argparse.ArgumentParser(prog="hetero")
        add_llm_commands(parser.add_subparsers(dest="command", required=True))
        return parser.parse_args(argv)

    path = str(GGUF_FIXTURES / "qwen3-q8_0.gguf")
    args = parse(["generate", path, "The quick brown fox", "-n", "3", "--temp", "0", "--no-stream", "-c", "64"])
    assert args.func(args) == 0
    capsys.readouterr()
    args = parse(["bench", "-m", path, "-p", "8", "-n", "4", "-r", "1", "--json", "--no-warmup"])
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp8", "tg4"] and all(r["avg_ts"] > 0 for r in rows)
    assert rows[0]["model"].startswith("qwen3 qwen3-q8_0")
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n/exit\n"))
    args = parse(["chat", path, "-n", "2", "--temp", "0", "-c", "128"])
    assert args.func(args) == 0
