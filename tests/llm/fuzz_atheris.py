#!/usr/bin/env python3
"""Coverage-guided fuzzing of the LLM front ends with atheris (libFuzzer), for long runs outside the test suite.

    pip install atheris            # into a venv of your own (or: pip install --target DIR atheris; PYTHONPATH=DIR)
    python tests/llm/fuzz_atheris.py config CORPUS_DIR -fork=2 -max_total_time=3600 -timeout=20 -rss_limit_mb=4096

TARGET is one of the functions of ``fuzz_targets`` (gguf, safetensors, config, generation_config, tokenizer,
tokenizer_config). With ``-fork=N`` libFuzzer runs the inputs in N child processes and keeps going after a crash,
a hang (``-timeout``) or a memory bomb (``-rss_limit_mb``), writing each such input as ``crash-*`` / ``timeout-*``
/ ``oom-*``; a raw Python exception (anything but a HeteroError) is a crash too. Seed CORPUS_DIR with
``tests/fixtures/fuzz/llm/TARGET`` and the fixture files; put what it finds into that corpus once fixed.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


def main() -> None:
    import atheris

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with atheris.instrument_imports(include=["hetero.llm"]):
        import hetero.llm.config
        import hetero.llm.gguf
        import hetero.llm.gguf_model
        import hetero.llm.safetensors
        import hetero.llm.template
        import hetero.llm.tokenizer  # noqa: F401 - instrumented for coverage
    from hetero.contract.errors import HeteroError
    from llm import fuzz_targets

    target = getattr(fuzz_targets, sys.argv.pop(1))

    def one_input(data: bytes) -> None:
        with contextlib.suppress(HeteroError):  # a clean refusal; anything else is a finding
            target(data)

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
