"""The one inference path end to end on phantoms, with the shipped models on CPU ORT."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from medrt.analyzer import AnalyzerConfig, load_analyzer
from medrt.bench.engine import phantom_frames
from medrt.evaluation import FramePrediction, evaluate
from medrt.phantom import generate_ct_series, generate_radiograph
from medrt.preprocess import Windowed, normalize


@pytest.fixture(scope="module")
def analyzer():  # type: ignore[no-untyped-def]
    return load_analyzer(AnalyzerConfig(seg_model="lesion_unet_lite", warmup_shapes=((512, 512),)))


@pytest.fixture(scope="module")
def ct_frames():  # type: ignore[no-untyped-def]
    return generate_ct_series(9902, n_frames=40)


@pytest.fixture(scope="module")
def shipped():  # type: ignore[no-untyped-def]
    """The analyzer as shipped: every default model, routed by its spec."""
    return load_analyzer(AnalyzerConfig(warmup_shapes=((256, 256),)))


def _spec_copy(tmp_path, name: str, new_name: str, old: str, new: str):  # type: ignore[no-untyped-def]
    """Shipped model ``name`` as ``new_name``: its file copied beside a spec with ``old`` replaced by ``new``."""
    import shutil

    from medrt.engine.registry import find_spec

    spec = find_spec(name)
    shutil.copy(spec.path, tmp_path / spec.path.name)
    text = spec.spec_path.read_text(encoding="utf-8").replace(f'name = "{name}"', f'name = "{new_name}"', 1)
    assert old in text
    path = tmp_path / f"{new_name}.toml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path


def _with_neighbours(ct_frames, p, key: str):  # type: ignore[no-untyped-def]
    """The medrt Frame of phantom slice ``p`` and its (head, feet) neighbours in the series."""
    around = [q.as_frame(f"{key}{q.index}") for q in ct_frames[max(p.index - 1, 0) : p.index + 2]]
    frame = next(f for f in around if f.sop_instance_uid == f"{key}{p.index}")
    others = [f for f in around if f is not frame]
    before = next((f for f in others if f.geometry.position[2] > frame.geometry.position[2]), None)
    after = next((f for f in others if f.geometry.position[2] < frame.geometry.position[2]), None)
    return frame, (before, after)


def test_ct_lesions_found_where_the_truth_says_and_blank_frames_give_none(analyzer, ct_frames) -> None:  # type: ignore[no-untyped-def]
    # Soft-tissue lesions that the CT window shows (very dense ones clip like bone).
    def clear(t):  # type: ignore[no-untyped-def]
        return t.diameter_mm >= 6 and 40 <= abs(t.contrast) <= 200

    bright = [f for f in ct_frames if any(clear(t) for t in f.lesions)]
    blank = [f for f in ct_frames if not f.lesions]
    assert bright and blank
    hits = total = 0
    for p in bright[:5]:
        # Full mode: on a 512² slice the UNet sees the whole frame either way; the ROI
        # classifier's own figures are in its model card.
        frame, nbs = _with_neighbours(ct_frames, p, "ct")
        res = analyzer.analyze(frame, mode="full", neighbours=nbs)
        assert res.timings.total > 0 and res.timings.segment > 0
        for t in p.lesions:
            if clear(t):
                total += 1
                hits += any(np.hypot(les.centroid[0] - t.center[0], les.centroid[1] - t.center[1]) * p.spacing_mm[0] < max(2.0, t.diameter_mm / 2)
                            for les in res.lesions)
    assert hits >= 0.6 * total, f"{hits} of {total}"
    empty = []
    for p in blank[:8]:
        frame, nbs = _with_neighbours(ct_frames, p, "blank")
        empty.append(analyzer.analyze(frame, mode="full", neighbours=nbs))
    assert sum(len(r.lesions) for r in empty) <= 8


def test_negative_frames_skip_the_unet(ct_frames) -> None:  # type: ignore[no-untyped-def]
    """Conditional compute: when the classifier calls a frame negative, no UNet runs (on
    the ROI path: auto mode runs a CT slice whole, see Analyzer.mode_for)."""
    strict = load_analyzer(AnalyzerConfig(seg_model="lesion_unet_lite", presence_threshold=1.01, mode="roi",
                                          heatmap_threshold=1.01, warmup_shapes=((512, 512),)))
    res = strict.analyze(ct_frames[0].as_frame("neg"))
    assert res.skipped and not res.crops and not res.lesions
    assert not res.labels.any()
    assert res.timings.roi > 0 and res.timings.segment < 1.0


@pytest.fixture(scope="module")
def radiograph_analyzer():  # type: ignore[no-untyped-def]
    return load_analyzer(AnalyzerConfig(seg_model="lesion_unet", warmup_shapes=((256, 256),)))


def test_a_model_refuses_frames_of_modalities_its_spec_does_not_list(analyzer) -> None:  # type: ignore[no-untyped-def]
    """lesion_unet_lite is CT-only ([model] modalities = ["CT"]): a radiograph gets an
    error naming the frame and the way out, not dozens of false lesions."""
    from medrt.errors import UnsupportedImageError

    (frame, _), = phantom_frames(1, size=512)
    assert analyzer.seg.spec.modalities == ("CT",) and frame.modality == "DX"
    with pytest.raises(UnsupportedImageError) as info:
        analyzer.analyze(frame)
    assert frame.key in str(info.value) and "CT only" in info.value.reason and "lesion_unet" in info.value.reason


def test_roi_path_agrees_with_full_mode(radiograph_analyzer) -> None:  # type: ignore[no-untyped-def]
    analyzer = radiograph_analyzer
    (frame, truth), = phantom_frames(1, size=2048)
    roi = analyzer.analyze(frame, mode="roi")
    full = analyzer.analyze(frame, mode="full")
    assert roi.mode == "roi" and full.mode == "full" and not full.crops
    t = {frame.sop_instance_uid: truth}
    rep_roi = evaluate([FramePrediction(frame.sop_instance_uid, roi.lesions, roi.labels)], t)
    rep_full = evaluate([FramePrediction(frame.sop_instance_uid, full.lesions, full.labels)], t)
    assert rep_roi.detected >= rep_full.detected - 1
    # Inside the crops, away from their edges (where the UNet's context differs: a lesion
    # cut by a crop edge is seen whole in full mode), the two modes' masks agree.
    inside = np.zeros(frame.shape, bool)
    for r0, c0, r1, c1 in roi.crops:
        m = (r1 - r0) // 8
        inside[max(r0, 0) + m : r1 - m, max(c0, 0) + m : c1 - m] = True
    a, b = roi.labels[inside] > 0, full.labels[inside] > 0
    if a.any() or b.any():
        assert (a & b).sum() / max((a | b).sum(), 1) > 0.5


def test_recheck_changes_only_small_or_faint_candidates(analyzer, ct_frames) -> None:  # type: ignore[no-untyped-def]
    for p in [f for f in ct_frames if f.lesions][:6]:
        frame, nbs = _with_neighbours(ct_frames, p, "rc")
        off = analyzer.analyze(frame, recheck_small=False, neighbours=nbs)
        on = analyzer.analyze(frame, recheck_small=True, neighbours=nbs)
        big_off = {les.bbox for les in off.lesions if les.diameter_mm >= 5.0}
        big_on = {les.bbox for les in on.lesions if les.diameter_mm >= 5.0 and not les.rechecked}
        assert big_on <= big_off
        for les in on.lesions:
            if les.bbox not in big_off:
                assert les.rechecked or les.diameter_mm < 5.0


def test_refine_is_what_segment_does_after_its_first_pass(analyzer, radiograph_analyzer, ct_frames) -> None:  # type: ignore[no-untyped-def]
    """``Analyzer.refine`` on the first pass gives the findings ``analyze`` gives: the 2x
    recheck on a CT slice, the fine sweep (which takes the first pass's place) on a
    radiograph. ``models/evaluate.py`` scores both steps apart this way, so the model
    cards' figures are the product's."""
    cases = [(analyzer, *_with_neighbours(ct_frames, p, "refine")) for p in [f for f in ct_frames if f.lesions][:6]]
    dx = generate_radiograph(5000, size=4096, index=29).as_frame("refine-dx")  # a sweep-found nodule
    found = 0
    for an, frame, neighbours in (*cases, (radiograph_analyzer, dx, None)):
        work = an.propose(an.prepare(frame, neighbours=neighbours))
        direct = an.analyze(frame, neighbours=neighbours)
        first = an.segment(replace(work, recheck=False))
        assert first.rechecked is None and first.prob is not None
        refined = an.finish(an.refine(replace(first, recheck=True)))
        assert refined.lesions == direct.lesions
        assert np.array_equal(refined.labels, direct.labels)
        found += bool(direct.lesions)
    assert found >= 3 and direct.lesions
    assert all(les.rechecked for les in direct.lesions)  # the radiograph was swept


def test_frames_go_to_the_roi_classifier_for_their_modality(tmp_path, ct_frames) -> None:  # type: ignore[no-untyped-def]
    """Several ROI classifiers: a frame goes to the first whose spec lists its modality,
    else to the first that lists none; with none for it, the error names the file."""
    from medrt.engine.registry import find_spec
    from medrt.errors import UnsupportedImageError
    assert find_spec("roi_classifier").modalities == ("CT",)
    spec = _spec_copy(tmp_path, "roi_classifier", "roi_any", 'modalities = ["CT"]\n', "")  # for any modality
    ct = ct_frames[5].as_frame("ct5")
    dx = generate_radiograph(77, size=1024, index=0).as_frame("dx0")
    both = load_analyzer(AnalyzerConfig(seg_model="lesion_unet", roi_model=f"{spec},roi_classifier",
                                        warmup_shapes=((256, 256),)))
    assert [r.spec.name for r in both.rois] == ["roi_any", "roi_classifier"]
    assert both.roi_for(ct).spec.name == "roi_classifier" and both.roi_for(dx).spec.name == "roi_any"
    assert both.analyze(ct, mode="roi").models[0].startswith("roi_classifier@")
    assert both.analyze(dx, mode="roi").models[0].startswith("roi_any@")
    assert both.analyze(dx, mode="full").models == (both.seg.spec.ident,)  # no classifier ran
    # auto: a radiograph much finer than lesion_unet's 0.5 mm runs over the whole frame, and
    # so does a CT slice, which fits in one crop (the ROI path could only skip it); a frame
    # larger than a crop at the UNet's own spacing takes the ROI path
    assert both.analyze(dx).mode == "full" and both.analyze(ct).mode == "full"
    assert both.analyze(ct).models == (both.seg.spec.ident,)  # no classifier ran
    small_crops = load_analyzer(AnalyzerConfig(seg_model="lesion_unet", roi_model=f"{spec},roi_classifier",
                                               crop=256, warmup_shapes=((256, 256),)))
    assert small_crops.analyze(ct).mode == "roi" and small_crops.analyze(dx).mode == "full"

    only_ct = load_analyzer(AnalyzerConfig(seg_model="lesion_unet", roi_model="roi_classifier",
                                           warmup_shapes=((256, 256),)))
    with pytest.raises(UnsupportedImageError) as info:
        only_ct.analyze(dx, mode="roi")
    assert "dx0" in str(info.value) and "DX frame" in str(info.value) and "--mode full" in str(info.value)
    assert only_ct.analyze(dx, mode="full").mode == "full"
    assert only_ct.refusal("DX", mode="roi") and only_ct.refusal("DX") is None  # auto: no classifier, full


def test_segmenters_are_routed_by_modality(ct_frames) -> None:  # type: ignore[no-untyped-def]
    """The default: CT slices to the 2.5-D lesion_unet_lite (its spec lists CT), radiographs
    to lesion_unet_dx (DX, CR); each with its own threshold; a modality none is for is refused."""
    from medrt.errors import UnsupportedImageError
    both = load_analyzer(AnalyzerConfig(warmup_shapes=((256, 256),)))
    assert [s.spec.name for s in both.segs] == ["lesion_unet_lite", "lesion_unet_dx"] and both.slices == 3
    ct = ct_frames[5].as_frame("ct5")
    dx = generate_radiograph(77, size=1024, index=0).as_frame("dx0")
    assert both.seg_for(ct).spec.name == "lesion_unet_lite" and both.seg_for(dx).spec.name == "lesion_unet_dx"
    assert both.analyze(ct).models[-1].startswith("lesion_unet_lite@")
    assert both.analyze(dx).models[-1].startswith("lesion_unet_dx@")
    assert both.prepare(dx).norm.ndim == 2  # a one-slice model gets the frame alone
    lite, unet = both.segs
    assert both.threshold_for(lite) == lite.spec.thresholds["probability"]
    assert both.threshold_for(unet) == unet.spec.thresholds["probability"]
    only_ct = load_analyzer(AnalyzerConfig(seg_model="lesion_unet_lite", warmup_shapes=((256, 256),)))
    with pytest.raises(UnsupportedImageError, match="dx0.*DX frame.*lesion_unet_lite@.* is for CT only"):
        only_ct.analyze(dx)
    # The shipped models say what they were trained on: another modality is refused,
    # not marked with "lesions" (both UNets found dozens on an 8-bit test pattern).
    ot = replace(dx, modality="OT", sop_instance_uid="ot0")
    with pytest.raises(UnsupportedImageError, match=r"OT frame, but .* are for CR, CT, DX only"):
        both.analyze(ot, mode="full")
    with pytest.raises(UnsupportedImageError, match="OT frame"):
        both.analyze(ot)
    # A Secondary Capture (a dose report, a burned-in overlay) is not an acquired CT slice,
    # whatever its Modality says.
    sc = replace(ct, sop_class_uid="1.2.840.10008.5.1.4.1.1.7")
    assert both.refusal(sc.modality, sop_class_uid=sc.sop_class_uid).startswith(
        "SC frame (a Secondary Capture, Modality CT), but")
    assert both.refusal(ct.modality, sop_class_uid="1.2.840.10008.5.1.4.1.1.2") is None
    with pytest.raises(UnsupportedImageError, match="SC frame"):
        both.analyze(sc)


def test_a_for_processing_radiograph_goes_only_to_a_model_that_lists_it(tmp_path, shipped) -> None:  # type: ignore[no-untyped-def]
    """Raw detector data (Digital X-Ray Image Storage - For Processing, which modalities send
    CAD systems beside the For Presentation image) is not what the radiograph UNet was
    trained on: it is refused with the reason, unless a spec lists "DX FOR PROCESSING"."""
    from pydicom.uid import (
        DigitalXRayImageStorageForPresentation,
        DigitalXRayImageStorageForProcessing,
    )

    from medrt.engine.registry import load_spec
    from medrt.errors import UnsupportedImageError

    dx = replace(generate_radiograph(77, size=1024, index=0).as_frame("dx0"), sop_class_uid=DigitalXRayImageStorageForPresentation)
    raw = replace(dx, sop_class_uid=DigitalXRayImageStorageForProcessing, sop_instance_uid="raw0")
    assert shipped.refusal("DX", sop_class_uid=dx.sop_class_uid) is None
    reason = shipped.refusal("DX", sop_class_uid=raw.sop_class_uid)
    assert reason.startswith("DX FOR PROCESSING frame (a For Processing image: raw detector data")
    assert "send medrt the For Presentation image" in reason and "are for CR, CT, DX only" in reason
    with pytest.raises(UnsupportedImageError, match="raw0: .*DX FOR PROCESSING frame"):
        shipped.analyze(raw)

    spec = _spec_copy(tmp_path, "lesion_unet_dx", "dx_raw", 'modalities = ["DX", "CR"]',
                      'modalities = ["dx  for processing"]')
    assert load_spec(spec).modalities == ("DX FOR PROCESSING",)
    own = load_analyzer(AnalyzerConfig(seg_model=f"lesion_unet_lite,{spec}", warmup_shapes=((256, 256),)))
    assert own.seg_for(raw).spec.name == "dx_raw"
    with pytest.raises(UnsupportedImageError, match="dx0: .*DX frame, but"):
        own.seg_for(dx)  # and that model is for raw data only


@pytest.mark.filterwarnings("ignore:Invalid value for VR CS")  # a lower-case Image Type, read all the same
def test_a_ct_localizer_is_refused_as_a_localizer(shipped) -> None:  # type: ignore[no-untyped-def]
    """A scout has the Modality and SOP class of the slices; only Image Type tells it apart."""
    import pydicom

    from conftest import SAMPLE_DIR
    from medrt.engine.routing import routing_modality
    from medrt.errors import UnsupportedImageError
    from medrt.io.dicom import read_frames
    from medrt.io.header import image_type_of

    ds = pydicom.dcmread(sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[20])
    axial = read_frames(ds)[0]
    ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
    scout = read_frames(ds)[0]
    assert image_type_of(ds) == ("ORIGINAL", "PRIMARY", "LOCALIZER")
    other = pydicom.Dataset()  # not ds: its frames share its header's elements
    other.ImageType = "derived"
    assert image_type_of(other) == ("DERIVED",) and image_type_of(None) == ()
    assert routing_modality("CT", ds.SOPClassUID, ("ORIGINAL", "PRIMARY", "AXIAL")) == "CT"
    assert routing_modality("CT", ds.SOPClassUID, ("LOCALIZER",)) == "CT"  # value 1 is ORIGINAL/DERIVED
    assert shipped.analyze(axial).models[-1].startswith("lesion_unet_lite@")
    with pytest.raises(UnsupportedImageError, match="CT LOCALIZER frame \\(a localizer, or scout"):
        shipped.analyze(scout)


def test_a_radiograph_of_another_body_part_or_a_lateral_view_goes_to_no_chest_model(tmp_path, shipped) -> None:  # type: ignore[no-untyped-def]
    """A radiography room sends the listener every image it takes; the chest-nodule UNet
    (trained on PA chest phantoms) takes chest radiographs, PA or AP, and those whose header
    names no body part or view, and refuses a knee or a lateral view with the reason. A
    spec that lists the body part takes it."""
    import pydicom

    from conftest import SAMPLE_DIR
    from medrt.engine.registry import load_spec
    from medrt.errors import UnsupportedImageError
    from medrt.io.dicom import read_frames

    dx = shipped.segs[1].spec
    assert (dx.body_parts, dx.views) == (("CHEST", "THORAX", "LUNG"), ("PA", "AP"))
    assert shipped.refusal("DX", body_part="KNEE") == (
        "DX frame of BodyPartExamined KNEE, but lesion_unet_dx@1.2.0 is for CHEST, LUNG, THORAX only (the spec's"
        " [model] body_parts; where KNEE is this site's word for one of them, --body-part-alias KNEE=CHEST reads it"
        " so); analyse it with a model made for it (--model SPEC.toml; see models/README.md)")
    assert shipped.refusal("CR", body_part="chest", view="LL").startswith(
        "CR frame of ViewPosition LL, but lesion_unet_dx@1.2.0 is for AP, PA views only (the spec's [model] views)")
    for body_part, view in (("", ""), ("chest", "pa"), ("CHEST", "AP"), ("", "PA"), ("CHEST", "")):
        assert shipped.refusal("DX", body_part=body_part, view=view) is None, (body_part, view)
    assert shipped.refusal("CT", body_part="HEAD") is None  # the CT model names no body part
    assert shipped.refusal("DX", mode="roi", body_part="KNEE").startswith("DX frame of BodyPartExamined KNEE")

    chest = read_frames(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")[0]
    ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
    ds.BodyPartExamined = "KNEE"
    ds.save_as(tmp_path / "knee.dcm")
    knee = read_frames(tmp_path / "knee.dcm")[0]
    assert shipped.seg_for(chest) is shipped.segs[1]
    with pytest.raises(UnsupportedImageError, match="knee.dcm: .*BodyPartExamined KNEE"):
        shipped.seg_for(knee)
    with pytest.raises(UnsupportedImageError, match="BodyPartExamined KNEE, but roi_classifier_dx@.*--roi-model"):
        shipped.roi_for(knee)

    spec = _spec_copy(tmp_path, "lesion_unet_dx", "knee_dx", 'body_parts = ["CHEST", "THORAX", "LUNG"]',
                      'body_parts = ["knee"]')
    assert load_spec(spec).body_parts == ("KNEE",)
    both = load_analyzer(AnalyzerConfig(seg_model=f"lesion_unet_dx,{spec}", warmup_shapes=((256, 256),)))
    assert both.seg_for(knee).spec.name == "knee_dx" and both.seg_for(chest).spec.name == "lesion_unet_dx"


def test_body_parts_are_matched_by_word_through_site_aliases_and_strictly_on_request(shipped) -> None:  # type: ignore[no-untyped-def]
    """Sites write BodyPartExamined as free text: a word of it naming a listed term is
    enough ("CHEST PA"), a site's own word is read as a term through
    ``body_part_aliases`` (``--body-part-alias``), and ``strict_routing``
    (``--strict-routing``) refuses an image whose header names no body part or view where
    the model lists some, with the reason."""
    from medrt.engine.routing import ImageKind, names, resolve_aliases

    for value in ("CHEST PA", "chest_ap", "Thorax, AP", "LUNGS CHEST"):
        assert shipped.refusal("DX", body_part=value, view="PA") is None, value
    for value in ("TORAX", "CHESTWALL", "KNEE AP"):
        assert shipped.refusal("DX", body_part=value).startswith(f"DX frame of BodyPartExamined {value.upper()}")
    assert names("CHEST PA", ("CHEST",)) and not names("", ("CHEST",)) and not names("CHESTX", ("CHEST",))
    assert resolve_aliases("TORAX PA", {"TORAX": "CHEST"}) == "CHEST PA"
    assert resolve_aliases("PECHO", {"PECHO": "CHEST"}) == "CHEST"
    assert ImageKind.of("DX", body_part=" torax  pa ").body_part == "TORAX PA"

    site = load_analyzer(AnalyzerConfig(body_part_aliases={" torax ": "chest", "Pecho": "Chest"}, strict_routing=True,
                                        warmup_shapes=((256, 256),)))
    assert site.config.body_part_aliases == {"TORAX": "CHEST", "PECHO": "CHEST"}
    for value in ("TORAX", "torax pa", "PECHO", "CHEST"):
        assert site.refusal("DX", body_part=value, view="PA") is None, value
    assert site.refusal("DX", body_part="", view="PA") == (
        "DX frame whose header names no BodyPartExamined, and with --strict-routing lesion_unet_dx@1.2.0 is only for"
        " images it names as CHEST, LUNG, THORAX; analyse it with a model made for it (--model SPEC.toml; see"
        " models/README.md)")
    assert site.refusal("DX", body_part="CHEST", view="").startswith(
        "DX frame whose header names no ViewPosition, and with --strict-routing lesion_unet_dx@1.2.0 is only for"
        " images it names as AP, PA views")
    assert site.refusal("DX", mode="roi", body_part="CHEST", view="PA") is None
    assert site.refusal("CT", body_part="", plane="AXIAL") is None  # the CT model lists no body part
    assert shipped.refusal("DX", body_part="", view="") is None  # not strict: taken
    # per frame too (the viewer, a stream)
    import pydicom

    from conftest import SAMPLE_DIR
    from medrt.errors import UnsupportedImageError
    from medrt.io.dicom import read_frames

    ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
    del ds.BodyPartExamined
    blank = read_frames(ds)[0]
    assert shipped.seg_for(blank) is shipped.segs[1]
    with pytest.raises(UnsupportedImageError, match="names no BodyPartExamined, and with --strict-routing"):
        site.seg_for(blank)
    ds.BodyPartExamined = "Torax"
    assert site.seg_for(read_frames(ds)[0]).spec.name == "lesion_unet_dx"
    with pytest.raises(ValueError, match="body_part_aliases"):
        AnalyzerConfig(body_part_aliases={"TORAX": " "})


def test_a_view_given_only_by_its_code_is_routed_by_it(tmp_path, shipped) -> None:  # type: ignore[no-untyped-def]
    """Some rooms leave ViewPosition empty and fill View Code Sequence (CID 4010): a lateral
    chest radiograph coded so is refused like one whose ViewPosition says LL, and a PA one
    is taken; a code this table does not know is read by its meaning."""
    import pydicom
    from pydicom.dataset import Dataset

    from conftest import SAMPLE_DIR
    from medrt.errors import UnsupportedImageError
    from medrt.io.dicom import read_frames
    from medrt.io.header import view_of
    from medrt.io.series import group_series

    def coded(value: str, scheme: str, meaning: str):  # type: ignore[no-untyped-def]
        ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
        ds.ViewPosition = ""
        item = Dataset()
        item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = value, scheme, meaning
        ds.ViewCodeSequence = [item]
        return ds

    lateral = coded("399067008", "SCT", "lateral")
    assert view_of(lateral) == "LATERAL"
    with pytest.raises(UnsupportedImageError, match="ViewPosition LATERAL, but lesion_unet_dx@"):
        shipped.seg_for(read_frames(lateral)[0])
    assert view_of(coded("R-10214", "SRT", "postero-anterior")) == "PA"  # an older code: by its meaning
    assert view_of(coded("X1", "99LOCAL", "Left Lateral")) == "LL"
    pa = coded("272479007", "SCT", "postero-anterior")
    assert view_of(pa) == "PA" and shipped.seg_for(read_frames(pa)[0]) is shipped.segs[1]
    assert view_of(coded("X2", "99LOCAL", "erect")) == "" and view_of(None) == ""
    lateral.ViewPosition = "PA"  # ViewPosition, where given, is what counts
    assert view_of(lateral) == "PA"
    lateral.ViewPosition = ""
    lateral.save_as(tmp_path / "lateral.dcm")
    (series,) = group_series([tmp_path / "lateral.dcm"]).series  # the series' view, for the batch plan
    assert series.view == "LATERAL"
    assert shipped.refusal("DX", body_part=series.body_part, view=series.view).startswith(
        "DX frame of ViewPosition LATERAL")


def test_a_radiograph_with_a_magnification_factor_is_measured_at_the_patient(shipped) -> None:  # type: ignore[no-untyped-def]
    """ImagerPixelSpacing is at the detector; with an Estimated Radiographic Magnification
    Factor of 1.1 the same nodules measure 1.1 times smaller, at the patient plane (the
    network sees the same input: 0.125 / 1.1 mm still averages 4 pixels to its 0.5 mm)."""
    import pydicom

    from conftest import SAMPLE_DIR
    from medrt.io.dicom import read_frames
    from medrt.types import SpacingSource

    ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
    detector = shipped.analyze(read_frames(ds)[0])
    ds.EstimatedRadiographicMagnificationFactor = "1.1"
    patient = shipped.analyze(read_frames(ds)[0])
    assert detector.frame.spacing_source is SpacingSource.IMAGER_PIXEL_SPACING
    assert patient.frame.spacing_source is SpacingSource.ERMF
    assert len(patient.lesions) == len(detector.lesions) >= 3
    for a, b in zip(detector.lesions, patient.lesions, strict=True):
        assert a.bbox == b.bbox
        assert b.diameter_mm == pytest.approx(a.diameter_mm / 1.1, rel=1e-6)
        assert b.area_mm2 == pytest.approx(a.area_mm2 / 1.21, rel=1e-6)


def test_a_coronal_or_sagittal_ct_reformat_goes_to_no_axial_model(tmp_path, shipped) -> None:  # type: ignore[no-untyped-def]
    """Every CT study comes with coronal and sagittal reformats; the CT UNet learnt axial
    slices ([model] planes = ["AXIAL"]) and would report each lesion again per reformat."""
    import pydicom

    from conftest import SAMPLE_DIR
    from medrt.errors import UnsupportedImageError
    from medrt.io.dicom import read_frames
    from medrt.types import Geometry

    def plane(*orientation: float) -> str:
        return Geometry((0.0, 0.0, 0.0), orientation).plane  # type: ignore[arg-type]

    assert plane(1, 0, 0, 0, 1, 0) == "AXIAL" and plane(1, 0, 0, 0, 0.94, -0.34) == "AXIAL"  # a tilted gantry
    assert plane(1, 0, 0, 0, 0, -1) == "CORONAL" and plane(0, 1, 0, 0, 0, -1) == "SAGITTAL"
    assert plane(0, 0, 0, 0, 0, 0) == ""

    assert shipped.segs[0].spec.planes == ("AXIAL",) and shipped.segs[1].spec.planes == ()
    assert shipped.refusal("CT", plane="coronal").startswith(
        "CT frame in the CORONAL plane (ImageOrientationPatient: a reformat, or a scan in that plane), but "
        "lesion_unet_lite@4.1.1 is for AXIAL images only (the spec's [model] planes)")
    assert shipped.refusal("CT", plane="AXIAL") is None and shipped.refusal("CT") is None
    assert shipped.refusal("DX", plane="CORONAL") is None  # a frontal radiograph with a plane

    slice_path = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[20]
    ds = pydicom.dcmread(slice_path)
    ds.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]
    ds.save_as(tmp_path / "coronal.dcm")
    axial, coronal = read_frames(slice_path)[0], read_frames(tmp_path / "coronal.dcm")[0]
    assert shipped.seg_for(axial) is shipped.segs[0]
    with pytest.raises(UnsupportedImageError, match="coronal.dcm: .*CT frame in the CORONAL plane"):
        shipped.seg_for(coronal)


def test_a_slice_reaches_the_two_and_a_half_d_model_with_its_neighbours(analyzer, ct_frames) -> None:  # type: ignore[no-untyped-def]
    """lesion_unet_lite 2.x and 3.x are 2.5-D: the slices before and after go in as channels,
    head side first whichever order they are given in, each in the model's window (3.x:
    its own fixed one); without them the slice stands in."""
    from medrt.preprocess import normalize

    assert analyzer.seg.spec.slices == 3
    p = ct_frames[20]
    frame, (before, after) = _with_neighbours(ct_frames, p, "nb")
    w = analyzer.seg.spec.input_window(frame.window)
    assert w == (-250.0, 1500.0)  # 3.x reads CT in one wide window (models/networks.py TwoWindows)
    for given in ((before, after), (after, before)):
        work = analyzer.prepare(frame, neighbours=given)
        assert work.norm.shape == (3, *frame.shape)
        assert work.sides[0] is before.pixels and work.sides[1] is after.pixels  # for a 2.5-D classifier too
        np.testing.assert_array_equal(work.norm[0], normalize(before.pixels, *w))
        np.testing.assert_array_equal(work.norm[1], normalize(frame.pixels, *w))
        np.testing.assert_array_equal(work.norm[2], normalize(after.pixels, *w))
    alone = analyzer.prepare(frame)
    np.testing.assert_array_equal(alone.norm[0], alone.norm[1])
    np.testing.assert_array_equal(alone.norm[2], alone.norm[1])
    # The neighbours reach the model's output.
    with_nb = analyzer.segment(analyzer.prepare(frame, mode="full", recheck_small=False, neighbours=(before, after)))
    without = analyzer.segment(analyzer.prepare(frame, mode="full", recheck_small=False))
    assert float(np.abs(with_nb.prob - without.prob).max()) > 0.01


def test_a_fixed_window_model_is_fed_its_own_window_not_the_frames(tmp_path, ct_frames) -> None:  # type: ignore[no-untyped-def]
    """``[normalization] method = "fixed_window"``: the analysis normalises by the spec's
    window whatever VOI window the frame carries (here a lung window)."""
    from test_registry import write_seg

    from medrt.types import Window

    spec = write_seg(tmp_path)  # logits = the normalised input itself; fixed window 40/400
    spec.write_text(spec.read_text().replace("probability = 0.5", "probability = 0.7"))
    analyzer = load_analyzer(AnalyzerConfig(seg_model=str(spec), mode="full", recheck=False,
                                            warmup_shapes=((512, 512),)))
    p = next(f for f in ct_frames if f.index == 20)
    frame = replace(p.as_frame("fixed"), window=Window(-600.0, 1500.0))
    found = analyzer.analyze(frame).labels > 0
    # sigmoid(x) >= 0.7 where x = (HU + 160) / 400 >= logit(0.7): above ~179 HU (bone, kidney)
    want = frame.pixels >= -160.0 + 400.0 * np.log(0.7 / 0.3)
    assert want.sum() > 1000
    assert (found != want).mean() < 0.01  # the lung window would have taken in all soft tissue too


def test_a_frame_without_pixel_spacing_is_analysed_with_a_warning_once_per_series(radiograph_analyzer, caplog) -> None:  # type: ignore[no-untyped-def]
    """lesion_unet works at 0.5 mm: a radiograph without (Imager)PixelSpacing cannot be
    brought there, so it runs at its own resolution, its sizes are in pixels, and the log
    says so once for the series."""
    dx = generate_radiograph(78, size=1024, index=0).as_frame("nospacing")
    bare = replace(dx, spacing_mm=None, series_instance_uid="1.2.3.4")
    for _ in range(2):
        radiograph_analyzer.analyze(bare, mode="full")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "no pixel spacing" in r.getMessage()]
    assert len(warned) == 1 and "lesion_unet@" in warned[0] and "0.5 mm" in warned[0] and "1.2.3.4" in warned[0]


def test_backend_options_reach_the_chosen_backend_only() -> None:
    """``AnalyzerConfig.backend_options[name]`` goes to backend ``name`` when it is the
    one chosen (the GPU check passes the torch backend's CUDA graph settings
    this way); options for a backend not chosen are not passed to another."""
    plain = load_analyzer(AnalyzerConfig(seg_model="lesion_unet_lite", roi_model="roi_classifier",
                                         warmup_shapes=((64, 64),)))
    assert all(m.io_binding for m in (*plain.rois, *plain.segs))
    off = load_analyzer(AnalyzerConfig(seg_model="lesion_unet_lite", roi_model="roi_classifier",
                                       warmup_shapes=((64, 64),),
                                       backend_options={"onnxruntime": {"io_binding": False},
                                                        "torch": {"cuda_graph": True, "max_graphs": 64}}))
    assert not any(m.io_binding for m in (*off.rois, *off.segs))


def test_lesions_under_the_minimum_diameter_are_not_reported(analyzer, ct_frames) -> None:  # type: ignore[no-untyped-def]
    """AnalyzerConfig.min_diameter_mm (default 1.5): the same analysis, minus what is shorter."""
    assert analyzer.config.min_diameter_mm == 1.5
    # a low threshold and no recheck (the CT false-positive filter): specks to drop
    everything = load_analyzer(replace(analyzer.config, min_diameter_mm=0.0, threshold=0.1, recheck=False))
    strict = load_analyzer(replace(analyzer.config, threshold=0.1, recheck=False))
    dropped = 0
    for p in ct_frames[::2]:
        frame, nbs = _with_neighbours(ct_frames, p, "md")
        kept, allof = strict.analyze(frame, neighbours=nbs), everything.analyze(frame, neighbours=nbs)
        assert all(les.diameter_mm >= 1.5 for les in kept.lesions)
        assert sorted(les.bbox for les in kept.lesions) == sorted(
            les.bbox for les in allof.lesions if les.diameter_mm >= 1.5)
        dropped += sum(les.diameter_mm < 1.5 for les in allof.lesions)
    assert dropped > 0, "nothing under 1.5 mm to drop: the test tests nothing"

    # without a pixel spacing the frame is read as if at the model's 0.5 mm: 3 pixels, not 1.5
    shortest = 1.5 / strict.segs[0].spec.spacing_mm
    assert shortest == 3.0
    dropped = 0
    for p in ct_frames[::2]:
        frame, nbs = _with_neighbours(ct_frames, p, "md")
        frame = replace(frame, spacing_mm=None)
        nbs = tuple(None if nb is None else replace(nb, spacing_mm=None) for nb in nbs)
        kept, allof = strict.analyze(frame, neighbours=nbs), everything.analyze(frame, neighbours=nbs)
        assert sorted(les.bbox for les in kept.lesions) == sorted(
            les.bbox for les in allof.lesions if les.diameter_mm >= shortest)
        dropped += sum(1.5 <= les.diameter_mm < shortest for les in allof.lesions)
    assert dropped > 0, "nothing between 1.5 and 3 pixels to drop: the test tests nothing"


def test_warm_up_runs_the_fine_sweeps_shapes(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Warm-up runs the fine sweep's whole-frame window (its largest input: on the CPU the
    first run of it grows ORT's arena, which made the first radiograph 2.5x the steady
    state) for a model that may sweep whole radiographs, and where a new input shape is
    costly (``Backend.few_shapes``: a GPU) its batched views in every bucket size too, so
    the first radiograph meets no new shape. A CT-only model, a 2.5-D one and the ROI
    path (which sweeps crops, not the whole frame) get only the configured shapes on the
    CPU."""
    an = load_analyzer(AnalyzerConfig(seg_model="lesion_unet", warmup_shapes=((64, 64),)))
    seg, calls = an.segs[0], []
    monkeypatch.setattr(seg, "warmup", lambda shapes, repeats=2, batch=1: calls.append((shapes, batch)))
    an.warmup()
    assert calls == [([(64, 64)], 1), ([(2048, 2048)], 1)]
    for config, model in ((replace(an.config, mode="roi"), seg.spec),
                          (replace(an.config, recheck=False), seg.spec),
                          (an.config, replace(seg.spec, modalities=("CT",))),
                          (an.config, replace(seg.spec, modalities=("CT", "DX")))):
        calls.clear()
        monkeypatch.setattr(an, "config", config)
        monkeypatch.setattr(seg, "spec", model)
        an.warmup()
        swept = (not model.modalities or "DX" in model.modalities) and config.mode != "roi" and config.recheck
        assert calls == [([(64, 64)], 1)] + ([([(2048, 2048)], 1)] if swept else []), (config, model.modalities)
    monkeypatch.undo()
    monkeypatch.setattr(seg, "warmup", lambda shapes, repeats=2, batch=1: calls.append((shapes, batch)))
    calls.clear()
    monkeypatch.setattr(seg, "few_shapes", True, raising=False)
    an.warmup()
    sides = an.config.sweep.view_sides(seg.spec.spacing_mm, seg.spec.multiple_of)
    assert sides == [320, 384, 448]
    assert calls == [([(64, 64)], 1), ([(2048, 2048)], 1), ([(h, w) for h in sides for w in sides], 2)]


def test_the_minimum_diameter_reaches_the_fine_sweep() -> None:
    """``min_diameter_mm`` is also the length from which the radiographs' fine sweep views
    and keeps a component (its own SweepConfig.min_diameter_mm is for direct callers), so
    a lower setting is not undone there before the lesion step sees it."""
    lower = load_analyzer(AnalyzerConfig(seg_model="lesion_unet", min_diameter_mm=0.5, warmup_shapes=((64, 64),)))
    assert lower.sweep_config is not None and lower.sweep_config.min_diameter_mm == 0.5
    assert lower.sweep_config.confirm == lower.config.sweep.confirm  # the rest as configured
    default = load_analyzer(AnalyzerConfig(seg_model="lesion_unet", warmup_shapes=((64, 64),)))
    assert default.sweep_config == default.config.sweep and default.sweep_config.min_diameter_mm == 1.5
    off = load_analyzer(AnalyzerConfig(seg_model="lesion_unet", sweep=None, warmup_shapes=((64, 64),)))
    assert off.sweep_config is None


def test_a_radiograph_swept_whole_is_normalised_only_where_read(radiograph_analyzer) -> None:  # type: ignore[no-untyped-def]
    """A radiograph in full mode with the fine sweep reaches it as a Windowed frame: its
    findings are those of the frame normalised whole, which is never made. The ROI path
    and a frame without the recheck get the normalised frame as before."""
    an = radiograph_analyzer
    frame = generate_radiograph(5000, size=4096, index=29).as_frame("windowed-dx")
    work = an.prepare(frame)
    assert work.mode == "full" and isinstance(work.norm, Windowed)
    assert not isinstance(an.prepare(frame, mode="roi").norm, Windowed)
    assert not isinstance(an.prepare(frame, recheck_small=False).norm, Windowed)
    lazy = an.finish(an.segment(work))
    whole = an.finish(an.segment(replace(work, norm=normalize(frame.pixels, *work.norm.window))))
    assert lazy.lesions == whole.lesions and lazy.lesions
    assert np.array_equal(lazy.labels, whole.labels)
    assert work.norm._whole is None


def test_warm_up_loads_what_measuring_a_lesion_loads_on_first_use() -> None:
    """The first frame after load_analyzer must not import Qhull (scipy.spatial, ~0.2 s
    here: the first radiograph took 1.3-1.6x the steady state's time); importing
    medrt.analyzer alone still does not."""
    code = ("import sys; from medrt.analyzer import AnalyzerConfig, load_analyzer; "
            "before = 'scipy.spatial' in sys.modules; "
            "load_analyzer(AnalyzerConfig(seg_model='lesion_unet_lite', warmup_shapes=((64, 64),))); "
            "print(before, 'scipy.spatial' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_the_engine_routes_and_gates_without_the_analyzer() -> None:
    """Layering: the INT8 gate and the modality routing live below the analyzer (the
    analyzer builds INT8 twins through the gate, so the gate must not need it back), and
    medrt.analyzer re-exports the very objects the faces import from it."""
    code = ("import sys; import medrt.engine.gate, medrt.engine.routing, medrt.analysis.config; "
            "print('medrt.analyzer' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]
    import medrt.analysis.config as config
    import medrt.analyzer as analyzer
    import medrt.engine.routing as routing

    assert analyzer.AnalyzerConfig is config.AnalyzerConfig and analyzer.sweep_config is config.sweep_config
    assert analyzer.pick_for_modality is routing.pick_for_modality
    assert analyzer.routing_modality is routing.routing_modality


def test_a_radiographs_black_shutter_border_is_not_read_as_nodules(shipped, tmp_path):
    """A radiograph with a 60-pixel black collimation border, marked as Pixel Padding Value
    (as modalities do): the networks marked its corners as nodules (3 to 5 false lesions of
    5-14 mm per image in an audit). The border is filled from the image's edge for the
    models only (the frame shows it black) and the findings are those of the image without
    a border."""
    import pydicom

    from medrt.io.dicom import read_frames
    from medrt.phantom import write_radiographs

    (path,) = write_radiographs(tmp_path, 7, count=1, size=2048, compress="none")
    ds = pydicom.dcmread(path)
    stored = ds.pixel_array.copy()
    b = 60
    stored[:b], stored[-b:], stored[:, :b], stored[:, -b:] = 0, 0, 0, 0
    ds.PixelData = stored.astype("<u2").tobytes()
    ds.PixelPaddingValue = 0
    ds["PixelPaddingValue"].VR = "US"
    (shuttered,) = read_frames(ds)
    assert shuttered.content_box == (b, 2048 - b, b, 2048 - b)
    assert shuttered.pixels[0, 0] == shuttered.pixels[: b, :].min()  # shown as it is: black
    (plain,) = read_frames(path)
    assert plain.content_box is None

    def found(frame):  # type: ignore[no-untyped-def]
        return sorted((round(les.centroid[0]), round(les.centroid[1])) for les in shipped.analyze(frame).lesions)

    inside = [c for c in found(plain) if b <= min(c) and max(c) < 2048 - b]
    assert found(shuttered) == inside and inside
    del ds.PixelPaddingValue  # the same border, not marked: no box, and the corners are read as nodules
    (unmarked,) = read_frames(ds)
    assert unmarked.content_box is None and len(found(unmarked)) > len(inside)


def test_pixels_that_are_not_square_are_named_once_per_series(analyzer, ct_frames, caplog):
    """The models are not given anisotropic pixels resampled to square ones: they see the
    image stretched, and an audit's 0.7 x 1.4 mm CT lost its small lesions. The log says so,
    once per series."""
    caplog.set_level("WARNING", logger="medrt")
    frames = [replace(f.as_frame(f"sq{f.index}"), spacing_mm=(0.7, 1.4)) for f in ct_frames[:3]]
    for frame in frames:
        analyzer.prepare(frame)
    assert caplog.text.count("pixels are not square (0.7 x 1.4 mm)") == 1
    assert "stretched 2.00 times" in caplog.text and frames[0].series_instance_uid in caplog.text
    analyzer.prepare(replace(ct_frames[3].as_frame("sq3"), spacing_mm=(0.7, 0.72)))  # within 10 %: nothing to say
    assert caplog.text.count("not square") == 1
