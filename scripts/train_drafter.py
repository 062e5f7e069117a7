"""Distil an Eagle-3 head and a DFlash drafter for a target model from the target's own outputs.

    pip install torch==2.13.0          (a venv of your own; the test suite does not need it)
    nice -n 19 python scripts/train_drafter.py TARGET_FOLDER --out drafters/ --minutes 20

1. Data (``--data-share`` of the time budget): text chunks from a local corpus (the Python standard library's
   sources and the documentation files under site-packages by default, or ``--corpus`` folders) are tokenized;
   hetero runs the target on each chunk's first tokens (a random length up to ``--prompt-tokens``: drafters meet
   contexts of every length) and continues it greedily for
   ``--gen-tokens`` tokens, recording every position's hidden states at the layers the drafters read and the
   target's greedy prediction. In the generated part the sequence *is* the target's greedy output, which is what a
   drafter must predict at inference. ``--soft-labels K`` also keeps the target's K most likely next tokens and
   their log-probabilities per position (``--distill`` trains DFlash on them); ``--data-only --save-every M`` makes
   a cache in the background that training runs can read while it grows (``--max-train-tokens`` takes its first
   N tokens, to compare data sizes on one cache; ``--more-data`` adds the training sequences of other caches, e.g.
   teacher-forced corpus text and greedy continuations made by separate runs).
2. Eagle-3 (training-time test, ``--eagle-steps`` unrolled depths) and DFlash (blocks of ``--block-size`` anchored
   in the generated part, the target's frozen LM head on the drafter's rows) train on that data with AdamW,
   each for half of the remaining time (``--kind`` picks one). ``--init-from-target`` starts the drafters' decoder
   layer(s) as the target's last one(s) (dequantized; a narrower MLP keeps the units that contribute most) with
   ``fc`` passing the highest target layer through; the copied weights then stay frozen for ``--warm-share`` of
   the time and train at ``--target-lr``, the rest at ``--lr``. ``--dflash-layers 2 --init-layers 22 23
   --dflash-layer-ids 1 11 21`` starts a two-layer drafter as the target layers right after the one ``fc`` passes
   through. ``--train-cpu-minutes`` trains for a CPU-time budget (runs that got different shares stop at the same
   work). ``--position-decay`` weights the loss towards the
   first draft positions (they decide acceptance).
3. Acceptance on held-out sequences is printed as training goes (and at the end): the mean number of drafted
   tokens the target accepts per verify step, and the acceptance rate (accepted / drafted). On held-out greedy
   continuations this equals what greedy speculative decoding accepts from the same positions (and the share of
   drafts whose first 1, 2, ... tokens were accepted: where along a draft it is lost). The curve's clock is
   the process' CPU time spent training (evaluations not counted), so runs on a shared machine compare.
   ``training_log.json`` in ``--out`` keeps the curve.

Output: ``OUT/eagle3`` and ``OUT/dflash``, in the published layouts hetero loads with ``--spec eagle:OUT/eagle3`` /
``--spec dflash:OUT/dflash`` (docs/speculative.md). The target is a Hugging Face folder or a GGUF file (its
embedding and LM head are read as float32 for training, from the safetensors or dequantized by the ``gguf``
package; inference shares the target's own in memory).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import drafter_torch

import hetero.llm
from hetero.llm import safetensors
from hetero.llm.speculative.drafter_files import write_folder
from hetero.llm.speculative.eagle import default_aux_layers


@dataclass
class Sequence:
    tokens: np.ndarray  # [N]
    hidden: dict[int, np.ndarray]  # layer -> [N, H], float16 (the cache of a corpus; float32 when trained on)
    predicted: np.ndarray  # [N]: the target's greedy token after position i
    generated_from: int  # tokens[generated_from:] are the target's greedy continuation
    top_ids: np.ndarray | None = None  # [N, K] int32: the target's K most likely next tokens after position i
    top_logp: np.ndarray | None = None  # [N, K] float16: their log-probabilities (soft labels for distillation)

    def agree(self) -> np.ndarray:
        """[N]: True where the text's next token is the target's prediction (always so in the generated part). A
        label deeper in a draft is the target's prediction after the *text*; it is what drafting there must predict
        only where the text up to it is what the earlier draft tokens were: the target's predictions."""
        out = np.zeros(len(self.tokens), dtype=bool)
        out[:-1] = self.tokens[1:] == self.predicted[:-1]
        return out

    def features(self, layers: list[int]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([self.hidden[layer] for layer in layers], -1).astype(np.float32))


def corpus_files(roots: list[Path], patterns: tuple[str, ...] = ("*.py", "*.rst", "*.md", "*.txt")) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        for pattern in patterns:
            found.extend(p for p in root.rglob(pattern) if p.is_file() and p.stat().st_size > 2000)
    return sorted(set(found))


def default_roots() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [stdlib, Path(sysconfig.get_paths()["purelib"])]


def chunks(files: list[Path], rng: random.Random, chars: int):
    while True:
        path = rng.choice(files)
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) <= chars:
            continue
        start = rng.randrange(0, len(text) - chars)
        yield text[start:start + chars]


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, V] logits -> ([N, k] int32 ids, [N, k] float16 log-probabilities), most likely first (torch's topk:
    a quarter of numpy's argpartition + sort on a 151936-token vocabulary)."""
    x = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
    top, ids = torch.topk(x, k, dim=-1)
    return ids.to(torch.int32).numpy(), (top - torch.logsumexp(x, -1, keepdim=True)).to(torch.float16).numpy()


def make_data(llm, layers: list[int], files: list[Path], seconds: float, count: int, gen_tokens: int, args,
              rng: random.Random, longest: int = 0, checkpoint=None) -> list[Sequence]:
    """Up to ``count`` sequences (or as many as ``seconds`` allow), each continued greedily for ``gen_tokens``
    after a prompt of up to ``longest`` tokens (default ``--prompt-tokens``). With ``gen_tokens`` = 0 a sequence is
    one prefill of corpus text (every position's prediction at once: a few times the tokens per second of
    generating them)."""
    data: list[Sequence] = []
    longest = longest or args.prompt_tokens
    started = reported = time.perf_counter()
    for text in chunks(files, rng, longest * 8):
        if time.perf_counter() - started > seconds or len(data) >= count:
            break
        # prompts of every length up to the longest: a drafter meets contexts (and positions) of all sizes
        want = rng.randint(max(4, longest // 8), longest)
        ids = llm.tokenize(text, add_special_tokens=False)[:want]
        if len(ids) < want:
            continue
        llm.reset()
        logits = np.asarray(llm.forward(ids))
        predicted = list(np.argmax(logits, axis=-1))
        tops = [top_k(logits, args.soft_labels)] if args.soft_labels else []
        tokens = list(ids)
        for _ in range(gen_tokens):
            tokens.append(int(predicted[-1]))
            row = np.asarray(llm.forward(tokens[-1:])[-1:])
            predicted.append(int(np.argmax(row[-1])))
            tops += [top_k(row, args.soft_labels)] if args.soft_labels else []
        n = len(tokens)
        hidden = {layer: np.asarray(llm.hidden(layer, 0, n), dtype=np.float16) for layer in layers}
        soft = (np.concatenate([t[0] for t in tops]), np.concatenate([t[1] for t in tops])) if tops else (None, None)
        data.append(Sequence(np.asarray(tokens), hidden, np.asarray(predicted), len(ids), *soft))
        if time.perf_counter() - reported > 30:
            reported = time.perf_counter()
            print(f"  data: {len(data)} sequences, {sum(len(s.tokens) for s in data)} tokens, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        if checkpoint is not None:
            checkpoint(data)
    return data


def target_matrices(folder: Path, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's embedding table, LM head (the same tensor when tied) and final norm as float32, for training
    only (the norm starts the drafters' own final norm: both feed the target's LM head, or rows of it)."""
    if folder.is_file():
        return gguf_matrices(folder)
    st = safetensors.SafetensorsModel(folder)
    embed = torch.from_numpy(np.array(st.float32("model.embed_tokens.weight")))
    head = embed if cfg.tie_word_embeddings or "lm_head.weight" not in st else \
        torch.from_numpy(np.array(st.float32("lm_head.weight")))
    return embed, head, torch.from_numpy(np.array(st.float32("model.norm.weight")))


def gguf_tensors(path: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """The GGUF's tensors of ``names`` (those it has) dequantized to float32, in numpy's [out, in] order."""
    import gguf  # the GGUF package dequantizes every tensor type

    return {t.name: torch.from_numpy(np.ascontiguousarray(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32))
            for t in gguf.GGUFReader(path).tensors if t.name in names}


def gguf_matrices(path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = gguf_tensors(path, {"token_embd.weight", "output.weight", "output_norm.weight"})
    embed = t["token_embd.weight"]
    return embed, t.get("output.weight", embed), t["output_norm.weight"].reshape(-1)


# a decoder layer's tensors: Hugging Face name (under model.layers.{i}.) -> GGUF name (under blk.{i}.)
LAYER_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def target_layer(target: Path, index: int) -> dict[str, torch.Tensor]:
    """The target's decoder layer ``index`` as float32 (dequantized from a GGUF), by Hugging Face name under
    ``model.layers.{index}.`` (``self_attn.q_proj.weight``, ``.bias`` where the target has one, ...)."""
    if target.is_file():
        got = gguf_tensors(target, {f"blk.{index}.{g}.{kind}" for g in LAYER_TENSORS.values()
                                    for kind in ("weight", "bias")})
        return {f"{hf}.{kind}": got[f"blk.{index}.{g}.{kind}"].reshape(-1) if "norm" in hf else
                got[f"blk.{index}.{g}.{kind}"] for hf, g in LAYER_TENSORS.items() for kind in ("weight", "bias")
                if f"blk.{index}.{g}.{kind}" in got}
    st = safetensors.SafetensorsModel(target)
    return {f"{hf}.{kind}": torch.from_numpy(np.array(st.float32(f"model.layers.{index}.{hf}.{kind}")))
            for hf in LAYER_TENSORS for kind in ("weight", "bias") if f"model.layers.{index}.{hf}.{kind}" in st}


def init_from_target(layer: drafter_torch.Layer, w: dict[str, torch.Tensor], rows: torch.Tensor, eps: float,
                     attn_in: slice) -> list[torch.nn.Parameter]:
    """Start a drafter layer as a target layer: its attention and norms copied (the attention reading the
    columns ``attn_in`` of the drafter's input; other input columns start at zero), its MLP the target's units
    that contribute most on ``rows`` (residual-stream rows of the target, [R, H]) when the drafter's MLP is
    narrower (a wider one's other units start with a zero output). The target's q/k/v biases have no place in
    the published layouts and are dropped; where the layer has q/k norms (DFlash) they are the target's (Qwen3) or,
    for a target without them (Qwen2), start at the target's per-dimension RMS of q and k on ``rows``, so the
    attention logits keep about the target's scale. Returns the parameters copied from the target."""
    a, m = layer.self_attn, layer.mlp
    with torch.no_grad():
        x = drafter_torch.rms_norm(rows, w["input_layernorm.weight"], eps)
        for name in ("q_proj", "k_proj", "v_proj"):
            lin = getattr(a, name)
            lin.weight.zero_()
            lin.weight[:, attn_in] = w[f"self_attn.{name}.weight"]
        a.o_proj.weight.copy_(w["self_attn.o_proj.weight"])
        if a.qk_norm:
            for name, norm in (("q", a.q_norm), ("k", a.k_norm)):
                if f"self_attn.{name}_norm.weight" in w:
                    norm.weight.copy_(w[f"self_attn.{name}_norm.weight"])
                    continue
                proj = x @ w[f"self_attn.{name}_proj.weight"].T + w.get(f"self_attn.{name}_proj.bias", 0.0)
                norm.weight.copy_(proj.view(-1, a.head_dim).pow(2).mean(0).sqrt())
        layer.input_layernorm.weight.copy_(w["input_layernorm.weight"])
        layer.post_attention_layernorm.weight.copy_(w["post_attention_layernorm.weight"])
        gate, up, down = (w[f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
        xm = drafter_torch.rms_norm(rows, w["post_attention_layernorm.weight"], eps)
        contribution = (F.silu(xm @ gate.T) * (xm @ up.T)).abs().mean(0) * down.norm(dim=0)
        n = min(m.gate_proj.weight.shape[0], len(contribution))  # a wider MLP's extra units start silent
        keep = torch.sort(torch.topk(contribution, n).indices).values
        m.gate_proj.weight[:n] = gate[keep]
        m.up_proj.weight[:n] = up[keep]
        m.down_proj.weight.zero_()
        m.down_proj.weight[:, :n] = down[:, keep]
    return [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, m.gate_proj.weight,
            m.up_proj.weight, m.down_proj.weight]


def param_groups(model: torch.nn.Module, copied: list[torch.nn.Parameter], args) -> list[dict] | None:
    """With ``--init-from-target``: the parameters copied from the target train at ``--target-lr`` after
    ``--warm-share`` of the time, the rest (fc, norms, heads) at ``--lr`` from the start."""
    if not copied:
        return None
    ids = {id(p) for p in copied}
    return [{"params": [p for p in model.parameters() if id(p) not in ids], "lr": args.lr},
            {"params": copied, "lr": args.target_lr, "warm": args.warm_share}]


def context_rows(train: list[Sequence], layer: int, count: int = 2048) -> torch.Tensor:
    """Up to ``count`` rows of the target's hidden states at ``layer`` from the training sequences."""
    return torch.from_numpy(np.concatenate([s.hidden[layer] for s in train])[:count].astype(np.float32))


def layer_config(cfg, intermediate: int) -> dict:
    return {"hidden_size": cfg.hidden_size, "intermediate_size": intermediate, "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope.theta, "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_position_embeddings, "tie_word_embeddings": False}


class Curve:
    """Acceptance against training minutes, printed and kept for training_log.json."""

    def __init__(self, kind: str, depth: int) -> None:
        self.kind, self.depth, self.points = kind, depth, []

    def add(self, minutes: float, wall: float, steps: int, loss: float, accepted: np.ndarray) -> None:
        """``minutes``: the process' CPU time spent training (what a free core would take; the machine is
        shared), ``wall``: the wall-clock minutes of it."""
        mean = float(accepted.mean()) if accepted.size else 0.0
        # the share of drafts whose first k tokens were all accepted: where along the draft acceptance is lost
        reach = [float((accepted >= k).mean()) if accepted.size else 0.0 for k in range(1, self.depth + 1)]
        point = {"minutes": round(minutes, 2), "wall_minutes": round(wall, 2), "steps": steps,
                 "loss": round(loss, 4) if steps else None,
                 "seconds_per_step": round(60 * minutes / max(steps, 1), 3),
                 "accepted_per_step": round(mean, 3), "acceptance_rate": round(mean / self.depth, 3),
                 "first_k_accepted": [round(r, 3) for r in reach], "anchors": int(accepted.size)}
        self.points.append(point)
        print(f"  {self.kind} {minutes:5.1f} CPU min ({wall:.1f} wall), step {steps} "
              f"({60 * minutes / max(steps, 1):.2f} CPU s/step): loss {loss:.3f}, {mean:.2f} of {self.depth} drafts "
              f"accepted per verify step (rate {mean / self.depth:.1%}, first 1..{self.depth} accepted "
              f"{' / '.join(f'{r:.0%}' for r in reach)}, {accepted.size} anchors)", flush=True)


def resume(cls, folder: Path, config: dict):
    """(config, model) of the drafter an earlier run wrote to ``folder`` (its config, and so its draft vocabulary,
    wins), or a fresh one when there is none."""
    if not (folder / "model.safetensors").is_file():
        print(f"  --resume: nothing in {folder}, starting afresh", flush=True)
        return config, cls(config)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model = cls(config)
    st = safetensors.SafetensorsModel(folder)
    model.load_state_dict({name: torch.from_numpy(np.array(st.raw(name))) for name in st})
    print(f"  resumed from {folder}", flush=True)
    return config, model


def save_data(path: Path, held: list[Sequence], train: list[Sequence]) -> None:
    arrays: dict[str, np.ndarray] = {}
    for i, seq in enumerate(held + train):
        arrays[f"{i}/tokens"], arrays[f"{i}/predicted"] = seq.tokens, seq.predicted
        arrays[f"{i}/generated_from"] = np.asarray(seq.generated_from)
        if seq.top_ids is not None:
            arrays[f"{i}/top_ids"], arrays[f"{i}/top_logp"] = seq.top_ids, seq.top_logp
        arrays.update({f"{i}/hidden{layer}": h for layer, h in seq.hidden.items()})
    tmp = path.with_name(path.name + ".partial.npz")  # renamed when whole: a reader never sees half a file
    np.savez(tmp, held=np.asarray(len(held)), **arrays)
    tmp.replace(path)


def load_data(path: Path, layers: set[int] | None = None,
              max_train_tokens: int = 0) -> tuple[list[Sequence], list[Sequence]]:
    """(held-out, training) sequences of a cache, keeping the hidden states of ``layers`` only (default all) and
    the first training sequences up to ``max_train_tokens`` tokens (0: all)."""
    with np.load(path) as z:
        names = set(z.files)
        count = 1 + max(int(k.split("/")[0]) for k in names if "/" in k)
        held = int(z["held"])
        seqs, tokens = [], 0
        for i in range(count):
            if max_train_tokens and i >= held and tokens >= max_train_tokens:
                break
            hidden = {int(k.split("hidden")[1]): z[k] for k in names if k.startswith(f"{i}/hidden")
                      and (layers is None or int(k.split("hidden")[1]) in layers)}
            seqs.append(Sequence(z[f"{i}/tokens"], hidden, z[f"{i}/predicted"], int(z[f"{i}/generated_from"]),
                                 z[f"{i}/top_ids"] if f"{i}/top_ids" in names else None,
                                 z[f"{i}/top_logp"] if f"{i}/top_logp" in names else None))
            tokens += len(seqs[-1].tokens) if i >= held else 0
    return seqs[:held], seqs[held:]


def fit(model: torch.nn.Module, loss_of_one_step, accepted, curve: Curve, args, seconds: float,
        groups: list[dict] | None = None, save=None) -> Curve:
    """AdamW on ``loss_of_one_step()`` for ``seconds`` of wall-clock training, measuring ``accepted()`` at the start
    and every ``--eval-every`` minutes of it. The curve's clock is the process' CPU time spent training (the
    measurements' own time is not counted): acceptance per CPU-minute of training, comparable between runs that
    got different shares of a busy machine. ``groups``: parameter groups, each with its own ``lr`` and optionally
    ``warm``, the share of ``seconds`` during which a group stays frozen (the other groups train alone). ``save()``
    writes the drafter after every measurement (a run stopped early on a busy machine leaves its latest one)."""
    groups = groups or [{"params": list(model.parameters()), "lr": args.lr}]
    opt = torch.optim.AdamW([{k: v for k, v in g.items() if k != "warm"} for g in groups], weight_decay=0.0)
    params = [p for g in groups for p in g["params"]]
    wall = cpu = since_eval = 0.0
    step, loss_avg = 0, 0.0
    curve.add(0.0, 0.0, 0, float("nan"), accepted())
    if args.train_cpu_minutes:  # a budget of training CPU time: runs that got different shares of the machine stop
        seconds = args.train_cpu_minutes * 60  # at the same amount of work (warm shares count in it too)
    while (cpu if args.train_cpu_minutes else wall) < seconds:
        t0, c0 = time.perf_counter(), time.process_time()
        for g in groups:  # a frozen group gets no gradients (and costs no weight-gradient matmuls)
            for p in g["params"]:
                p.requires_grad_((cpu if args.train_cpu_minutes else wall) >= g.get("warm", 0.0) * seconds)
        loss = loss_of_one_step()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        loss_avg = 0.95 * loss_avg + 0.05 * loss.item() if step > 1 else loss.item()
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        clock = cpu if args.train_cpu_minutes else wall
        if clock - since_eval > args.eval_every * 60:
            curve.add(cpu / 60, wall / 60, step, loss_avg, accepted())
            since_eval = clock
            if save is not None:
                save()
    curve.add(cpu / 60, wall / 60, step, loss_avg, accepted())
    return curve


def prefix_matches(hits: torch.Tensor) -> torch.Tensor:
    """[A, depth] booleans -> [A]: the length of each row's leading run of True."""
    return hits.to(torch.int64).cumprod(1).sum(1)


def agree_runs(seq: Sequence) -> torch.Tensor:
    """[N]: how many positions up to and including i in a row the text followed the target's prediction."""
    run, out = 0, np.zeros(len(seq.tokens), dtype=np.int64)
    for i, ok in enumerate(seq.agree()):
        run = run + 1 if ok else 0
        out[i] = run
    return torch.from_numpy(out)


class VocabSubset:
    """Training logits over the tokens the corpus' labels use (the target's LM head rows gathered once) plus a few
    random other rows per step (so the rest of the vocabulary is pushed down too), instead of all of a 151k
    vocabulary: the LM head's matmul was most of a DFlash training step. Acceptance is still measured with the
    whole head."""

    def __init__(self, head: torch.Tensor, labels: np.ndarray, negatives: int, rng: torch.Generator) -> None:
        ids = np.unique(labels) if negatives >= 0 else np.arange(head.shape[0])  # < 0: the whole vocabulary
        self.rows = head[torch.from_numpy(ids)].contiguous()
        self.index = torch.full((head.shape[0],), -1, dtype=torch.long)
        self.index[torch.from_numpy(ids)] = torch.arange(len(ids))
        rest = np.setdiff1d(np.arange(head.shape[0]), ids)
        self.rest, self.head, self.negatives, self.rng = torch.from_numpy(rest), head, negatives, rng

    def __len__(self) -> int:
        return len(self.rows)

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, len(self) + negatives]; a label's column is ``self.index[label]``."""
        out = rows @ self.rows.T
        if self.negatives > 0 and len(self.rest):
            pick = self.rest[torch.randint(len(self.rest), (self.negatives,), generator=self.rng)]
            out = torch.cat([out, rows @ self.head[pick].T], -1)
        return out


# -- Eagle-3 ------------------------------------------------------------------------------------------------------
def eagle_inputs(seq: Sequence, layers: list[int], embed: torch.Tensor):
    feats = seq.features(layers)[:-1]
    nxt = torch.from_numpy(seq.tokens[1:])
    # row j (feature of token j, token j + 1) predicts token j + 2: the target's prediction after token j + 1
    return feats, embed[nxt], torch.from_numpy(seq.predicted[1:])


def eagle_accepted(model, data: list[Sequence], layers, embed, steps: int) -> np.ndarray:
    out = []
    with torch.no_grad():
        for seq in data:
            feats, emb, _ = eagle_inputs(seq, layers, embed)
            preds = [model.d2t[lg.argmax(-1)] + lg.argmax(-1) for lg in model.unrolled(feats, emb, steps)]
            n = len(seq.tokens)
            # anchor a: history tokens[0..a]; depth s is predicted by row a - 1 + s and must equal tokens[a + 1 + s]
            anchors = [a for a in range(max(seq.generated_from - 1, 1), n - 1 - steps)]
            if not anchors:
                continue
            hits = torch.stack([torch.stack([preds[s][a - 1 + s] == int(seq.tokens[a + 1 + s]) for s in range(steps)])
                                for a in anchors])
            out.append(prefix_matches(hits).numpy())
    return np.concatenate(out) if out else np.zeros(0)


def train_eagle(llm, train: list[Sequence], held: list[Sequence], embed, head, norm, args, seconds: float) -> Curve:
    cfg = llm.config
    layers = list(default_aux_layers(cfg.num_layers))
    counts = np.bincount(np.concatenate([s.predicted for s in train]), minlength=cfg.vocab_size)
    draft_vocab = min(args.draft_vocab, cfg.vocab_size)
    keep = np.sort(np.argsort(-counts, kind="stable")[:draft_vocab])
    c = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
         **layer_config(cfg, args.intermediate or cfg.hidden_size * 2), "draft_vocab_size": draft_vocab,
         "target_hidden_size": cfg.hidden_size,
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i + 1 for i in layers]}}
    c, model = resume(drafter_torch.Eagle3, args.out / "eagle3", c) if args.resume else (c, drafter_torch.Eagle3(c))
    copied: list[torch.nn.Parameter] = []
    if args.resume and (args.out / "eagle3").is_dir():
        keep = (model.d2t + torch.arange(len(model.d2t))).numpy()  # the earlier run's draft vocabulary
        draft_vocab = len(keep)
    else:
        model.d2t.copy_(torch.from_numpy(keep - np.arange(draft_vocab)))
        model.t2d[torch.from_numpy(keep)] = True
        # a warm start: the head's output side is the target's (its final norm, its LM head's rows of the draft
        # vocabulary) and fc passes the highest target layer through, so the head begins where the target's own
        # prediction is and learns the step beyond it, not a vocabulary from random weights
        with torch.no_grad():
            model.lm_head.weight.copy_(head[torch.from_numpy(keep)])
            model.norm.weight.copy_(norm)
            h = cfg.hidden_size
            model.fc.weight.zero_()
            model.fc.weight[:, 2 * h:3 * h] = torch.eye(h)
        if args.init_from_target:  # the layer's attention reads the feature half of its input, as the target's
            copied = init_from_target(model.midlayer, target_layer(args.target, cfg.num_layers - 1),
                                      context_rows(train, layers[-1]), cfg.rms_norm_eps, slice(h, 2 * h))
            with torch.no_grad():
                model.midlayer.hidden_norm.weight.copy_(model.midlayer.input_layernorm.weight)
                model.midlayer.input_layernorm.weight.fill_(1.0)
    decay = args.position_decay or 0.8
    to_draft = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    to_draft[torch.from_numpy(keep)] = torch.arange(draft_vocab)
    rng = random.Random(args.seed)

    def loss_of_one_step() -> torch.Tensor:
        seq = rng.choice(train)
        feats, emb, labels = eagle_inputs(seq, layers, embed)
        target = to_draft[labels]
        runs = agree_runs(seq)[:-1]  # row j, depth s: the text after the anchor j - s was the target's own
        if args.window and len(target) > args.window:  # a random window: more, cheaper steps
            w0 = rng.randrange(len(target) - args.window + 1)
            cut = slice(w0, w0 + args.window)
            feats, emb, target, runs = feats[cut], emb[cut], target[cut], runs[cut]
        loss = torch.zeros(())
        for s, logits in enumerate(model.unrolled(feats, emb, args.eagle_steps)):
            valid = (target[s:] >= 0) & (runs[s:] >= s)
            if valid.any():
                loss = loss + decay ** s * F.cross_entropy(logits[s:][valid], target[s:][valid])
        return loss

    curve = fit(model, loss_of_one_step, lambda: eagle_accepted(model, held, layers, embed, args.eagle_steps),
                Curve("eagle3", args.eagle_steps), args, seconds, param_groups(model, copied, args))
    tensors = drafter_torch.state_tensors(model)
    write_folder(args.out / "eagle3", c, tensors)
    return curve


# -- DFlash -------------------------------------------------------------------------------------------------------
def dflash_layers(num_layers: int, count: int) -> list[int]:
    """``count`` layers spread from the second to the third-last (the DFlash checkpoints' pattern)."""
    hi = max(num_layers - 3, 1)
    picks = np.round(np.linspace(min(1, num_layers - 1), hi, min(count, num_layers))).astype(int)
    return sorted({int(min(p, num_layers - 1)) for p in picks})


def dflash_target_layers(num_layers: int, args) -> list[int]:
    """``--dflash-layer-ids`` as given, or ``--dflash-target-layers`` spread as the checkpoints spread them."""
    return list(args.dflash_layer_ids) if args.dflash_layer_ids else dflash_layers(num_layers,
                                                                                  args.dflash_target_layers)


def dflash_batch(seq: Sequence, layers, embed, block: int, mask_id: int, anchors: list[int]):
    """Blocks at ``anchors`` in one pass: queries of all blocks, keys = the context rows, then every block's rows;
    a block sees context rows before its anchor and its own rows."""
    n = len(seq.tokens)
    ctx = seq.features(layers)
    ids = [[int(seq.tokens[a])] + [mask_id] * (block - 1) for a in anchors]
    noise = embed[torch.tensor(ids).reshape(-1)]
    pos = torch.tensor([a + i for a in anchors for i in range(block)])
    rows = len(anchors) * block
    mask = torch.zeros(rows, n + rows, dtype=torch.bool)
    for b, a in enumerate(anchors):
        mask[b * block:(b + 1) * block, :a] = True
        mask[b * block:(b + 1) * block, n + b * block:n + (b + 1) * block] = True
    # the target's prediction after each position: in the generated part, the next token itself
    labels = torch.tensor([[int(seq.predicted[a + i - 1]) for i in range(1, block)] for a in anchors])
    return ctx, torch.arange(n), noise, pos, mask, labels


def dflash_anchors(seq: Sequence, block: int, *, generated: bool = True) -> list[int]:
    """Block starts whose labels are the target's greedy continuation (``generated``: what acceptance is measured
    on), or every start (training on teacher-forced text: the labels are still the target's predictions)."""
    return list(range(max(seq.generated_from - 1, 1) if generated else 1, len(seq.tokens) - block + 1))


def dflash_accepted(model, data, layers, embed, head, block, mask_id) -> np.ndarray:
    out = []
    with torch.no_grad():
        for seq in data:
            anchors = dflash_anchors(seq, block)
            if not anchors:
                continue
            ctx, cpos, noise, pos, mask, labels = dflash_batch(seq, layers, embed, block, mask_id, anchors)
            rows = model(ctx, cpos, noise, pos, mask).view(len(anchors), block, -1)[:, 1:]
            drafted = torch.cat([(part @ head.T).argmax(-1) for part in rows.split(16)])  # the whole head
            out.append(prefix_matches(drafted == labels).numpy())
    return np.concatenate(out) if out else np.zeros(0)


def train_dflash(llm, train, held, embed, head, norm, args, seconds: float) -> Curve:
    cfg = llm.config
    layers = dflash_target_layers(cfg.num_layers, args)
    block, mask_id = args.block_size, args.mask_token_id if args.mask_token_id >= 0 else cfg.vocab_size - 1
    c = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": args.dflash_layers,
         **layer_config(cfg, args.intermediate or cfg.intermediate_size), "num_target_layers": cfg.num_layers,
         "block_size": block,
         "dflash_config": {"block_size": block, "mask_token_id": mask_id, "target_layer_ids": layers}}
    c, model = resume(drafter_torch.DFlash, args.out / "dflash", c) if args.resume else (c, drafter_torch.DFlash(c))
    copied: list[torch.nn.Parameter] = []
    if not (args.resume and (args.out / "dflash").is_dir()):
        with torch.no_grad():
            model.norm.weight.copy_(norm)  # its rows go through the target's LM head, as the target's own do
        if args.init_from_target:
            # fc passes the highest target layer through and hidden_norm is the copied layer's input norm: the
            # context keys / values start as the target's last layers would make them from that layer's output
            h, rows = cfg.hidden_size, context_rows(train, layers[-1])
            starts = args.init_layers or range(cfg.num_layers - len(model.layers), cfg.num_layers)
            if len(starts) != len(model.layers):
                raise SystemExit(f"--init-layers names {len(starts)} layers for {len(model.layers)} drafter layers")
            for layer, index in zip(model.layers, starts, strict=True):
                w = target_layer(args.target, index)
                copied += init_from_target(layer, w, rows, cfg.rms_norm_eps, slice(0, h))
            with torch.no_grad():
                model.fc.weight.zero_()
                model.fc.weight[:, (len(layers) - 1) * h:] = torch.eye(h)
                model.hidden_norm.weight.copy_(model.layers[0].input_layernorm.weight)
    # early positions decide acceptance
    weights = (args.position_decay or 0.85) ** torch.arange(block - 1, dtype=torch.float32)
    rng = random.Random(args.seed + 1)
    usable = [seq for seq in train if dflash_anchors(seq, block, generated=False)]
    soft = args.distill > 0 and all(seq.top_ids is not None for seq in usable)
    if args.distill > 0 and not soft:
        raise SystemExit("--distill needs a data cache made with --soft-labels")
    k = min(args.soft_k, usable[0].top_ids.shape[1]) if soft else 0
    used = [seq.predicted for seq in usable] + [seq.top_ids[:, :k].reshape(-1) for seq in usable if soft]
    vocab = VocabSubset(head, np.concatenate(used), args.negatives, torch.Generator().manual_seed(args.seed))
    print(f"  dflash: logits over {len(vocab)} tokens the labels use + {max(args.negatives, 0)} others per step "
          f"(of {head.shape[0]}){f', distilled from the top {k}' if soft else ''}", flush=True)
    depth = torch.arange(1, block)

    def loss_of_one_step() -> torch.Tensor:
        seq = rng.choice(usable)
        anchors = dflash_anchors(seq, block, generated=False)
        anchors = sorted(rng.sample(anchors, min(len(anchors), args.anchors)))
        ctx, cpos, noise, pos, mask, labels = dflash_batch(seq, layers, embed, block, mask_id, anchors)
        rows = model(ctx, cpos, noise, pos, mask).view(len(anchors), block, -1)[:, 1:]
        # block row i (label: the prediction after anchor + i - 1) counts where the text from the anchor on was the
        # target's own predictions, as an accepted draft's would be
        runs = agree_runs(seq)
        at = torch.tensor(anchors)[:, None] + depth[None, :] - 2
        valid = (depth[None, :] == 1) | (runs[at.clamp(min=0)] >= depth[None, :] - 1)
        logits = vocab.logits(rows.reshape(-1, rows.shape[-1]))
        ce = F.cross_entropy(logits, vocab.index[labels.reshape(-1)], reduction="none")
        if soft:  # the target's distribution over its top k (renormalised) as well as its argmax
            where = (at + 1).reshape(-1).numpy()
            p = torch.softmax(torch.from_numpy(seq.top_logp[where, :k].astype(np.float32)), -1)
            cols = vocab.index[torch.from_numpy(seq.top_ids[where, :k].astype(np.int64))]
            soft_ce = -(p * torch.log_softmax(logits, -1).gather(1, cols)).sum(-1)
            ce = (1 - args.distill) * ce + args.distill * soft_ce
        w = weights[None, :] * valid
        return (ce.view(len(anchors), block - 1) * w).sum() / w.sum().clamp(min=1e-6)

    def save() -> None:
        write_folder(args.out / "dflash", c, drafter_torch.state_tensors(model))

    curve = fit(model, loss_of_one_step, lambda: dflash_accepted(model, held, layers, embed, head, block, mask_id),
                Curve("dflash", block - 1), args, seconds, param_groups(model, copied, args), save)
    save()
    return curve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", type=Path, help="the target model: a Hugging Face folder or a GGUF file")
    p.add_argument("--out", type=Path, required=True, help="writes OUT/eagle3 and OUT/dflash")
    p.add_argument("--kind", choices=["both", "eagle", "dflash"], default="both")
    p.add_argument("--minutes", type=float, default=20.0, help="the whole time budget (data + training)")
    p.add_argument("--train-cpu-minutes", type=float, default=0.0,
                   help="train each drafter for this much process CPU time instead of the rest of --minutes")
    p.add_argument("--data-share", type=float, default=0.35, help="share of the budget spent making data")
    p.add_argument("--corpus", type=Path, nargs="*", help="folders of text (default: stdlib + site-packages docs)")
    p.add_argument("--corpus-patterns", nargs="+", default=["*.py", "*.rst", "*.md", "*.txt"],
                   help="file name patterns of the corpus (*.py alone: code only)")
    p.add_argument("--data-only", action="store_true", help="stop after making (and writing --data) the data")
    p.add_argument("--save-every", type=float, default=0.0,
                   help="minutes between writes of --data while making it (0: once at the end)")
    p.add_argument("--record-layers", type=int, nargs="*",
                   help="target layers whose hidden states the data keeps (default: those the drafters read)")
    p.add_argument("--distill", type=float, default=0.0,
                   help="DFlash: weight of the loss against the target's top-k distribution (needs a cache made "
                        "with --soft-labels; the rest is the argmax's cross-entropy)")
    p.add_argument("--soft-k", type=int, default=8, help="with --distill: the target's top tokens used")
    p.add_argument("--max-train-tokens", type=int, default=0,
                   help="train on the cache's first sequences up to this many tokens (0: all; to compare data sizes)")
    p.add_argument("--soft-labels", type=int, default=0,
                   help="keep the target's K most likely next tokens and their log-probabilities per position")
    p.add_argument("--prompt-tokens", type=int, default=96)
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--train-gen-tokens", type=int, default=-1,
                   help="greedy tokens per training sequence (default --gen-tokens; 0 trains on the target's "
                        "predictions over corpus text only: for targets too slow to generate much)")
    p.add_argument("--held-out", type=int, default=6, help="sequences kept for measuring acceptance")
    p.add_argument("--eagle-steps", type=int, default=4, help="training-time-test depth (= drafting depth)")
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--dflash-layers", type=int, default=1)
    p.add_argument("--dflash-target-layers", type=int, default=3)
    p.add_argument("--dflash-layer-ids", type=int, nargs="*",
                   help="the target layers DFlash reads (default: --dflash-target-layers spread over the depth)")
    p.add_argument("--mask-token-id", type=int, default=-1, help="default: the last id of the vocabulary")
    p.add_argument("--anchors", type=int, default=16, help="DFlash blocks per training step")
    p.add_argument("--window", type=int, default=128, help="Eagle-3: rows of a sequence per training step (0: all)")
    p.add_argument("--negatives", type=int, default=1024,
                   help="DFlash: LM head rows outside the labels' tokens added to each step's logits (-1: train "
                        "over the whole vocabulary, as before)")
    p.add_argument("--train-tokens", type=int, default=0,
                   help="longest training sequence (default --prompt-tokens); with --train-gen-tokens 0 each is one "
                        "prefill of corpus text, so long ones make data fastest")
    p.add_argument("--intermediate", type=int, default=0, help="drafter MLP width (default: Eagle 2H, DFlash "
                                                               "the target's)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--init-from-target", action="store_true",
                   help="start the drafter's layer(s) as the target's last decoder layer(s) (dequantized), fc passing "
                        "the highest target layer through")
    p.add_argument("--init-layers", type=int, nargs="*",
                   help="with --init-from-target: the target layers the drafter's layers start as (default: the "
                        "last --dflash-layers; the layers after the last of --dflash-layer-ids continue the target "
                        "from the layer fc passes through)")
    p.add_argument("--target-lr", type=float, default=2e-4, help="with --init-from-target: the learning rate of "
                                                                 "the weights copied from the target")
    p.add_argument("--warm-share", type=float, default=0.1, help="with --init-from-target: the share of the time "
                                                                 "the copied weights stay frozen at first")
    p.add_argument("--position-decay", type=float, default=0.0,
                   help="loss weight decay per draft position (default DFlash 0.85, Eagle-3 0.8 per depth)")
    p.add_argument("--eval-every", type=float, default=2.0, help="minutes between acceptance measurements")
    p.add_argument("--data", type=Path, help="an .npz of sequences: read if it exists (this run adds to it), "
                                             "written after making data (runs can share what a slow target made)")
    p.add_argument("--more-data", type=Path, nargs="*",
                   help="more .npz caches whose training sequences (not their held-out ones) are trained on too "
                        "(read only: corpus text and greedy continuations made by separate runs)")
    p.add_argument("--resume", action="store_true", help="continue training the drafters already in --out")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    budget = args.minutes * 60

    files = corpus_files(args.corpus or default_roots(), tuple(args.corpus_patterns))
    if not files:
        p.error("no corpus files found")
    print(f"corpus: {len(files)} files", flush=True)
    probe = hetero.llm.load(args.target, context=16, kv_cache="f32", on_fallback="silent")
    cfg = probe.config
    probe.close()
    layers = sorted(set(args.record_layers) if args.record_layers else
                    {*default_aux_layers(cfg.num_layers), *dflash_target_layers(cfg.num_layers, args)})
    llm = hetero.llm.load(args.target, context=args.context, kv_cache="f32", all_logits=True, on_fallback="silent",
                          threads=args.threads, hidden_layers=layers)
    print(f"target: {llm.name}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}; "
          f"hidden states of layers {layers}", flush=True)
    data_started = time.perf_counter()
    needed = None if args.data_only else {*(default_aux_layers(cfg.num_layers) if args.kind != "dflash" else ()),
                                          *(dflash_target_layers(cfg.num_layers, args) if args.kind != "eagle" else ())}
    held, train = load_data(args.data, needed, args.max_train_tokens) if args.data is not None and \
        args.data.is_file() else ([], [])
    if held or train:
        print(f"data: {len(train)} + {len(held)} sequences from {args.data}", flush=True)
    else:
        held = make_data(llm, layers, files, budget * args.data_share / 2, args.held_out, args.gen_tokens, args, rng)
    train_gen = args.gen_tokens if args.train_gen_tokens < 0 else args.train_gen_tokens
    saved = [time.perf_counter()]

    def checkpoint(made: list[Sequence]) -> None:  # a long data run can be trained on while it goes on
        if args.data is not None and args.save_every and time.perf_counter() - saved[0] > args.save_every * 60:
            save_data(args.data, held, train + made)
            saved[0] = time.perf_counter()
            print(f"  data: saved {len(train) + len(made)} training sequences to {args.data}", flush=True)

    made = make_data(llm, layers, files, budget * args.data_share - (time.perf_counter() - data_started), 1 << 30,
                     train_gen, args, rng, args.train_tokens, checkpoint)
    llm.close()
    if args.data is not None and (made or not args.data.is_file()):
        save_data(args.data, held, train + made)
    train += made
    for path in args.more_data or []:  # training sequences of other caches (not written into --data); the held-out
        more = load_data(path, needed)[1]  # set is --data's
        print(f"data: {len(more)} more training sequences from {path}", flush=True)
        train += more
    if args.data_only:
        print(f"data: {len(train)} training + {len(held)} held-out sequences in {args.data}", flush=True)
        return 0
    if not held or not train:
        p.error(f"only {len(held)} held-out and {len(train)} training sequences made: raise --minutes")
    data = held + train
    print(f"data: {len(train)} training + {len(held)} held-out sequences, {sum(len(s.tokens) for s in data)} tokens, "
          f"{(time.perf_counter() - started) / 60:.1f} min", flush=True)
    embed, head, norm = target_matrices(args.target, cfg)
    kinds = ["eagle", "dflash"] if args.kind == "both" else [args.kind]
    log: dict = {"target": str(args.target), "threads": args.threads, "data_minutes":
                 round((time.perf_counter() - started) / 60, 2), "train_sequences": len(train),
                 "train_tokens": int(sum(len(s.tokens) for s in train)), "curves": {}}
    for i, kind in enumerate(kinds):
        seconds = (budget - (time.perf_counter() - started)) / (len(kinds) - i)
        curve = train_eagle(llm, train, held, embed, head, norm, args, seconds) if kind == "eagle" else \
            train_dflash(llm, train, held, embed, head, norm, args, seconds)
        log["curves"][curve.kind] = curve.points
    (args.out / "training_log.json").write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {', '.join(str(args.out / k) for k in ('eagle3', 'dflash') if (args.out / k).is_dir())} in "
          f"{(time.perf_counter() - started) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
