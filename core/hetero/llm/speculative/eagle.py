"""Eagle-3: a one-layer draft head fed with the target's hidden states at three depths, drafting a token tree.

Input of the head at sequence position ``j``: the feature ``fc(concat(h_low[j], h_mid[j], h_high[j]))`` of token
``j`` (``h_*``: the target's hidden states at three layers) and the embedding of token ``j + 1``; the layer's
attention reads ``concat(input_norm(embedding), hidden_norm(feature))`` and its residual stream is the feature. Its
output predicts token ``j + 2`` through the head's own LM head over a reduced draft vocabulary (``d2t`` maps a draft
id ``i`` to the target id ``i + d2t[i]``). Deeper drafts feed the head its own output instead of a target feature.

Drafting grows a tree: ``top_k`` children of each frontier node, the ``top_k`` best (by cumulative log-probability)
kept per depth; each node attends to the verified context and to its own ancestors (a tree attention mask). hetero's
target Attention takes a causal block, not an arbitrary mask, so the target verifies one chain of the tree: the path
with the largest expected accepted length under the head's own probabilities (``Tree.best_chain``). ``Tree.mask``
gives the ancestor mask a tree-verifying target would use.

The folder layout (EAGLE-3 authors', ``yuhuili/EAGLE3-*`` on the Hugging Face Hub) is documented in
docs/speculative.md, "Drafter files".
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...contract.errors import HeteroError, ModelFormatError
from .drafter_files import DrafterFolder, LayerShape, layer_ids
from .drafter_nn import LayerWeights, Linear, attention, fused, rms_norm, silu
from .feature_drafter import FeatureDrafter
from .native_linears import compile_for_target
from .registry import register
from .target import Target
from .target_head import TargetHead


@dataclass
class Eagle3Weights:
    shape: LayerShape
    fc: Linear  # [3 * target_hidden] -> [hidden]
    hidden_norm: np.ndarray
    layer: LayerWeights
    norm: np.ndarray
    lm_head: Linear  # [hidden] -> [draft_vocab]
    d2t: np.ndarray | None  # [draft_vocab] offsets to target ids; None when the vocabularies are the same
    vocab_size: int  # the target's
    target_hidden: int
    aux_layers: tuple[int, ...] | None  # outputs of these target layers (0-based); None: the authors' default

    def draft_to_target(self, ids: np.ndarray) -> np.ndarray:
        return ids if self.d2t is None else ids + self.d2t[ids]


def load_eagle3(path: str | Path) -> Eagle3Weights:
    folder = DrafterFolder(path, "Eagle-3")
    f = folder.fields
    s = folder.layer_shape()
    if f.int("num_hidden_layers", 1) != 1:
        raise f.fail("num_hidden_layers", "1 (an Eagle-3 head is one layer)")
    vocab = f.int("vocab_size", bound="vocab")
    draft_vocab = f.int("draft_vocab_size", vocab, bound="vocab")
    target_hidden = f.int("target_hidden_size", s.hidden, bound="hidden")
    d2t = None
    if draft_vocab != vocab or folder.has("d2t"):
        d2t = folder.integers("d2t", (draft_vocab,))
        targets = np.arange(draft_vocab) + d2t
        if targets.min() < 0 or targets.max() >= vocab:
            raise ModelFormatError(f"{folder.path}: tensor 'd2t' maps draft ids outside the target vocabulary "
                                   f"[0, {vocab})")
    aux = None
    eagle = folder.section("eagle_config")
    if eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        # vLLM / SpecForge convention: the input of layer i, i.e. the output of layer i - 1.
        ids = layer_ids(eagle, "eagle_aux_hidden_state_layer_ids", 1 << 12, count=3)
        if min(ids) < 1:
            raise eagle.fail("eagle_aux_hidden_state_layer_ids", "layer indices >= 1 (the input of that layer)")
        aux = tuple(i - 1 for i in ids)
    return Eagle3Weights(
        shape=s,
        fc=folder.linear("fc.weight", s.hidden, 3 * target_hidden),
        hidden_norm=folder.tensor("midlayer.hidden_norm.weight", (s.hidden,)),
        layer=folder.layer("midlayer.", s, attn_in=2 * s.hidden, qk_norm=False),
        norm=folder.tensor("norm.weight", (s.hidden,)),
        lm_head=folder.linear("lm_head.weight", draft_vocab, s.hidden),
        d2t=d2t, vocab_size=vocab, target_hidden=target_hidden, aux_layers=aux,
    )


CATCH_UP = 32  # rows: the most a draft runs the head over to catch up with the target (a trial after a pause)


class RowStore:
    """Rows ``[n, width]`` indexed by sequence position, written from a position on (what followed is dropped), in
    a buffer that doubles: a long generation copies each row a few times, not once per step."""

    def __init__(self, width: int) -> None:
        self.data = np.zeros((0, width), np.float32)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def put(self, start: int, rows: np.ndarray) -> None:
        end = start + len(rows)
        self._reserve(start, end)
        self.data[start:end] = rows
        self.size = end

    def skip(self, start: int, count: int) -> None:
        """Positions ``start .. start + count - 1`` counted but not stored (rows nothing reads; what followed is
        dropped)."""
        self._reserve(start, start + count)
        self.size = start + count

    def _reserve(self, start: int, end: int) -> None:
        """Room for rows up to ``end``, keeping those before ``start``."""
        if end > len(self.data):
            grown = np.zeros((max(end, 2 * len(self.data), 64), self.data.shape[1]), np.float32)
            grown[:start] = self.data[:start]
            self.data = grown

    def rows(self, start: int, end: int) -> np.ndarray:
        return self.data[start:min(end, self.size)]


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """The EAGLE-3 authors' choice: the inputs of layers 2, L/2 and L-3 (outputs of layers 1, L/2-1, L-4),
    clamped for shallow targets."""
    picks = (2, num_layers // 2, num_layers - 3)
    return tuple(min(max(i, 1), num_layers) - 1 for i in picks)


class Eagle3Head:
    """The head's arithmetic with its own KV cache (``keys``/``values``: the verified context's rows)."""

    def __init__(self, w: Eagle3Weights) -> None:
        self.w = w
        s = w.shape
        lw = w.layer
        self.qkv = fused([lw.q, lw.k, lw.v])  # the layer's projections of one input, each pair in one call
        self.gate_up = fused([lw.gate, lw.up])
        self.splits = (s.heads * s.head_dim, (s.heads + s.kv_heads) * s.head_dim)
        self.keys = np.zeros((0, s.kv_heads, s.head_dim), np.float32)
        self.values = np.zeros((0, s.kv_heads, s.head_dim), np.float32)

    def project(self, target_hidden: np.ndarray) -> np.ndarray:
        """Target hidden states ``[T, 3 * target_hidden]`` (low, mid, high concatenated) -> features ``[T, H]``."""
        return (np.asarray(target_hidden, np.float32) @ self.w.fc).astype(np.float32, copy=False)

    def step(self, features: np.ndarray, embeddings: np.ndarray, positions: np.ndarray, visible: np.ndarray,
             extra_k: np.ndarray | None = None,
             extra_v: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One pass of the layer over rows ``[T, H]``. Keys: the cache, then ``extra_*`` (tree nodes), then the
        rows themselves; ``visible`` ``[T, all keys]``. Returns (output hidden, the rows' keys, their values)."""
        w, s = self.w, self.w.shape
        lw = w.layer
        x = np.concatenate([rms_norm(embeddings, lw.input_norm, s.eps), rms_norm(features, w.hidden_norm, s.eps)],
                           axis=-1)
        t = len(x)
        q, k, v = (part.reshape(t, -1, s.head_dim) for part in np.split(x @ self.qkv, self.splits, axis=-1))
        q, k = s.rope.apply(q, positions), s.rope.apply(k, positions)
        keys = [self.keys, *([extra_k] if extra_k is not None else []), k]
        vals = [self.values, *([extra_v] if extra_v is not None else []), v]
        h = features + attention(q, np.concatenate(keys), np.concatenate(vals), visible) @ lw.o
        gate, up = np.split(rms_norm(h, lw.post_norm, s.eps) @ self.gate_up, 2, axis=-1)
        h = h + (silu(gate) * up) @ lw.down
        return h.astype(np.float32, copy=False), k, v

    def log_probs(self, hidden: np.ndarray) -> np.ndarray:
        """Log-probabilities over the draft vocabulary ``[T, draft_vocab]``."""
        logits = rms_norm(hidden, self.w.norm, self.w.shape.eps) @ self.w.lm_head
        logits = logits - logits.max(axis=-1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


@dataclass
class Tree:
    """A drafted token tree: node ``i`` holds target token ``tokens[i]``, child of ``parents[i]`` (-1: a child of
    the last verified token), at ``depth[i]`` (1-based), with cumulative log-probability ``scores[i]``."""

    tokens: list[int]
    parents: list[int]
    depth: list[int]
    scores: list[float]

    def path(self, node: int) -> list[int]:
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def mask(self) -> np.ndarray:
        """``[N, N]``: node i may attend to node j (j is i or an ancestor of i)."""
        n = len(self.tokens)
        out = np.zeros((n, n), dtype=bool)
        for i in range(n):
            out[i, self.path(i)] = True
        return out

    def best_chain(self) -> list[int]:
        """Tokens of the root-to-node path with the largest expected accepted length (the sum of the path's
        cumulative probabilities: the chance each prefix is accepted, under the head's own distribution)."""
        if not self.tokens:
            return []
        probs = np.exp(np.asarray(self.scores))
        gain = [float(probs[self.path(i)].sum()) for i in range(len(self.tokens))]
        return [self.tokens[i] for i in self.path(int(np.argmax(gain)))]


class Eagle3Drafter(FeatureDrafter):
    """Eagle-3 drafting for one target (a ``Drafter``). ``hidden_layers``: the target layers it reads.

    The head's cache holds one row per sequence position ``j`` whose pair (target feature of token ``j``, token
    ``j + 1``) is known and was run (``positions``); ``draft`` extends it to the history given, then grows the tree
    from the last row. It catches up over at most ``catch_up`` rows: after a pause in drafting (the policy switched
    it off) the rows before those are left out of the head's context (their keys are absent; every cached key keeps
    its own rotary position), so a trial costs the same after any pause. Run over every row since the last draft, a
    trial cost the head's per-row work times the pause (on the 0.5B target, a pause of 256 tokens: 6.6-9.5 plain
    steps, 32 rows 0.3-0.55; benchmarks/eagle_catch_up.py, 2026-12-06): pricing the pause by the trial's seconds
    could not bound its share, and Eagle-3 ran at 0.93x of plain decoding at 2 threads. The target's hidden states
    are kept raw (``RowStore``) and projected by ``fc`` only for the rows the head runs."""

    def __init__(self, weights: Eagle3Weights, embed: Callable[[Sequence[int]], np.ndarray], *, num_layers: int,
                 top_k: int = 1, max_draft: int = 6, catch_up: int = CATCH_UP) -> None:
        """``embed(ids) -> [T, hidden]``: the target's embedding table; ``num_layers``: the target's depth;
        ``top_k``: children kept per tree level; ``max_draft``: the tree's depth. The default ``top_k=1`` drafts
        the greedy chain: while the target verifies one chain, a wider tree picked the same chain in every
        measurement here (tests/fixtures/drafters, top_k 1-8) at up to twice the drafting time. ``catch_up``: the
        most rows a draft runs the head over (``begin`` runs the whole prompt)."""
        if top_k < 1 or max_draft < 1 or catch_up < 1:
            raise HeteroError(f"Eagle-3 top_k={top_k}, max_draft={max_draft}, catch_up={catch_up}; expected at "
                              "least 1 each")
        self.catch_up = catch_up
        self.max_draft = max_draft
        self.w = weights
        self.head = Eagle3Head(weights)
        self.embed = embed
        self.top_k = top_k
        layers = weights.aux_layers or default_aux_layers(num_layers)
        if max(layers) >= num_layers:
            raise HeteroError(f"the Eagle-3 head reads target layers {list(layers)}; the target has {num_layers}")
        self.hidden_layers = tuple(layers)
        self.raw = RowStore(len(layers) * weights.target_hidden)  # the target's hidden states per position
        self.positions: list[int] = []  # the position j of each cached head row (ascending)
        self.pairs: list[int] = []  # token j + 1 of each cached row
        self.tree = Tree([], [], [], [])

    @classmethod
    def for_target(cls, path: str | Path, llm: Target, *, linears: str | None = "q8",
                   **options: int) -> Eagle3Drafter:
        """The drafter in folder ``path`` reading ``llm``'s hidden states and embedding table; its linears run on
        the target's backends with weights in ``linears`` (``native_linears``; None: float32 numpy)."""
        weights = load_eagle3(path)
        cfg = llm.config
        if weights.vocab_size != cfg.vocab_size or weights.target_hidden != cfg.hidden_size:
            raise HeteroError(f"Eagle-3 drafter {str(path)!r} was made for a target with vocab_size "
                              f"{weights.vocab_size} and hidden size {weights.target_hidden}; model {llm.name!r} "
                              f"has {cfg.vocab_size} and {cfg.hidden_size}")
        drafter = cls(weights, TargetHead(llm).embed, num_layers=cfg.num_layers, **options)
        head, lw = drafter.head, weights.layer
        compile_for_target([weights.fc, head.qkv, lw.o, head.gate_up, lw.down, weights.lm_head], llm, linears)
        for part in (lw.q, lw.k, lw.v, lw.gate, lw.up):  # fused above: the head never runs them
            part.weight = None
        return drafter

    def forget(self) -> None:
        self.raw.size = 0
        self._truncate(0)

    def begin(self, prompt: Sequence[int], hidden: Mapping[int, np.ndarray]) -> None:
        """Also runs the head over the prompt's known pairs now, with the target's prefill (counted as prefill
        time, as the draft model's prompt is): left to the first draft, that pass cost a generation's first
        drafting step 5-25x a plain step, whatever the drafter's acceptance (2026-12-05)."""
        super().begin(prompt, hidden)
        if len(prompt) >= 2:
            self._extend(prompt, whole=True)

    def observe(self, start: int, hidden: np.ndarray) -> None:
        """The target's hidden states (``[T, 3 * target_hidden]``, ``hidden_layers`` order) of the tokens at
        positions ``start .. start + T - 1``; anything the drafter held from ``start`` on is replaced."""
        if not 0 <= start <= len(self.raw):
            raise HeteroError(f"Eagle-3: hidden states from position {start}, but only {len(self.raw)} "
                              "positions are known")
        self.raw.put(start, hidden)
        self._truncate(bisect_left(self.positions, start))

    def accept(self, n_accepted: int, tokens: Sequence[int], hidden: Mapping[int, np.ndarray]) -> None:
        """As every feature drafter, but of a batch longer than ``catch_up`` rows (the steps of a pause in drafting:
        up to 1024 positions of 3 layers) only the last ``catch_up`` are stacked and kept: a draft reads at most the
        last ``catch_up`` rows known at the time, and the rows known only grow."""
        count = min((len(rows) for rows in hidden.values()), default=0)
        unread = count - self.catch_up
        if unread > 0:
            self.raw.skip(self.known, unread)
            self._truncate(bisect_left(self.positions, self.known))
            self.known += unread
            hidden = {layer: rows[unread:] for layer, rows in hidden.items()}
        super().accept(n_accepted, tokens, hidden)

    def _truncate(self, rows: int) -> None:
        """Keep the first ``rows`` cached head rows."""
        del self.pairs[rows:], self.positions[rows:]
        self.head.keys, self.head.values = self.head.keys[:rows], self.head.values[:rows]

    def _extend(self, history: Sequence[int], whole: bool = False) -> np.ndarray:
        """Cache rows for the known pairs of ``history``: those after the last cached row, at most ``catch_up``
        of them (all with ``whole``); returns the output hidden of the last row."""
        want = min(len(history) - 1, len(self.raw))
        if want < 1:
            raise HeteroError("Eagle-3 needs the target's hidden states of at least one token before drafting")
        same = 0  # cached rows still right: before ``want`` and paired with the token that followed
        while (same < len(self.pairs) and self.positions[same] < want
               and self.pairs[same] == history[self.positions[same] + 1]):
            same += 1
        self._truncate(same)
        start = min(self.positions[-1] + 1 if same else 0, want - 1)  # the last row is run again: we draft from it
        if not whole:
            start = max(start, want - self.catch_up)
        self._truncate(bisect_left(self.positions, start))
        tokens = list(history[start + 1:want + 1])
        n, cached = len(tokens), len(self.positions)
        visible = np.concatenate([np.ones((n, cached), dtype=bool), np.tril(np.ones((n, n), dtype=bool))], axis=1)
        features = self.head.project(self.raw.rows(start, want))
        out, k, v = self.head.step(features, self.embed(tokens), np.arange(start, want), visible)
        self.head.keys = np.concatenate([self.head.keys, k])
        self.head.values = np.concatenate([self.head.values, v])
        self.positions.extend(range(start, want))
        self.pairs.extend(tokens)
        return out[-1:]

    def draft(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``history`` (whose last token the target has not run yet)."""
        if k < 1:
            return []
        root = self._extend(history)
        self.tree = self.grow(root, self.positions[-1] + 1, k)
        return self.tree.best_chain()

    def grow(self, root_hidden: np.ndarray, position: int, depth: int) -> Tree:
        """The tree of ``depth`` levels below the last cached row (whose output is ``root_hidden``)."""
        tree = Tree([], [], [], [])
        cached = len(self.head.keys)
        s = self.w.shape
        tree_k = np.zeros((0, s.kv_heads, s.head_dim), np.float32)
        tree_v = np.zeros_like(tree_k)
        logp = self.head.log_probs(root_hidden)[0]
        frontier_hidden = root_hidden
        frontier: list[int] = []
        choices = top_indices(logp, self.top_k)
        for c in choices:
            frontier.append(self._add(tree, int(c), -1, 1, float(logp[c])))
        for level in range(2, depth + 1):
            tokens = [tree.tokens[i] for i in frontier]
            n_old = len(tree_k)
            rows = len(frontier)
            visible = np.ones((rows, cached + n_old + rows), dtype=bool)
            ancestors = tree.mask()  # nodes already run are 0 .. n_old - 1; the frontier is at the end
            visible[:, cached:cached + n_old] = ancestors[np.asarray(frontier)][:, :n_old]
            visible[:, cached + n_old:] = np.eye(rows, dtype=bool)
            hidden_in = np.repeat(frontier_hidden, rows, axis=0) if len(frontier_hidden) == 1 else frontier_hidden
            out, k, v = self.head.step(hidden_in, self.embed(tokens), np.full(rows, position + level - 2), visible,
                                       tree_k, tree_v)
            tree_k, tree_v = np.concatenate([tree_k, k]), np.concatenate([tree_v, v])
            child_logp = self.head.log_probs(out)
            scores = np.asarray([tree.scores[i] for i in frontier])[:, None] + child_logp
            best = top_indices(scores, self.top_k)
            parent_rows, ids = np.unravel_index(best, scores.shape)
            frontier = [self._add(tree, int(c), frontier[p], level, float(scores[p, c]))
                        for p, c in zip(parent_rows, ids, strict=True)]
            frontier_hidden = out[parent_rows]
        return tree

    def _add(self, tree: Tree, draft_id: int, parent: int, depth: int, score: float) -> int:
        tree.tokens.append(int(self.w.draft_to_target(np.asarray(draft_id))))
        tree.parents.append(parent)
        tree.depth.append(depth)
        tree.scores.append(score)
        return len(tree.tokens) - 1


def top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """The flat indices of the ``k`` largest of ``values``, largest first (ties: the lower index first). A partial
    selection: a full sort of the 8192-wide draft vocabulary was ~1/8 of a drafting level's time (cProfile)."""
    flat = values.ravel()
    if k >= flat.size:
        return np.argsort(-flat, kind="stable")
    picked = np.argpartition(-flat, k - 1)[:k]
    return picked[np.lexsort((picked, -flat[picked]))]


def _eagle(argument: str, target: Target) -> Eagle3Drafter:
    """``PATH[,catch_up=N]``."""
    path, eq, rows = argument.rpartition(",catch_up=")
    if not eq:
        path, rows = argument, str(CATCH_UP)
    if not path:
        raise HeteroError("--spec eagle:PATH needs the Eagle-3 drafter's folder (config.json + model.safetensors)")
    if not rows.isdigit() or int(rows) < 1:
        raise HeteroError(f"--spec eagle:{argument}: catch_up={rows!r}; expected a number of rows (at least 1)")
    return Eagle3Drafter.for_target(path, target, catch_up=int(rows))


register("eagle", _eagle)
