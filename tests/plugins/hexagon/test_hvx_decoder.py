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
