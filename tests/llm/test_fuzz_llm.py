"""Fuzzing the LLM front ends (GGUF, safetensors, config / generation_config / tokenizer / tokenizer_config JSON).

Every input is parsed in a child process (``hetero.testing.fuzz.ChildRunner``), so a crash, a hang or a memory
bomb is caught as a result; every input must end as a return or a ``HeteroError``.

* The normal run is bounded (``HETERO_FUZZ_EXAMPLES``, default 10 per harness: seconds).
* A long run: ``HETERO_FUZZ_EXAMPLES=20000 python -m pytest tests/llm/test_fuzz_llm.py -q``; with
  ``HETERO_FUZZ_SAVE=DIR`` the failing inputs are written there, to be added to the regression corpus.
* Coverage-guided runs with atheris (libFuzzer, in child processes with ``-fork``): ``tests/llm/fuzz_atheris.py``.
* The regression corpus (``tests/fixtures/fuzz/llm/<target>/``) holds the inputs that once failed; every file in
  it runs in every test run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero.testing.fuzz import ChildRunner

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CORPUS = FIXTURES / "fuzz" / "llm"
TARGETS = ("gguf", "safetensors", "config", "generation_config", "tokenizer", "tokenizer_config")
EXAMPLES = int(os.environ.get("HETERO_FUZZ_EXAMPLES", "10"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def runners():
    made: dict[str, ChildRunner] = {}

    def get(target: str) -> ChildRunner:
        if target not in made:
            made[target] = ChildRunner(f"llm.fuzz_targets:{target}", timeout=60, memory_mb=4096)
        return made[target]

    yield get
    for runner in made.values():
        runner.close()


def check(runner: ChildRunner, target: str, data: bytes) -> None:
    outcome = runner.run(data)
    if outcome.bad:
        save = os.environ.get("HETERO_FUZZ_SAVE")
        if save:
            folder = Path(save) / target
            folder.mkdir(parents=True, exist_ok=True)
            (folder / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)
    assert not outcome.bad, f"{target}: {outcome}"


# -- the regression corpus --------------------------------------------------------------------------------------------
CASES = sorted(p for p in CORPUS.glob("*/*") if p.is_file())


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_regression_corpus(runners, path):
    check(runners(path.parent.name), path.parent.name, path.read_bytes())


def test_the_corpus_covers_every_target():
    assert {p.parent.name for p in CASES} == set(TARGETS)


def test_the_runner_reports_crashes_hangs_and_raw_exceptions(tmp_path):
    """The harness would catch each failure kind (a target that crashes, hangs or raises a raw exception)."""
    script = tmp_path / "bad_targets.py"
    script.write_text("import os, signal, time\n"
                      "def crash(data): os.kill(os.getpid(), signal.SIGBUS)\n"
                      "def hang(data): time.sleep(60)\n"
                      "def raw(data): raise KeyError('x')\n"
                      "def bomb(data): bytearray(1 << 40)\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        got = {}
        for name in ("crash", "hang"):
            with ChildRunner(f"bad_targets:{name}", timeout=5, memory_mb=1024) as runner:
                got[name] = runner.run(b"x")
                assert runner.run(b"again").kind == got[name].kind  # the worker restarts after a crash / hang
        with ChildRunner("bad_targets:raw", timeout=5, memory_mb=1024) as runner:
            got["raw"] = runner.run(b"x")
            runner.target = "bad_targets:bomb"  # the next worker serves the other target
            runner.close()
            got["bomb"] = runner.run(b"x")
    finally:
        sys.path.remove(str(tmp_path))
    assert got["crash"].kind == "crashed" and "killed by SIGBUS" in got["crash"].detail
    assert got["hang"].kind == "hung"
    assert got["raw"].kind == "raised" and got["raw"].detail.startswith("KeyError: 'x'")
    assert got["bomb"].kind == "raised" and got["bomb"].detail.startswith("MemoryError")


# -- byte mutations of the binary formats -----------------------------------------------------------------------------
def _seed_safetensors() -> bytes:
    import tempfile

    import numpy as np

    from hetero.llm import safetensors

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        safetensors.write(path, {"a": np.arange(12, dtype=np.float32).reshape(3, 4),
                                 "b": np.ones(5, dtype=np.float16)}, {"format": "pt"})
        return path.read_bytes()


def _gguf_head() -> bytes:
    """The fixture GGUF up to its data section, plus a little data (mutations of the weights are just numbers)."""
    from hetero.llm.gguf import GgufFile

    data = (FIXTURES / "gguf" / "qwen3-q8_0.gguf").read_bytes()
    gf = GgufFile(FIXTURES / "gguf" / "qwen3-q8_0.gguf")
    start = gf.data_start
    gf.close()
    return data[:start], data[start:]


mutations = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8)


@FUZZ
@given(flips=mutations, cut=st.one_of(st.none(), st.floats(0, 1)))
def test_gguf_mutations(runners, flips, cut):
    head, data = _GGUF
    mutated = bytearray(head)
    for where, value in flips:
        mutated[int(where * len(mutated))] = value
    blob = bytes(mutated) + data
    check(runners("gguf"), "gguf", blob[:int(cut * len(blob))] if cut is not None else blob)


@FUZZ
@given(flips=mutations, cut=st.one_of(st.none(), st.floats(0, 1)))
def test_safetensors_mutations(runners, flips, cut):
    mutated = bytearray(_SAFETENSORS)
    header = 8 + int.from_bytes(_SAFETENSORS[:8], "little")
    for where, value in flips:
        mutated[int(where * header)] = value
    blob = bytes(mutated)
    check(runners("safetensors"), "safetensors", blob[:int(cut * len(blob))] if cut is not None else blob)


_GGUF = _gguf_head()
_SAFETENSORS = _seed_safetensors()


# -- structural mutations of the JSON files ---------------------------------------------------------------------------
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([10**400, -1, 0, 2**63]),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
              st.sampled_from(["qwen3", "Qwen3ForCausalLM", "yarn", "linear", "default", ""])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def _mutate_json(seed: dict, edits: list[tuple[int, object]], deletes: list[int]) -> bytes:
    data = dict(seed)
    keys = sorted(data)
    for index, value in edits:
        data[keys[index % len(keys)]] = value
    for index in deletes:
        data.pop(keys[index % len(keys)], None)
    return json.dumps(data, allow_nan=True).encode()


def _json_seed(*parts: str) -> dict:
    return json.loads((FIXTURES / "llm").joinpath(*parts).read_text())


SEEDS = {
    "config": [_json_seed("qwen3", "config.json"), _json_seed("qwen3_moe", "config.json"),
               _json_seed("qwen3_5", "config.json")],
    "generation_config": [{**_json_seed("qwen3", "generation_config.json"), "do_sample": True}],
    "tokenizer_config": [_json_seed("qwen3", "tokenizer_config.json")],
    "tokenizer": [_json_seed("qwen3", "tokenizer.json")],
}
edits = st.lists(st.tuples(st.integers(0, 1000), json_values), min_size=1, max_size=4)


@FUZZ
@given(target=st.sampled_from(["config", "generation_config", "tokenizer_config", "tokenizer"]),
       seed=st.integers(0, 2), changes=edits, deletes=st.lists(st.integers(0, 1000), max_size=2))
def test_json_structure_mutations(runners, target, seed, changes, deletes):
    seeds = SEEDS[target]
    check(runners(target), target, _mutate_json(seeds[seed % len(seeds)], changes, deletes))


TEMPLATE_PIECES = ["{% for i in range(100000) %}", "{% endfor %}", "{{ 'x' * 100000 }}", "{% set ns.s = ns.s ~ ns.s %}",
                   "{{ messages * 1000 }}", "{{ raise_exception('no') }}", "{% if %}", "{{ x.__class__ }}",
                   "{% set ns = namespace(s='ab') %}", "{{ 'a'.ljust(99999999) }}", "{{ 9 ** 99999 }}"]


@FUZZ
@given(pieces=st.lists(st.sampled_from(TEMPLATE_PIECES), min_size=1, max_size=6))
def test_chat_template_mutations(runners, pieces):
    data = dict(SEEDS["tokenizer_config"][0])
    data["chat_template"] = "".join(pieces) + str(data.get("chat_template", ""))
    check(runners("tokenizer_config"), "tokenizer_config", json.dumps(data).encode())


@FUZZ
@given(target=st.sampled_from(["config", "generation_config"]), flips=mutations)
def test_json_byte_mutations(runners, target, flips):
    text = bytearray(json.dumps(SEEDS[target][0]).encode())
    for where, value in flips:
        text[int(where * len(text))] = value
    check(runners(target), target, bytes(text))

