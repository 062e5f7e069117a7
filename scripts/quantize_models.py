"""Quantized variants of real fp32 models, made with onnxruntime's own quantizer (no quantized convolutional model
ships in a PyPI wheel that this project found), calibrated on the model's own benchmark input and two perturbed
copies: magika's every Conv statically in the QOperator format (``QLinearConv``: uint8 activations, int8 weights per
output channel, QuantizeLinear / DequantizeLinear at the borders to the float ops), and paraphrase-MiniLM-L3's
MatMuls statically in the QDQ format (``minilm_l3_qdq``: DequantizeLinear of uint8 activations and of int8 weights per
column in front of each float MatMul, the attention's activation x activation products included: what hetero's
``fuse_qdq_matmul`` fuses).

    python scripts/quantize_models.py [--out DIR] [NAME ...]     # default: every model in QUANTIZED

The files go to ``~/.cache/hetero/quantized`` (never into the repository); ``quantized_model(name)`` makes one on
first use, which is how ``benchmarks/onnx_models.py`` and ``tests/real_models/test_quantized.py`` get them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from real_models.models import MODELS, Feeds, made_models_main  # noqa: E402

CACHE = Path.home() / ".cache" / "hetero" / "quantized"
# quantized name -> the fp32 model it comes from
QUANTIZED = {"magika_qlinearconv": "magika", "minilm_l3_qdq": "minilm_l3"}
# quantized name -> (format, op types quantized)
SETTINGS = {"magika_qlinearconv": ("QOperator", ["Conv"]), "minilm_l3_qdq": ("QDQ", ["MatMul"])}


def _calibration(feeds: Feeds) -> list[Feeds]:
    rng = np.random.default_rng(0)
    out = [feeds]
    for scale in (0.9, 1.1):
        out.append({k: (v * scale + rng.normal(0, 0.01, v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
                    for k, v in feeds.items()})
    return out


def quantize(name: str, out_dir: Path = CACHE) -> Path | None:
    """Makes ``out_dir/<name>.onnx`` from its fp32 model; None when that model's package is not installed."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    source = MODELS[QUANTIZED[name]]
    path = source.file()
    if path is None:
        return None
    samples = _calibration(source.feeds(source))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(samples)

        def get_next(self) -> Feeds | None:
            return next(self.left, None)

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.onnx"
    partial = target.with_suffix(".partial.onnx")
    quant_format, op_types = SETTINGS[name]
    quantize_static(str(path), str(partial), Reader(), quant_format=QuantFormat[quant_format],
                    op_types_to_quantize=op_types, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    partial.replace(target)
    return target


def quantized_model(name: str) -> Path | None:
    """The cached quantized model, made on first use (None when its fp32 model is not installed)."""
    target = CACHE / f"{name}.onnx"
    return target if target.is_file() else quantize(name)


made_model = quantized_model  # the name the catalogue's made_by calls


def main(argv: list[str] | None = None) -> int:
    return made_models_main(__doc__ or "", QUANTIZED, quantize, CACHE, argv)

if __name__ == "__main__":
    raise SystemExit(main())
