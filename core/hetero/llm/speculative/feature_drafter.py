"""What Eagle-3 and DFlash share as ``Drafter``s (``drafter.py``): both read the target's hidden states at a few
layers for every token in the target's cache, and keep their own per-position state built from them.

The loop hands over hidden states in ``begin`` (the prompt's) and ``accept`` (the verified tokens'); a subclass
receives them as one ``[T, len(hidden_layers) * H]`` array (the layers concatenated in ``hidden_layers`` order, as
the drafters' ``fc`` projections expect) through ``observe(start, rows)``, ``start`` being the position of the first
row. ``known`` counts the positions handed over so far.

The loop calls ``accept`` only around drafting steps: while the policy has drafting off (a drafter that does not
pay: ``policy.py``) the rows of the steps in between come in one call at the next draft (``loop.py``), read from
the target's store of exposed hidden states. One ``observe`` of many rows costs little more than one of a single
row (a DFlash drafter observing each token as it came cost its 0.5B target's plain steps ~5%, 2026-12-04).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...contract.errors import HeteroError


class FeatureDrafter:
    hidden_layers: tuple[int, ...] = ()
    max_draft: int = 8
    known: int = 0

    def observe(self, start: int, rows: np.ndarray) -> None:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop every per-position state (``reset`` also zeroes ``known``)."""
        raise NotImplementedError

    def stack(self, hidden: Mapping[int, np.ndarray]) -> np.ndarray:
        missing = [layer for layer in self.hidden_layers if layer not in hidden]
        if missing:
            raise HeteroError(f"{type(self).__name__} needs the target's hidden states of layers "
                              f"{list(self.hidden_layers)}; layers {missing} were not given")
        return np.concatenate([np.asarray(hidden[layer], np.float32) for layer in self.hidden_layers], axis=-1)

    def begin(self, prompt: Sequence[int], hidden: Mapping[int, np.ndarray]) -> None:
        self.reset()
        rows = self.stack(hidden)
        if len(rows) != len(prompt):
            raise HeteroError(f"{type(self).__name__}.begin: {len(rows)} hidden rows for a prompt of "
                              f"{len(prompt)} tokens")
        self.observe(0, rows)
        self.known = len(rows)

    def accept(self, n_accepted: int, tokens: Sequence[int], hidden: Mapping[int, np.ndarray]) -> None:
        rows = self.stack(hidden)
        if len(rows):
            self.observe(self.known, rows)
            self.known += len(rows)

    def reset(self) -> None:
        self.known = 0
        self.forget()
