"""Fuzzed request bodies against the running server: whatever arrives, the answer is a 2xx or a 4xx with an OpenAI
error object — never a 5xx, never a traceback, never a hang. HETERO_FUZZ_EXAMPLES sets the count (default 60)."""

from __future__ import annotations

import json
import os

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module, reason=f"{_module} is not installed (pip install 'hetero[serve]')")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from .serve_harness import running  # noqa: E402
from .serve_models import load_model  # noqa: E402

EXAMPLES = int(os.environ.get("HETERO_FUZZ_EXAMPLES", "60"))
FIELDS = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
          "logprobs", "top_logprobs", "logit_bias", "response_format", "tools", "n", "input", "echo",
          "stream_options", "presence_penalty", "role", "content"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=40))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                 "content": st.one_of(st.text(max_size=30), values)})
bodies = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=6),
    st.fixed_dictionaries({"messages": st.lists(message, max_size=3)},
                          optional={k: values for k in ("max_tokens", "temperature", "stop", "logit_bias", "seed",
                                                        "response_format", "logprobs", "top_logprobs", "stream")}),
    st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 400), max_size=6))},
                          optional={k: values for k in ("max_tokens", "echo", "logprobs", "stop", "stream")}),
)
ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]


@pytest.fixture(scope="module")
def server():
    with running([load_model(context=48)], max_queue=8) as s:  # a small context bounds every generation
        yield s


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, endpoint=st.sampled_from(ENDPOINTS), raw=st.one_of(st.none(), st.binary(max_size=64)))
def test_fuzzed_bodies_get_2xx_or_4xx(server, body, endpoint, raw):
    data = raw if raw is not None else json.dumps(body, allow_nan=True).encode()
    status, _, answer = server.request("POST", endpoint, data)
    assert status < 500, (status, data[:300], answer[:300])
    if status >= 400:
        error = json.loads(answer)["error"]
        assert isinstance(error["message"], str) and error["type"]
    assert b"Traceback" not in answer
