"""The lesion overlay: RGBA fill and outline, the rendered picture with size labels, the PNG."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydicom.dataset import Dataset

from medrt.analysis.lesions import lesions_from_probability
from medrt.export.write import atomic_write
from medrt.overlay import (
    font_size,
    grayscale,
    label_text,
    lesion_color,
    overlay_rgba,
    render,
    save_png,
)
from medrt.types import (
    Frame,
    FrameResult,
    Lesion,
    SourceRef,
    SpacingSource,
    StageTimings,
    Window,
)

FILL, EDGE = round(0.2 * 255), round(0.7 * 255)
WINDOW = Window(500.0, 1000.0)


def make_result(
    pixels: np.ndarray,
    labels: np.ndarray,
    lesions: tuple[Lesion, ...] | None = None,
    spacing: tuple[float, float] | None = (0.5, 0.5),
    window: Window = WINDOW,
) -> FrameResult:
    """A FrameResult on a synthetic frame; lesions measured from ``labels`` unless given."""
    if lesions is None:
        labels, found = lesions_from_probability((labels > 0).astype(np.float32), spacing, 0.5)
        lesions = tuple(found)
    frame = Frame(
        pixels=np.asarray(pixels, np.float32), spacing_mm=spacing,
        spacing_source=SpacingSource.PIXEL_SPACING if spacing else SpacingSource.NONE,
        window=window, photometric="MONOCHROME2", sop_class_uid="", sop_instance_uid="synthetic",
        series_instance_uid="", study_instance_uid="", frame_of_reference_uid=None, modality="OT",
        frame_index=0, source=SourceRef(Dataset()),
    )
    return FrameResult(frame=frame, lesions=lesions, labels=np.asarray(labels, np.uint16),
                       presence=1.0, proposals=(), crops=(), mode="full", timings=StageTimings(),
                       backend="test", precision="fp32", models=("test@1",))


def disk(shape: tuple[int, int], center: tuple[float, float], radius: float) -> np.ndarray:
    rr, cc = np.ogrid[: shape[0], : shape[1]]
    return (rr - center[0]) ** 2 + (cc - center[1]) ** 2 <= radius**2


def touching_labels() -> np.ndarray:
    """Three labels: a box, a disk touching it, and a blob cut by the image corner."""
    lab = np.zeros((48, 64), np.uint16)
    lab[5:16, 5:21] = 1
    lab[disk(lab.shape, (10, 27), 6) & (lab == 0)] = 2
    lab[disk(lab.shape, (46, 62), 9)] = 3
    return lab


def expected_edge(labels: np.ndarray, px: int) -> np.ndarray:
    """Brute force: a labelled pixel is outline when a pixel of another value lies within
    ``px`` (Chebyshev distance) inside the image; the image border itself is no edge."""
    rows, cols = labels.shape
    out = np.zeros(labels.shape, bool)
    for r, c in zip(*np.nonzero(labels), strict=True):
        win = labels[max(r - px, 0) : r + px + 1, max(c - px, 0) : c + px + 1]
        out[r, c] = bool((win != labels[r, c]).any())
    return out


# --------------------------------------------------------------------------- overlay_rgba


@pytest.mark.parametrize("px", [0, 1, 2, 3])
def test_rgba_is_opaque_exactly_on_labels_with_outline_on_the_boundary(px: int) -> None:
    lab = touching_labels()
    res = make_result(np.zeros(lab.shape), lab, lesions=())
    rgba = overlay_rgba(res, outline_px=px)
    assert rgba.shape == (*lab.shape, 4) and rgba.dtype == np.uint8
    alpha = rgba[..., 3]
    assert np.array_equal(alpha > 0, lab > 0)
    edge = expected_edge(lab, px) if px else np.zeros(lab.shape, bool)
    assert np.array_equal(alpha == EDGE, edge)
    assert np.array_equal(alpha == FILL, (lab > 0) & ~edge)
    for value in (1, 2, 3):
        assert (rgba[lab == value, :3] == lesion_color(value)).all()
    assert not rgba[lab == 0].any()
    # The blob cut by the image corner is not outlined along the image border.
    assert (alpha[-1, -3:] == FILL).all() and (alpha[-3:, -1] == FILL).all()


def test_rgba_alphas_are_settings_and_colours_distinct() -> None:
    lab = touching_labels()
    rgba = overlay_rgba(make_result(np.zeros(lab.shape), lab, lesions=()),
                        fill_alpha=0.0, outline_alpha=1.0, outline_px=1)
    assert np.array_equal(rgba[..., 3] == 255, expected_edge(lab, 1))
    assert set(np.unique(rgba[..., 3])) == {0, 255}
    assert len({lesion_color(k) for k in range(1, 11)}) == 10
    assert lesion_color(11) == lesion_color(1)


# --------------------------------------------------------------------------- render


def test_render_windows_to_grey_and_composites_only_on_lesions() -> None:
    ramp = np.tile(np.linspace(-500, 1500, 64, dtype=np.float32), (48, 1))
    lab = touching_labels()
    res = make_result(ramp, lab, lesions=())
    gray = grayscale(res)
    assert gray[0, 0] == 0 and gray[0, -1] == 255  # window 0..1000, clipped outside
    assert np.all(np.diff(gray[0].astype(int)) >= 0)
    rgb = render(res)
    assert rgb.shape == (*lab.shape, 3) and rgb.dtype == np.uint8
    outside = lab == 0
    assert all(np.array_equal(rgb[..., k][outside], gray[outside]) for k in range(3))
    a = overlay_rgba(res)[..., 3:].astype(np.float32) / 255.0
    blend = gray[..., None] * (1 - a) + overlay_rgba(res)[..., :3] * a
    inside = ~outside
    assert np.abs(rgb[inside].astype(int) - np.rint(blend[inside]).astype(int)).max() <= 1
    narrow = render(res, window=Window(500.0, 10.0), labels=False)
    assert narrow[0, 0, 0] == 0 and narrow[0, -1, 0] == 255


def test_label_text_in_mm_or_pixels_with_recheck_marker() -> None:
    les = Lesion(label=1, bbox=(0, 0, 5, 5), centroid=(2.0, 2.0), area_mm2=20.0,
                 diameter_mm=12.34, score=0.9, max_score=0.95)
    assert label_text(les, True) == "12.3 mm"
    assert label_text(les, False) == "12 px"
    rechecked = Lesion(**{**{f: getattr(les, f) for f in les.__slots__}, "rechecked": True})
    assert label_text(rechecked, True) == "12.3 mm*"
    # a radiograph measured at its ImagerPixelSpacing says so, as the viewer's tools do
    assert label_text(les, True, SpacingSource.IMAGER_PIXEL_SPACING.qualifier) == "12.3 mm at detector"
    assert label_text(les, False, " at detector") == "12 px"


def _label_ink(res: FrameResult) -> np.ndarray:
    """Where the labelled render differs from the unlabelled one: the text."""
    return (render(res, labels=True) != render(res, labels=False)).any(axis=2)


def test_labels_on_4096_frames_are_large_near_their_lesion_and_never_clipped() -> None:
    n = 4096
    flat = np.full((n, n), 300.0, np.float32)
    size = font_size((n, n))
    assert size >= 80  # about 2 % of the image: readable when the frame is shown whole

    def ink_for(center: tuple[float, float]) -> tuple[np.ndarray, FrameResult]:
        res = make_result(flat, disk((n, n), center, 40).astype(np.uint16), spacing=(0.1, 0.1))
        assert len(res.lesions) == 1
        return _label_ink(res), res

    free, free_res = ink_for((n / 2, n / 2))
    # Measured at a radiograph's detector: the label says so ("… mm at detector": more ink).
    detector = dataclasses.replace(free_res, frame=dataclasses.replace(
        free_res.frame, spacing_source=SpacingSource.IMAGER_PIXEL_SPACING))
    assert np.count_nonzero(_label_ink(detector)) > 1.5 * np.count_nonzero(free)
    corner, corner_res = ink_for((n - 41, n - 41))  # touches the bottom-right corner
    # Same text, so the same ink, also where no side of the corner lesion has room.
    assert np.count_nonzero(free) == np.count_nonzero(corner) > 0
    for ink, res in ((free, free_res), (corner, corner_res)):
        r0, c0, r1, c1 = res.lesions[0].bbox
        rows, cols = np.nonzero(ink)
        assert rows.max() - rows.min() >= 0.6 * size  # the font scaled with the image
        reach = 8 * size
        assert rows.min() >= r0 - reach and rows.max() < r1 + reach
        assert cols.min() >= c0 - reach and cols.max() < c1 + reach
        # The text does not cover its own lesion.
        assert not ink[r0:r1, c0:c1].any()


def test_labels_of_close_lesions_cover_no_lesion_and_each_is_written() -> None:
    shape = (512, 512)
    mask = disk(shape, (100, 100), 12) | disk(shape, (100, 140), 6) | disk(shape, (400, 300), 20)
    res = make_result(np.zeros(shape), mask.astype(np.uint16))
    assert len(res.lesions) == 3
    ink = _label_ink(res)
    rgb = render(res)
    for les in res.lesions:
        r0, c0, r1, c1 = les.bbox
        assert not ink[r0:r1, c0:c1].any(), f"a label covers lesion {les.label}"
        near = np.abs(rgb.astype(int) - lesion_color(les.label)).sum(axis=2) < 90
        assert (near & ink).sum() >= 10, f"no text in the colour of lesion {les.label}"


# --------------------------------------------------------------------------- save_png


def test_save_png_is_atomic_and_downsamples(tmp_path: Path) -> None:
    lab = np.zeros((300, 400), np.uint16)
    lab[disk(lab.shape, (150, 200), 30)] = 1
    res = make_result(np.full(lab.shape, 400.0), lab)
    out = save_png(res, tmp_path / "sub" / "frame.png")
    assert os.listdir(tmp_path / "sub") == ["frame.png"]
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size == (400, 300) and img.mode == "RGB"
        assert np.array_equal(np.asarray(img), render(res))
    save_png(res, out, max_side=100)  # replaces the file in place
    with Image.open(out) as img:
        assert img.size == (100, 75)
    assert os.listdir(tmp_path / "sub") == ["frame.png"]
    with pytest.raises(ValueError, match='"window"'):
        save_png(res, tmp_path / "bad.png", window=(0.0, 0.0))
    assert sorted(os.listdir(tmp_path)) == ["sub"]


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "report.png"
    target.write_bytes(b"old")

    def half_then_fail(fp) -> None:  # type: ignore[no-untyped-def]
        fp.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["report.png"]


def test_atomic_write_gives_the_mode_open_would_under_the_umask(tmp_path: Path) -> None:
    """Every file came out 0600 (the temporary file's mode) whatever the umask: a PACS import
    job or a colleague could not read a batch's SEG, and the listener unit's UMask=0027
    was ignored. A child process, as the umask is the whole process's."""
    import subprocess
    import sys

    code = ("import os, sys; from medrt.io.atomic import atomic_write; os.umask(int(sys.argv[2], 8)); "
            "p = atomic_write(sys.argv[1], lambda fp: fp.write(b'x')); print(oct(os.stat(p).st_mode & 0o777))")
    for umask, mode in (("022", "0o644"), ("027", "0o640"), ("077", "0o600")):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / f"seg{umask}.dcm"), umask],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == mode, out.stdout + out.stderr


# --------------------------------------------------------------------------- bad arguments


def test_bad_arguments_raise_value_errors_naming_them(tmp_path: Path) -> None:
    lab = touching_labels()
    res = make_result(np.zeros(lab.shape), lab, lesions=())
    for kw, name in (({"fill_alpha": 1.5}, "fill_alpha"), ({"outline_alpha": -0.1}, "outline_alpha"),
                     ({"outline_px": -1}, "outline_px")):
        with pytest.raises(ValueError, match=f'"{name}"'):
            overlay_rgba(res, **kw)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f'"{name}"'):
            render(res, **kw)  # type: ignore[arg-type]
    for window in ((0.0, 0.0), (0.0, float("nan")), "wide"):
        with pytest.raises(ValueError, match='"window"'):
            render(res, window=window)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='"max_side"'):
        save_png(res, tmp_path / "x.png", max_side=0)
    with pytest.raises(ValueError, match='"result"'):
        overlay_rgba(make_result(np.zeros((4, 4)), np.zeros((4, 5), np.uint16), lesions=()))
    with pytest.raises(TypeError, match='"result"'):
        render(lab)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='"label"'):
        lesion_color(0)
    assert os.listdir(tmp_path) == []
