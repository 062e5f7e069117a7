"""LLMs on hetero: Qwen2 / Qwen3 / Qwen3-MoE from Hugging Face folders, with generate, chat and bench.

    import hetero.llm
    llm = hetero.llm.load("Qwen3-0.6B", quant="q4", context=4096)
    print(llm.chat([{"role": "user", "content": "Hi!"}]))

Importing this package is cheap: the loader, tokenizer and families load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batch import decode_step
    from .loader import load
    from .model import Llm, Stats
    from .sampler import Sampler, SamplingDefaults, SamplingParams

_LAZY = {
    "load": ("loader", "load"),
    "Llm": ("model", "Llm"),
    "Stats": ("model", "Stats"),
    "Sampler": ("sampler", "Sampler"),
    "SamplingParams": ("sampler", "SamplingParams"),
    "SamplingDefaults": ("sampler", "SamplingDefaults"),
    "load_synthetic": ("synthetic", "load_synthetic"),
    "decode_step": ("batch", "decode_step"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        module, attr = _LAZY[name]
        return getattr(import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Llm", "Sampler", "SamplingDefaults", "SamplingParams", "Stats", "decode_step", "load", "load_synthetic"]
