"""Lookahead / prompt lookup: drafts copied from the prompt and the history, no model.

The last n tokens (n from ``max_ngram`` down to ``min_ngram``) are looked up among the earlier n-grams of the
history (prompt included); the tokens that followed the most recent match are the draft. Code completion, edits
and answers that quote their input repeat long spans, which this finds at the cost of a dictionary lookup. The
index is kept incrementally: each call adds only the n-grams that ended since the previous one.
"""

from __future__ import annotations

from collections.abc import Sequence

from .drafter import Hidden


class Lookahead:
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, *, max_ngram: int = 4, min_ngram: int = 2, max_draft: int = 8) -> None:
        if not 1 <= min_ngram <= max_ngram:
            from ...contract.errors import HeteroError

            raise HeteroError(f"lookahead: n-gram sizes {min_ngram}..{max_ngram}; expected 1 <= min <= max")
        self.max_ngram, self.min_ngram, self.max_draft = max_ngram, min_ngram, max_draft
        self.reset()

    def reset(self) -> None:
        self._where: dict[tuple[int, ...], int] = {}  # n-gram -> the position after its latest occurrence
        self._indexed = 0  # n-grams ending before this position are in the index
        self._tail: list[int] = []  # the last tokens indexed: a history that does not extend them is another one

    def begin(self, prompt: Sequence[int], hidden: Hidden) -> None:
        self.reset()

    def accept(self, n_accepted: int, tokens: Sequence[int], hidden: Hidden) -> None:
        pass  # the history passed to draft() carries all it needs

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        end = len(history)
        if end < self._indexed or list(history[max(self._indexed - self.max_ngram, 0):self._indexed]) != self._tail:
            self.reset()  # not the history this index was built from
        self._index(history)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            start = self._where.get(tuple(history[end - n:end]))
            if start is not None:
                return list(history[start:start + k])
        return []

    def _index(self, history: Sequence[int]) -> None:
        end = len(history)
        for stop in range(max(self._indexed, 1), end):  # n-grams ending at stop (exclusive), before the query's end
            for n in range(self.min_ngram, min(self.max_ngram, stop) + 1):
                self._where[tuple(history[stop - n:stop])] = stop
        self._indexed = end
        self._tail = list(history[max(end - self.max_ngram, 0):end])
