"""``Llm``: a decoder graph in a Session, its KV cache (inside the Attention nodes), the tokenizer and the API.

The cache holds the K/V of ``self.tokens``; a new prompt reuses the longest common prefix and rolls back the rest
(positions are explicit, so rolling back is running from an earlier ``past_len``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contract.errors import HeteroError
from ..contract.graph import Graph
from ..runtime.session import Session
from .config import LlmConfig
from .families.decoder import INPUT_IDS, LOGITS, PAST_LEN
from .generate import Generation, generate_stream
from .sampler import Sampler, SamplingParams
from .tokenizer import Tokenizer


@dataclass
class Stats:
    """Counters of the last ``generate``/``chat``/``prefill`` call."""

    prompt_tokens: int = 0  # length of the prompt
    cached_tokens: int = 0  # prompt tokens whose K/V were reused from the cache
    prefill_tokens: int = 0  # prompt tokens computed
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "prefill_tokens_per_second": self.prefill_tokens_per_second,
                "decode_tokens_per_second": self.decode_tokens_per_second}


# KV cache element types: float16 halves the cache (and decode attention's reads); float32 is exact; q8 (int8 with a
# float scale per 32 values, 1.125 bytes a value) nearly halves it again at a small, measured accuracy cost
# (docs/llm.md, "KV cache").
KV_CACHE_TYPES = ("f16", "f32", "q8")

_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty", "penalty_last_n", "seed")


class Llm:
    """A loaded language model. Create it with ``hetero.llm.load``."""

    def __init__(self, config: LlmConfig, graph: Graph, tokenizer: Tokenizer | None, *, context: int,
                 backends: Sequence[str] | str | None = None, on_fallback: str = "warn", threads: int | None = None,
                 prefill_chunk: int = 512, name: str = "", quant: str = "", path: Path | None = None,
                 kv_cache: str = "f16") -> None:
        if kv_cache not in KV_CACHE_TYPES:
            raise HeteroError(f"kv_cache={kv_cache!r}; expected one of {KV_CACHE_TYPES}")
        if context < 1:
            raise HeteroError(f"context={context}; expected a positive number of tokens")
        if prefill_chunk < 0:
            raise HeteroError(f"prefill_chunk={prefill_chunk}; expected 0 (whole prompt) or a positive size")
        self.config = config
        self.tokenizer = tokenizer
        self.context = context
        self.prefill_chunk = prefill_chunk
        self.name = name or config.family
        self.quant = quant
        self.path = path
        self.threads = threads
        for node in graph.nodes:
            if node.op_type == "Attention":
                node.attrs["kv_dtype"] = kv_cache
        self.kv_cache = kv_cache
        self.session = Session(graph, backends=backends, on_fallback=on_fallback, threads=threads)
        self.tokens: list[int] = []  # the tokens whose K/V the cache holds, in order
        self.stats = Stats()
        self.last = Generation()

    # -- text <-> ids ---------------------------------------------------------------------------------------------
    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise HeteroError(f"model {self.name!r} has no tokenizer (tokenizer.json): pass token ids instead")
        return self.tokenizer

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok().encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok().decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        if self.tokenizer is not None:
            return self.tokenizer.eos_ids
        return self.config.eos_token_ids

    # -- the cache ------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the cache (the next prompt is prefilled from position 0)."""
        self.tokens = []

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` cached tokens, forget the rest."""
        if not 0 <= length <= len(self.tokens):
            raise HeteroError(f"cannot roll back to {length}: the cache holds {len(self.tokens)} tokens")
        del self.tokens[length:]

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """Run ``ids`` after the cached tokens; returns float32 logits (the last token's, or all with all_logits)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise HeteroError("forward needs at least one token")
        past = len(self.tokens)
        if past + len(ids) > self.context:
            raise HeteroError(
                f"{past} cached + {len(ids)} new tokens exceed the context of {self.context} tokens",
                hint="load the model with a larger context=..., or reset() / shorten the conversation",
            )
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise HeteroError(f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        feeds = {INPUT_IDS: np.asarray(ids, dtype=np.int64), PAST_LEN: np.asarray(past, dtype=np.int64)}
        logits = self.session.run(feeds, [LOGITS])[LOGITS]
        self.tokens.extend(ids)
        return logits

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold exactly ``ids``, computing only what is not cached; returns the logits of the last
        computed chunk (its last row is the next-token distribution)."""
        ids = [int(i) for i in ids]
        if not ids:
            raise HeteroError("the prompt is empty: nothing to predict from")
        if len(ids) > self.context:
            raise HeteroError(f"the prompt has {len(ids)} tokens; the context holds {self.context}",
                              hint="load the model with a larger context=...")
        common = _common_prefix(self.tokens, ids)
        common = min(common, len(ids) - 1)  # the last token is always run: its logits are the prediction
        self.rollback(common)
        self.stats.prompt_tokens = len(ids)
        self.stats.cached_tokens = common
        self.stats.prefill_tokens = len(ids) - common
        started = time.perf_counter()
        rest = ids[common:]
        step = self.prefill_chunk or len(rest)
        logits = np.empty(0, dtype=np.float32)
        for start in range(0, len(rest), step):
            logits = self.forward(rest[start:start + step])
        self.stats.prefill_seconds = time.perf_counter() - started
        return logits

    # -- generation -----------------------------------------------------------------------------------------------
    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """The model's defaults (generation_config.json when it samples, else greedy) with ``overrides`` on top."""
        base: dict[str, Any] = {}
        gen = self.tokenizer.generation_config if self.tokenizer is not None else {}
        if gen.get("do_sample"):
            base["temperature"] = float(gen.get("temperature", 1.0))
            base["top_k"] = int(gen.get("top_k", 50) or 0)
            for key in ("top_p", "min_p", "repetition_penalty"):
                if gen.get(key) is not None:
                    base[key] = float(gen[key])
        base.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(base) - set(_SAMPLING_KEYS)
        if unknown:
            raise HeteroError(f"unknown sampling option(s) {sorted(unknown)}; expected {list(_SAMPLING_KEYS)}")
        return SamplingParams(**base)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 256, *, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repetition_penalty: float | None = None, presence_penalty: float | None = None,
                 frequency_penalty: float | None = None, penalty_last_n: int | None = None, seed: int | None = None,
                 stop: Sequence[str] | str | None = None, stream: bool = False,
                 add_special_tokens: bool = True) -> str | Iterator[str]:
        """Continue ``prompt`` (text, or token ids). Returns the text, or with ``stream=True`` an iterator of text
        pieces (closing it cancels). Unset sampling options come from the model's generation_config.json."""
        params = self.sampling_params(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, penalty_last_n=penalty_last_n,
            seed=seed)
        ids = self.tokenize(prompt, add_special_tokens) if isinstance(prompt, str) else [int(i) for i in prompt]
        return self._run(ids, max_new_tokens, params, stop, stream)

    def chat(self, messages: Sequence[dict[str, Any]], max_new_tokens: int = 512, *, stream: bool = False,
             stop: Sequence[str] | str | None = None, template_kwargs: dict[str, Any] | None = None,
             **sampling: Any) -> str | Iterator[str]:
        """Answer the conversation ``messages`` ([{"role", "content"}, ...]) through the model's chat template.
        The cache is reused across turns: only tokens after the common prefix are prefilled."""
        text = self._tok().render_chat(list(messages), add_generation_prompt=True, **(template_kwargs or {}))
        ids = self.tokenize(text, add_special_tokens=False)
        return self._run(ids, max_new_tokens, self.sampling_params(**sampling), stop, stream)

    def _run(self, ids: list[int], max_new_tokens: int, params: SamplingParams,
             stop: Sequence[str] | str | None, stream: bool) -> str | Iterator[str]:
        if max_new_tokens < 0:
            raise HeteroError(f"max_new_tokens={max_new_tokens}; expected >= 0")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if stops and self.tokenizer is None:
            raise HeteroError("stop strings need a tokenizer")
        self.stats = Stats()
        self.last = Generation()
        decode = (lambda t: self.detokenize(t, skip_special_tokens=True)) if self.tokenizer is not None \
            else (lambda t: "")
        pieces = generate_stream(self, ids, max_new_tokens, Sampler(params), stops, self.eos_ids, self.last, decode)
        if stream:
            return pieces
        for _ in pieces:
            pass
        return self.last.text

    # -- reporting ------------------------------------------------------------------------------------------------
    def num_params(self) -> int:
        """Logical parameter count (quantized weights counted by element, tied tables once)."""
        cfg = self.config
        total = 0
        for name, array in self.session.graph.initializers.items():
            if name.startswith(("shape_", "last_index")):
                continue
            total += _logical_size(name, array, cfg)
        return total

    def size_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.session.graph.initializers.values())

    def backend_names(self) -> list[str]:
        return list(self.session.placement.counts())

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Llm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Llm {self.name} context={self.context} cached={len(self.tokens)}>"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if diff.size else n


def _logical_size(name: str, array: np.ndarray, cfg: LlmConfig) -> int:
    if array.dtype != np.uint8:
        return int(array.size)
    # Quantized rows: the logical row length is the hidden size, or the intermediate size for down projections.
    rows = int(np.prod(array.shape[:-1]))
    if "down" in name:
        k = cfg.moe_intermediate_size if "experts" in name else cfg.intermediate_size
    elif "o_proj" in name:
        k = cfg.num_heads * cfg.head_dim
    else:
        k = cfg.hidden_size
    return rows * k
