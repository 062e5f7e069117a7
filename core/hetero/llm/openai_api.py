"""The OpenAI API in Python: ``create_completion`` / ``create_chat_completion`` on an ``Llm``, returning the OpenAI
objects as plain dicts (``choices``, ``finish_reason``, ``usage``; streaming chunks as ``chat.completion.chunk``).

Each call has its own sampler and record, so calls from several threads are safe (the model's steps take turns on
its lock; see ``hetero.llm.model``). ``hetero serve`` puts these functions behind HTTP.

Options as OpenAI's: ``max_tokens`` (None: until the context is full), ``stop``, ``seed``, ``temperature``,
``top_p``, ``presence_penalty`` / ``frequency_penalty``, ``logit_bias``, ``logprobs`` / ``top_logprobs``,
``response_format`` (``json_object``, or ``json_schema`` through constrained decoding: ``hetero.llm.grammar``),
``tools`` (given to the chat template; calls parsed from the Qwen / Hermes ``<tool_call>{json}</tool_call>`` format).
hetero's own sampling options (``top_k``, ``min_p``, ``repetition_penalty``) are accepted too.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ..contract.errors import HeteroError
from .generate import Generation, generate_stream
from .sampler import Sampler, TokenLogprob
from .snapshot import common_prefix

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "seed")


class ContextLengthError(HeteroError):
    """The prompt leaves no room in the context for a reply (HTTP 400, code ``context_length_exceeded``)."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V were reused from the model's cache
    prefill_seconds: float = 0.0  # to the first token
    decode_seconds: float = 0.0  # the rest

    def timings(self) -> dict[str, Any]:
        """hetero's figures beside OpenAI's ``usage`` (the ``timings`` entry, as llama.cpp's server gives)."""
        return {"prompt_n": self.prompt_tokens, "prompt_cached": self.cached_tokens,
                "prompt_ms": self.prefill_seconds * 1e3, "predicted_n": self.completion_tokens,
                "predicted_ms": self.decode_seconds * 1e3}

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class _TimedSampler(Sampler):
    """A sampler that notes when it chose its first token: the time to first token, even when the first text
    piece is held back (an unfinished UTF-8 sequence, a possible stop string, a model without a tokenizer)."""

    first_token_at: float | None = None

    def sample(self, logits: Any, history: Sequence[int] = (), argmax: int | None = None) -> int:
        token = super().sample(logits, history, argmax)
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        return token


@dataclass
class _Request:
    """One generation: its prompt ids, sampler, record; the text pieces come from ``pieces()``."""

    llm: Any
    ids: list[int]
    max_tokens: int
    sampler: _TimedSampler
    stop: list[str]
    record: Generation = field(default_factory=Generation)
    usage: Usage = field(default_factory=Usage)

    def pieces(self) -> Iterator[str]:
        llm, record = self.llm, self.record
        self.usage.prompt_tokens = len(self.ids)
        self.usage.cached_tokens = min(common_prefix(llm.tokens, self.ids), len(self.ids) - 1)
        decode = (lambda t: llm.detokenize(t, skip_special_tokens=True)) if llm.tokenizer is not None \
            else (lambda t: "")
        started = time.perf_counter()
        stats = llm.stats  # what generate_stream's prefill records (the prefix cache's restored tokens too)
        stream = generate_stream(llm, self.ids, self.max_tokens, self.sampler, self.stop, llm.eos_ids, record, decode)
        try:
            for piece in stream:
                self.usage.completion_tokens = len(record.tokens)
                yield piece
        finally:
            stream.close()  # a client gone: the loop stops, the cache stays consistent
            self.usage.completion_tokens = len(record.tokens)
            if stats.prompt_tokens == len(self.ids):
                self.usage.cached_tokens = max(self.usage.cached_tokens, stats.cached_tokens)
            end = time.perf_counter()
            first = self.sampler.first_token_at or end
            self.usage.prefill_seconds = first - started
            self.usage.decode_seconds = end - first

    @property
    def finish_reason(self) -> str:
        return "stop" if self.record.finish_reason in ("eos", "stop") else self.record.finish_reason

    def logprob_entries(self, start: int, end: int) -> list[TokenLogprob]:
        return self.sampler.logprobs[start:min(end, len(self.record.tokens))]


def _prepare(llm: Any, ids: list[int], *, max_tokens: int | None, stop: Any, logit_bias: Any, logprobs: int | None,
             constraint: Any, sampling: dict[str, Any]) -> _Request:
    if not ids:
        raise HeteroError("the prompt is empty: nothing to predict from")
    room = llm.context - len(ids)
    if room < 1:
        raise ContextLengthError(f"the prompt has {len(ids)} tokens; the context holds {llm.context}, leaving no "
                                 "room for a reply", hint="shorten the prompt, or load with a larger context")
    if max_tokens is None:
        max_tokens = room
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise HeteroError(f"max_tokens={max_tokens!r}; expected a positive integer")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 4 or not all(isinstance(s, str) for s in stops):
        raise HeteroError(f"stop={stop!r}; expected a string or a list of up to 4 strings")
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise HeteroError(f"top_logprobs={logprobs}; expected 0 to {MAX_TOP_LOGPROBS}")
    params = llm.sampling_params(**{k: v for k, v in sampling.items() if k in _SAMPLING})
    bias = {_token_key(k): v for k, v in (logit_bias or {}).items()}
    sampler = _TimedSampler(params, logit_bias=bias, constraint=constraint, top_logprobs=logprobs)
    return _Request(llm, ids, max_tokens, sampler, stops)


def _token_key(key: Any) -> int:
    """logit_bias keys are token ids, as JSON object keys: strings of digits."""
    if isinstance(key, str) and key.strip().isdigit():
        return int(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    raise HeteroError(f"logit_bias: key {key!r} is not a token id")


def _constraint(llm: Any, response_format: Mapping[str, Any] | None) -> Any:
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise HeteroError("response_format must be an object such as {\"type\": \"json_object\"}")
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    from .grammar import GrammarConstraint  # llguidance: only when asked for

    if kind == "json_object":
        return GrammarConstraint.json_schema(llm, None)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
            raise HeteroError("response_format.json_schema must be an object with a 'schema' object")
        return GrammarConstraint.json_schema(llm, dict(spec.get("schema") or {}))
    raise HeteroError(f"response_format.type={kind!r}; expected 'text', 'json_object' or 'json_schema'")


def _unique_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


# -- log-probabilities in the two shapes OpenAI uses -------------------------------------------------------------------
def _token_text(llm: Any, token: int) -> str:
    return llm.detokenize([token]) if llm.tokenizer is not None else str(token)


def _chat_logprobs(llm: Any, entries: list[TokenLogprob]) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        text = _token_text(llm, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                        for e in entries], "refusal": None}


def _completion_logprobs(llm: Any, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
    tokens = [_token_text(llm, e.token) for e in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_token_text(llm, t): lp for t, lp in e.top} for e in entries], "text_offset": offsets}


# -- completions -------------------------------------------------------------------------------------------------------
def create_completion(llm: Any, prompt: str | Sequence[int], *, max_tokens: int | None = 16, stream: bool = False,
                      stop: str | Sequence[str] | None = None, logprobs: int | None = None, echo: bool = False,
                      logit_bias: Mapping[Any, float] | None = None, response_format: Mapping[str, Any] | None = None,
                      stream_options: Mapping[str, Any] | None = None, **sampling: Any) -> Any:
    """OpenAI's ``/v1/completions``: a ``text_completion`` dict, or with ``stream=True`` an iterator of them (one
    per text piece, the last with ``finish_reason``). ``logprobs`` is how many alternatives to list per token."""
    _no_unknown(sampling)
    ids = llm.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
    request = _prepare(llm, ids, max_tokens=max_tokens, stop=stop, logit_bias=logit_bias, logprobs=logprobs,
                       constraint=_constraint(llm, response_format), sampling=sampling)
    prefix = prompt if echo and isinstance(prompt, str) else ""
    base = {"id": _unique_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": llm.name}
    chunks = _completion_chunks(llm, request, base, prefix, logprobs is not None, _include_usage(stream_options))
    return CompletionStream(chunks, request) if stream else _collect_completion(chunks, request)


def _completion_chunks(llm: Any, request: _Request, base: dict[str, Any], prefix: str, want_logprobs: bool,
                       include_usage: bool) -> Iterator[dict[str, Any]]:
    offset, done = 0, 0
    if prefix:
        yield {**base, "choices": [{"index": 0, "text": prefix, "logprobs": None, "finish_reason": None}]}
        offset = len(prefix)
    for piece in request.pieces():
        entries = request.logprob_entries(done, len(request.record.tokens))
        done += len(entries)
        lp = _completion_logprobs(llm, entries, offset) if want_logprobs else None
        offset += len(piece)
        yield {**base, "choices": [{"index": 0, "text": piece, "logprobs": lp, "finish_reason": None}]}
    rest = request.logprob_entries(done, len(request.record.tokens))
    lp = _completion_logprobs(llm, rest, offset) if want_logprobs and rest else None
    yield {**base, "choices": [{"index": 0, "text": "", "logprobs": lp, "finish_reason": request.finish_reason}]}
    if include_usage:
        yield {**base, "choices": [], "usage": request.usage.as_dict()}


def _collect_completion(chunks: Iterator[dict[str, Any]], request: _Request) -> dict[str, Any]:
    text, logprobs, last = [], None, None
    for chunk in chunks:
        if not chunk["choices"]:
            continue
        choice = last = chunk["choices"][0]
        text.append(choice["text"])
        if choice["logprobs"] is not None:
            logprobs = _merge_completion_logprobs(logprobs, choice["logprobs"])
    assert last is not None
    result = {**{k: v for k, v in chunk.items() if k not in ("choices", "usage")},
              "choices": [{"index": 0, "text": "".join(text), "logprobs": logprobs,
                           "finish_reason": last["finish_reason"]}],
              "usage": request.usage.as_dict(), "timings": request.usage.timings()}
    return result


def _merge_completion_logprobs(into: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    if into is None:
        return {k: list(v) for k, v in more.items()}
    for key, values in more.items():
        into[key].extend(values)
    return into


# -- chat completions --------------------------------------------------------------------------------------------------
def create_chat_completion(llm: Any, messages: Sequence[Mapping[str, Any]], *, max_tokens: int | None = None,
                           max_completion_tokens: int | None = None, stream: bool = False,
                           stop: str | Sequence[str] | None = None, logprobs: bool = False,
                           top_logprobs: int | None = None, logit_bias: Mapping[Any, float] | None = None,
                           response_format: Mapping[str, Any] | None = None,
                           tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
                           stream_options: Mapping[str, Any] | None = None,
                           template_kwargs: Mapping[str, Any] | None = None, compress_to: int | None = None,
                           **sampling: Any) -> Any:
    """OpenAI's ``/v1/chat/completions``: a ``chat.completion`` dict, or with ``stream=True`` an iterator of
    ``chat.completion.chunk`` dicts. With ``tools``, calls the model writes as ``<tool_call>{"name": ...,
    "arguments": {...}}</tool_call>`` come back as ``message.tool_calls`` (finish_reason ``tool_calls``).
    ``compress_to``: fit the prompt into this many tokens by compressing the last user message (its first two
    and last two sentences kept, and those most relevant to them; ``hetero.llm.compress``; off by default)."""
    _no_unknown(sampling)
    if tool_choice not in (None, "auto", "none"):
        raise HeteroError(f"tool_choice={tool_choice!r}: only 'auto' and 'none' are supported")
    use_tools = bool(tools) and tool_choice != "none"
    if compress_to is not None:
        from .compress import compress_messages, token_counter

        count, chars = token_counter(llm)
        messages = compress_messages(messages, compress_to, lambda m: len(chat_prompt(llm, m, tools if use_tools
                                                                                     else None, template_kwargs)),
                                     count, max_unit_chars=compress_to * chars)
    ids = chat_prompt(llm, messages, tools if use_tools else None, template_kwargs)
    limit = max_completion_tokens if max_completion_tokens is not None else max_tokens
    request = _prepare(llm, ids, max_tokens=limit, stop=stop, logit_bias=logit_bias,
                       logprobs=(top_logprobs or 0) if logprobs else None,
                       constraint=_constraint(llm, response_format), sampling=sampling)
    base = {"id": _unique_id("chatcmpl"), "created": int(time.time()), "model": llm.name,
            "system_fingerprint": _fingerprint()}
    if stream:
        chunks = _chat_chunks(llm, request, base, logprobs, use_tools, _include_usage(stream_options))
        return CompletionStream(chunks, request)
    for _ in request.pieces():
        pass
    content = request.record.text
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    finish = request.finish_reason
    calls = parse_tool_calls(content) if use_tools else None
    if calls:
        message["content"] = TOOL_CALL.sub("", content).strip() or None
        message["tool_calls"] = calls
        finish = "tool_calls"
    return {**base, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": _chat_logprobs(llm, request.logprob_entries(0, len(request.record.tokens)))
                         if logprobs else None}],
            "usage": request.usage.as_dict(), "timings": request.usage.timings()}


def chat_prompt(llm: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """The token ids of ``messages`` through the model's chat template, ready for the reply."""
    if llm.template is None:
        raise HeteroError(f"model {llm.name!r} has no chat template: use create_completion")
    if isinstance(messages, str) or not isinstance(messages, Sequence):
        raise HeteroError(f"messages must be a list of message objects, got {type(messages).__name__}")
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = [dict(t) for t in tools]
    text = llm.template.render([_message(m, i) for i, m in enumerate(messages)], add_generation_prompt=True,
                               **kwargs)
    return llm.tokenize(text, add_special_tokens=False)


def _chat_chunks(llm: Any, request: _Request, base: dict[str, Any], want_logprobs: bool, use_tools: bool,
                 include_usage: bool) -> Iterator[dict[str, Any]]:
    base = {**base, "object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    done = 0
    held: list[str] = []  # with tools the reply is held back: it may turn out to be a call
    for piece in request.pieces():
        entries = request.logprob_entries(done, len(request.record.tokens))
        done += len(entries)
        lp = _chat_logprobs(llm, entries) if want_logprobs else None
        if use_tools:
            held.append(piece)
        else:
            yield chunk({"content": piece}, lp=lp)
    finish = request.finish_reason
    if use_tools:
        text = "".join(held)
        calls = parse_tool_calls(text)
        if calls:
            rest = TOOL_CALL.sub("", text).strip()
            if rest:
                yield chunk({"content": rest})
            yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})
            finish = "tool_calls"
        elif text:
            yield chunk({"content": text})
    yield chunk({}, finish)
    if include_usage:
        yield {**base, "choices": [], "usage": request.usage.as_dict()}


def parse_tool_calls(text: str) -> list[dict[str, Any]]:
    """The ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks of ``text`` as OpenAI tool calls
    (arguments as a JSON string); blocks that are not such JSON are left as text."""
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", {})
        calls.append({"id": _unique_id("call"), "type": "function",
                      "function": {"name": call["name"], "arguments": arguments if isinstance(arguments, str)
                                   else json.dumps(arguments, ensure_ascii=False)}})
    return calls


def _message(m: Any, index: int) -> dict[str, Any]:
    """An OpenAI message as the chat template reads it: content parts joined into text, tool calls' arguments
    parsed back into objects (Qwen's template writes them with tojson)."""
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
        raise HeteroError(f"messages[{index}] must be an object with a 'role' string")
    out = dict(m)
    content = m.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise HeteroError(f"messages[{index}].content: only text parts are supported")
            texts.append(part["text"])
        out["content"] = "".join(texts)
    elif content is None:
        out["content"] = ""
    elif not isinstance(content, str):
        raise HeteroError(f"messages[{index}].content must be a string or a list of text parts")
    calls = m.get("tool_calls")
    if calls:
        out["tool_calls"] = [_template_call(c, index) for c in calls]
    return out


def _template_call(call: Any, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise HeteroError(f"messages[{index}].tool_calls: each call needs function.name")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise HeteroError(f"messages[{index}].tool_calls: arguments are not JSON: {exc}") from None
    return {**dict(call), "function": {"name": function["name"], "arguments": arguments}}


class CompletionStream:
    """The chunks of a streamed completion; ``usage`` is filled in as it runs, ``close()`` stops the generation
    (a client that went away)."""

    def __init__(self, chunks: Iterator[dict[str, Any]], request: _Request) -> None:
        self._chunks = chunks
        self._request = request

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._chunks

    def __next__(self) -> dict[str, Any]:
        return next(self._chunks)

    @property
    def usage(self) -> Usage:
        return self._request.usage

    @property
    def finish_reason(self) -> str:
        return self._request.finish_reason

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def _include_usage(stream_options: Mapping[str, Any] | None) -> bool:
    if stream_options is None:
        return False
    if not isinstance(stream_options, Mapping):
        raise HeteroError("stream_options must be an object")
    return bool(stream_options.get("include_usage"))


def _no_unknown(sampling: Mapping[str, Any]) -> None:
    unknown = sorted(set(sampling) - set(_SAMPLING))
    if unknown:
        raise HeteroError(f"unknown option(s) {unknown}; sampling options are {list(_SAMPLING)}")


def _fingerprint() -> str:
    try:
        return f"hetero-{metadata.version('hetero')}"
    except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH
        return "hetero"
