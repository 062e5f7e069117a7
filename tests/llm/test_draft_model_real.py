"""The draft model on a real pair: Qwen2.5-Coder-1.5B-Instruct drafted for by Qwen2.5-Coder-0.5B-Instruct (GGUF
files; docs/speculative.md says where they come from). Greedy output must be plain decoding's, token for token, and
the drafts must be accepted (the pair agrees on most code tokens). Skipped when a file is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import backend_ok
from hetero.llm.speculative import Speculation, make_drafter

from .helpers import load

TARGET = Path(os.environ.get("HETERO_SPEC_TARGET", "/work/models/qwen2.5-coder-1.5b.gguf"))
DRAFT = Path(os.environ.get("HETERO_SPEC_DRAFT", "/work/models/sns-0.5b.gguf"))


@pytest.mark.slow
def test_real_draft_model_keeps_the_output_and_is_accepted():
    for path, what in ((TARGET, "HETERO_SPEC_TARGET"), (DRAFT, "HETERO_SPEC_DRAFT")):
        if not path.is_file():
            pytest.skip(f"{path} is missing (set {what} to a GGUF file)")
    ok, why = backend_ok("cpu")
    if not ok:
        pytest.skip(why)
    target = load(TARGET, backends=["cpu"], context=256, kv_cache="f16")
    prompt = "def fibonacci(n):\n"
    want = target.generate(prompt, 16, temperature=0)
    tokens = list(target.last.tokens)
    # the defaults (draft vocabulary, re-quantized to q4, its own lookup); the whole head; the stored formats, one
    # token per draft-model step
    for vocab in ("", ",vocab=all", ",quant=none,lookup=0"):
        spec = Speculation(make_drafter(f"draft:{DRAFT}{vocab}", target), max_draft=4, adaptive=False)
        target.generate(prompt, 16, temperature=0, spec=spec)
        assert list(target.last.tokens) == tokens and target.last.text == want, vocab
        assert target.stats.verify_steps > 0 and target.stats.accepted_tokens > 0, vocab
