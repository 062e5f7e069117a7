"""What one DFlash training step of scripts/train_drafter.py costs with the logits over the labels' vocabulary
subset (``--negatives N``) against the whole vocabulary (``--negatives -1``, the step before the subset), on data
that script cached (``--data``), alternated in one process, thread CPU time (the machine may be shared), medians.

    PYTHONPATH=core:plugins/cpu:.venv-train/lib/python3.11/site-packages \\
        python benchmarks/drafter_train_step.py MODEL.gguf --data data.npz --steps 6
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import drafter_torch
import train_drafter as td

import hetero.llm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("target", type=Path)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--anchors", type=int, default=32)
    p.add_argument("--block-size", type=int, default=5)
    p.add_argument("--intermediate", type=int, default=3072)
    p.add_argument("--negatives", type=int, default=1024)
    args = p.parse_args()
    torch.set_num_threads(1)
    probe = hetero.llm.load(args.target, context=16, kv_cache="f32", on_fallback="silent")
    cfg = probe.config
    probe.close()
    _, train = td.load_data(args.data)
    embed, head, _ = td.target_matrices(args.target, cfg)
    layers = td.dflash_layers(cfg.num_layers, 3)
    block, mask_id = args.block_size, cfg.vocab_size - 1
    c = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 1,
         **td.layer_config(cfg, args.intermediate), "num_target_layers": cfg.num_layers, "block_size": block,
         "dflash_config": {"block_size": block, "mask_token_id": mask_id, "target_layer_ids": layers}}
    model = drafter_torch.DFlash(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    labels = np.concatenate([s.predicted for s in train])
    gen = torch.Generator().manual_seed(0)
    kinds = {"subset": td.VocabSubset(head, labels, args.negatives, gen),
             "whole": td.VocabSubset(head, labels, -1, gen)}
    rng = random.Random(0)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.steps):
        seq = rng.choice(train)
        anchors = td.dflash_anchors(seq, block, generated=False)
        anchors = sorted(rng.sample(anchors, min(len(anchors), args.anchors)))
        for name, vocab in kinds.items():
            started = time.thread_time()
            ctx, cpos, noise, pos, mask, lab = td.dflash_batch(seq, layers, embed, block, mask_id, anchors)
            rows = model(ctx, cpos, noise, pos, mask).view(len(anchors), block, -1)[:, 1:]
            loss = F.cross_entropy(vocab.logits(rows.reshape(-1, rows.shape[-1])), vocab.index[lab.reshape(-1)])
            opt.zero_grad()
            loss.backward()
            opt.step()
            times[name].append(time.thread_time() - started)
    sub, whole = statistics.median(times["subset"]), statistics.median(times["whole"])
    print(f"DFlash step, {args.anchors} blocks of {block}, MLP {args.intermediate}, 1 thread, thread CPU time, "
          f"median of {args.steps}: subset ({len(kinds['subset'])} + {args.negatives} rows) {sub:.2f} s, whole "
          f"vocabulary ({head.shape[0]} rows) {whole:.2f} s: {whole / sub:.1f}x; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
