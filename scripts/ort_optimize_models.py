"""Real models saved after onnxruntime's own optimizers, as many published "model_optimized.onnx" files are (issue
17): they hold com.microsoft contrib ops that the exported model did not.

- ``<name>_ort_fused``: ``onnxruntime.transformers.optimizer.optimize_model`` (the transformer fusions that
  Hugging Face Optimum's ORTOptimizer runs too): EmbedLayerNormalization, packed-QKV Attention with a 1-D mask_index,
  SkipLayerNormalization, BiasGelu.
- ``<name>_ort_extended``: an onnxruntime session at ORT_ENABLE_EXTENDED with ``optimized_model_filepath``:
  FusedMatMul (the scaled Q K^T), BiasGelu, LayerNormalization; on the dynamically quantized T5 encoder
  MatMulIntegerToFloat, DynamicQuantizeMatMul, FastGelu and (in the ONNX domain) SimplifiedLayerNormalization.

    python scripts/ort_optimize_models.py [--out DIR] [NAME ...]     # default: every model in OPTIMIZED

The files go to ``~/.cache/hetero/ort_optimized`` (never into the repository); ``made_model(name)`` makes one on
first use, which is how ``benchmarks/onnx_models.py`` and ``tests/real_models/test_ort_optimized.py`` get them
(the catalogue's ``made_by``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from real_models.models import MODELS, made_models_main  # noqa: E402

CACHE = Path.home() / ".cache" / "hetero" / "ort_optimized"
# optimized name -> (the exported model it comes from, how, the transformer fusions' num_heads and hidden_size)
OPTIMIZED: dict[str, tuple[str, str, int, int]] = {
    "minilm_l3_ort_fused": ("minilm_l3", "transformers", 12, 384),
    "minilm_l3_ort_extended": ("minilm_l3", "session", 0, 0),
    "t5_encoder_int8_ort_extended": ("t5_encoder_int8_dynamic", "session", 0, 0),
}


@contextlib.contextmanager
def _without_symbolic_shapes() -> Iterator[None]:
    """Without sympy, onnxruntime's symbolic shape inference is unavailable and its optimizer's Cast clean-up
    (which needs it) raises; the fusions themselves run without it. Skip that clean-up while it runs (only then)."""
    if importlib.util.find_spec("sympy") is not None:
        yield
        return
    import onnxruntime.transformers.onnx_model  # noqa: F401  (the optimizer imports it under two names)

    patched = []
    for module in list(sys.modules.values()):
        cls = getattr(module, "OnnxModel", None)
        if isinstance(cls, type) and "remove_useless_cast_nodes" in vars(cls):
            patched.append((cls, vars(cls)["remove_useless_cast_nodes"]))
            setattr(cls, "remove_useless_cast_nodes", lambda self: None)  # noqa: B010  (a method, patched)
    try:
        yield
    finally:
        for cls, method in patched:
            setattr(cls, "remove_useless_cast_nodes", method)  # noqa: B010


def optimize(name: str, out_dir: Path = CACHE) -> Path | None:
    """Makes ``out_dir/<name>.onnx`` from its exported model; None when that model's package is not installed."""
    source_name, how, heads, hidden = OPTIMIZED[name]
    path = MODELS[source_name].file()
    if path is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.onnx"
    partial = target.with_suffix(".partial.onnx")
    if how == "transformers":
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        options = FusionOptions("bert")
        options.enable_shape_inference = False  # needs sympy; the BERT fusions do not
        with _without_symbolic_shapes():
            model = optimize_model(str(path), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0,
                                   optimization_options=options)
        model.save_model_to_file(str(partial))
    else:
        import onnxruntime as ort

        session_options = ort.SessionOptions()
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        session_options.optimized_model_filepath = str(partial)
        ort.InferenceSession(str(path), session_options, providers=["CPUExecutionProvider"])
    partial.replace(target)
    return target


def made_model(name: str) -> Path | None:
    """The cached optimized model, made on first use (None when its exported model is not installed)."""
    target = CACHE / f"{name}.onnx"
    return target if target.is_file() else optimize(name)


def main(argv: list[str] | None = None) -> int:
    return made_models_main(__doc__ or "", {name: how[0] for name, how in OPTIMIZED.items()}, optimize, CACHE,
                            argv)

if __name__ == "__main__":
    raise SystemExit(main())
