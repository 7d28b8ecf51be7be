"""The phantom: determinism, masks on the lesions, valid DICOM, lossless round trips
(pydicom and DCMTK), the ground-truth sidecar, and the committed sample set."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pydicom
import pytest

from conftest import require_tool
from medrt.phantom import (
    SAMPLE_CT,
    SAMPLE_XRAY,
    generate_ct_series,
    generate_radiograph,
    load_ground_truth,
    longest_diameter_mm,
    radiograph_scenario,
    write_ct_series,
    write_enhanced_ct,
    write_radiographs,
)
from medrt.phantom.dicom_write import ct_dataset, dx_dataset
from medrt.phantom.truth import TRUTH_JSON

CT_SEED = 11


@pytest.fixture(scope="module")
def ct_series():
    """A full 40-slice series at 256² (fast), with and without the lesions drawn in."""
    return generate_ct_series(CT_SEED, 40, 256), generate_ct_series(
        CT_SEED, 40, 256, render_lesions=False
    )


@pytest.fixture(scope="module")
def radiograph():
    kw = dict(size=512, index=0, spacing_mm=0.125, n_lesions=3, border_lesion=True, far_apart=True)
    return generate_radiograph(3, **kw), generate_radiograph(3, render_lesions=False, **kw)


def _dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """Binary dilation with a disk of ``radius`` pixels (numpy only)."""
    rows, cols = mask.shape
    padded = np.pad(mask, radius)
    out = np.zeros_like(mask)
    for dr in range(-radius, radius + 1):
        for dc in range(-radius, radius + 1):
            if dr * dr + dc * dc <= radius * radius:
                out |= padded[radius + dr : radius + dr + rows, radius + dc : radius + dc + cols]
    return out


# --- determinism -----------------------------------------------------------------


def test_ct_same_seed_same_pixels_and_uids() -> None:
    a = generate_ct_series(5, 4, 128)
    b = generate_ct_series(5, 4, 128)
    c = generate_ct_series(6, 4, 128)
    for fa, fb in zip(a, b, strict=True):
        assert np.array_equal(fa.pixels, fb.pixels) and np.array_equal(fa.labels, fb.labels)
        assert fa.lesions == fb.lesions
        da, db = ct_dataset(fa)[0], ct_dataset(fb)[0]
        assert (da.SOPInstanceUID, da.SeriesInstanceUID) == (
            db.SOPInstanceUID,
            db.SeriesInstanceUID,
        )
    assert not np.array_equal(a[0].pixels, c[0].pixels)
    assert ct_dataset(a[0])[0].SOPInstanceUID != ct_dataset(c[0])[0].SOPInstanceUID
    assert ct_dataset(a[0])[0].SOPInstanceUID != ct_dataset(a[1])[0].SOPInstanceUID


def test_radiograph_same_seed_same_pixels_and_uids() -> None:
    a = generate_radiograph(5, 256, index=1)
    b = generate_radiograph(5, 256, index=1)
    assert np.array_equal(a.pixels, b.pixels) and a.lesions == b.lesions
    assert dx_dataset(a)[0].SOPInstanceUID == dx_dataset(b)[0].SOPInstanceUID
    assert not np.array_equal(a.pixels, generate_radiograph(5, 256, index=2).pixels)
    assert not np.array_equal(a.pixels, generate_radiograph(6, 256, index=1).pixels)
    assert 0.1 <= a.spacing_mm[0] <= 0.15 and a.spacing_mm[0] == a.spacing_mm[1]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match='"seed"'):
        generate_ct_series(-1, 2, 128)
    with pytest.raises(ValueError, match='"size"'):
        generate_radiograph(1, 16)
    with pytest.raises(ValueError, match='"compress"'):
        write_ct_series(Path("/nonexistent-never-written"), 1, 1, 64, compress="zip")


# --- masks and lesions -----------------------------------------------------------


def _check_masks_on_lesions(with_l, without, labels, lesions, spacing, halo: int) -> None:
    """Pixels change only under the masks (plus the soft edge), by the recorded contrast."""
    diff = with_l.astype(np.float64) - without.astype(np.float64)
    near = _dilate(labels > 0, halo)
    assert not diff[~near].any(), "pixels changed where no lesion is labelled"
    for t in lesions:
        m = labels == t.label
        assert m.any()
        rows, cols = np.nonzero(m)
        assert t.bbox == (rows.min(), cols.min(), rows.max() + 1, cols.max() + 1)
        assert t.center == pytest.approx((rows.mean(), cols.mean()), abs=1e-3)
        assert t.area_mm2 == pytest.approx(m.sum() * spacing[0] * spacing[1], rel=1e-4)
        # Quantisation moves each pixel by at most 1, so the mean by much less.
        assert diff[m].mean() == pytest.approx(t.contrast, abs=0.75)


def test_ct_masks_sit_on_the_lesions(ct_series) -> None:
    with_l, without = ct_series
    for a, b in zip(with_l, without, strict=True):
        assert a.lesions == b.lesions and np.array_equal(a.labels, b.labels)
        _check_masks_on_lesions(a.pixels, b.pixels, a.labels, a.lesions, a.spacing_mm, halo=2)


def test_ct_lesion_contrast_matches_a_ring_around_it(ct_series) -> None:
    """Mean inside the mask minus a ring 2-5 px outside ~ contrast, within noise."""
    checked = 0
    for f in ct_series[0]:
        for t in f.lesions:
            m = f.labels == t.label
            ring = _dilate(m, 5) & ~_dilate(m, 2)
            inside = f.pixels[m].astype(np.float64)
            around = f.pixels[ring].astype(np.float64)
            # Noise is correlated over a few pixels (blur 0.8 px, texture 2.5 mm): count
            # about 8 pixels per independent sample, and allow 5 standard errors.
            sigma = max(around.std(), 10.0)
            tol = 5.0 * sigma * math.sqrt(8.0 / inside.size + 8.0 / around.size) + 3.0
            assert inside.mean() - around.mean() == pytest.approx(t.contrast, abs=tol), t
            checked += 1
    assert checked >= 3


def test_ct_sizes_kinds_and_lesion_free_frames(ct_series) -> None:
    frames = ct_series[0]
    assert any(not f.lesions for f in frames), "the series needs lesion-free slices"
    assert sum(1 for f in frames if f.lesions) >= 3
    labels_seen: set[int] = set()
    for f in frames:
        for t in f.lesions:
            labels_seen.add(t.label)
            assert t.shape in ("round", "irregular") and t.kind in ("faint", "bright")
            if t.extras.get("ignore"):
                assert t.diameter_mm < 2.0
            else:
                assert 2.0 <= t.diameter_mm <= 30.0
            assert 2.0 <= t.extras["generated_diameter_mm"] <= 30.0
            sigma = 15.0
            if t.kind == "faint":
                assert abs(t.contrast) <= 3.0 * sigma
    assert len(labels_seen) >= 3
    # Geometry: positions move along z by the slice thickness, in plane they stay.
    z = [f.position[2] for f in frames]
    assert np.allclose(np.diff(z), -frames[0].slice_thickness_mm)
    assert all(f.slice_location == f.position[2] for f in frames)


def test_radiograph_masks_sit_on_the_nodules(radiograph) -> None:
    a, b = radiograph
    assert a.lesions == b.lesions
    _check_masks_on_lesions(a.pixels, b.pixels, a.labels, a.lesions, a.spacing_mm, halo=3)
    for t in a.lesions:
        assert t.contrast > 0 and 2.0 <= t.diameter_mm <= 30.0


def test_radiograph_border_and_far_apart_nodules(radiograph) -> None:
    f = radiograph[0]
    size = f.shape[0]
    border = [t for t in f.lesions if t.extras.get("border")]
    assert border, "asked for a nodule across the border"
    for t in border:
        r0, c0, r1, c1 = t.bbox
        assert r0 == 0 or c0 == 0 or r1 == size or c1 == size
    far = max(math.dist(s.center, t.center) for s in f.lesions for t in f.lesions)
    assert far > 0.7 * size * math.sqrt(2.0)


def test_longest_diameter_convention() -> None:
    one = np.zeros((5, 5), bool)
    one[2, 2] = True
    assert longest_diameter_mm(one, (0.5, 0.5)) == pytest.approx(0.5)
    line = np.zeros((5, 20), bool)
    line[2, 3:13] = True
    assert longest_diameter_mm(line, (0.7, 0.5)) == pytest.approx(5.0)
    yy, xx = np.mgrid[:101, :101]
    disk = (yy - 50) ** 2 + (xx - 50) ** 2 <= 40**2
    assert longest_diameter_mm(disk, (0.1, 0.1)) == pytest.approx(8.1, abs=0.05)


# --- DICOM -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_files(tmp_path_factory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("phantom")
    out = {}
    for codec in ("none", "rle", "jpegls", "j2k", "htj2k", "jpegxl"):
        out[f"ct-{codec}"] = write_ct_series(
            root / f"ct-{codec}", 2, n_frames=2, size=128, compress=codec
        )
        out[f"dx-{codec}"] = write_radiographs(
            root / f"dx-{codec}", 2, count=2, size=256, compress=codec
        )
    for codec in ("none", "rle", "jpegls"):
        out[f"ct-enhanced-{codec}"] = write_enhanced_ct(root / f"ct-enhanced-{codec}", 2, n_frames=3, size=64, compress=codec)
    out["ct-enhanced-shuffled"] = write_enhanced_ct(root / "ct-enhanced-shuffled", 2, n_frames=3, size=64, shuffle_frames=True)
    return out


@pytest.mark.parametrize("key", ["ct-rle", "ct-none", "dx-jpegls", "dx-none", "ct-j2k", "ct-htj2k", "dx-htj2k",
                                 "ct-jpegxl", "dx-jpegxl", "ct-enhanced-none", "ct-enhanced-rle",
                                 "ct-enhanced-jpegls", "ct-enhanced-shuffled"])
def test_dciodvfy_reports_no_errors(small_files, key: str) -> None:
    """Every phantom kind and syntax, by the dev extra's dciodvfy (dicom3tools 20260927; the
    distributions' 2022 one reads no HTJ2K or JPEG XL and calls the enhanced CT's Referenced
    Series Sequence, which PS3.3 C.12.2 requires for its conversion sources, an error)."""
    tool = require_tool("dciodvfy")
    for path in small_files[key]:
        res = subprocess.run([tool, str(path)], capture_output=True, text=True, timeout=60)
        text = res.stdout + res.stderr
        errors = [line for line in text.splitlines() if line.startswith("Error")]
        assert not errors, f"{path.name}: {errors}"
        # the enhanced CT's window is named with PS3.3's defined term (SOFT_TISSUE)
        assert "Window Center & Width Explanation" not in text, path.name
        if "enhanced" in key:
            # and its Image Flavor too: VOLUME, where the conversion copied the single-frame
            # CT's AXIAL into Image Type and Frame Type value 3 (dciodvfy: "Unrecognized
            # defined term <AXIAL> for value 3"); nothing else is warned about either
            warnings = [line for line in text.splitlines() if line.startswith("Warning")]
            assert not warnings, f"{path.name}: {warnings}"
            ds = pydicom.dcmread(path, stop_before_pixels=True)
            kinds = [g.CTImageFrameTypeSequence[0] for g in (*ds.SharedFunctionalGroupsSequence,
                                                             *ds.PerFrameFunctionalGroupsSequence)
                     if "CTImageFrameTypeSequence" in g]
            assert kinds and all(list(k.FrameType) == ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"] for k in kinds)
            assert list(ds.ImageType) == ["ORIGINAL", "PRIMARY", "VOLUME", "NONE"]


@pytest.mark.parametrize("codec", ["rle", "jpegls", "j2k", "htj2k", "jpegxl"])
def test_compressed_round_trip_is_lossless(small_files, codec: str) -> None:
    from medrt.io.dicom import read_frames

    for kind in ("ct", "dx"):
        ref = small_files[f"{kind}-none"]
        for plain, packed in zip(ref, small_files[f"{kind}-{codec}"], strict=True):
            a = pydicom.dcmread(plain)
            b = pydicom.dcmread(packed)
            assert b.file_meta.TransferSyntaxUID != a.file_meta.TransferSyntaxUID
            assert a.SOPInstanceUID == b.SOPInstanceUID
            assert np.array_equal(a.pixel_array, b.pixel_array)
            # medrt's reader gives back the phantom's display-semantics pixels.
            (frame,) = read_frames(packed)
            gen = (
                generate_ct_series(2, 2, 128)[int(b.InstanceNumber) - 1]
                if kind == "ct"
                else generate_radiograph(
                    2,
                    256,
                    index=int(packed.stem[-1]) - 1,
                    **radiograph_scenario(int(packed.stem[-1]) - 1),
                )
            )
            assert np.array_equal(frame.pixels, gen.pixels), (packed, b.PhotometricInterpretation)


def test_monochrome1_is_stored_inverted(small_files) -> None:
    paths = small_files["dx-none"]
    kinds = [pydicom.dcmread(p).PhotometricInterpretation for p in paths]
    assert kinds == ["MONOCHROME2", "MONOCHROME1"]
    ds = pydicom.dcmread(paths[1])
    f = generate_radiograph(2, 256, index=1, **radiograph_scenario(1))
    assert np.array_equal(ds.pixel_array, 4095 - f.pixels.astype(np.uint16))
    assert ds.PresentationLUTShape == "INVERSE"
    assert float(ds.WindowCenter) == pytest.approx(4095 - f.window[0])


@pytest.mark.parametrize("codec,tool", [("jpegls", "dcmdjpls"), ("rle", "dcmdrle")])
def test_dcmtk_decompresses_to_the_same_pixels(
    small_files, tmp_path: Path, codec: str, tool: str
) -> None:
    exe = require_tool(tool)
    for kind in ("ct", "dx"):
        for packed in small_files[f"{kind}-{codec}"]:
            out = tmp_path / f"{kind}-{packed.name}"
            res = subprocess.run(
                [exe, str(packed), str(out)], capture_output=True, text=True, timeout=60
            )
            assert res.returncode == 0, res.stderr
            plain = pydicom.dcmread(out)
            assert plain.file_meta.TransferSyntaxUID.is_compressed is False
            assert np.array_equal(plain.pixel_array, pydicom.dcmread(packed).pixel_array)


# --- ground truth ----------------------------------------------------------------


def test_ground_truth_sidecar_round_trip(small_files) -> None:
    paths = small_files["ct-none"]
    truth = load_ground_truth(paths[0].parent)
    frames = generate_ct_series(2, 2, 128)
    assert len(truth) == 2
    for path, f in zip(paths, frames, strict=True):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        t = truth[ds.SOPInstanceUID]
        assert t.file == path and t.lesions == f.lesions
        assert np.array_equal(t.mask, f.labels) and t.mask.dtype == np.uint16
        assert t.spacing_mm == tuple(float(v) for v in ds.PixelSpacing)
        assert t.spacing_source == "PixelSpacing" and (t.rows, t.cols) == (128, 128)
    dx = load_ground_truth(small_files["dx-none"][0].parent)
    assert {t.spacing_source for t in dx.values()} == {"ImagerPixelSpacing"}


def test_ground_truth_rejects_other_versions(tmp_path: Path) -> None:
    (tmp_path / TRUTH_JSON).write_text(
        json.dumps({"version": 99, "generator": "medrt.phantom", "frames": []})
    )
    with pytest.raises(ValueError, match="version"):
        load_ground_truth(tmp_path)


# --- the committed sample set ----------------------------------------------------


def test_sample_set_contents(sample_dir: Path) -> None:
    total = sum(p.stat().st_size for p in sample_dir.rglob("*") if p.is_file())
    assert total <= 25 * 1024 * 1024, f"sample_dicom/ is {total / 1e6:.1f} MB"
    ct = load_ground_truth(sample_dir / "ct_stream")
    assert (
        len(ct) == 40
        and any(not t.lesions for t in ct.values())
        and any(t.lesions for t in ct.values())
    )
    dx = load_ground_truth(sample_dir / "radiographs")
    assert len(dx) == 3
    assert "MONOCHROME1" in {t.photometric for t in dx.values()}
    assert any(any(x.extras.get("border") for x in t.lesions) for t in dx.values())
    assert any(
        max((math.dist(a.center, b.center) for a in t.lesions for b in t.lesions), default=0)
        > 0.7 * t.rows * math.sqrt(2)
        for t in dx.values()
    )
    for t in dx.values():
        ds = pydicom.dcmread(t.file, stop_before_pixels=True)
        assert ds.file_meta.TransferSyntaxUID.is_compressed
        assert (ds.Rows, ds.Columns) == (4096, 4096)


def test_sample_set_matches_the_generator(sample_dir: Path, tmp_path: Path) -> None:
    """The committed files are what ``make_sample`` writes (CT in full, one radiograph)."""
    ct_dir = sample_dir / "ct_stream"
    fresh = write_ct_series(tmp_path / "ct", **SAMPLE_CT)
    assert sorted(p.name for p in fresh) == sorted(p.name for p in ct_dir.glob("*.dcm"))
    for path in fresh:
        new, old = pydicom.dcmread(path), pydicom.dcmread(ct_dir / path.name)
        assert new.file_meta.TransferSyntaxUID == old.file_meta.TransferSyntaxUID
        assert np.array_equal(new.pixel_array, old.pixel_array), path.name
        del new.PixelData, old.PixelData  # encoders may differ by version; headers may not
        assert new == old, path.name
    fresh_json = (tmp_path / "ct" / "ground_truth.json").read_bytes()
    assert fresh_json == (ct_dir / "ground_truth.json").read_bytes()
    with (
        np.load(tmp_path / "ct" / "ground_truth_masks.npz") as a,
        np.load(ct_dir / "ground_truth_masks.npz") as b,
    ):
        assert sorted(a.files) == sorted(b.files)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    # One 4096² radiograph: the MONOCHROME1 one with the border nodule.
    index = 1
    f = generate_radiograph(
        SAMPLE_XRAY["seed"],
        SAMPLE_XRAY["size"],
        index=index,
        spacing_mm=SAMPLE_XRAY["spacing_mm"],
        **radiograph_scenario(index),
    )
    ds = pydicom.dcmread(sample_dir / "radiographs" / f"dx_{index + 1:04d}.dcm")
    assert ds.SOPInstanceUID == dx_dataset(f)[0].SOPInstanceUID
    committed = (
        4095 - ds.pixel_array.astype(np.int32)
        if ds.PhotometricInterpretation == "MONOCHROME1"
        else ds.pixel_array
    )
    digest = hashlib.sha256(np.ascontiguousarray(committed, dtype=np.uint16).tobytes()).hexdigest()
    assert digest == hashlib.sha256(f.pixels.astype(np.uint16).tobytes()).hexdigest()
    truth = load_ground_truth(sample_dir / "radiographs")[ds.SOPInstanceUID]
    assert truth.lesions == f.lesions


# --- command line ----------------------------------------------------------------


def test_cli_writes_a_phantom(tmp_path: Path, capsys) -> None:
    from medrt.cli import main
    from medrt.commands.phantom import CODECS
    from medrt.phantom import COMPRESSIONS

    assert sorted(CODECS) == sorted(COMPRESSIONS)

    ct_args = f"phantom ct --out {tmp_path / 'ct'} --frames 3 --size 96 --seed 4".split()
    assert main(ct_args) == 0
    assert "wrote 3 files" in capsys.readouterr().out
    assert len(load_ground_truth(tmp_path / "ct")) == 3
    dx_args = (
        f"phantom xray --out {tmp_path / 'dx'} --count 1 --size 128 --monochrome1 --compress rle"
    )
    assert main(dx_args.split()) == 0
    dx = pydicom.dcmread(tmp_path / "dx" / "dx_0001.dcm")
    assert dx.PhotometricInterpretation == "MONOCHROME1"
    # the smallest size the help allows (below 128 nodule sizes ran out of room: a traceback)
    assert main(f"phantom xray --out {tmp_path / 'dx64'} --count 3 --size 64 --compress none".split()) == 0
    assert len(load_ground_truth(tmp_path / "dx64")) == 3
    with pytest.raises(SystemExit):
        main(["phantom", "ct", "--out", str(tmp_path / "x"), "--size", "8"])


# --- enhanced (multi-frame) CT ---------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "rle", "jpegls", "j2k", "htj2k", "jpegxl"])
def test_an_enhanced_ct_phantom_holds_the_series_slices_as_frames(tmp_path: Path, codec: str) -> None:
    """``write_enhanced_ct``: the series of a seed as one Legacy Converted Enhanced CT, in
    the transfer syntax asked for; each frame the slice of the single-frame series at its
    position, pixel for pixel, and its ground truth that slice's, keyed by frame
    (``UID#n``). ``shuffle_frames`` stores them out of position order, the truth following."""
    from pydicom.uid import LegacyConvertedEnhancedCTImageStorage

    from medrt.io.dicom import read_frames
    from medrt.phantom import COMPRESSIONS, write_enhanced_ct
    from medrt.phantom.truth import truth_key

    series = {f.position[2]: f for f in generate_ct_series(CT_SEED, 5, 64)}
    for shuffle in (False, True):
        folder = tmp_path / f"{codec}-{shuffle}"
        (path,) = write_enhanced_ct(folder, CT_SEED, n_frames=5, size=64, compress=codec, shuffle_frames=shuffle)
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        assert ds.SOPClassUID == LegacyConvertedEnhancedCTImageStorage and int(ds.NumberOfFrames) == 5
        assert ds.file_meta.TransferSyntaxUID == COMPRESSIONS[codec]
        frames = read_frames(path)
        z = [f.geometry.position[2] for f in frames]
        in_order = z == sorted(z) or z == sorted(z, reverse=True)
        assert in_order != shuffle
        truth = load_ground_truth(folder)
        assert len(truth) == 5
        for f in frames:
            slice_ = series[f.geometry.position[2]]
            assert np.array_equal(f.pixels, slice_.pixels)
            t = truth[truth_key(f.sop_instance_uid, f.frame_index)]
            assert (t.frame_index, t.file, t.slice_location) == (f.frame_index, path, slice_.slice_location)
            assert t.lesions == slice_.lesions and np.array_equal(t.mask, slice_.labels)


def test_an_enhanced_ct_phantom_is_the_same_bytes_each_time(tmp_path: Path) -> None:
    """highdicom stamps the conversion's time and a new Dimension Organization UID; the
    phantom fixes both, so the same arguments give the same file."""
    from medrt.phantom import write_enhanced_ct

    a, b = (write_enhanced_ct(tmp_path / k, 3, n_frames=4, size=64, shuffle_frames=True)[0] for k in "ab")
    assert a.read_bytes() == b.read_bytes()
    assert (tmp_path / "a" / TRUTH_JSON).read_bytes() == (tmp_path / "b" / TRUTH_JSON).read_bytes()
    assert (tmp_path / "a" / "ground_truth_masks.npz").read_bytes() == (tmp_path / "b" / "ground_truth_masks.npz").read_bytes()


def test_an_enhanced_ct_phantom_is_the_same_bytes_in_another_process(tmp_path: Path) -> None:
    """highdicom lists the converted slices in the Referenced Series Sequence from a set,
    whose order follows each process's string hashing; the phantom lists them in frame
    order, so two processes with different PYTHONHASHSEED write the same file."""
    code = "import sys; from medrt.phantom import write_enhanced_ct; write_enhanced_ct(sys.argv[1], 3, n_frames=6, size=64)"
    for hash_seed in ("1", "2"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path / hash_seed)], check=True, timeout=300,
                       env={**os.environ, "PYTHONHASHSEED": hash_seed})
    a, b = ((tmp_path / k / "ct_enhanced.dcm").read_bytes() for k in "12")
    assert a == b
    ds = pydicom.dcmread(tmp_path / "1" / "ct_enhanced.dcm", stop_before_pixels=True)
    (series,) = ds.ReferencedSeriesSequence
    assert [i.ReferencedSOPInstanceUID for i in series.ReferencedInstanceSequence] == [
        g.ConversionSourceAttributesSequence[0].ReferencedSOPInstanceUID for g in ds.PerFrameFunctionalGroupsSequence]


def test_an_enhanced_ct_phantom_takes_little_more_memory_than_its_slices(tmp_path: Path) -> None:
    """The slices' float32 HU (twice the volume's stored values) were all held through
    highdicom's conversion and the encoding, though nothing read them after the stored
    values were made: writing peaked 2 volumes above generating (tracemalloc, 20 slices of
    256²), at a 40-slice 512² phantom 40 MB of its 418 MB. They are let go one by one now."""
    import tracemalloc

    write_enhanced_ct(tmp_path / "warm", CT_SEED, n_frames=2, size=64)  # highdicom's IOD tables, loaded once
    n, size = 20, 256
    volume = n * size * size * 2  # bytes, uint16
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        generate_ct_series(CT_SEED, n, size)
        _, generating = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        write_enhanced_ct(tmp_path / "ct", CT_SEED, n_frames=n, size=size)
        _, writing = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    assert writing - generating < volume, (writing / 2**20, generating / 2**20, volume / 2**20)


def test_cli_writes_an_enhanced_phantom(tmp_path: Path, capsys) -> None:
    from medrt.cli import main

    args = f"phantom ct --out {tmp_path / 'ct'} --frames 4 --size 64 --seed 4 --enhanced --shuffle-frames --compress jpegls"
    assert main(args.split()) == 0
    assert "wrote 1 files" in capsys.readouterr().out
    ds = pydicom.dcmread(tmp_path / "ct" / "ct_enhanced.dcm", stop_before_pixels=True)
    assert int(ds.NumberOfFrames) == 4 and ds.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.80"
    assert len(load_ground_truth(tmp_path / "ct")) == 4
    assert main(f"phantom ct --out {tmp_path / 'x'} --frames 4 --shuffle-frames".split()) == 2
    assert "--shuffle-frames needs --enhanced" in capsys.readouterr().err
