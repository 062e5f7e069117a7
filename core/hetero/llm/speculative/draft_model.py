"""Draft model: a smaller model with the target's tokenizer drafts greedily with its own KV cache.

The draft model prefills the prompt in ``begin`` (the loop counts it as prefill time, as the target's); then its
cache follows the history: each ``draft`` call prefills the history against what the cache holds
(``Llm.prefill`` keeps the common prefix and rolls back the rest, recurrent state included), which after a verify
step is one or two tokens (the target's own token, and the last draft when all were accepted) in one step whose
logits give the first draft token, then runs k - 1 one-token steps. Its drafts are greedy (q one-hot), which keeps
sampled output exact (``accept.py``).

**Draft vocabulary** (``vocab``): the draft model can be loaded with its LM head cut to the ``vocab`` lowest token
ids plus the tokenizer's added (special) tokens (``load(head_rows=...)``), as Eagle-3 drafts over a draft
vocabulary: its argmax is then over those tokens only. A small model's LM head is a large share of the bytes a
decode step reads (Qwen2.5-0.5B: 136 M of its 494 M parameters), so each draft token costs less; a token outside
the subset is never drafted (the target rejects the draft there and commits its own token), which is all it can
cost: the output stays the target's. BPE ids follow the merge order, so the lowest ids are the most frequent
pieces of the tokenizer's training text (docs/speculative.md: the coverage and acceptance measured). ``rank=freq``
(FR-Spec, arXiv 2502.14856) keeps the ``vocab`` tokens most frequent on a local corpus instead (the Python standard
library's sources, tokenized once by the target's tokenizer and the counts cached: ``token_counts``); ``rank=PATH``
reads such counts from a ``.npy`` file (one count per token id: ``read_token_counts``).

**Re-quantized** (``quant``, default q4_sym_b128: ``load(requantize=...)``): matrices stored wider than that (q5_0,
q6_k, q8, q4_k) are rounded to 4 bits at load, ~20% fewer bytes per draft token for the small model; one f16 scale
per 128 weights (4.125 bits a weight against q4's 4.5) made a draft step of the 0.5B ~5-9% cheaper for the same
drafts. **Its own lookup** (``lookup``):
n-gram continuations of what it drafted so far are checked by it in one multi-token step (``draft``), the same
drafts in fewer steps where the text repeats. (The n-gram index follows the drafts; after a rejected draft the
history is another one and it is rebuilt: a dictionary insert per token and n-gram size.)
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...contract.errors import HeteroError
from ...contract.vendor_worker import cache_root
from ..families.decoder import VERIFY_ROWS
from ..tokenizer import Tokenizer
from .drafter import Draft, Hidden
from .lookahead import Lookahead
from .target import Target

DRAFT_VOCAB = 32768  # default draft vocabulary: the lowest ids (plus added tokens); 0 or None: the whole vocabulary
# the draft model's matrices stored in wider formats are re-quantized to this at load (None: kept); 128-blocks: the
# draft only proposes (the target checks every token), so its coarser rounding can cost acceptance, never output
DRAFT_QUANT = "q4_sym_b128"
MAX_DRAFT = 10  # the longest draft (the loop's policy drafts fewer at lower acceptance)
LOOKUP, LOOKUP_MAX = 3, 4  # n-gram lengths whose continuations are guessed for the draft model to check (0: off)
P_MIN = 0.0  # a draft ends after a token the draft model gives less than this probability (0: never)
DRAFT_RANK = "bpe"  # which ids a draft vocabulary keeps: the lowest ("bpe"), the most frequent on a corpus ("freq")
CORPUS_BYTES = 4_000_000  # rank=freq: the standard library's sources counted, in sorted path order (~10 s, once)
COUNTS_VERSION = 1  # part of the cached counts' key: bump when the corpus or the counting changes


class DraftModel:
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model: Target, target: Target, *, max_draft: int = MAX_DRAFT, p_min: float = P_MIN,
                 lookup: int = LOOKUP) -> None:
        check_same_vocabulary(model, target)
        self.model = model
        self.max_draft = max_draft
        self.p_min = p_min
        rows = getattr(model, "head_rows", None)
        self.rows: np.ndarray | None = None if rows is None else np.asarray(rows, dtype=np.int64)
        # lookup > 0: n-gram guesses (of at least ``lookup`` tokens) of its next tokens, checked in one step (draft)
        if not 0 <= lookup <= LOOKUP_MAX:
            raise HeteroError(f"draft model: lookup={lookup}; expected 0 (off) to {LOOKUP_MAX} tokens of n-gram")
        self.lookup = Lookahead(min_ngram=lookup, max_ngram=LOOKUP_MAX, graded=False) if lookup else None

    def reset(self) -> None:
        pass  # the draft cache is matched against each history by prefill()

    def begin(self, prompt: Sequence[int], hidden: Hidden) -> None:
        self.model.prefill(list(prompt))  # the prompt's cache now, with the target's (counted as prefill time)

    def accept(self, n_accepted: int, tokens: Sequence[int], hidden: Hidden) -> None:
        pass  # the next draft() prefill rolls the cache back to what was kept

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        """The draft model's greedy continuation of ``history``, ``k`` tokens (fewer when ``p_min`` ends it). With
        ``lookup``, where the tokens drafted so far end with an n-gram of at least ``lookup`` tokens seen earlier
        (prompt lookup, as the lookahead drafter), the tokens that followed it are guessed and the draft model
        scores them in one step (``Llm.verify``): it keeps the guesses its own argmax agrees with, and the row after
        the last kept one gives its next token. The draft is the one of a token per step (the rows of a multi-token
        step are those of single steps), for fewer steps where the text repeats itself."""
        model = self.model
        k = min(k, model.context - len(history))
        if k <= 0:
            return []
        row = model.prefill(list(history))[-1]  # the tokens the cache lacks (one or two), in one step
        out: list[int] = []
        while True:
            out.append(self._token(row))
            if len(out) == k or self._unsure(row):
                return out  # (an unsure token is still drafted: it is the step's best guess, and rows are cheap)
            guess = self._guess([*history, *out], k - len(out))
            if not guess:
                row = model.forward(out[-1:])[-1]
                continue
            rows = model.verify([out[-1], *guess])  # row i: what the draft model drafts after guess[:i]
            kept = 0
            while kept < len(guess) and self._token(rows[kept]) == guess[kept]:
                out.append(guess[kept])
                kept += 1
                if len(out) == k or self._unsure(rows[kept - 1]):
                    break
            model.rollback(len(model.tokens) - (len(guess) - kept))  # the guesses it would not have drafted
            if len(out) == k or (kept and self._unsure(rows[kept - 1])):
                return out
            row = rows[kept]

    def _token(self, row: np.ndarray) -> int:
        """The token of the row's argmax (a draft vocabulary's column mapped back to its id)."""
        best = int(np.argmax(row))
        return best if self.rows is None else int(self.rows[best])

    def _unsure(self, row: np.ndarray) -> bool:
        """``p_min``: the draft ends after a token the draft model gave less than that probability."""
        return self.p_min > 0 and _top_probability(row, int(np.argmax(row))) < self.p_min

    def _guess(self, history: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens (at most a verify step's) that followed the latest earlier occurrence of the last
        ``lookup`` or more tokens of ``history``; none without ``lookup`` or when nothing repeats."""
        if self.lookup is None:
            return []
        guess = self.lookup.draft(history, min(k, VERIFY_ROWS - 1))
        return guess.tokens if isinstance(guess, Draft) else list(guess)


def _top_probability(row: np.ndarray, best: int) -> float:
    """softmax(row)[best] (``best``: the row's argmax)."""
    return float(1.0 / np.exp(row - row[best]).sum())


def draft_vocabulary(tokenizer: object, vocab_size: int, size: int | None,
                     counts: np.ndarray | None = None) -> np.ndarray | None:
    """The token ids a draft model's head keeps, ascending: the ``size`` lowest ids (BPE merge order) or, given
    ``counts`` (one per id), the ``size`` most frequent (ties: the lower id first, so unseen tokens fall back to
    BPE order), and the tokenizer's added tokens (EOS, the chat markers) besides; None (the whole head) when ``size``
    is 0 / None or covers the vocabulary."""
    if not size or size >= vocab_size:
        return None
    backend = getattr(tokenizer, "backend", None)
    added = backend.get_added_tokens_decoder() if backend is not None else {}
    if counts is None:
        kept = np.arange(size, dtype=np.int64)
    else:
        kept = np.lexsort((np.arange(vocab_size), -np.asarray(counts, dtype=np.float64)))[:size].astype(np.int64)
    extra = [i for i in added if 0 <= i < vocab_size]
    return np.union1d(kept, np.asarray(extra, dtype=np.int64))


def read_token_counts(path: str | Path, vocab_size: int) -> np.ndarray:
    """Per-token counts from a ``.npy`` file (``rank=PATH``): ``vocab_size`` finite non-negative numbers, count i
    for token id i; anything else is a ``HeteroError`` naming the file."""
    try:
        counts = np.load(Path(path), allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise HeteroError(f"draft vocabulary: cannot read token counts from {path}: {exc}",
                          hint="rank=PATH takes a .npy file of one count per token id (numpy.save)") from None
    if counts.ndim != 1 or counts.shape[0] != vocab_size or counts.dtype.kind not in "iuf":
        raise HeteroError(f"draft vocabulary: {path} holds a {counts.dtype} array of shape {counts.shape}; expected "
                          f"{vocab_size} counts (one per token id of the target's vocabulary)")
    if (counts.dtype.kind == "f" and not np.isfinite(counts).all()) or (counts < 0).any():
        raise HeteroError(f"draft vocabulary: {path} holds negative or non-finite counts")
    return counts.astype(np.float64)


def token_counts(tokenizer: Tokenizer, vocab_size: int, files: Sequence[Path] | None = None) -> np.ndarray:
    """How often each token id occurs in ``files`` (default: the Python standard library's ``.py`` sources in
    sorted order, the first ``CORPUS_BYTES`` of text: a local corpus of code and English that every install has)
    tokenized by ``tokenizer``. Default corpus: cached in ``$HETERO_CACHE_DIR/requantized`` (beside the re-quantized
    draft models) keyed by the vocabulary and the corpus, so it is counted once per tokenizer (~10 s)."""
    cache = None
    if files is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        vocab = tokenizer.vocabulary()
        key = hashlib.sha256(json.dumps([COUNTS_VERSION, CORPUS_BYTES, str(stdlib), sys.version, vocab_size,
                                         sorted(vocab.items())]).encode()).hexdigest()[:16]
        cache = cache_root() / "requantized" / f"token-counts-{key}.npy"
        if cache.is_file():
            try:
                return read_token_counts(cache, vocab_size)
            except HeteroError:
                pass  # damaged: counted again below
        files = sorted(stdlib.rglob("*.py"))
    counts = np.zeros(vocab_size, dtype=np.int64)
    seen = 0
    for file in files:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = np.asarray(tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
        counts += np.bincount(ids[(ids >= 0) & (ids < vocab_size)], minlength=vocab_size)
        seen += len(text)
        if seen >= CORPUS_BYTES:
            break
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.save(cache, counts)
        except OSError:
            pass  # counted again next time
    return counts.astype(np.float64)


def check_same_vocabulary(draft: Target, target: Target) -> None:
    """Refuse a draft model whose tokenizer maps any token to another id than the target's."""
    where = f"draft model {_where(draft)} and target {_where(target)}"
    a, b = draft.tokenizer, target.tokenizer
    if a is None or b is None:
        if a is not b or draft.config.vocab_size != target.config.vocab_size:
            raise HeteroError(f"{where}: cannot tell their vocabularies are the same (a tokenizer is missing and the "
                              f"vocabulary sizes are {draft.config.vocab_size} and {target.config.vocab_size})")
        return
    va, vb = a.vocabulary(), b.vocabulary()
    if va != vb:
        differ = sorted(set(va.items()) ^ set(vb.items()), key=lambda item: item[1])[:3]
        raise HeteroError(f"{where} have different vocabularies ({len(va)} and {len(vb)} tokens; e.g. "
                          f"{', '.join(f'{t!r} -> {i}' for t, i in differ)})",
                          hint="a draft model must use the target's tokenizer (same family and version)")


def _where(llm: Target) -> str:
    return str(llm.path) if llm.path is not None else repr(llm.name)
