"""The XPRESS encoder, decoded by an independent implementation (dissect.util's lzxpress)."""

import numpy as np
import pytest
from dissect.util.compression.lzxpress import decompress

from pipeline.synth.xpress import compress


@pytest.mark.parametrize("run, expected", [
    # one literal + one match of length run-1 at offset 1; sizes prove which length form was used:
    # flags(4) + literal(1) + token(2) [+ nibble(1) [+ byte(1) [+ u16(2) [+ u32(4)]]]]
    (1 + 9, 4 + 1 + 2),                    # inline 3-bit length (<= 9)
    (1 + 24, 4 + 1 + 2 + 1),               # nibble (10..24)
    (1 + 279, 4 + 1 + 2 + 1 + 1),          # extra byte (25..279)
    (1 + 65538, 4 + 1 + 2 + 1 + 1 + 2),    # u16 escape
    (1 + 200_000, 4 + 1 + 2 + 1 + 1 + 2 + 4),  # u32 escape
])
def test_length_forms(run, expected):
    data = b"z" * run
    z = compress(data)
    assert len(z) == expected
    assert decompress(z) == data


def test_shared_nibble_two_long_matches():
    # two matches needing a nibble share one byte: high nibble on the second use
    data = b"a" * 13 + b"b" + b"a" * 13
    z = compress(data)
    assert decompress(z) == data


@pytest.mark.parametrize("n", [0, 1, 2, 3, 31, 32, 33, 64, 1000])
def test_flag_word_boundaries(n):
    data = bytes(np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8))
    assert decompress(compress(data)) == data


def test_varied_offsets_and_lengths():
    rng = np.random.default_rng(7)
    words = [bytes(rng.integers(0, 256, int(rng.integers(3, 90)), dtype=np.uint8)) for _ in range(60)]
    data = b"".join(words[int(i)] for i in rng.integers(0, len(words), 3000))
    z = compress(data)
    assert decompress(z) == data
    assert len(z) < len(data) // 3


def test_incompressible_and_window_edge():
    rng = np.random.default_rng(8)
    noise = bytes(rng.integers(0, 256, 9000, dtype=np.uint8))
    data = noise + noise[:500] + noise[-8192:-8000]    # matches at and beyond the 8 KiB window
    assert decompress(compress(data)) == data
