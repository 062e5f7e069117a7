"""Files that llama.cpp made, run by hetero and by llama.cpp (llama-cpp-python, in a subprocess): the same model.

The F16 files are written by scripts/make_gguf_fixtures.py (the ``gguf`` package's writer); every quantized file is
made from them by llama.cpp's own quantizer (``llama_model_quantize``), so the tensor mixes are llama.cpp's, e.g.:

* ``qwen2-896``: a Qwen2 with hidden size 896, as Qwen2.5-0.5B: rows of 896 are not a whole number of 256-blocks,
  so llama.cpp's Q4_K_M falls back to Q5_0 / Q8_0 for those matrices (k-quants remain where rows are 1024);
* ``qwen35``: llama.cpp's ``qwen35`` architecture (Qwen3.5: Gated DeltaNet + gated attention), from the
  transformers-made fixture and from random 256-wide weights (k-quant rows).

Float files must agree closely (max |logit difference| < 1% of the largest logit; llama.cpp's F16 products round
the activations to F16). Quantized ones are compared by the correlation of each position's logits (mean > 0.97, none
under 0.9): llama.cpp rounds activations to 8 bits for its quantized products, and these random models amplify such
rounding (quantizing the weights alone moves the hybrid's logits to a correlation
of ~0.5 with the F16 model's), while a file read wrongly (a type, a layout, a fallback) is uncorrelated."""

from __future__ import annotations

import numpy as np
import pytest

from hetero.llm.gguf import GgufFile

from .helpers import FIXTURES, load

pytest.importorskip("llama_cpp", reason="llama-cpp-python (llama.cpp's own loader and quantizer) is absent")

IDS = [1, 5, 9, 33, 100, 7, 200, 3, 64, 77, 12, 250, 17, 18, 19, 20]
BASE = {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "bos_token_id": 0,
        "eos_token_id": 2, "hidden_act": "silu", "vocab_size": 320}
CONFIGS = {
    "qwen2-896": {**BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                  "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 14,
                  "num_key_value_heads": 2, "rope_theta": 1e6},
    "qwen35-256": {**BASE, "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 256,
                   "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                   "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
                   "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}},
}
TOKENIZER = {"qwen2-896": "qwen2", "qwen35-256": "qwen3"}
QUANTS = ["Q8_0", "Q4_0", "Q4_K_M"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(model, type) -> path: the F16 file of each model, and llama.cpp's quantizations of it (made once)."""
    from .helpers import gguf_writer

    w = gguf_writer()
    root = tmp_path_factory.mktemp("llama_cpp")
    made: dict[tuple[str, str], object] = {}

    def get(model: str, qtype: str):
        if (model, qtype) not in made:
            if qtype == "F16":
                src = FIXTURES / "qwen3_5" if model == "qwen35-fixture" else w.random_folder(
                    root / model, CONFIGS[model], seed=3, tokenizer_from=FIXTURES / TOKENIZER[model],
                    dtype=np.float32)
                w.convert(src, root / f"{model}-f16.gguf", "F16")
                made[model, qtype] = root / f"{model}-f16.gguf"
            else:
                made[model, qtype] = w.llama_quantize(get(model, "F16"), root / f"{model}-{qtype}.gguf", qtype)
        return made[model, qtype]

    return get


def matrix_types(path) -> set[str]:
    gf = GgufFile(path)
    return {gf[name].type.name for name in gf if len(gf[name].dims) > 1}


def logits_pair(files, model: str, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    from .helpers import gguf_writer

    path = files(model, qtype)
    ours = load(path, all_logits=True, context=64, kv_cache="f16").forward(IDS)
    return ours, gguf_writer().llama_logits(path, IDS)


def test_llama_cpp_q4_k_m_falls_back_on_896_wide_rows(files):
    assert matrix_types(files("qwen2-896", "Q4_K_M")) >= {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    assert matrix_types(files("qwen35-256", "Q4_K_M")) >= {"Q4_K", "Q6_K"}


@pytest.mark.parametrize("model", ["qwen35-fixture", "qwen35-256", "qwen2-896"])
def test_float_files_match_llama_cpp(files, model):
    assert GgufFile(files(model, "F16")).metadata["general.architecture"] == ("qwen2" if model == "qwen2-896"
                                                                               else "qwen35")
    ours, theirs = logits_pair(files, model, "F16")
    assert np.abs(ours - theirs).max() < 0.01 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a - a.mean(-1, keepdims=True), b - b.mean(-1, keepdims=True)
    return (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))


@pytest.mark.parametrize("qtype", QUANTS)
@pytest.mark.parametrize("model", ["qwen35-256", "qwen2-896"])
def test_llama_cpp_quantized_files_match_llama_cpp(files, model, qtype):
    ours, theirs = logits_pair(files, model, qtype)
    agreement = correlation(ours, theirs)
    assert agreement.mean() > 0.97 and agreement.min() > 0.9
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.75
