"""Depthwise convs on flat maps (``dw_plane_shared``: AVX-512, and AVX2 at stride 1): 5x5 taps on maps of at most 6
output rows wider than a vector (PP-OCRv5's text classifier: 5 x 80 and 3 x 80, strides 1 and (2, 1)) run blocks of
all their rows that skip the buffer's rows of zero padding; the other shapes here check that the rest of the row
kernel is unchanged. Against float64 on every ISA at 1 and 2 threads, and bit for bit against the 2 x 2 blocks (on
AVX2: dw_plane's blocks) that load every row, which a fresh process with HETERO_CPU_DW_FLAT=0 runs instead."""

from __future__ import annotations

import sys

import pytest

from .test_dw_blocked_rows import check_against_float64, check_same_bits_with_paths_off, save_all_outputs

CASES = [
    # (N, C, H, W, kh, kw, strides, pads (top, left, bottom, right), dilations)
    (2, 24, 5, 80, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # PP-OCRv5 cls: 5 x 80 (one block of 5 rows)
    (2, 24, 3, 80, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # 3 x 80 (a block of 3; 9 of 15 row taps hold input)
    (1, 20, 5, 80, 5, 5, (2, 1), (2, 2, 2, 2), (1, 1)),  # strides (2, 1): 5 x 80 -> 3 x 80
    (1, 7, 4, 37, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # 4 rows (2 + 2) of 37 (a part vector)
    (1, 5, 6, 33, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # 6 rows (3 + 3) of 33
    (1, 3, 2, 40, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # 2 rows (1 + 1), both padding rows on each side
    (1, 3, 1, 17, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # one row, one column past a vector
    (1, 4, 5, 50, 5, 5, (1, 1), (0, 2, 4, 2), (1, 1)),  # all the padding below: rows 0-4 of the 5-row block
    (1, 4, 7, 48, 5, 5, (2, 1), (3, 1, 1, 3), (1, 1)),  # uneven pads, stride (2, 1): 3 rows
    (1, 4, 9, 40, 5, 5, (2, 1), (2, 2, 2, 2), (1, 1)),  # stride (2, 1) onto 5 rows
    (1, 6, 5, 80, 5, 5, (2, 2), (2, 2, 2, 2), (1, 1)),  # stride 2 along W: the 2 x 2 blocks
    (1, 6, 12, 40, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # 12 rows: the 2 x 2 blocks
    (1, 6, 10, 80, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # 3x3 (4 x 2 blocks)
    (1, 6, 9, 12, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),  # 3x3 / 2 on rows of one vector (8-row blocks)
    (1, 3, 100, 90, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),  # in bands (depthwise_bands)
    (1, 6, 3, 80, 5, 5, (1, 1), (4, 2, 4, 2), (2, 1)),  # dilated along H: the generic taps (no skip)
]


SEED = 141


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_dw_flat_against_float64(isa, threads, case):
    check_against_float64(case, SEED)


def all_outputs() -> None:
    save_all_outputs(CASES, SEED, sys.argv[1])


def test_dw_flat_same_bits_as_the_2x2_blocks(tmp_path):
    check_same_bits_with_paths_off("test_dw_flat", ("HETERO_CPU_DW_FLAT",), len(CASES), tmp_path)
