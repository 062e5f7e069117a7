"""The decode step on HVX (``hvx_decoder``): the qwen3 fixture in hetero q4, every linear layer, norm and RoPE a
hetero_hvx call run under qemu-hexagon (the device path's code, through the FastRPC dispatcher), attention on the
host; against hetero's cpu with the same q4 weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetero.contract.errors import BackendUnavailable
from hetero.llm.loader import load

from .test_htp_llm import float_weights

hvx_decoder = pytest.importorskip("hetero_hexagon.hvx_decoder")
hvx_qemu = pytest.importorskip("hetero_hexagon.hvx_qemu")
llm_graph = pytest.importorskip("hetero_hexagon.llm_graph")
FOLDER = Path(__file__).resolve().parents[2] / "fixtures" / "llm" / "qwen3"
# measured: 0.096 on logits of magnitude <= 6 (both quantize the activations to int8 blocks; the sums' order differs)
CPU_TOLERANCE = 0.2


@pytest.fixture(scope="module")
def qemu():
    try:
        return hvx_qemu.QemuTransport(hvx_qemu.find_toolchain())
    except BackendUnavailable as e:
        pytest.skip(e.message)


def test_hvx_decode_steps_match_cpu_q4(qemu):
    config = json.loads((FOLDER / "config.json").read_text())
    ids = json.loads((FOLDER / "expected.json").read_text())["prompts"][0]["ids"][:5]
    decoder = hvx_decoder.HvxDecoder(llm_graph.DecoderShape.from_config(config), float_weights(FOLDER), context=16,
                                     transport=qemu, where="qemu-hexagon")
    assert decoder.name == "hexagon (HVX on qemu-hexagon, q4)" and "not the DSP's" in decoder.note
    cpu = load(FOLDER, backends=["cpu"], quant="q4", all_logits=True, context=16)
    on_cpu = cpu.forward(ids)
    on_hvx = decoder.run(ids, 0)
    assert np.abs(on_hvx - on_cpu).max() < CPU_TOLERANCE
    assert on_hvx.argmax(axis=1).tolist() == on_cpu.argmax(axis=1).tolist()
    # rolling back: the last token again after the first four gives its row again
    np.testing.assert_allclose(decoder.run(ids[4:], 4)[0], on_hvx[4], rtol=0, atol=1e-6)


class _Counting:
    """The qemu transport, counting the calls of each method."""

    def __init__(self, transport) -> None:
        self.transport, self.calls = transport, {}

    def invoke(self, method, inputs, output_sizes):
        self.calls[method] = self.calls.get(method, 0) + 1
        return self.transport.invoke(method, inputs, output_sizes)


def test_a_verify_block_is_one_pass_and_the_tokens_one_at_a_time_bit_for_bit(qemu):
    """Speculative decoding's verify path on HVX: a block of drafted tokens runs as one pass -- each linear layer one
    hvx_matmul_q4 call for all of them, not one per token -- and its logits are bit for bit the tokens decoded one
    at a time; a rejected tail is forgotten by the next call's ``past``."""
    from hetero_hexagon.hvx_ops import METHOD_MATMUL_Q4, METHOD_MATVEC_Q4

    config = json.loads((FOLDER / "config.json").read_text())
    ids = json.loads((FOLDER / "expected.json").read_text())["prompts"][0]["ids"][:7]
    shape, weights = llm_graph.DecoderShape.from_config(config), float_weights(FOLDER)
    counting = _Counting(qemu)
    block = hvx_decoder.HvxDecoder(shape, weights, context=16, transport=counting, where="qemu-hexagon")
    single = hvx_decoder.HvxDecoder(shape, weights, context=16, transport=qemu, where="qemu-hexagon")
    prompt = block.run(ids[:3], 0)
    linears = 7 * shape.layers + 1  # q, k, v, o, gate, up, down per layer, and the LM head
    assert counting.calls == {**counting.calls, METHOD_MATMUL_Q4: linears} and METHOD_MATVEC_Q4 not in counting.calls
    verified = block.run(ids[3:7], 3)  # a 4-token block: the last accepted token and three drafts
    assert counting.calls[METHOD_MATMUL_Q4] == 2 * linears
    one_at_a_time = np.concatenate([single.run([t], i) for i, t in enumerate(ids)])
    np.testing.assert_array_equal(np.concatenate([prompt, verified]).view(np.uint32), one_at_a_time.view(np.uint32))
    # two drafts rejected: the next block starts after position 4, and its rows are again the one-token ones
    again = block.run([ids[5], ids[4]], 5)
    single.run([ids[5]], 5)
    np.testing.assert_array_equal(again[1].view(np.uint32), single.run([ids[4]], 6)[0].view(np.uint32))
