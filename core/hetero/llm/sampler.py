"""Choosing the next token from logits: penalties, then greedy or temperature + top-k / top-p / min-p sampling.

Order (as transformers and llama.cpp apply them): repetition / presence / frequency penalties on the raw logits,
an additive ``logit_bias``, a grammar's mask (tokens that would break the output get -inf), temperature, top-k,
top-p, min-p, then a draw from a seeded numpy Generator. temperature 0 means greedy. Log-probabilities, when asked
for, are those of the distribution before temperature and truncation (after penalties, bias and mask), as the
OpenAI API reports them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..contract.errors import HeteroError, ModelFormatError
from .fields import Fields


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off; >1 discourages tokens already seen
    presence_penalty: float = 0.0  # subtracted once from every seen token
    frequency_penalty: float = 0.0  # subtracted per occurrence
    penalty_last_n: int = 64  # how many recent tokens the penalties look at (0: all)
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise HeteroError(f"sampling: {name}={value!r}; expected a finite number")
        for name in ("top_k", "penalty_last_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise HeteroError(f"sampling: {name}={value!r}; expected an integer")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)
                                 or not 0 <= seed < 1 << 64):
            raise HeteroError(f"sampling: seed={seed!r}; expected None or an integer in [0, 2**64)")
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (self.penalty_last_n >= 0, "penalty_last_n must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise HeteroError(f"sampling: {message}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# llama.cpp's and Ollama's defaults, for GGUF files that carry no sampling metadata
LLAMA_CPP_DEFAULTS: dict[str, Any] = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# GGUF sampling metadata (llama.cpp's ``general.sampling.*``) -> SamplingParams field
GGUF_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
                      "general.sampling.top_p": "top_p", "general.sampling.min_p": "min_p",
                      "general.sampling.penalty_last_n": "penalty_last_n",
                      "general.sampling.penalty_repeat": "repetition_penalty"}


@dataclass(frozen=True)
class SamplingDefaults:
    """The sampling settings a model uses when the caller sets none, and where they come from."""

    settings: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields; empty: greedy
    source: str = "greedy"

    def __str__(self) -> str:
        shown = ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in self.settings.items()) or "greedy"
        return f"{shown} ({self.source})"


def from_generation_config(gen: Mapping[str, Any], path: Path) -> SamplingDefaults:
    """A Hugging Face folder's defaults: generation_config.json's when it samples (``do_sample``), else greedy.
    Ill-typed values are a ModelFormatError naming the file and key."""
    if not gen:
        return SamplingDefaults({}, "greedy: no generation_config.json")
    f = Fields(gen, path)
    if not f.bool("do_sample", False):
        return SamplingDefaults({}, f"greedy: {path.name} does not sample")
    settings: dict[str, Any] = {"temperature": f.float("temperature", 1.0), "top_k": f.int("top_k", 50, minimum=0)}
    for key in ("top_p", "min_p", "repetition_penalty"):
        if gen.get(key) is not None:
            settings[key] = f.float(key)
    return _checked(settings, path.name)


def from_gguf(metadata: Mapping[str, Any], path: Path) -> SamplingDefaults:
    """A GGUF file's defaults: its ``general.sampling.*`` metadata where present, llama.cpp's defaults for the
    rest (as llama.cpp and Ollama do)."""
    f = Fields(metadata, path, noun="metadata")
    found = {name: (f.int(key, minimum=0) if name in ("top_k", "penalty_last_n") else f.float(key))
             for key, name in GGUF_SAMPLING_KEYS.items() if key in metadata}
    if not found:
        return SamplingDefaults(dict(LLAMA_CPP_DEFAULTS), "llama.cpp defaults")
    return _checked({**LLAMA_CPP_DEFAULTS, **found}, f"{path.name} general.sampling.* + llama.cpp defaults")


def _checked(settings: dict[str, Any], source: str) -> SamplingDefaults:
    try:
        SamplingParams(**settings)
    except HeteroError as exc:
        raise ModelFormatError(f"{source}: {exc.message}") from None
    return SamplingDefaults(settings, source)


class Constraint(Protocol):
    """What limits the tokens that may come next (``hetero.llm.grammar``): a mask, then the token chosen."""

    def allowed(self, vocab_size: int) -> np.ndarray: ...  # bool [vocab_size]

    def advance(self, token: int) -> None: ...


@dataclass(frozen=True)
class TokenLogprob:
    """A chosen token's log-probability and the ``top`` most likely alternatives (id, logprob), best first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Sampler:
    """Picks tokens with ``params``; ``logit_bias`` ({token id: added logit}), a ``constraint`` and log-probabilities
    (``top_logprobs``: None for none, else how many alternatives; each choice goes to ``self.logprobs``)."""

    def __init__(self, params: SamplingParams | None = None, *, logit_bias: Mapping[int, float] | None = None,
                 constraint: Constraint | None = None, top_logprobs: int | None = None) -> None:
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)
        self.bias = _bias_arrays(logit_bias or {})
        self.constraint = constraint
        if top_logprobs is not None and (isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int)
                                         or top_logprobs < 0):
            raise HeteroError(f"top_logprobs={top_logprobs!r}; expected None or an integer >= 0")
        self.top_logprobs = top_logprobs
        self.logprobs: list[TokenLogprob] = []
        # greedy with nothing but a logit bias: the argmax without the float64 copy (a server's decode steps wait for
        # every sequence's sampling: 0.4 -> 0.1 ms a token on a 152k vocabulary)
        self._plain_greedy = (self.params.greedy and constraint is None and top_logprobs is None
                              and self.params.repetition_penalty == 1 and self.params.presence_penalty == 0
                              and self.params.frequency_penalty == 0)

    def _argmax(self, x: np.ndarray, hint: int | None = None) -> int | None:
        """What ``sample`` picks greedily from ``x`` (float32 logits) with ``self.bias`` added (in float64, the
        first of equal maxima), or None where that takes the general path (a non-finite maximum, a biased argmax).
        ``hint``: ``np.argmax(x)`` already known (the LM head's native call computed it)."""
        best_id = int(np.argmax(x)) if hint is None else hint
        best = float(x[best_id])
        if not math.isfinite(best):
            return None
        ids, values = self.bias
        biased = ids.tolist()
        if best_id in biased:
            return None
        for i, v in zip(biased, values.tolist(), strict=True):
            if i < x.size:
                b = float(x[i]) + v
                if b > best or (b == best and i < best_id):
                    best_id, best = i, b
        return best_id

    def __call__(self, logits: np.ndarray, history: Sequence[int] = (), argmax: int | None = None) -> int:
        return self.sample(logits, history, argmax)

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing but a logit bias: ``sample`` needs no more of the logits than their argmax (and the
        biased ids' values) unless the maximum is not finite."""
        return self._plain_greedy

    def sample(self, logits: np.ndarray, history: Sequence[int] = (), argmax: int | None = None) -> int:
        """The next token from ``logits`` (``[vocab]``); ``history`` (prompt + generated ids) feeds the penalties.
        ``argmax``: ``np.argmax(logits)`` where the caller already has it (``Llm.greedy_hint``), else None."""
        p = self.params
        if self._plain_greedy:
            token = self._argmax(np.asarray(logits).reshape(-1), argmax)
            if token is not None:
                return token
        x = np.array(logits, dtype=np.float64).reshape(-1)
        x = apply_penalties(x, history, p)
        if not np.isfinite(x).any():
            raise HeteroError("the model produced no finite logit (NaN or inf everywhere): broken weights or "
                              "settings")
        ids, values = self.bias
        if ids.size:
            keep = ids < x.size
            x[ids[keep]] += values[keep]
        if self.constraint is not None:
            allowed = self.constraint.allowed(x.size)
            if not allowed.any():
                raise HeteroError("the grammar allows no next token (the output cannot be completed)")
            x = np.where(allowed, x, -np.inf)
        if p.greedy:
            token = int(np.argmax(x))
        else:
            probs, support = _filtered(x, p)
            token = _draw(self.rng, probs, support)
        if self.top_logprobs is not None:
            self.logprobs.append(_logprob(x, token, self.top_logprobs))
        if self.constraint is not None:
            self.constraint.advance(token)
        return token


def _bias_arrays(bias: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    ids, values = [], []
    for key, value in bias.items():
        if isinstance(key, bool) or not isinstance(key, int | np.integer) or key < 0:
            raise HeteroError(f"logit_bias: key {key!r} is not a token id (an integer >= 0)")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise HeteroError(f"logit_bias: the bias of token {key} is {value!r}; expected a number in [-100, 100]")
        ids.append(int(key))
        values.append(float(value))
    return np.asarray(ids, dtype=np.int64), np.asarray(values, dtype=np.float64)


def _logprob(x: np.ndarray, token: int, top: int) -> TokenLogprob:
    finite = np.isfinite(x)
    shifted = x - np.max(x[finite])
    log_total = np.log(np.sum(np.exp(shifted[finite])))
    logprobs = np.where(finite, shifted - log_total, -np.inf)
    best: tuple[tuple[int, float], ...] = ()
    if top:
        count = min(top, x.size)
        order = np.argpartition(-logprobs, count - 1)[:count]
        order = order[np.argsort(-logprobs[order], kind="stable")]
        best = tuple((int(i), float(logprobs[i])) for i in order)
    return TokenLogprob(token, float(logprobs[token]), best)


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    if not history or (p.repetition_penalty == 1 and p.presence_penalty == 0 and p.frequency_penalty == 0):
        return logits
    recent = list(history)[-p.penalty_last_n:] if p.penalty_last_n else list(history)
    counts = Counter(t for t in recent if 0 <= t < logits.size)
    ids = np.fromiter(counts, dtype=np.int64)
    n = np.fromiter(counts.values(), dtype=np.float64)
    out = logits.copy()
    seen = out[ids]
    # Repetition penalty (CTRL): shrink positive logits, push negative ones further down.
    seen = np.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
    out[ids] = seen - p.presence_penalty - p.frequency_penalty * n
    return out


def filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """Probabilities after temperature, top-k, top-p and min-p (float64, summing to 1)."""
    return _filtered(logits, p)[0]


def _full_filtered_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """``filtered_probs`` over the whole vocabulary at every stage: the definition ``_filtered`` reproduces bit for
    bit, and its path for what it does not take on (NaN or +inf logits)."""
    x = logits / max(p.temperature, 1e-8)

    keep = np.ones(x.size, dtype=bool)
    if 0 < p.top_k < x.size:
        kth = np.partition(x, -p.top_k)[-p.top_k]
        keep &= x >= kth
    probs = _softmax(np.where(keep, x, -np.inf))
    if p.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least the most likely token).
        cut = int(np.searchsorted(cumulative, p.top_p, side="left")) + 1
        mask = np.zeros_like(keep)
        mask[order[:cut]] = True
        keep &= mask
        probs = _softmax(np.where(keep, x, -np.inf))
    if p.min_p > 0:
        keep &= probs >= p.min_p * probs.max()
        probs = _softmax(np.where(keep, x, -np.inf))
    return probs


def _filtered(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray | None]:
    """``_full_filtered_probs``, bit for bit, and the ascending ids outside which every probability is 0 (None: any).
    Each stage works on the ids still kept instead of the whole vocabulary: on a 152k vocabulary with llama.cpp's
    defaults the full stable argsort of top-p, three softmaxes and the draw's cumsum took ~9 ms a token (a third of a
    0.5B model's step). Equal bits: a kept id's exp is the same element-wise exp, the sums run over the same
    full-size array (zeros where the full path has exp(-inf)), and the top-p prefix is the head of the same stable
    order, found by a partition (``_top_p_prefix``)."""
    x = logits / max(p.temperature, 1e-8)
    ids: np.ndarray | None = None
    if 0 < p.top_k < x.size:
        ids = np.flatnonzero(x >= _kth_largest(x, p.top_k))
    probs = _softmax_at(x, ids)
    if probs is None:  # NaN or +inf among the kept logits: the full path says what that gives
        return _full_filtered_probs(logits, p), None
    if p.top_p < 1:
        head = _top_p_prefix(probs, ids, p.top_p)
        if head is not None:  # None: the kept mass never reaches top_p (rounding); the full path keeps them all
            ids = np.sort(head)
            probs = _softmax_at(x, ids)
            assert probs is not None  # a subset of finite kept logits holding their maximum
    if p.min_p > 0:
        floor = p.min_p * probs.max()
        ids = np.flatnonzero(probs >= floor) if ids is None else ids[probs[ids] >= floor]
        probs = _softmax_at(x, ids)
        assert probs is not None
    return probs, ids


def _kth_largest(x: np.ndarray, k: int) -> float:
    """``np.partition(x, -k)[-k]``, on a 152k vocabulary ~10x faster: the k-th largest of every 16th value is a floor
    that at least k values reach, so the k-th largest of all is among the values at or above it (usually ~16 k of
    them). NaN (which partition puts last, as the largest) takes the full partition."""
    sample = x[::16]
    if k <= sample.size and not np.isnan(np.max(x)):
        floor = np.partition(sample, -k)[-k]
        above = x[x >= floor]
        return float(np.partition(above, -k)[-k])
    return float(np.partition(x, -k)[-k])


def _softmax_at(x: np.ndarray, ids: np.ndarray | None) -> np.ndarray | None:
    """``_softmax(np.where(keep, x, -inf))`` where ``keep`` holds ``ids`` (None: all), or None where a kept value
    is NaN or +inf. The exps are taken of the kept values only; the sum and the division still run over the full
    array, whose pairwise summation must see the zeros where they were."""
    if ids is None:
        top = np.max(x)
        if not np.isfinite(top):
            return None
        e = np.exp(x - top)
        return e / e.sum()
    if not ids.size:
        return None
    kept = x[ids]
    top = np.max(kept)
    if not np.isfinite(top):
        return None
    e = np.zeros(x.size)
    part = np.exp(kept - top)
    e[ids] = part
    part /= e.sum()  # only the kept ids' quotients are not 0 / sum = 0: the full array is not divided
    e[ids] = part
    return e


def _top_p_prefix(probs: np.ndarray, ids: np.ndarray | None, top_p: float) -> np.ndarray | None:
    """``order[:cut]`` of the full path's top-p step (``order``: ids by probability, highest first, ties by id; the
    cut: the smallest prefix whose cumulative sum reaches ``top_p``), or None where the cut lies past every positive
    probability. Only the head of the order is sorted: the ids whose probability is at least the ``count``-th
    largest (all of a tie, so exactly the order's first ones, in its order after a stable sort of ascending ids);
    their cumulative sum is the full one's prefix (cumsum adds in order). ``count`` grows until the cut is inside."""
    pool = probs if ids is None else probs[ids]
    count = 64
    while True:
        kth = _kth_largest(pool, count) if count < pool.size else 0.0
        whole = kth <= 0
        if whole:  # the head is every positive probability (the maximum's is one)
            kth = np.min(pool[pool > 0])
        head = np.flatnonzero(pool >= kth)
        if ids is not None:
            head = ids[head]
        head = head[np.argsort(-probs[head], kind="stable")]
        cut = int(np.searchsorted(np.cumsum(probs[head]), top_p, side="left"))
        if cut < head.size:
            return head[:cut + 1]
        if whole:
            return None
        count *= 8


def _draw(rng: np.random.Generator, probs: np.ndarray, support: np.ndarray | None) -> int:
    """``rng.choice(probs.size, p=probs)``, the same id from the same one uniform draw, over ``support`` (ascending
    ids holding every positive probability) instead of the vocabulary: choice's cdf is the cumulative sum divided by
    its last value and picks the first entry above the draw, which is never one of probability 0 (its cdf equals the
    positive entry's before it), and a cumsum adds the same values in the same order with or without zeros."""
    if support is None:
        return int(rng.choice(probs.size, p=probs))
    positive = support[probs[support] > 0]
    cdf = np.cumsum(probs[positive])
    cdf /= cdf[-1]
    return int(positive[cdf.searchsorted(rng.random(), side="right")])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / e.sum()


Hint = Callable[[np.ndarray], int | None]  # a logits row -> its argmax where already known (Llm.greedy_hint)


def no_hint(row: np.ndarray) -> None:
    """The hint of a model or sampler that has none: the sampler reads the row itself."""
    return None


def greedy_hint(model: object, sampler: Sampler) -> Hint:
    """The model's ``greedy_hint`` (each row's argmax from the LM head's native call) where ``sampler`` needs no
    more of a row than its argmax (plain greedy), else ``no_hint``: penalties, sampling and grammars read the
    logits."""
    found = getattr(model, "greedy_hint", None) if sampler.plain_greedy else None
    return found if found is not None else no_hint
