"""Series lesions: the sections of one lesion on neighbouring CT slices counted once.

The phantom's ground truth keeps a 3-D lesion's label on every slice it crosses, so what
a perfect analyzer finds slice by slice must link back into exactly those lesions.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from test_analysis_slices import as_acquisition

from medrt import read_frames
from medrt.analysis.tracking import LesionCounter, link_series
from medrt.bench.outputs import truth_result
from medrt.phantom import load_ground_truth, write_ct_series, write_radiographs
from medrt.types import FrameResult


@pytest.fixture(scope="module")
def ct(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[FrameResult], list[np.ndarray]]:
    """A 40-slice 256² CT phantom read back from disk, the truth of each slice beside it."""
    folder = tmp_path_factory.mktemp("ct")
    paths = write_ct_series(folder, 11, n_frames=40, size=256, compress="none")
    truth = load_ground_truth(folder)
    frames = [f for p in paths for f in read_frames(p)]
    masks = [np.asarray(truth[f.sop_instance_uid].mask) for f in frames]
    return [truth_result(f, m) for f, m in zip(frames, masks, strict=True)], masks


def true_label(result: FrameResult, mask: np.ndarray, label: int) -> int:
    values = mask[(result.labels == label) & (mask > 0)]
    return int(np.bincount(values).argmax())


def test_sections_link_into_the_phantoms_3d_lesions(ct) -> None:  # type: ignore[no-untyped-def]
    results, masks = ct
    lesions, numbers = link_series(results)
    truth: dict[tuple[str, int], int] = {}  # section -> the 3-D lesion it is a section of
    for r, m in zip(results, masks, strict=True):
        for les in r.lesions:
            truth[(r.frame.key, les.label)] = true_label(r, m, les.label)
    assert set(numbers) == set(truth) and len(truth) > len(lesions) > 2  # several lesions, most on several slices
    by_number: dict[int, set[int]] = {}
    for key, n in numbers.items():
        by_number.setdefault(n, set()).add(truth[key])
    assert all(len(v) == 1 for v in by_number.values())  # no two true lesions joined
    assert len({next(iter(v)) for v in by_number.values()}) == len(lesions)  # no true lesion split

    step = abs(float(np.dot(results[1].frame.geometry.position, results[1].frame.geometry.normal))
               - float(np.dot(results[0].frame.geometry.position, results[0].frame.geometry.normal)))
    assert step in (3.0, 5.0)
    keys = [r.frame.key for r in results]  # head first, as written
    for les in lesions:
        assert [s.slice for s in les.sections] == sorted(s.slice for s in les.sections)
        assert les.slices == len(les.sections) and les.in_mm
        assert les.diameter_mm == max(s.lesion.diameter_mm for s in les.sections) == les.largest.lesion.diameter_mm
        assert les.volume_mm3 == pytest.approx(sum(s.lesion.area_mm2 for s in les.sections) * step)
        record = les.to_json()
        assert record["lesion"] == les.number and record["first"]["sop_instance_uid"] == les.sections[0].sop_instance_uid
        assert record["slices"] == les.slices and record["diameter_px"] is None
    firsts = [keys.index(les.sections[0].key) for les in lesions]
    assert firsts == sorted(firsts) and [les.number for les in lesions] == list(range(1, len(lesions) + 1))

    shuffled = results[:]
    random.Random(3).shuffle(shuffled)
    again, again_numbers = link_series(shuffled)  # the order frames arrive in does not matter
    assert again_numbers == numbers and [les.uid for les in again] == [les.uid for les in lesions]
    assert len({les.uid for les in lesions}) == len(lesions)


def test_a_gap_in_the_series_breaks_a_lesion_and_no_mm_means_no_volume(ct) -> None:  # type: ignore[no-untyped-def]
    from medrt.analysis.slices import MAX_GAP_MM

    results, _ = ct
    lesions, _ = link_series(results)
    g0, g1 = (r.frame.geometry for r in results[:2])
    step = abs(float(np.dot(np.subtract(g0.position, g1.position), g0.normal)))
    k = int(MAX_GAP_MM // step)  # this many slices missing leaves a gap over MAX_GAP_MM
    tall = max(lesions, key=lambda les: les.slices)
    assert tall.slices >= k + 2
    first = tall.sections[1].slice
    kept = results[:first] + results[first + k:]
    _, numbers = link_series(kept)
    before, after = tall.sections[0], tall.sections[-1]
    assert numbers[(before.key, before.lesion.label)] != numbers[(after.key, after.lesion.label)]
    _, whole = link_series(results[:first] + results[first + k - 1:])  # one slice fewer: within the gap
    assert whole[(before.key, before.lesion.label)] == whole[(after.key, after.lesion.label)]

    no_mm = [replace(r, frame=replace(r.frame, spacing_mm=None)) for r in results]
    pixels, _ = link_series(no_mm)
    assert len(pixels) == len(lesions) and all(les.volume_mm3 is None and not les.in_mm for les in pixels)
    assert pixels[0].to_json()["diameter_mm"] is None and pixels[0].to_json()["diameter_px"] is not None


def test_two_whole_acquisitions_are_linked_each_by_itself(ct) -> None:  # type: ignore[no-untyped-def]
    """A pre- and a post-contrast pass in one series: each pass gets the lesions it gets
    alone, numbered on from one pass to the next, each saying its acquisition; a section of
    one pass was joined to the other's on the slice beside it, one lesion over both."""
    results, _ = ct
    alone, _ = link_series(results)
    first = [replace(r, frame=as_acquisition(r.frame, 1)) for r in results]
    second = [replace(r, frame=as_acquisition(r.frame, 2)) for r in results]
    mixed = first + second
    random.Random(4).shuffle(mixed)
    lesions, numbers = link_series(mixed)
    assert len(lesions) == 2 * len(alone) and [les.number for les in lesions] == list(range(1, len(lesions) + 1))

    def shape(found):  # type: ignore[no-untyped-def]
        return [(les.slices, round(les.diameter_mm, 4), les.volume_mm3) for les in found]

    assert shape(lesions[:len(alone)]) == shape(lesions[len(alone):]) == shape(alone)
    assert {les.acquisition for les in lesions[:len(alone)]} == {1} and lesions[0].to_json()["acquisition"] == 1
    assert {les.acquisition for les in lesions[len(alone):]} == {2} and alone[0].acquisition is None
    for les in lesions:  # no lesion has sections of both passes
        assert len({s.sop_instance_uid.endswith(".2") for s in les.sections}) == 1
    assert len(numbers) == 2 * sum(len(r.lesions) for r in results)


def test_radiographs_keep_one_lesion_per_section(tmp_path) -> None:  # type: ignore[no-untyped-def]
    paths = write_radiographs(tmp_path, 5, count=2, size=512, compress="none")
    truth = load_ground_truth(tmp_path)
    results = [truth_result(f, truth[f.sop_instance_uid].mask) for p in paths for f in read_frames(p)]
    lesions, numbers = link_series(results)
    assert len(lesions) == sum(len(r.lesions) for r in results) > 0
    assert all(les.slices == 1 and les.volume_mm3 is None for les in lesions)
    assert link_series([]) == ([], {})


def test_a_stream_counts_each_lesion_once_as_the_slices_come(ct) -> None:  # type: ignore[no-untyped-def]
    """medrt stream links each slice to the one before: on the whole series, as the
    scanner sends it, the same lesions as link_series, holding one frame at a time."""
    results, _ = ct
    lesions, numbers = link_series(results)
    counter = LesionCounter()
    streamed = {}
    for r in results:  # head first, as written and replayed
        for les, n in zip(r.lesions, counter.add(r), strict=True):
            streamed[(r.frame.key, les.label)] = n
    assert counter.lesions == len(lesions) and counter.sections == len(numbers)
    assert streamed == numbers  # numbered in the same order, too
    dropped = LesionCounter()
    tall = max(lesions, key=lambda les: les.slices)
    gone = {s.key for s in tall.sections[1:-1]}
    for r in results:  # the stream dropped the middle of the tallest lesion: over the gap, a new one
        if r.frame.key not in gone or tall.slices < 4:
            dropped.add(r)
    assert dropped.lesions >= len(lesions)


def _disc_mask(shape: tuple[int, int], centres: list[tuple[int, int]], radius: int) -> np.ndarray:
    rows, cols = np.ogrid[:shape[0], :shape[1]]
    mask = np.zeros(shape, np.uint8)
    for r, c in centres:
        mask[(rows - r) ** 2 + (cols - c) ** 2 <= radius ** 2] = 1
    return mask


def test_a_stream_counts_parts_that_meet_on_a_later_slice_once(ct) -> None:  # type: ignore[no-untyped-def]
    """A V along the slices: two sections apart on the first slices, one where they meet.
    The stream has numbered both parts before it sees them meet; it counts them once then,
    as link_series does for the whole series, and the slices after carry the first number."""
    results, _ = ct
    frames = [r.frame for r in results[10:16]]
    shape = results[0].labels.shape
    arms = [[(100, 60), (100, 140)], [(100, 75), (100, 125)], [(100, 88), (100, 112)],
            [(100, 100)], [(100, 100)], [(100, 100)]]
    v = [truth_result(f, _disc_mask(shape, centres, 14)) for f, centres in zip(frames, arms, strict=True)]
    assert [len(r.lesions) for r in v] == [2, 2, 1, 1, 1, 1]  # two arms, then one section
    lesions, _ = link_series(v)
    counter = LesionCounter()
    streamed = [counter.add(r) for r in v]
    assert len(lesions) == 1 and counter.lesions == 1 and counter.sections == 8
    assert streamed[:2] == [[1, 2], [1, 2]] and streamed[2:] == [[1]] * 4
    other = next(r for r in results if r.lesions)  # another series' lesion: numbered after both parts
    assert counter.add(replace(other, frame=replace(other.frame, series_instance_uid="1.2.3.4")))[0] == 3
    assert counter.lesions == 1 + len(other.lesions)


def test_a_stream_of_two_whole_acquisitions_counts_each_pass_by_itself(ct) -> None:  # type: ignore[no-untyped-def]
    """A pre- and a post-contrast pass in one series, streamed: the last slice of the first
    pass stood one or two steps (<= 10 mm) from the first slice of the next, so the stream
    joined a lesion of one pass to the other's and counted fewer lesions than link_series.
    Each pass is now linked by itself, in order or interleaved, and a sequential CT that
    numbers every slice (or every rotation) as an acquisition of its own is still one pass."""
    results, _ = ct
    frames = [r.frame for r in results[10:13]]  # three slices: a pass spans 6 or 10 mm
    shape = results[0].labels.shape
    disc = [truth_result(f, _disc_mask(shape, [(100, 100)], 14)) for f in frames]  # one lesion through all three

    def passes(group: list[FrameResult]) -> list[FrameResult]:
        return [replace(r, frame=as_acquisition(r.frame, n)) for n in (1, 2) for r in group]

    for group in (disc, results):
        both = passes(group)
        lesions, numbers = link_series(both)
        counter = LesionCounter()
        streamed = {}
        for r in both:  # each pass head first, one after the other, as a scanner sends them
            for les, n in zip(r.lesions, counter.add(r), strict=True):
                streamed[(r.frame.key, les.label)] = n
        assert counter.lesions == len(lesions) == 2 * len(link_series(group)[0])
        assert streamed == numbers and counter.sections == len(numbers)
        interleaved = LesionCounter()  # by position, the two passes' images in turn
        for a, b in zip(both[:len(group)], both[len(group):], strict=True):
            interleaved.add(a)
            interleaved.add(b)
        assert interleaved.lesions == len(lesions)
    assert len(link_series(disc)[0]) == 1

    alone, numbers = link_series(results)
    for per in (1, 4):  # a sequential CT: an AcquisitionNumber per slice, or per rotation of 4
        counter = LesionCounter()
        streamed = {}
        for k, r in enumerate(results):
            r = replace(r, frame=as_acquisition(r.frame, k // per + 1))
            for les, n in zip(r.lesions, counter.add(r), strict=True):
                streamed[(r.frame.key, les.label)] = n
        assert counter.lesions == len(alone) and len(streamed) == len(numbers)


def test_a_second_pass_sent_with_the_first_is_told_apart_as_the_live_neighbours_tell_it(ct) -> None:  # type: ignore[no-untyped-def]
    """A post-contrast pass over the lower half of a series, sent at the same time as the
    whole pre-contrast pass (two senders, the images in turn): LesionCounter compared each
    frame with its series' last frame's pass only, so the second pass, starting where the
    first had not been yet, was never a pass of its own; every frame followed one of the
    other pass 100 mm away, nothing was linked, and the stream counted 30 lesions where
    link_series counts 18. LivePasses, which picks the live neighbours of a 2.5-D model,
    held the two apart from the first pass's first slice in the second's range: the
    counter now asks it too, and counts as link_series does."""
    from medrt.analysis.slices import along_normal
    from medrt.io.stacks import LivePasses

    results, _ = ct
    first = [replace(r, frame=as_acquisition(r.frame, 1)) for r in results]
    second = [replace(r, frame=as_acquisition(r.frame, 2)) for r in results[20:]]
    lesions, numbers = link_series(first + second)
    assert len(lesions) == len(link_series(results)[0]) + len(link_series(results[20:])[0])
    sent = [r for pair in zip(first[:20], second, strict=True) for r in pair] + first[20:]
    counter, passes = LesionCounter(), LivePasses()
    for r in sent:
        counter.add(r)
        passes.add(r.frame.series_instance_uid, 1 if r in first else 2, along_normal(r.frame))
    assert passes.apart(results[0].frame.series_instance_uid, 1, 2)
    assert counter.lesions == len(lesions) and counter.sections == len(numbers)


def test_a_slice_without_a_position_stands_in_its_gap_by_instance_number(ct) -> None:  # type: ignore[no-untyped-def]
    """A damaged slice (no ImagePositionPatient) split each lesion through it in two. It now
    takes its place by InstanceNumber and bridges its neighbours when they are two steps
    apart; not when a slice beside it is missing too, nor when the instance numbers do not
    run with the positions."""
    results, _ = ct
    lesions, numbers = link_series(results)
    k = next(i for i, r in enumerate(results[1:-1], start=1)  # a slice inside a lesion of several
             if any(les.slices >= 3 and les.sections[0].slice < i < les.sections[-1].slice for les in lesions))
    damaged = [*results[:k], replace(results[k], frame=replace(results[k].frame, geometry=None)), *results[k + 1:]]
    assert damaged[k].lesions
    got, got_numbers = link_series(damaged)
    assert got_numbers == numbers and [les.volume_mm3 for les in got] == [les.volume_mm3 for les in lesions]
    shuffled = damaged[:]
    random.Random(4).shuffle(shuffled)
    assert link_series(shuffled)[1] == numbers

    gap = [*damaged[:k + 1], *damaged[k + 2:]]  # the slice after it missing as well: no bridge
    assert len(link_series(gap)[0]) > len(link_series([*results[:k + 1], *results[k + 2:]])[0])

    def renumbered(r: FrameResult, n: int) -> FrameResult:
        ds = r.frame.source.dataset.copy()
        ds.InstanceNumber = n
        return replace(r, frame=replace(r.frame, source=replace(r.frame.source, dataset=ds)))

    order = list(range(1, len(damaged) + 1))
    random.Random(6).shuffle(order)  # instance numbers that say nothing of the slice order
    assert len(link_series([renumbered(r, n) for r, n in zip(damaged, order, strict=True)])[0]) > len(lesions)


def test_live_passes_forget_the_pairs_of_an_acquisition_they_no_longer_hold() -> None:
    """A series of one AcquisitionNumber per image, all at one place (a dynamic or cine
    series): each image is apart from every held one. The acquisitions held are capped
    (``per_series``), but their pairs were kept for good: with the default cap, about a
    thousand more pairs an image for as long as a watched folder runs."""
    from medrt.io.stacks import LivePasses

    passes = LivePasses(per_series=4)
    for acquisition in range(1, 101):
        passes.add("s", acquisition, 0.0)
    assert passes.apart("s", 99, 100) and passes.apart("s", 100, 97) and passes.of_its_own("s", 100)
    assert not passes.apart("s", 1, 2) and not passes.of_its_own("s", 1)  # long gone
    held = passes._apart["s"]
    assert set(held) == {97, 98, 99, 100} and all(len(others) == 3 for others in held.values())
