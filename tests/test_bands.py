"""Row bands on threads (medrt.bands): the same bits as one band, on large frames only."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from medrt import bands
from medrt.preprocess import block_mean, normalize


@pytest.mark.parametrize(("rows", "n", "multiple"), [(4096, 8, 1), (4096, 8, 16), (4000, 3, 3), (7, 8, 1),
                                                     (10, 4, 4), (1, 8, 1), (0, 4, 1)])
def test_bands_cover_the_rows_once_on_block_boundaries(rows: int, n: int, multiple: int) -> None:
    got = bands.bands(rows, n, multiple)
    assert len(got) <= n
    assert [r for a, b in got for r in range(a, b)] == list(range(rows))
    assert all(a % multiple == 0 for a, _ in got)


def _threads(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setenv("MEDRT_BAND_THREADS", str(n))


def test_banded_passes_are_bit_identical_to_one_band(monkeypatch: pytest.MonkeyPatch) -> None:
    """Normalise and block means (whole and ragged blocks, factors that are not powers of
    two) of a frame large enough to be banded give exactly the one-thread result."""
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 4096, size=(2050, 1101), dtype=np.uint16)  # 2.26 Mpixel
    assert frame.size >= bands.MIN_PIXELS
    cases = [lambda: normalize(frame, 1500.0, 2500.0), lambda: block_mean(frame, 4, 4),
             lambda: block_mean(frame, 3, 7), lambda: block_mean(frame[:2048, :1100], 16, 16)]
    _threads(monkeypatch, 1)
    want = [f() for f in cases]
    _threads(monkeypatch, 5)
    for f, w in zip(cases, want, strict=True):
        got = f()
        assert got.dtype == np.float32 and got.shape == w.shape
        np.testing.assert_array_equal(got, w)


def test_small_frames_and_calls_from_a_band_stay_on_their_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 512² slice is not handed off; a banded call made from inside a band runs there
    (waiting on the same pool could deadlock it)."""
    _threads(monkeypatch, 4)
    seen: list[str] = []
    bands.for_bands(lambda a, b: seen.append(threading.current_thread().name), 512, pixels=512 * 512)
    assert seen == [threading.current_thread().name]

    inner: list[list[str]] = []

    def outer(a: int, b: int) -> None:
        names: list[str] = []
        bands.for_bands(lambda c, d: names.append(threading.current_thread().name), b - a, pixels=1 << 24)
        inner.append(names)

    bands.for_bands(outer, 4096, pixels=1 << 24)
    assert len(inner) == 4 and all(len(names) == 1 for names in inner)
    assert bands.map_bands(lambda x: x * x, [1, 2, 3], pixels=1 << 24) == [1, 4, 9]  # in order


def test_an_error_in_one_band_is_raised_after_all_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    _threads(monkeypatch, 4)
    done: list[int] = []

    def work(a: int, b: int) -> None:
        if a == 0:
            raise ValueError("band 0")
        done.append(a)

    with pytest.raises(ValueError, match="band 0"):
        bands.for_bands(work, 4096, pixels=1 << 24)
    assert len(done) == 3


def test_a_bad_thread_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDRT_BAND_THREADS", "many")
    with pytest.raises(ValueError, match="MEDRT_BAND_THREADS"):
        bands.threads()


def test_a_large_radiograph_gives_the_same_findings_on_one_thread_and_several(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole analysis of a 2048² phantom radiograph (ROI path, crops on the pool, and
    the whole frame; both with the fine sweep): the same label map and lesions with one
    band thread and with several."""
    from medrt.analyzer import AnalyzerConfig, load_analyzer
    from medrt.phantom import generate_radiograph

    phantom = generate_radiograph(1000, size=2048, index=0)
    frame = phantom.as_frame("bands")
    analyzer = load_analyzer(AnalyzerConfig(roi_model="roi_classifier_dx", seg_model="lesion_unet",
                                            warmup_shapes=((256, 256),)))
    for mode in ("roi", "full"):
        _threads(monkeypatch, 1)
        one = analyzer.analyze(frame, mode=mode)
        _threads(monkeypatch, 3)
        several = analyzer.analyze(frame, mode=mode)
        if mode == "roi":
            assert len(one.crops) > 1, "the test needs several crops to hand out"
        assert len(one.lesions) > 0
        np.testing.assert_array_equal(one.labels, several.labels)
        assert [(les.bbox, les.area_mm2, les.diameter_mm) for les in one.lesions] == \
            [(les.bbox, les.area_mm2, les.diameter_mm) for les in several.lesions]
