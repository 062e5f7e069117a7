"""The decoder of an ``Llm`` run whole by a backend (``Backend.llm_decoder``: NPUs compile an LLM into their own
static graphs), when the first backend the user named offers one; otherwise the graph runs through a session."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from .. import plugins
from ..contract.decoder import DecoderRequest, LlmDecoder
from ..contract.errors import HeteroWarning, UnsupportedOp
from ..contract.quant import QuantFormat
from ..runtime.selection import select, split_names
from .config import LlmConfig
from .model_files import ModelFiles

WHOLE_DECODER_KINDS = ("npu", "dsp")


def whole_decoder(backends: Sequence[str] | str | None, model: ModelFiles, context: int,
                  fmt: QuantFormat | None) -> LlmDecoder | None:
    """The first named backend's decoder of ``model``; None when no backend was named, the first one cannot start
    (the session then skips it as usual) or offers none. A decoder it refuses (``UnsupportedOp``) is a warning
    naming why, and the session runs the model."""
    names = split_names(backends) if isinstance(backends, str) else list(backends or [])
    if not names:
        return None
    first = names[0]
    row = plugins.status(first.partition(":")[0])
    # only NPU / DSP devices are asked: creating a backend is not free (an OpenCL context), and the session creates
    # its own
    if row is None or not row.ok or not any(d.kind in WHOLE_DECODER_KINDS for d in row.devices):
        return None
    backend = select([first]).backends[0]
    request = DecoderRequest(config=config_json(model.config), has=model.weights.has, tensor=model.weights.matrix,
                             context=context, quant=fmt.name if fmt is not None else None)
    try:
        return backend.llm_decoder(request)
    except UnsupportedOp as exc:
        warnings.warn(f"hetero: {backend.name} does not run {model.name} whole ({exc}); its ops run through a "
                      "session instead", HeteroWarning, stacklevel=3)
        return None


def config_json(cfg: LlmConfig) -> dict[str, object]:
    """``cfg`` in config.json's keys (what a ``DecoderRequest`` carries), whichever file it was read from (a GGUF
    file's metadata too); what a dense decoder's graphs would leave out is kept for them to refuse."""
    return {"model_type": cfg.family, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "intermediate_size": cfg.intermediate_size, "rms_norm_eps": cfg.rms_norm_eps,
            "tie_word_embeddings": cfg.tie_word_embeddings, "num_experts": cfg.num_experts,
            "rope_parameters": {"rope_type": "default" if cfg.rope.scaling == "none" else cfg.rope.scaling,
                                "rope_theta": cfg.rope.theta},
            "partial_rotary_factor": (cfg.rope.rotary_dim or cfg.head_dim) / cfg.head_dim}
