"""The line the LLM commands print after a reply: model size, load time, time to first token, prefill and decode
speed, and the sampling settings in force with where they came from (``Llm.sampling_defaults``: the file's keys,
llama.cpp's defaults, generation_config.json; or the flags)."""

from __future__ import annotations

from typing import Any

# SamplingParams fields -> the flags that set them, in the order they are printed.
_FLAGS = (("temperature", "temp"), ("top_k", "top-k"), ("top_p", "top-p"), ("min_p", "min-p"),
          ("repetition_penalty", "repeat-penalty"), ("presence_penalty", "presence-penalty"),
          ("frequency_penalty", "frequency-penalty"), ("seed", "seed"))
_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "seed": None}


def sampling_text(llm: Any, overrides: dict[str, Any]) -> str:
    """``temp 0.8 top-k 40 top-p 0.95 min-p 0.05 (llama.cpp defaults)``, or ``greedy (--temp 0)``."""
    params = llm.sampling_params(**overrides)
    given = {k for k, v in overrides.items() if v is not None}
    from_model = [k for k, _ in _FLAGS if k not in given]
    source = llm.sampling_defaults.source  # the file's keys, llama.cpp's defaults, generation_config.json
    if params.temperature == 0:
        if "temperature" in given:
            return "greedy (--temp 0)"
        return source if source.startswith("greedy") else f"greedy ({source})"
    parts = []
    for key, flag in _FLAGS:
        value = getattr(params, key)
        if key != "temperature" and value == _OFF[key]:
            continue
        parts.append(f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}")
    origin = source if not given else ("flags" if not from_model else f"flags + {source}")
    return f"{' '.join(parts)} ({origin})"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def stats_line(llm: Any, load_seconds: float, first_token_seconds: float | None, overrides: dict[str, Any]) -> str:
    s = llm.stats
    first = first_token_seconds if first_token_seconds is not None else s.prefill_seconds
    quant = f" {llm.quant}" if getattr(llm, "quant", "") else ""
    return (f"[model {_size(llm.size_bytes())}{quant}, loaded in {load_seconds:.2f} s | prompt {s.prompt_tokens} "
            f"tokens ({s.cached_tokens} cached), {s.prefill_tokens_per_second:.1f} t/s, first token after "
            f"{first:.2f} s | generated {s.generated_tokens} tokens, {s.decode_tokens_per_second:.1f} t/s"
            f"{_speculative(s)} | sampling {sampling_text(llm, overrides)}]")


def _speculative(s: Any) -> str:
    if not getattr(s, "verify_steps", 0):
        return ""
    return (f" (speculative: {s.acceptance_rate:.0%} of {s.drafted_tokens} drafts accepted, "
            f"{s.tokens_per_verify:.2f} tokens per verify step)")
