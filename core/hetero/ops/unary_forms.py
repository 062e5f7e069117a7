"""How kernels see ONNX's elementwise unary ops: a snake_case op name and two float parameters.

Every backend with a unary kernel reads the same ONNX attributes the same way, so the table lives here once: each
ONNX op maps to (kernel op name, attribute feeding ``alpha``, its default, attribute feeding ``beta``, its default).
A backend registers the ONNX ops whose kernel op names it implements.
"""

from __future__ import annotations

from typing import Any

# ONNX op -> (kernel op, alpha attribute, its default, beta attribute, its default)
UNARY_FORMS: dict[str, tuple[str, str | None, float, str | None, float]] = {
    "Relu": ("relu", None, 0.0, None, 0.0),
    "LeakyRelu": ("leaky_relu", "alpha", 0.01, None, 0.0),
    "Elu": ("elu", "alpha", 1.0, None, 0.0),
    "Selu": ("selu", "alpha", 1.6732632423543772, "gamma", 1.0507009873554805),
    "Celu": ("celu", "alpha", 1.0, None, 0.0),
    "Sigmoid": ("sigmoid", None, 0.0, None, 0.0),
    "HardSigmoid": ("hard_sigmoid", "alpha", 0.2, "beta", 0.5),
    "HardSwish": ("hard_swish", None, 0.0, None, 0.0),
    "Tanh": ("tanh", None, 0.0, None, 0.0),
    "Softplus": ("softplus", None, 0.0, None, 0.0),
    "Softsign": ("softsign", None, 0.0, None, 0.0),
    "Exp": ("exp", None, 0.0, None, 0.0),
    "Log": ("log", None, 0.0, None, 0.0),
    "Sqrt": ("sqrt", None, 0.0, None, 0.0),
    "Neg": ("neg", None, 0.0, None, 0.0),
    "Abs": ("abs", None, 0.0, None, 0.0),
    "Reciprocal": ("reciprocal", None, 0.0, None, 0.0),
    "Erf": ("erf", None, 0.0, None, 0.0),
    "Floor": ("floor", None, 0.0, None, 0.0),
    "Ceil": ("ceil", None, 0.0, None, 0.0),
    "Round": ("round", None, 0.0, None, 0.0),
    "Sin": ("sin", None, 0.0, None, 0.0),
    "Cos": ("cos", None, 0.0, None, 0.0),
    "Tan": ("tan", None, 0.0, None, 0.0),
    "Mish": ("mish", None, 0.0, None, 0.0),
    "Sign": ("sign", None, 0.0, None, 0.0),
    "ThresholdedRelu": ("thresholded_relu", "alpha", 1.0, None, 0.0),
}


def unary_params(op_type: str, attrs: dict[str, Any]) -> tuple[str, float, float]:
    """(kernel op, alpha, beta) for an ONNX unary node; Gelu picks "gelu" or "gelu_tanh" by ``approximate``."""
    if op_type == "Gelu":
        return ("gelu_tanh" if attrs.get("approximate", "none") == "tanh" else "gelu"), 0.0, 0.0
    name, alpha_key, alpha, beta_key, beta = UNARY_FORMS[op_type]
    return (name, float(attrs.get(alpha_key, alpha)) if alpha_key else alpha,
            float(attrs.get(beta_key, beta)) if beta_key else beta)
