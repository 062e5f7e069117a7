"""``HtpDecoder``: a dense Qwen decoder run on the HTP as two compiled static-shape graphs (``llm_graph``): a prefill
chunk of ``chunk`` tokens and a one-token decode step, the KV cache kept on the host (``KvCache``) and passed in
and out of every step. Weights fp16, or hetero's q8 / q4 block formats with 16-bit activations (``llm_quant``),
whose activation scales a float calibration run on onnxruntime's CPU fixes before the graphs are compiled.

It is also what the hexagon backend hands to ``hetero.llm`` (``Backend.llm_decoder``): ``run(ids, past)`` computes
the logits of ``ids`` after the first ``past`` cached positions, so ``hetero generate`` / ``hetero bench
--backend hexagon`` run their steps here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.contract import DecoderRequest, HeteroError, LlmDecoder, UnsupportedOp

from .llm_graph import DecoderShape, KvCache, calibration_graph, decoder_graph
from .llm_quant import WEIGHT_MODES, weight_mode
from .qnn import HtpOptions, QnnRuntime
from .qnn import mode as qnn_mode

ENGINE_ENV = "HETERO_HEXAGON_LLM"  # which unit runs hetero.llm's decoder: the HTP graphs (default) or HVX
ENGINES = ("htp", "hvx")
CALIBRATION_SEED = 0
CALIBRATION_CHUNKS = 4  # prefill chunks of seeded random token ids the activation ranges are measured on
SIMULATOR_NOTE = ("tokens per second on QNN's HTP simulator: x86 emulation of the HTP, not the speed of a "
                  "Snapdragon's NPU (run on the device for that)")


class HtpDecoder:
    """Greedy generation and single steps with the decoder's graphs compiled for the HTP (QNN, no CPU fallback)."""

    def __init__(self, shape: DecoderShape, weights: dict[str, np.ndarray], *, chunk: int = 8, context: int = 64,
                 mode: str = "fp16", calibration: Sequence[int] | None = None,
                 options: HtpOptions | None = None) -> None:
        if mode not in WEIGHT_MODES:
            raise HeteroError(f"HTP decoder weights {mode!r}; expected one of {WEIGHT_MODES}")
        self.shape, self.chunk, self.context, self.mode = shape, chunk, context, mode
        self.runtime = QnnRuntime.shared()
        device = qnn_mode()
        self.name = f"hexagon (HTP {device}, {mode})"
        self.note = SIMULATOR_NOTE if device == "simulator" else ""
        ranges = self.calibrate(weights, calibration) if mode != "fp16" else None
        self.steps = {}
        for tokens in (chunk, 1):
            what = f"the decoder's {tokens}-token graph ({shape.layers} layers, context {context}, {mode})"
            model = decoder_graph(shape, weights, tokens, context, mode=mode, ranges=ranges)
            key, names = self.runtime.compile(model, options or HtpOptions(), what)
            self.steps[tokens] = (key, names["outputs"], what)
        self.cache = KvCache(shape, context)

    def calibrate(self, weights: dict[str, np.ndarray], ids: Sequence[int] | None) -> dict[str, float]:
        """The largest magnitude of every linear layer's input and output over prefill chunks of ``ids`` (default:
        seeded random token ids), from the float graph on onnxruntime's CPU."""
        if ids is None:
            rng = np.random.default_rng(CALIBRATION_SEED)
            ids = rng.integers(0, self.shape.vocab, CALIBRATION_CHUNKS * self.chunk).tolist()
        context = -(-len(ids) // self.chunk) * self.chunk  # its own: the layers' magnitudes do not depend on it
        model, probes = calibration_graph(self.shape, weights, self.chunk, context)
        what = f"the decoder's float {self.chunk}-token graph (calibration)"
        key, names = self.runtime.load_reference(model, what)
        cache, ranges = KvCache(self.shape, context), dict.fromkeys(probes, 0.0)
        for start in range(0, len(ids), self.chunk):
            part = list(ids[start : start + self.chunk])
            outputs = dict(zip(names, self.runtime.run(key, cache.feeds(part, self.chunk), what), strict=True))
            cache.append(outputs, len(part))
            for probe, value in probes.items():
                ranges[probe] = max(ranges[probe], float(np.abs(outputs[value][: len(part)]).max()))
        return ranges

    def _step(self, cache: KvCache, ids: list[int], tokens: int) -> np.ndarray:
        key, names, what = self.steps[tokens]
        outputs = dict(zip(names, self.runtime.run(key, cache.feeds(ids, tokens), what), strict=True))
        cache.append(outputs, len(ids))
        return outputs["logits"][: len(ids)]

    def _extend(self, cache: KvCache, ids: list[int]) -> np.ndarray:
        """Logits of every one of ``ids`` run after the cache: the decode graph for one token, else prefill chunks."""
        if len(ids) == 1:
            return self._step(cache, ids, 1)
        return np.concatenate([self._step(cache, ids[i : i + self.chunk], self.chunk)
                               for i in range(0, len(ids), self.chunk)])

    def run(self, ids: Sequence[int], past: int) -> np.ndarray:
        """float32 logits ``[len(ids), vocab]`` of ``ids`` after the first ``past`` positions of the decoder's cache
        (positions past ``past`` are forgotten: rolling back is running from an earlier ``past``)."""
        if not 0 <= past <= self.cache.length:
            raise HeteroError(f"the HTP decoder's cache holds {self.cache.length} positions; asked to run after "
                              f"{past}")
        self.cache.length = past
        return self._extend(self.cache, [int(i) for i in ids])

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy tokens after ``ids`` (a cache of its own: the decoder's ``run`` cache is left alone)."""
        cache = KvCache(self.shape, self.context)
        out = [int(np.argmax(self._extend(cache, ids)[-1]))]
        while len(out) < max_new_tokens:
            out.append(int(np.argmax(self._extend(cache, [out[-1]])[-1])))
        return out

    def close(self) -> None:
        """Nothing to free here: the worker keeps the loaded contexts for the process (as for segments)."""


def decoder_weights(shape: DecoderShape, request: DecoderRequest) -> dict[str, np.ndarray]:
    """The float32 tensors the graphs read, by Hugging Face name, each checked against the shape it must have."""
    s, qkv = shape, {"q": shape.heads * shape.head_dim, "k": shape.kv_heads * shape.head_dim,
                     "v": shape.kv_heads * shape.head_dim}
    inter = int(request.config["intermediate_size"])
    wanted: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s.vocab, s.hidden),
                                          "model.norm.weight": (s.hidden,)}
    if request.has("lm_head.weight") and not request.config.get("tie_word_embeddings", False):
        wanted["lm_head.weight"] = (s.vocab, s.hidden)
    for layer in range(s.layers):
        p = f"model.layers.{layer}."
        wanted |= {f"{p}input_layernorm.weight": (s.hidden,), f"{p}post_attention_layernorm.weight": (s.hidden,),
                   f"{p}self_attn.o_proj.weight": (s.hidden, qkv["q"]), f"{p}mlp.gate_proj.weight": (inter, s.hidden),
                   f"{p}mlp.up_proj.weight": (inter, s.hidden), f"{p}mlp.down_proj.weight": (s.hidden, inter)}
        for name, rows in qkv.items():
            wanted[f"{p}self_attn.{name}_proj.weight"] = (rows, s.hidden)
            if request.has(f"{p}self_attn.{name}_proj.bias"):
                wanted[f"{p}self_attn.{name}_proj.bias"] = (rows,)
            if name != "v" and request.has(f"{p}self_attn.{name}_norm.weight"):
                wanted[f"{p}self_attn.{name}_norm.weight"] = (s.head_dim,)
    return {name: np.asarray(request.tensor(name, dims), np.float32) for name, dims in wanted.items()}


def from_request(request: DecoderRequest, options: HtpOptions, engine: str = "htp") -> LlmDecoder:
    """The decoder ``hetero.llm.load`` asked the hexagon backend for. ``engine`` htp: the HTP graphs, fp16 for the
    stored float weights, q8 / q4 for ``quant``; hvx: the decode step on HVX (``hvx_decoder``, q4 only). An
    UnsupportedOp names a model, quantization or engine this does not cover."""
    if engine not in ENGINES:
        raise UnsupportedOp(f"{ENGINE_ENV}={engine!r}; expected one of {ENGINES}")
    shape = DecoderShape.from_config(request.config)
    mode = weight_mode(request.quant)
    weights = decoder_weights(shape, request)
    if engine == "hvx":
        if mode != "q4":
            raise UnsupportedOp(f"the HVX decoder runs hetero q4 weights; quant is {request.quant!r} (use -q q4)")
        from .hvx_decoder import HvxDecoder

        return HvxDecoder(shape, weights, context=request.context)
    return HtpDecoder(shape, weights, context=request.context, mode=mode, options=options)
