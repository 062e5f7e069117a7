"""The generation loop: sample, feed back, detokenize incrementally, stop on EOS, stop strings or the token limit.

Text is emitted as it becomes final: a piece that ends inside a UTF-8 sequence, or that could be the start of a
stop string, is held back until the next token decides it. Each token is decoded once (``TextDecoder``): decoding
the whole reply at every token made a long generation quadratic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from . import steplog
from .sampler import Sampler, greedy_hint


class _Counters(Protocol):
    generated_tokens: int
    decode_seconds: float


class Llm(Protocol):
    """What the loop needs of a model (``hetero.llm.model.Llm``, which imports this module): prefill, one step."""

    @property
    def stats(self) -> _Counters: ...

    def prefill(self, ids: Sequence[int]) -> np.ndarray: ...

    def forward(self, ids: Sequence[int]) -> np.ndarray: ...

    context: int  # positions the KV cache holds

    # stats: the model's own Stats (Any: this module cannot import the model, which imports it)
    def _advance(self, owner: object, ids: list[int], stats: Any = None, prompt_file: Any = None) -> np.ndarray: ...


@dataclass
class Generation:
    """What the last ``generate``/``chat`` call produced."""

    prompt_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # generated ids (an EOS that ended it excluded)
    text: str = ""
    finish_reason: str = ""  # eos | stop | length | cancelled
    context_full: bool = False  # "length" because the KV cache could hold no more tokens (not max_new_tokens)


class StopMatcher:
    """Finds stop strings in growing text and says how much of the text is safe to emit."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]

    def find(self, text: str, start: int = 0) -> int:
        """Index of the earliest stop string at or after ``start`` (looking back enough to catch overlaps), or -1."""
        best = -1
        for stop in self.stops:
            i = text.find(stop, max(0, start - len(stop) + 1))
            if i != -1 and (best == -1 or i < best):
                best = i
        return best

    def safe_end(self, text: str) -> int:
        """Length of the prefix of ``text`` that cannot turn into the start of a stop string."""
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        return len(text) - hold


SINGLES_MAX = 1 << 18  # TextDecoder's decode([t]) memo: at most this many tokens (more than any vocabulary here)


class TextDecoder:
    """The text of a growing list of tokens, decoding only the tokens since the last finished character (and those
    of the piece before it, for tokenizers whose text of a token depends on the one before: SentencePiece's leading
    space). A piece that ends inside a UTF-8 sequence (decoded as U+FFFD) waits for the tokens that finish it;
    ``flush`` gives what is left at the end (a sequence that never finished, as U+FFFD, as decoding all would)."""

    def __init__(self, decode: Callable[[list[int]], str], singles: dict[int, str] | None = None,
                 concatenates: bool = False) -> None:
        self.decode = decode
        # ``concatenates``: decode(a + [t]) == decode(a) + decode([t]) whenever neither holds U+FFFD (byte-level BPE:
        # each token's bytes joined, one UTF-8 decode; ``Tokenizer.concatenates``). Then a token after a finished
        # piece whose own text is whole costs no decode once its text is in ``singles``.
        self.concatenates = concatenates
        self.tokens: list[int] = []
        self.start = 0  # the tokens [start, done) decode to the last piece added to the text ...
        self.done = 0  # ... and the tokens from done on are not in the text yet
        # decode([t]) by token: the usual "before" is the one token of the last piece, so with it known a token
        # costs one decode, not two. ``singles`` may be shared by the decoders of one decode function (a model's):
        # decode is a pure function of the ids, so a racing writer stores the same text.
        self.singles: dict[int, str] = {} if singles is None else singles
        self._before: tuple[int, int, str] | None = None  # (start, done, text): a window held over unfinished adds

    def _window(self, start: int, done: int) -> str:
        if done - start == 1:
            return self._single(self.tokens[start])
        held = self._before
        if held is not None and held[0] == start and held[1] == done:
            return held[2]
        text = self.decode(self.tokens[start:done])
        self._before = (start, done, text)
        return text

    def _single(self, token: int) -> str:
        text = self.singles.get(token)
        if text is None:
            text = self.decode([token])
            if len(self.singles) < SINGLES_MAX:
                self.singles[token] = text
        return text

    def add(self, token: int) -> str:
        """The text that ``token`` finishes (often its own piece; "" while a character is unfinished)."""
        self.tokens.append(token)
        if self.concatenates and self.done == len(self.tokens) - 1:  # the last piece finished: after = before + own
            before = self._window(self.start, self.done)
            own = self._single(token)
            if "\ufffd" not in before and "\ufffd" not in own:
                if not own:  # as decoding both: a token with no text (a special one) finishes nothing
                    return ""
                self.start, self.done = self.done, len(self.tokens)
                return own
        before = self._window(self.start, self.done)
        after = self.decode(self.tokens[self.start:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.start, self.done = self.done, len(self.tokens)
        return after[len(before):]

    def flush(self) -> str:
        """The text of the tokens still held back (at the end of the generation)."""
        if self.done == len(self.tokens):
            return ""
        before = self._window(self.start, self.done)
        after = self.decode(self.tokens[self.start:])
        self.start = self.done = len(self.tokens)
        return after[len(before):]


def emit_end(text: str, matcher: StopMatcher) -> int:
    """How much of the decoded ``text`` is final: a piece ending inside a UTF-8 sequence (decoded as U+FFFD) waits,
    and so does what may begin a stop string — judged without the unfinished character, so "xa" + half of "é" does
    not leak the "a" of the stop string "aé"."""
    end = len(text.rstrip("\ufffd")) if text.endswith("\ufffd") else len(text)
    return min(end, matcher.safe_end(text[:end]))


class TokenSource(Protocol):
    """Where tokens come from instead of one sampled step each (``hetero.llm.speculative.Speculation``)."""

    def start(self, llm: Any, record: Generation, prompt: list[int], sampler: Sampler,
              stats: Any) -> Iterator[int]: ...


def generate_stream(llm: Llm, prompt_ids: list[int], max_new_tokens: int, sampler: Sampler, stop: Sequence[str],
                    eos_ids: Sequence[int], record: Generation,
                    decode: Callable[[list[int]], str], source: TokenSource | None = None,
                    prompt_file: Any = None, singles: dict[int, str] | None = None,
                    concatenates: bool = False) -> Generator[str, None, None]:
    """Yield text pieces; closing the iterator stops generation and leaves the cache consistent. ``source``: take
    the tokens from it (speculative decoding; it prefills the prompt) instead of sampling each from a step.
    ``prompt_file``: the prompt's prefix-cache file (``hetero.llm.prompt_cache.PromptFile``). ``singles``: the
    ``TextDecoder`` memo of one-token texts to share (a model's, for its ``decode``), or None for a fresh one;
    ``concatenates``: ``decode`` joins the tokens' texts (``TextDecoder``)."""
    stats = llm.stats
    matcher = StopMatcher(stop)
    record.prompt_tokens = list(prompt_ids)
    record.finish_reason = "cancelled"
    eos = set(eos_ids)
    tokens = source.start(llm, record, list(prompt_ids), sampler, stats) if source is not None else None
    logits = llm._advance(record, list(prompt_ids), stats, prompt_file) if tokens is None \
        else np.zeros((1, 0), np.float32)
    history = list(prompt_ids)
    log = steplog.active()
    if log:
        steplog.write("start", spec=source is not None, prompt_tokens=len(prompt_ids), max_new_tokens=max_new_tokens)
    emitted = 0  # characters of the decoded text already yielded
    text = ""
    pieces = TextDecoder(decode, singles, concatenates)
    # the step's argmax from the LM head's native call (Llm.greedy_hint), for a sampler that needs no more
    hint = greedy_hint(llm, sampler)
    decode_started = time.perf_counter()
    try:
        for _ in range(max_new_tokens):
            if tokens is None:
                row = logits[-1]
                token = sampler.sample(row, history, hint(row))
            else:
                token = next(tokens)
            if token in eos:
                record.finish_reason = "eos"
                break
            record.tokens.append(token)
            history.append(token)
            stats.generated_tokens += 1
            text += pieces.add(token)
            hit = matcher.find(text, emitted)
            if hit != -1:
                text = text[:hit]
                if hit > emitted:
                    yield text[emitted:hit]
                emitted = hit
                record.finish_reason = "stop"
                break
            end = emit_end(text, matcher)
            if end > emitted:
                yield text[emitted:end]
                emitted = end
            if len(record.tokens) == max_new_tokens:
                record.finish_reason = "length"
                break
            if len(history) >= llm.context:  # the cache cannot take the token just sampled: stop, keep the text
                record.finish_reason = "length"
                record.context_full = True
                break
            if tokens is None:
                step_started = time.perf_counter()
                logits = llm._advance(record, history)
                if log:
                    steplog.write("plain", produced=len(record.tokens), seconds=time.perf_counter() - step_started)
        else:
            record.finish_reason = "length"
        if record.finish_reason != "stop":
            text += pieces.flush()
            hit = matcher.find(text, emitted)
            if hit != -1:  # the tail finished a stop string
                text = text[:hit]
                record.finish_reason = "stop"
        if emitted < len(text):  # the held-back tail is final now
            yield text[emitted:]
            emitted = len(text)
    finally:
        stats.decode_seconds += time.perf_counter() - decode_started
        record.text = text[:emitted] if record.finish_reason == "cancelled" else text


def greedy_tokens(llm: Llm, prompt_ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt_ids`` (no EOS handling): the reference check against transformers."""
    logits = llm.prefill(prompt_ids)
    out: list[int] = []
    for i in range(n):
        token = int(np.argmax(logits[-1]))
        out.append(token)
        if i + 1 < n:
            logits = llm.forward([token])
    return out
