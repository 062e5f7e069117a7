"""A BERT sentence encoder (paraphrase-MiniLM-L3-v2, exported by PyTorch at opset 17: LayerNormalization, erf GELU,
12-head attention with an additive padding mask, mean pooling over the mask) against onnxruntime, on cpu and opencl."""

from __future__ import annotations

import numpy as np

from .conftest import Agreement, hetero_session, model_path, ort_runner
from .models import token_batch

POOLED = "461"  # the mean-pooled sentence embedding [batch, 384] (the export's own output name)


def test_encoder(agreement: Agreement, backend: str) -> None:
    """Token states and pooled embeddings of padded batches of two shapes, then what the padding must not change:
    a sentence's embedding alone equals its embedding padded inside a batch (the mask keeps the padding out of
    attention and pooling), in hetero as in onnxruntime."""
    path = model_path("minilm_l3")
    ort_run, session = ort_runner(path), hetero_session(path, agreement, backend)
    batch = token_batch([62, 30, 7], seed=0)
    for feeds in (batch, token_batch([20, 5], seed=1), batch):
        want, got = ort_run(feeds), session.run(feeds)
        agreement.check_all(got, want)
        assert got[POOLED].shape == (len(feeds["input_ids"]), 384)
    # the 7-token sentence (third row) alone: no padding at all
    alone = {name: value[2:3, : 7 + 2] for name, value in batch.items()}
    want, got = ort_run(alone), session.run(alone)
    agreement.check_all(got, want)
    padded = session.run(batch)[POOLED][2]
    np.testing.assert_allclose(got[POOLED][0], padded, rtol=1e-4, atol=1e-5)
    agreement.check_hot_path()
