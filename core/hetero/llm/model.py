"""``Llm``: a decoder graph in a Session, its KV cache (inside the Attention nodes), the tokenizer and the API.

The cache holds the K/V of ``self.tokens``; a new prompt reuses the longest common prefix and rolls back the rest
(positions are explicit, so rolling back is running from an earlier ``past_len``).

One ``Llm`` may be used from several threads: every step runs under the model's lock, and each generation states the
tokens it needs in the cache (``_advance``), so two generations interleaved — from two threads, or a paused stream
resumed after another ``generate`` — each recompute what the other replaced instead of reading its cache. Both
work; neither sees the other's tokens.
"""

from __future__ import annotations

import copy
import operator
import os
import re
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import plugins
from ..contract.decoder import LlmDecoder
from ..contract.errors import HeteroError
from ..contract.graph import Graph
from ..contract.kv_rotated import KV_ROTATED_BITS, check_head_dim
from ..runtime.selection import split_names
from ..runtime.session import Session
from .batch import LOGIT_ROWS, Batcher, slot_graph
from .config import LlmConfig
from .families.decoder import INPUT_IDS, LAST_TOKENS, LOGITS, PAST_LEN, VERIFY_ROWS
from .files import MappedFiles, limit
from .generate import Generation, generate_stream
from .model_hash import ModelIdentity, model_files
from .prefix_cache import PrefixCache
from .prompt_cache import PromptFile, prompt_file
from .prompt_cache import restore as restore_prompt
from .prompt_cache import save as save_prompt
from .sampler import Sampler, SamplingDefaults, SamplingParams, from_generation_config
from .snapshot import common_prefix
from .template import ChatTemplate
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
    # speculative decoding (hetero.llm.speculative): verify steps that carried a draft, tokens drafted, accepted
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens committed per verify step that carried a draft (accepted drafts + the target's own token)."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "prefill_tokens_per_second": self.prefill_tokens_per_second,
                "decode_tokens_per_second": self.decode_tokens_per_second,
                "acceptance_rate": self.acceptance_rate, "tokens_per_verify": self.tokens_per_verify}


# KV cache element types: float16 halves the cache (and decode attention's reads); float32 is exact; q8 (int8 with a
# float scale per 32 values, 1.125 bytes a value) nearly halves it again at a small, measured accuracy cost
# (docs/llm.md, "KV cache"); q4r / q3r (Walsh-Hadamard rotated, 4 / 3-bit Lloyd-Max codes, 0.5625 / 0.4375 bytes a
# value, hetero.contract.kv_rotated) quarter / fifth it, measured in docs/long-context.md.
KV_CACHE_TYPES = ("f16", "f32", "q8", "q4r", "q3r")

_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                  "frequency_penalty", "penalty_last_n", "seed")


def check_options(context: Any, prefill_chunk: Any, kv_cache: Any, slots: Any = 1) -> None:
    """The options every way of making an Llm takes, checked before anything is allocated for them."""
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= VERIFY_ROWS:
        raise HeteroError(f"slots={slots!r}; expected 1 to {VERIFY_ROWS} sequences (a batched step's logits are "
                          f"its last {VERIFY_ROWS} rows)")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise HeteroError(f"context={context!r}; expected a positive number of tokens")
    limit(context, "positions", "context")
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 0:
        raise HeteroError(f"prefill_chunk={prefill_chunk!r}; expected 0 (whole prompt) or a positive size")
    if kv_cache not in KV_CACHE_TYPES:
        raise HeteroError(f"kv_cache={kv_cache!r}; expected one of {KV_CACHE_TYPES}")


class Llm:
    """A loaded language model. Create it with ``hetero.llm.load``."""

    def __init__(self, config: LlmConfig, graph: Graph, tokenizer: Tokenizer | None, *, context: int,
                 backends: Sequence[str] | str | None = None, on_fallback: str = "warn", threads: int | None = None,
                 prefill_chunk: int = 512, name: str = "", quant: str = "", path: Path | None = None,
                 kv_cache: str = "f16", sampling: SamplingDefaults | None = None, mapped: Sequence[Path] = (),
                 template: ChatTemplate | None = None, hidden_layers: Sequence[int] = (),
                 embeddings: bool = False, decoder: LlmDecoder | None = None, slots: int = 1,
                 head_rows: np.ndarray | None = None) -> None:
        check_options(context, prefill_chunk, kv_cache, slots)
        if decoder is not None and (hidden_layers or embeddings):
            raise HeteroError(f"{decoder.name} runs the decoder whole: it exposes no hidden layers or embeddings",
                              hint="load on cpu / opencl for hidden_layers= or embeddings=True")
        if decoder is not None and slots > 1:
            raise HeteroError(f"{decoder.name} runs the decoder whole, one sequence: it takes no slots={slots}",
                              hint="load on cpu / opencl for several sequences")
        # A backend's whole decoder (an NPU's compiled graphs, Backend.llm_decoder) runs every step; the session is
        # then on cpu and only answers the reports (sizes, parameters)
        self.decoder = decoder
        self.config = config
        self.tokenizer = tokenizer
        self.context = context
        self.prefill_chunk = prefill_chunk
        self.name = name or config.family
        self.quant = quant
        self.path = path
        self.threads = threads
        if kv_cache in KV_ROTATED_BITS and (why := check_head_dim(config.head_dim, kv_cache)):
            raise HeteroError(f"{name or config.family}: {why}", hint="use kv_cache='q8' or 'f16'")
        for node in graph.nodes:
            if node.op_type == "Attention":
                node.attrs["kv_dtype"] = kv_cache
        self.kv_cache = kv_cache
        self._layer_outputs = _layer_outputs(graph)
        self.all_logits = not any(node.name == LAST_TOKENS for node in graph.nodes)
        self.hidden_layers: tuple[int, ...] = ()
        # load(head_rows=...): the logits' columns are these token ids only (a drafter's draft vocabulary)
        self.head_rows = head_rows
        self._hidden: dict[int, np.ndarray] = {}  # layer -> [capacity, H] host copy of the cached tokens' rows
        self._session_args: dict[str, Any] = {"backends": backends if decoder is None else ["cpu"],
                                              "on_fallback": on_fallback, "threads": threads}
        self._graph = graph
        self._expose(self._layer_indices(hidden_layers))
        # embed() reads the final norm's output; as a graph output it is a fresh array every step (not an arena
        # slot, so decode's replay cannot bind its kernel): only models loaded for embeddings pay for it
        self._final_norm = _expose_final_norm(graph) if embeddings else None
        self._last_hidden: np.ndarray | None = None  # the final norm's output of the last step (embed())
        # _step_outputs' memo: (exposed layers, final norm, the output names a step reads)
        self._outputs_built: tuple[tuple[int, ...], str | None, list[str]] | None = None
        # slots > 1: one session serves that many sequences (hetero.llm.batch); this object is slot 0
        self.slots = slots
        if slots > 1:
            slot_graph(graph, slots)
        # the argmax of each logits row as the LM head's second output (the cpu plugin's llm_matmul_argmax: each
        # thread reduces the logits it just wrote), so that greedy sampling need not read 600 KB of cold logits
        # again (greedy_hint); one sequence, on cpu only (the other backends' QMatMul refuse the second output)
        self._greedy = _expose_greedy(graph) if (decoder is None and slots == 1 and head_rows is None
                                                 and not self.all_logits and _cpu_first(backends)) else None
        self._best: tuple[np.ndarray, list[int]] | None = None  # (the last step's logits, each row's argmax)
        self.session = Session(graph, **self._session_args)
        self._batch = Batcher(self.session, slots, logit_rows=LOGIT_ROWS in graph.inputs) if slots > 1 else None
        self._slot = 0
        self._sequences: list[Llm | None] = [self, *([None] * (slots - 1))]
        self.tokens: list[int] = []  # the tokens whose K/V the cache holds, in order
        self.stats = Stats()
        self.last = Generation()
        if sampling is None:
            gen = tokenizer.generation_config if tokenizer is not None else {}
            sampling = from_generation_config(gen, (path or Path(".")) / "generation_config.json")
        self._sampling = sampling
        if template is None and tokenizer is not None and tokenizer.chat_template is not None:
            template = ChatTemplate(tokenizer.chat_template, bos_token=tokenizer.bos_token,
                                    eos_token=tokenizer.eos_token)
        self.template = template
        self._lock = threading.RLock()
        self._owner: object | None = None  # the generation whose tokens the cache holds
        # computed prompts kept for the next one that starts the same way (hetero.llm.prefix_cache); may be shared
        self.prefix_cache: PrefixCache | None = None
        self._mapped = MappedFiles(list(mapped))
        # the model's files and their stat at load: the key of its prefix-cache files (hetero.llm.model_hash)
        self.identity = ModelIdentity(model_files(path, mapped))
        self._tail: tuple[list[int], int, np.ndarray] | None = None  # (tokens, their count, the last one's logits)
        self._singles: tuple[object, dict[int, str]] | None = None  # (tokenizer, TextDecoder's one-token texts)
        self._finalizer = weakref.finalize(self, self._mapped.close)
        self._model: Llm = self  # slot 0, whose finalizer closes the files (what each sequence keeps alive)
        self._sequences_lock = threading.Lock()

    # -- text <-> ids ---------------------------------------------------------------------------------------------
    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise HeteroError(f"model {self.name!r} has no tokenizer (tokenizer.json): pass token ids instead")
        return self.tokenizer

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. A text that cannot fit the context (longer than ``context`` x the longest token)
        is refused before the tokenizer's regex engine sees it (100 MB prompts made it panic at ~4 GB)."""
        tok = self._tok()
        if not isinstance(text, str):
            raise HeteroError(f"prompt must be a str or a list of token ids, got {type(text).__name__}")
        bound = self.context * tok.max_token_chars
        if len(text) > bound:
            raise HeteroError(f"the text has {len(text)} characters; at most {bound} can fit the context of "
                              f"{self.context} tokens", hint="shorten it, or load with a larger context")
        return tok.encode(text, add_special_tokens=add_special_tokens)

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
        with self._lock:
            self._owner = None
            self.tokens = []

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` cached tokens, forget the rest."""
        with self._lock:
            self._owner = None
            self._rollback(length)

    def _rollback(self, length: int) -> None:
        if not 0 <= length <= len(self.tokens):
            raise HeteroError(f"cannot roll back to {length}: the cache holds {len(self.tokens)} tokens")
        del self.tokens[length:]

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """Run ``ids`` after the cached tokens; returns float32 logits (the last token's, or all with all_logits)."""
        with self._lock:
            self._owner = None
            logits = self._forward(_token_ids(ids))
            return logits if self.all_logits else logits[-1:]

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        """Run ``ids`` (at most ``VERIFY_ROWS`` tokens) after the cached tokens in one pass; returns the logits of
        every one of them, float32 ``[len(ids), vocab]`` (row i: the distribution after ``ids[:i + 1]``). The hidden
        states of the exposed layers (``expose_hidden``) are then in ``hidden(layer, start, end)``."""
        ids = _token_ids(ids)
        if len(ids) > VERIFY_ROWS and not self.all_logits:
            raise HeteroError(f"verify takes at most {VERIFY_ROWS} tokens at once, got {len(ids)}")
        with self._lock:
            self._owner = None
            return self._forward(ids)[-len(ids):]

    def _forward(self, ids: list[int]) -> np.ndarray:
        past = self._check_step(ids)
        if self.decoder is not None:  # a backend's whole decoder (Backend.llm_decoder)
            logits = self.decoder.run(ids, past)
            self.tokens.extend(ids)
            return logits
        wanted = self._step_outputs()
        if self._batch is not None:  # one of several sequences: the batcher runs it (with others, for one token)
            out = self._batch.run(self._slot, ids, past, wanted)
        else:
            out = self.session.run({INPUT_IDS: np.asarray(ids, dtype=np.int64),
                                    PAST_LEN: np.asarray(past, dtype=np.int64)}, wanted)
        return self._took(ids, past, out)

    def _check_step(self, ids: list[int]) -> int:
        """The position of a step of ``ids`` after the cached tokens, after checking it can run."""
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
        self._mapped.check()
        return past

    def _step_outputs(self) -> list[str]:
        """The graph outputs a step reads: the logits, the exposed layers', the final norm's (embed). Built once
        per (exposed layers, final norm): a step reads it without changing it, and ``expose_hidden`` replaces the
        tuple, which builds it again."""
        key = (self.hidden_layers, self._final_norm)
        built = self._outputs_built
        if built is not None and built[0] is key[0] and built[1] == key[1]:
            return built[2]
        extra = [self._final_norm] if self._final_norm is not None else []
        if self._greedy is not None:
            extra.append(self._greedy)
        wanted = [LOGITS, *(self._layer_outputs[layer] for layer in self.hidden_layers), *extra]
        self._outputs_built = (*key, wanted)
        return wanted

    def _took(self, ids: list[int], past: int, out: dict[str, np.ndarray]) -> np.ndarray:
        """Keep what a step of ``ids`` at ``past`` returned (hidden states, the cached tokens); its logits."""
        for layer in self.hidden_layers:
            self._store_hidden(layer, past, out[self._layer_outputs[layer]])
        if self._final_norm is not None:
            self._last_hidden = out[self._final_norm]
        self.tokens.extend(ids)
        logits = out[LOGITS]
        self._tail = (self.tokens, len(self.tokens), logits[-1]) if len(logits) else None
        best = out.get(self._greedy) if self._greedy is not None else None
        # every row's: a decode step's one, a verify step's k + 1 (the LM head writes the logits output itself, so
        # its argmax rows are the logits' rows)
        self._best = (logits, best.tolist()) if best is not None and len(best) == len(logits) else None
        return logits

    def greedy_hint(self, row: np.ndarray) -> int | None:
        """numpy's argmax of ``row`` when it is a whole logits row of this model's last step (the LM head's call
        computed it: any row of a decode, verify or prefill step), else None. The sampler's greedy path takes it
        instead of reading the logits again. A view's ``base`` is the array that owns the memory, a fresh one each
        step, so a stale row is refused by identity; the row's place in it is its byte offset / the row stride."""
        best = self._best
        if best is None:
            return None
        owner = best[0]
        if row.base is not owner or row.shape != owner.shape[1:] or row.strides != owner.strides[1:]:
            return None
        i, rest = divmod(row.__array_interface__["data"][0] - owner.__array_interface__["data"][0], owner.strides[0])
        return best[1][i] if not rest and 0 <= i < len(best[1]) else None

    # -- several sequences (hetero.llm.batch) ---------------------------------------------------------------------
    def sequence(self, slot: int) -> Llm:
        """Slot ``slot`` of a model loaded with ``slots=N``: an ``Llm`` of its own (its KV cache, tokens, stats;
        ``generate``, ``chat``, ``create_*``) sharing this model's weights and session. Slot 0 is the model itself.
        Use each from one thread at a time; sequences stepping in different threads at once are batched
        (``hetero.llm.batch``). ``reset()`` frees the slot's cache for the next sequence."""
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.slots:
            raise HeteroError(f"slot {slot!r}: {self.name!r} was loaded with {self.slots} slot(s) "
                              f"(0..{self.slots - 1})", hint="hetero.llm.load(..., slots=N)")
        with self._sequences_lock:
            seq = self._sequences[slot]
            if seq is None:
                seq = self._sequences[slot] = self._new_sequence(slot)
            return seq

    def sequences(self) -> list[Llm]:
        """Every slot's sequence, slot 0 (the model) first."""
        return [self.sequence(i) for i in range(self.slots)]

    def _new_sequence(self, slot: int) -> Llm:
        seq = copy.copy(self)  # shares everything ...
        # ... but what is the sequence's own
        seq._slot = slot
        seq.tokens = []
        seq.stats = Stats()
        seq.last = Generation()
        seq._owner = None
        seq._hidden = {}
        seq._last_hidden = None
        seq._lock = threading.RLock()
        seq._model = self._model  # keeps the model (its finalizer closes the mapped files) alive
        return seq

    def idle(self) -> None:
        """Say this sequence takes no step for a while (its generation ended): other sequences' batched steps stop
        waiting for it. Optional (they wait at most ``hetero.llm.batch.WINDOW`` seconds); a no-op on a model of
        one sequence."""
        if self._batch is not None:
            self._batch.idle(self._slot)

    # -- hidden states (speculative drafters) ---------------------------------------------------------------------
    def _layer_indices(self, layers: Sequence[int]) -> tuple[int, ...]:
        n = self.config.num_layers
        out = []
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int | np.integer) or not -n <= layer < n:
                raise HeteroError(f"hidden layer {layer!r} is not a layer of {self.name!r} (it has {n}: 0..{n - 1})")
            out.append(int(layer) % n)
        return tuple(dict.fromkeys(out))

    def _expose(self, layers: tuple[int, ...]) -> None:
        for layer in layers:
            name = self._layer_outputs.get(layer)
            if name is None:
                raise HeteroError(f"the graph of {self.name!r} has no output of layer {layer} (node "
                                  f"'...layers.{layer}.mlp_residual')")
            if name not in self._graph.outputs:
                self._graph.outputs.append(name)
        self.hidden_layers = tuple(sorted({*self.hidden_layers, *layers}))

    def expose_hidden(self, layers: Sequence[int]) -> tuple[int, ...]:
        """Make every step also return the outputs of decoder ``layers`` (a drafter's ``hidden_layers``; negative
        indices count from the end); returns them as non-negative indices. Exposing a layer not exposed yet
        rebuilds the session, which forgets the cache: load with ``hidden_layers=...`` to avoid that."""
        wanted = self._layer_indices(layers)
        if self.decoder is not None:
            raise HeteroError(f"{self.decoder.name} runs the decoder whole: it exposes no hidden layers")
        with self._lock:
            if set(wanted) - set(self.hidden_layers) and self.slots > 1:
                raise HeteroError(f"{self.name!r} serves {self.slots} sequences: its hidden layers are fixed at load",
                                  hint="hetero.llm.load(..., hidden_layers=[...])")
            if set(wanted) - set(self.hidden_layers):
                self._expose(wanted)
                self.session.close()
                self.session = Session(self._graph, **self._session_args)
                self._owner = None
                self.tokens = []
        return wanted

    def hidden(self, layer: int, start: int, end: int) -> np.ndarray:
        """The output of exposed decoder ``layer`` at cached positions ``[start, end)``, float32 ``[end - start, H]``
        (a view: copy what you keep)."""
        layer = self._layer_indices([layer])[0]
        if layer not in self.hidden_layers:
            raise HeteroError(f"layer {layer} of {self.name!r} is not exposed", hint="expose_hidden([...]) first")
        if not 0 <= start <= end <= len(self.tokens):
            raise HeteroError(f"hidden rows [{start}, {end}) are outside the {len(self.tokens)} cached tokens")
        store = self._hidden.get(layer)
        if store is None:
            return np.zeros((0, self.config.hidden_size), dtype=np.float32)
        return store[start:end]

    def _store_hidden(self, layer: int, start: int, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.float32).reshape(-1, self.config.hidden_size)
        end = start + rows.shape[0]
        store = self._hidden.get(layer)
        if store is None or store.shape[0] < end:
            size = min(max(end, 64, 2 * (0 if store is None else store.shape[0])), self.context)
            grown = np.zeros((size, self.config.hidden_size), dtype=np.float32)
            if store is not None:
                grown[:store.shape[0]] = store
            store = self._hidden[layer] = grown
        store[start:end] = rows

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold exactly ``ids``, computing only what is not cached; returns the logits of the last
        computed chunk (its last row is the next-token distribution)."""
        with self._lock:
            self._owner = None
            return self._prefill(_token_ids(ids), self.stats)

    def _advance(self, owner: object, ids: list[int], stats: Stats | None = None,
                 prompt_file: PromptFile | None = None) -> np.ndarray:
        """The next-token logits after ``ids`` for the generation ``owner``: one step when the cache holds its
        tokens (the usual case), a prefill of what differs when another generation ran in between. ``stats``
        records a prefill (the prompt's); a recomputation after an interruption is not counted. ``prompt_file``:
        the prompt's prefix-cache file (``generate(prompt_cache=...)``)."""
        with self._lock:
            if self._owner is owner and len(self.tokens) == len(ids) - 1:
                self._owner = None  # forward's body, inlined: one call level and one lock less a step
                logits = self._forward(_token_ids(ids[-1:]))
                if not self.all_logits:
                    logits = logits[-1:]
            else:
                logits = self._prefill(ids, stats or Stats(), prompt_file)
            self._owner = owner
            return logits

    def _verify(self, owner: object, history: list[int], drafts: list[int]) -> np.ndarray:
        """The logits rows after ``history`` and after each prefix of ``drafts`` (``len(drafts) + 1`` rows) for the
        generation ``owner``, in one pass when the cache holds ``history[:-1]`` (as ``_advance``)."""
        with self._lock:
            if self._owner is not owner or len(self.tokens) != len(history) - 1:
                if len(history) > 1:
                    self._prefill(history[:-1], Stats())
                else:
                    self._rollback(0)
            rows = self._forward([history[-1], *drafts])
            self._owner = owner
            return rows[-(len(drafts) + 1):]

    def warm_verify(self, widths: Iterable[int]) -> list[int]:
        """Plan and record now the step of each verify width in ``widths`` (a draft of k tokens: a step of k + 1
        rows), so that no generation pays for it: a step's first two runs of a new shape are interpreted (the first
        plans its arena, the second records its replay) and cost 1-2 plain steps more each on the 1.5B at 1 thread
        (issue 15: each width's first runs in a process were chat's largest loss). Call it off the critical path --
        after loading, in a bench's warm-up -- with the widths a drafter can use (``Speculation.warm``). Runs at the
        end of the cache and rolls back: the cached tokens are kept. A no-op for a backend's whole decoder or a model
        of several sequences (their steps run elsewhere). Returns the widths warmed."""
        if self.decoder is not None or self._batch is not None:
            return []
        warmed = []
        with self._lock:
            length = len(self.tokens)
            for k in sorted({int(w) for w in widths}):
                if not 1 <= k < VERIFY_ROWS or length + k + 1 > self.context:
                    continue
                for _ in range(2):  # the first run plans the shape's arena, the second records its replay
                    self._forward([0] * (k + 1))
                    self._rollback(length)
                warmed.append(k)
            self._tail = None  # the warm-up's logits are no prompt's
        return warmed

    def _keep(self, owner: object, length: int) -> None:
        """After a verify step of ``owner``: keep the first ``length`` cached tokens (the rejected drafts go)."""
        with self._lock:
            if self._owner is owner:
                self._rollback(length)

    def _prefill(self, ids: list[int], stats: Stats, prompt_file: PromptFile | None = None) -> np.ndarray:
        if not ids:
            raise HeteroError("the prompt is empty: nothing to predict from")
        if len(ids) > self.context:
            raise HeteroError(f"the prompt has {len(ids)} tokens; the context holds {self.context}",
                              hint="load the model with a larger context=...")
        started = time.perf_counter()
        restored = prompt_file.restore(self, ids) if prompt_file is not None else None
        stats.prompt_tokens = len(ids)
        if restored is not None and self.tokens == ids:  # the file held the whole prompt and its logits
            stats.cached_tokens, stats.prefill_tokens = len(ids), 0
            self._tail = (self.tokens, len(ids), restored[-1])
            stats.prefill_seconds = time.perf_counter() - started
            return restored
        if self.prefix_cache is not None:
            self.prefix_cache.restore(self, self._slot, ids)
        common = common_prefix(self.tokens, ids)
        common = min(common, len(ids) - 1)  # the last token is always run: its logits are the prediction
        self._rollback(common)
        stats.cached_tokens = common
        stats.prefill_tokens = len(ids) - common
        rest = ids[common:]
        step = self.prefill_chunk or len(rest)
        if self._batch is not None:  # one of several sequences: chunks small enough to ride with others' steps
            step = min(step, self._batch.chunk)
        logits = np.empty(0, dtype=np.float32)
        for start in range(0, len(rest), step):
            logits = self.forward(rest[start:start + step])  # the one step every path takes
        if self.prefix_cache is not None:
            self.prefix_cache.store(self, self._slot, ids)
        if prompt_file is not None:
            prompt_file.store(self, ids, logits[-1])
        stats.prefill_seconds = time.perf_counter() - started
        return logits

    # -- prefix-cache files (hetero.llm.prompt_cache) ------------------------------------------------------------
    def save_prompt_cache(self, path: str | Path) -> int:
        """Write the state of the cached tokens (after ``prefill`` / ``generate``: the prompt, and the reply but
        its last token) to ``path``, for ``load_prompt_cache`` / ``generate(prompt_cache=...)`` in this or a later
        process (``hetero.llm.prompt_cache_file``: keyed by the model file's content, backend, KV cache type).
        Written atomically; returns the file's bytes."""
        with self._lock:
            tail = self._tail
            logits = tail[2] if tail is not None and tail[0] is self.tokens and tail[1] == len(self.tokens) else None
            return save_prompt(self, path, logits)

    def load_prompt_cache(self, path: str | Path) -> int:
        """Make the cache hold what ``path`` (``save_prompt_cache``) holds; returns the tokens restored (then in
        ``tokens``). A file that does not fit this model (another model or model file version, backend, KV cache
        type), or that is damaged, is ignored with a ``PromptCacheWarning`` and 0 is returned. The next prompt that
        starts with those tokens computes only the rest."""
        with self._lock:
            self._owner = None
            return restore_prompt(self, path, None)[0]

    @property
    def embeddings(self) -> bool:
        """Whether ``embed`` works (the model was loaded with ``embeddings=True``)."""
        return self._final_norm is not None

    def embed(self, prompt: str | Sequence[int]) -> np.ndarray:
        """An embedding of ``prompt``: its last token's hidden state after the final norm, L2-normalised (last-token
        pooling, as Qwen3-Embedding models are read). The cache then holds the prompt, as after ``prefill``."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else _token_ids(prompt)
        with self._lock:
            if self._final_norm is None:
                raise HeteroError(f"model {self.name!r} was not loaded for embeddings",
                                  hint="hetero.llm.load(..., embeddings=True); hetero serve --embeddings")
            self._owner = None
            self._prefill(ids, Stats())
            assert self._last_hidden is not None
            vector = np.asarray(self._last_hidden, dtype=np.float32).reshape(-1, self.config.hidden_size)[-1]
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else vector

    # -- generation -----------------------------------------------------------------------------------------------
    @property
    def sampling_defaults(self) -> SamplingDefaults:
        """The sampling settings used where a call sets none, and their source (``str()`` gives one line): a
        Hugging Face folder's generation_config.json (greedy when it does not sample); a GGUF file's
        ``general.sampling.*`` metadata, else llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95,
        min-p 0.05)."""
        return self._sampling

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """The model's defaults (``sampling_defaults``) with ``overrides`` on top."""
        base: dict[str, Any] = dict(self._sampling.settings)
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
                 add_special_tokens: bool = True, spec: Any = None, compress_to: int | None = None,
                 prompt_cache: str | Path | None = None, prompt_cache_ro: bool = False) -> str | Iterator[str]:
        """Continue ``prompt`` (text, or token ids). Returns the text, or with ``stream=True`` an iterator of text
        pieces (closing it cancels). Unset sampling options come from the model's generation_config.json.
        ``spec``: speculative decoding (same output distribution, greedy output identical): a
        ``hetero.llm.speculative.Speculation``, a ``Drafter``, or a name as ``hetero generate --spec`` takes it
        ("lookahead", "draft:PATH", ...; see ``hetero.llm.speculative.registry``). ``compress_to``: fit a text
        prompt into this many tokens by keeping its first two and last two sentences and those most relevant to them
        (``hetero.llm.compress``; off by default). ``prompt_cache``: a prefix-cache file, as llama.cpp's
        ``--prompt-cache``: the part of the prompt it holds is loaded instead of computed, and the computed prompt
        is saved to it (``prompt_cache_ro=True``: not saved); a file that does not fit is ignored with a warning."""
        cache_file = prompt_file(prompt_cache, prompt_cache_ro)
        if compress_to is not None:
            from .compress import compress_for

            prompt = compress_for(self, prompt, compress_to)
        params = self.sampling_params(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, penalty_last_n=penalty_last_n,
            seed=seed)
        ids = self.tokenize(prompt, add_special_tokens) if isinstance(prompt, str) else _token_ids(prompt)
        return self._run(ids, max_new_tokens, params, stop, stream, spec, cache_file)

    def chat(self, messages: Sequence[dict[str, Any]], max_new_tokens: int = 512, *, stream: bool = False,
             stop: Sequence[str] | str | None = None, template_kwargs: dict[str, Any] | None = None,
             spec: Any = None, prompt_cache: str | Path | None = None, prompt_cache_ro: bool = False,
             **sampling: Any) -> str | Iterator[str]:
        """Answer the conversation ``messages`` ([{"role", "content"}, ...]) through the model's chat template.
        The cache is reused across turns: only tokens after the common prefix are prefilled. A bare string is
        refused (not taken as one message): ``chat`` takes a conversation, ``generate`` takes text. ``spec``,
        ``prompt_cache``, ``prompt_cache_ro``: as in ``generate``."""
        cache_file = prompt_file(prompt_cache, prompt_cache_ro)
        messages = _checked_messages(messages)
        self._tok()
        if self.template is None:
            raise HeteroError(f"model {self.name!r} has no chat template", hint="load it with "
                              "chat_template='plain' for a plain 'role: content' format, or use generate()")
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise HeteroError(f"template_kwargs must be a dict, got {type(template_kwargs).__name__}")
        text = self.template.render(messages, add_generation_prompt=True, **(template_kwargs or {}))
        ids = self.tokenize(text, add_special_tokens=False)
        return self._run(ids, max_new_tokens, self.sampling_params(**sampling), stop, stream, spec, cache_file)

    def _run(self, ids: list[int], max_new_tokens: int, params: SamplingParams,
             stop: Sequence[str] | str | None, stream: bool, spec: Any = None,
             cache_file: PromptFile | None = None) -> str | Iterator[str]:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
            raise HeteroError(f"max_new_tokens={max_new_tokens!r}; expected an integer >= 0")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if not all(isinstance(s, str) for s in stops):
            raise HeteroError(f"stop={stop!r}; expected a string or a list of strings")
        if stops and self.tokenizer is None:
            raise HeteroError("stop strings need a tokenizer")
        if self.head_rows is not None:
            raise HeteroError(f"model {self.name!r} was loaded with head_rows= (logits of {len(self.head_rows)} "
                              "tokens only): it drafts for another model, it does not generate")
        self.stats = Stats()
        record = self.last = Generation()  # this call's own: another thread's call replaces self.last
        decode = (lambda t: self.detokenize(t, skip_special_tokens=True)) if self.tokenizer is not None \
            else (lambda t: "")
        singles = None  # decode's one-token texts, kept across generations while the tokenizer stays the same
        concatenates = False
        if self.tokenizer is not None:
            concatenates = bool(getattr(self.tokenizer, "concatenates", False))  # a stand-in tokenizer: no
            memo = getattr(self, "_singles", None)
            if memo is None or memo[0] is not self.tokenizer:
                memo = self._singles = (self.tokenizer, {})
            singles = memo[1]
        source = None
        if spec is not None:
            from .speculative.registry import speculation

            source = speculation(spec, self)
            if cache_file is not None:
                with self._lock:  # the drafter prefills the prompt itself: the file's part is loaded before
                    self._owner = None
                    cache_file.restore(self, ids)
                cache_file = None
        pieces = generate_stream(self, ids, max_new_tokens, Sampler(params), stops, self.eos_ids, record, decode,
                                 source, cache_file, singles, concatenates)
        if stream:
            return pieces
        for _ in pieces:
            pass
        return record.text

    def create_completion(self, prompt: str | Sequence[int], **options: Any) -> Any:
        """OpenAI's completions API on this model (``hetero.llm.openai_api.create_completion``)."""
        from .openai_api import create_completion

        return create_completion(self, prompt, **options)

    def create_chat_completion(self, messages: Sequence[dict[str, Any]], **options: Any) -> Any:
        """OpenAI's chat completions API on this model (``hetero.llm.openai_api.create_chat_completion``)."""
        from .openai_api import create_chat_completion

        return create_chat_completion(self, messages, **options)

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
        return [self.decoder.name] if self.decoder is not None else list(self.session.placement.counts())

    def close(self) -> None:
        """Free the model (every sequence of it: ``sequence(i).close()`` closes the model too)."""
        if self.decoder is not None:
            self.decoder.close()
        self.session.close()
        self._mapped.close()

    def __enter__(self) -> Llm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Llm {self.name} context={self.context} cached={len(self.tokens)}>"


GREEDY = "greedy"  # the ArgMax of the logits' rows (int64 [rows]): Llm.greedy_hint


def _expose_greedy(graph: Graph) -> str | None:
    """Give the LM head's ``QMatMul`` its second output, the argmax of each logits row (numpy's: first maximum,
    first NaN), as the graph output ``GREEDY``."""
    head = next((n for n in graph.nodes if n.outputs == [LOGITS]), None)
    if head is None or head.op_type != "QMatMul" or LOGITS not in graph.outputs \
            or any(GREEDY in n.outputs for n in graph.nodes):
        return None
    head.outputs.append(GREEDY)
    graph.outputs.append(GREEDY)
    return GREEDY


def _cpu_first(backends: Sequence[str] | str | None) -> bool:
    """Whether the session's first backend is the cpu plugin's (the one that fuses the ArgMax into the LM head):
    the first one named (the argument, else HETERO_BACKENDS), else the first working plugin by priority."""
    names = split_names(backends) if isinstance(backends, str) else list(backends or [])
    if not names and backends is None:
        names = split_names(os.environ.get("HETERO_BACKENDS", ""))
    if not names:
        ok = sorted((r for r in plugins.statuses() if r.ok), key=lambda r: (r.priority, r.name))
        names = [r.name for r in ok[:1]]
    return bool(names) and names[0].partition(":")[0] == "cpu"


def _expose_final_norm(graph: Graph) -> str | None:
    """Make the final norm's output (the hidden state the LM head reads) a graph output, for ``embed``."""
    node = next((n for n in graph.nodes if n.name == "final_norm"), None)
    if node is None or not node.outputs:
        return None
    if node.outputs[0] not in graph.outputs:
        graph.outputs.append(node.outputs[0])
    return node.outputs[0]


def _token_ids(ids: Sequence[int]) -> list[int]:
    """``ids`` as Python ints; a string or floats are refused (``operator.index``: ints and numpy integers only)."""
    if isinstance(ids, str | bytes):
        raise HeteroError(f"token ids must be a list of integers, got {type(ids).__name__}")
    try:
        return [operator.index(i) for i in ids]
    except TypeError:
        raise HeteroError(f"token ids must be a list of integers, got {str(ids)[:80]}") from None


def _checked_messages(messages: Any) -> list[dict[str, Any]]:
    if isinstance(messages, str) or not isinstance(messages, Sequence):
        raise HeteroError(f"chat() takes a list of messages, got {type(messages).__name__}",
                          hint='llm.chat([{"role": "user", "content": "hello"}]), or llm.generate("hello")')
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or \
                not isinstance(m.get("content", ""), str | list | type(None)):
            raise HeteroError(f"chat(): message #{i} must be a dict with a 'role' string and a 'content' string, "
                              f"got {str(m)[:120]!r}")
    return list(messages)


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


_LAYER_OUTPUT = re.compile(r"layers\.(\d+)\.mlp_residual$")


def _layer_outputs(graph: Graph) -> dict[int, str]:
    """Decoder layer index -> the name of its output value (the residual stream after the layer)."""
    found = {}
    for node in graph.nodes:
        match = _LAYER_OUTPUT.search(node.name)
        if match and node.outputs:
            found[int(match.group(1))] = node.outputs[0]
    return found
