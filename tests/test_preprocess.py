"""Windowing and block means (medrt.preprocess): the fused pass and the lazily normalised
frame give exactly the values of normalising first, then averaging."""

from __future__ import annotations

import numpy as np
import pytest

from medrt import bands
from medrt.analysis.segment import _region
from medrt.preprocess import Windowed, block_mean, normalize, normalized_block_mean

WINDOW = (1500.0, 2500.0)


def _threads(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setenv("MEDRT_BAND_THREADS", str(n))


@pytest.mark.parametrize("threads", [1, 5])
def test_normalized_block_mean_is_block_mean_of_normalize(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Bit for bit, on one thread and in bands: whole and ragged blocks, factors that are
    not powers of two, integer and float pixels, values clipped at both ends of the window."""
    _threads(monkeypatch, threads)
    rng = np.random.default_rng(7)
    frames = [rng.integers(0, 4096, size=(2050, 1101), dtype=np.uint16),  # banded: 2.26 Mpixel
              (rng.random((4095, 33)) * 5000.0 - 800.0).astype(np.float32),
              rng.integers(-1024, 3000, size=(7, 5)).astype(np.float32)]
    assert frames[0].size >= bands.MIN_PIXELS
    for frame in frames:
        for factors in ((2, 2), (4, 4), (3, 7), (1, 1), (16, 16)):
            want = block_mean(normalize(frame, *WINDOW), *factors)
            got = normalized_block_mean(frame, *WINDOW, *factors)
            assert got.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="2-D"):
        normalized_block_mean(np.zeros((2, 3, 4), np.float32), *WINDOW, 2, 2)
    with pytest.raises(ValueError, match="positive"):
        normalized_block_mean(frames[2], *WINDOW, 0, 2)


def test_a_windowed_frame_gives_normalize_values_where_read() -> None:
    rng = np.random.default_rng(8)
    pixels = (rng.random((301, 257)) * 4000.0).astype(np.float32)
    norm = normalize(pixels, *WINDOW)
    w = Windowed(pixels, *WINDOW)
    assert w.shape == (301, 257) and w.ndim == 2
    for box in ((10, 20, 60, 90), (-7, -3, 40, 33), (280, 240, 330, 300), (400, 400, 410, 420), (0, 0, 301, 257)):
        np.testing.assert_array_equal(w.region(*box), _region(norm, *box))
    means = w.block_mean(2, 2)
    np.testing.assert_array_equal(means, block_mean(norm, 2, 2))
    assert w.block_mean(2, 2) is means  # kept for the next reader
    assert w._whole is None  # nothing so far normalised all of it
    np.testing.assert_array_equal(np.asarray(w), norm)
    np.testing.assert_array_equal(w.block_mean(3, 5), block_mean(norm, 3, 5))  # from the whole, once made
    np.testing.assert_array_equal(w.region(-7, -3, 40, 33), _region(norm, -7, -3, 40, 33))
    with pytest.raises(ValueError, match="2-D"):
        Windowed(np.zeros((3, 4, 5), np.float32), *WINDOW)
