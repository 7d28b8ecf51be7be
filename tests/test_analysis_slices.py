"""2.5-D inputs: which frames are neighbours, the input stack, and the decode stage that
hands each file its neighbouring slices."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from medrt.analysis.slices import adjacent, series_neighbours, slice_stack, stack_pixels
from medrt.io.dicom import read_frames
from medrt.pipeline.stages import Decoded, SliceContext, decode
from medrt.types import Frame, Geometry

STREAM = REPO / "sample_dicom" / "ct_stream"


@pytest.fixture(scope="module")
def series() -> list:
    paths = sorted(STREAM.glob("*.dcm"))[:4]
    return [read_frames(p)[0] for p in paths]


def _moved(frame: object, dz: float) -> object:
    g = frame.geometry  # type: ignore[attr-defined]
    return replace(frame, geometry=Geometry((g.position[0], g.position[1], g.position[2] + dz), g.orientation))


def test_neighbours_are_checked_not_assumed(series: list) -> None:
    a, b = series[0], series[1]
    assert adjacent(a, b) and adjacent(b, a)
    assert not adjacent(a, a) and not adjacent(a, None)
    assert not adjacent(a, replace(b, series_instance_uid="1.2.3.4"))  # another series
    assert not adjacent(a, replace(b, spacing_mm=(9.0, 9.0)))
    assert not adjacent(a, _moved(b, -20.0))  # a gap: a missing slice
    assert not adjacent(a, _moved(b, a.geometry.position[2] - b.geometry.position[2]))  # the same position
    tilted = replace(b, geometry=Geometry(b.geometry.position, (1.0, 0.0, 0.0, 0.0, 0.0, 1.0)))
    assert not adjacent(a, tilted)
    nbs = series_neighbours(series)
    assert nbs[0][0] is None and nbs[0][1] is series[1]
    assert nbs[-1][1] is None and nbs[2] == (series[1], series[3])


def test_stack_is_head_to_feet_whatever_the_reading_order(series: list) -> None:
    head, mid, feet = series[0], series[1], series[2]  # the sample runs head to feet (z falling)
    assert head.geometry.position[2] > mid.geometry.position[2] > feet.geometry.position[2]
    one = slice_stack(mid, (head, feet))
    other = slice_stack(mid, (feet, head))
    np.testing.assert_array_equal(one, other)
    w = (mid.window.center, mid.window.width)
    np.testing.assert_array_equal(one, stack_pixels(mid.pixels, w, head.pixels, feet.pixels))
    # Neighbours are normalised by this frame's window, and a missing one is the frame again.
    alone = slice_stack(mid, (None, replace(feet, series_instance_uid="9.9")))
    np.testing.assert_array_equal(alone[0], alone[1])
    np.testing.assert_array_equal(alone[2], alone[1])
    assert not np.array_equal(one[0], one[1])


def test_slice_context_decodes_each_file_once_in_order(tmp_path: Path) -> None:
    paths = sorted(STREAM.glob("*.dcm"))[:5]
    calls: list[str] = []

    def counting(item: object) -> list[Decoded]:
        calls.append(str(item))
        return decode(item)

    ctx = SliceContext(counting, paths)
    out = [ctx(p) for p in paths]
    assert sorted(calls) == sorted(str(p) for p in paths) and len(calls) == len(paths)
    assert all(len(o) == 1 for o in out)
    first, second = out[0][0], out[1][0]
    assert first.neighbours[0] is None and first.neighbours[1] is second.frame
    assert second.neighbours == (first.frame, out[2][0].frame)
    # What is not in the order (bytes, another file) passes through without neighbours.
    other = tmp_path / "x.dcm"
    other.write_bytes(paths[0].read_bytes())
    assert ctx(other)[0].neighbours is None
    assert ctx(paths[0].read_bytes())[0].neighbours is None


def test_slice_context_skips_a_neighbour_that_cannot_be_decoded(tmp_path: Path) -> None:
    paths = sorted(STREAM.glob("*.dcm"))[:3]
    bad = tmp_path / "bad.dcm"
    bad.write_bytes(b"not a DICOM file")
    ctx = SliceContext(decode, [paths[0], bad, paths[1]])
    d = ctx(paths[0])[0]
    assert d.neighbours == (None, None)


def test_a_live_source_gets_the_slice_decoded_before(series: list) -> None:
    """Without a file order (a watched folder, a queue) the next slice has not arrived:
    each frame gets the one decoded before it; a radiograph (no position) gets none."""
    paths = sorted(STREAM.glob("*.dcm"))[:3]
    ctx = SliceContext(decode)
    out = [ctx(p)[0] for p in paths]
    assert out[0].neighbours == (None, None)
    assert out[1].neighbours[0] is out[0].frame and out[1].neighbours[1] is None
    stack = slice_stack(out[1].frame, out[1].neighbours)  # the earlier slice is on the head side
    w = (out[1].frame.window.center, out[1].frame.window.width)
    np.testing.assert_array_equal(stack, stack_pixels(out[1].frame.pixels, w, out[0].frame.pixels, None))
    dx = sorted((REPO / "sample_dicom" / "radiographs").glob("*.dcm"))[0]
    assert ctx(dx)[0].neighbours is None


def test_a_live_source_with_lookahead_gets_both_neighbours_and_decodes_each_file_once() -> None:
    """With ``ahead`` (a Lookahead source: the files that arrived after this one) a
    live frame gets the slice after it too, as a replay in file order does; that file is
    decoded once and reused for its own turn."""
    paths = sorted(STREAM.glob("*.dcm"))[:4]
    after = dict(zip(paths[:-1], paths[1:], strict=True))  # the last one: nothing came in time
    calls: list[str] = []

    def counting(item: object) -> list[Decoded]:
        calls.append(str(item))
        return decode(item)

    class Ahead:  # what a Lookahead of depth 1 says (the real one: the thin-slice test below)
        depth = 1

        def following(self, item: object) -> list:
            return [after[item]] if item in after else []

        def want(self, depth: int) -> None:
            self.depth = depth

    ahead = Ahead()
    live = SliceContext(counting, ahead=ahead, target_mm=3.0)
    out = [live(p)[0] for p in paths]
    ordered = [d[0] for d in map(SliceContext(decode, paths), paths)]
    assert sorted(calls) == sorted(str(p) for p in paths)  # each file decoded once
    for got, want in zip(out, ordered, strict=True):
        assert [None if n is None else n.sop_instance_uid for n in got.neighbours] == \
            [None if n is None else n.sop_instance_uid for n in want.neighbours]
    assert out[1].neighbours[1] is out[2].frame and out[-1].neighbours[1] is None
    assert ahead.depth == 1  # 5 mm slices: the next one is the model's 3 mm neighbour


def test_slice_context_keeps_only_slices(tmp_path: Path) -> None:
    """A radiograph in the file order is decoded once and not held: it cannot be anyone's
    neighbour, and a 4096² frame is 64 MB."""
    ct = sorted(STREAM.glob("*.dcm"))[:2]
    dx = sorted((REPO / "sample_dicom" / "radiographs").glob("*.dcm"))[0]
    ctx = SliceContext(decode, [ct[0], dx, ct[1]])
    assert ctx(dx)[0].neighbours is None
    assert ctx(ct[0])[0].neighbours == (None, None)  # the radiograph beside it is no neighbour
    assert str(dx) not in ctx._cache and str(ct[0]) in ctx._cache


@pytest.fixture(scope="module")
def thin() -> list:
    """A 1 mm phantom series (the models learnt 3 and 5 mm slices)."""
    from medrt.phantom import generate_ct_series

    return [p.as_frame(f"thin{p.index}") for p in generate_ct_series(31, n_frames=12, size=64, thickness_mm=1.0)]


def test_a_thin_series_gives_the_neighbours_the_model_learnt(thin: list) -> None:
    """With [model] neighbour_mm each side's neighbour is the slice nearest that distance;
    the walk stops at a gap or another series, and without a target it is the next slice."""
    from medrt.analysis.slices import along_normal, nearest_at
    from medrt.engine.registry import find_spec
    from medrt.phantom import generate_ct_series

    assert find_spec("lesion_unet_lite").neighbour_mm == 3.0
    with pytest.raises(ValueError, match="thickness_mm"):
        generate_ct_series(31, n_frames=2, size=64, thickness_mm=0.0)
    steps = {round(abs(along_normal(a) - along_normal(b)), 6) for a, b in zip(thin, thin[1:], strict=False)}
    assert steps == {1.0}
    nbs = series_neighbours(thin, 3.0)
    assert nbs[5] == (thin[2], thin[8]) and nbs[1] == (thin[0], thin[4]) and nbs[-1] == (thin[-4], None)
    assert series_neighbours(thin)[5] == (thin[4], thin[6])
    assert series_neighbours(thin, 2.5)[5] == (thin[3], thin[7])  # 2 and 3 mm are as near: the nearer one
    # a 3 mm series: the next slice is 3 mm away already
    three = [replace(f, geometry=Geometry((*f.geometry.position[:2], f.geometry.position[2] * 3.0),
                                          f.geometry.orientation)) for f in thin]
    assert series_neighbours(three, 3.0)[5] == (three[4], three[6])
    # the walk ends at a slice of another series, and looks at no slice past it
    seen: list = []
    mixed = [thin[6], replace(thin[7], series_instance_uid="9.9"), thin[8], thin[9]]

    def outward():
        for f in mixed:
            seen.append(f)
            yield f

    assert nearest_at(thin[5], outward(), 3.0) is thin[6] and len(seen) == 2


def test_slice_context_takes_the_neighbours_the_model_learnt(thin: list) -> None:
    """Files in order (a batch, a replay): the files up to neighbour_mm away are decoded
    once each; a multi-frame object's frames get theirs too."""
    items = [f"slice{i}" for i in range(len(thin))]
    by_item = dict(zip(items, thin, strict=True))
    calls: list[str] = []

    def decoder(item: object) -> list[Decoded]:
        calls.append(str(item))
        if item == "multi":
            return [Decoded(f, 0.0, nb) for f, nb in zip(thin, series_neighbours(thin), strict=True)]
        return [Decoded(by_item[str(item)], 0.0)]

    ctx = SliceContext(decoder, items, target_mm=3.0)
    out = [ctx(i)[0] for i in items]
    assert out[5].neighbours == (thin[2], thin[8]) and out[0].neighbours == (None, thin[3])
    assert sorted(calls) == sorted(items)  # each once, from the cache after
    multi = ctx("multi")
    assert multi[5].neighbours == (thin[2], thin[8])
    assert SliceContext(decoder, items)(items[5])[0].neighbours == (thin[4], thin[6])  # no target: the next


def as_acquisition(frame: Frame, number: int) -> Frame:
    """``frame`` as an image of whole acquisition ``number`` of its series (a post-contrast
    pass at the same positions): its own header copy with that AcquisitionNumber and, for a
    pass other than 1, its own SOPInstanceUID (the frame's; the header's is not read here)."""
    ds = copy.deepcopy(frame.source.dataset)
    ds.AcquisitionNumber = number
    uid = frame.sop_instance_uid if number == 1 else f"{frame.sop_instance_uid}.{number}"
    return replace(frame, sop_instance_uid=uid, source=replace(frame.source, dataset=ds))


def test_two_whole_acquisitions_are_never_each_others_neighbours(thin: list) -> None:
    """A series holding two passes at the same positions (medrt.io.stacks): each slice's
    neighbours are of its own pass, whatever order the frames come in; a stack's last
    slice was given the other pass's first (9 mm away on a 4-slice 3 mm series)."""
    three = [replace(f, geometry=Geometry((*f.geometry.position[:2], f.geometry.position[2] * 3.0),
                                          f.geometry.orientation)) for f in thin[:4]]
    a = [as_acquisition(f, 1) for f in three]
    b = [as_acquisition(f, 2) for f in three]
    by_stack = series_neighbours(a + b)
    assert by_stack[:4] == series_neighbours(a) and by_stack[4:] == series_neighbours(b)
    assert by_stack[3] == (a[2], None) and by_stack[4] == (None, b[1])
    interleaved = [f for pair in zip(a, b, strict=True) for f in pair]  # by position, as a folder sorts
    nbs = dict(zip((f.sop_instance_uid for f in interleaved), series_neighbours(interleaved, 3.0), strict=True))
    assert [nbs[f.sop_instance_uid] for f in a] == series_neighbours(a, 3.0)
    assert [nbs[f.sop_instance_uid] for f in b] == series_neighbours(b, 3.0)
    assert series_neighbours(b)[1] == (b[0], b[2])
    # the batch's file order: a None ends a stack (medrt.io.series.slice_order)
    items = [f"a{i}" for i in range(4)] + [None] + [f"b{i}" for i in range(4)] + [None]
    by_item = dict(zip([i for i in items if i], a + b, strict=True))
    ctx = SliceContext(lambda item: [Decoded(by_item[str(item)], 0.0)], items, target_mm=3.0)
    assert ctx("a3")[0].neighbours == (a[2], None) and ctx("b0")[0].neighbours == (None, b[1])
    assert ctx("b2")[0].neighbours == (b[1], b[3])


def test_a_watched_thin_series_gets_the_neighbours_the_model_learnt(thin: list) -> None:
    """A live source (a watched folder behind a Lookahead): from the slices' spacing the
    decode stage asks the source to hold three files on a 1 mm series for a model that
    learnt 3 mm neighbours, and from then on each slice gets the slices 3 mm before and
    after it, as a replay in file order gives them; each file is decoded once."""
    import threading

    from medrt.io.sources import Lookahead, QueueSource

    items = [f"slice{i}" for i in range(len(thin))]
    by_item = dict(zip(items, thin, strict=True))
    calls: list[str] = []

    def decoder(item: object) -> list[Decoded]:
        calls.append(str(item))
        return [Decoded(by_item[str(item)], 0.0)]

    src = QueueSource()
    ahead = Lookahead(src, wait=5.0)
    ctx = SliceContext(decoder, ahead=ahead, target_mm=3.0)
    for item in items:
        src.put(item)
    src.close()
    got: list = []
    t = threading.Thread(target=lambda: got.extend(ctx(item)[0] for item in ahead))  # the decode stage
    t.start()
    t.join(20)
    assert not t.is_alive() and len(got) == len(thin)
    assert ahead.depth == 3
    assert sorted(calls) == sorted(items)
    want = series_neighbours(thin, 3.0)
    assert got[0].neighbours == (None, thin[1])  # before the spacing was known: the next file
    for i in range(1, len(thin)):
        assert got[i].neighbours == want[i], i
    assert got[5].neighbours == (thin[2], thin[8])


def test_neighbours_among_slices_in_any_order(thin: list) -> None:
    """nearest_sides: the head- and feet-side neighbours among slices that came in no
    order (a sender that does not send in slice order), other series and far slices left
    out; the same as series_neighbours on the ordered series."""
    from medrt.analysis.slices import nearest_sides

    rng = np.random.default_rng(3)
    other = replace(thin[6], series_instance_uid="9.9")
    for target in (None, 3.0):
        want = series_neighbours(thin, target)
        for i in (0, 5, 11):
            pool = [thin[j] for j in rng.permutation(len(thin)) if j != i] + [other, None]
            assert nearest_sides(thin[i], pool, target) == want[i], (target, i)
    assert nearest_sides(thin[5], [thin[0], thin[11], thin[5]], 3.0) == (thin[0], thin[11])  # the nearest there is
    assert nearest_sides(thin[5], [replace(thin[0], geometry=None)], None) == (None, None)


def test_a_live_source_out_of_slice_order_still_finds_the_neighbours(thin: list) -> None:
    """Two series landing interleaved (a scanner sending two reconstructions at once),
    each two by two in the wrong order (a PACS's own order, a spool named by SOP Instance
    UID): the source is asked to hold twice the files the spacing needs, and each slice's
    neighbours are looked for among those received lately and those held after it, one
    on each side and of its own series, not taken as the files next to it in arrival
    order; so every slice gets one on each side, 2-4 mm away (in order: 3 mm)."""
    import threading

    from medrt.analysis.slices import along_normal
    from medrt.io.sources import Lookahead, QueueSource

    other = [replace(f, series_instance_uid="9.9", sop_instance_uid=f"{f.sop_instance_uid}.9") for f in thin]
    by_item = {}
    for i in [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10]:
        by_item[f"a{i}"], by_item[f"b{i}"] = thin[i], other[i]

    def decoder(item: object) -> list[Decoded]:
        return [Decoded(by_item[str(item)], 0.0)]

    src = QueueSource()
    ahead = Lookahead(src, wait=5.0, depth=0)
    ctx = SliceContext(decoder, ahead=ahead, target_mm=3.0)
    for item in by_item:
        src.put(item)
    src.close()
    got: dict[str, object] = {}
    t = threading.Thread(target=lambda: got.update((item, ctx(item)[0]) for item in ahead))
    t.start()
    t.join(20)
    assert not t.is_alive() and len(got) == 2 * len(thin) and ahead.depth == 6  # 3 files x 2 series
    for series, frames in (("a", thin), ("b", other)):
        for i in range(2, len(thin) - 2):  # 0 and 1 came before the spacing was known, 10 and 11 last
            here = got[f"{series}{i}"]
            gaps = [along_normal(frames[i]) - along_normal(nb) for nb in here.neighbours]
            assert gaps[0] < 0 < gaps[1] and all(2.0 <= abs(g) <= 4.0 for g in gaps), (series, i, gaps)
            assert {nb.series_instance_uid for nb in here.neighbours} == {frames[i].series_instance_uid}


def test_a_watched_folder_keeps_the_passes_of_one_series_apart(tmp_path: Path) -> None:
    """A pre- and a post-contrast pass of six 5 mm slices copied into a watched folder
    interleaved (each position's first-pass image, then its second-pass one): each
    slice's neighbours are of its own pass, and once the first slices said the spacing
    (the source holds two files: two passes arriving together) they are the replay's,
    which ends each pass (FileReplay.slice_order). Before, the feet-side neighbour was
    the other pass's slice held after it as often as its own."""
    import shutil
    import threading

    from conftest import two_pass_series
    from medrt.io.sources import FileReplay, FolderWatch, Lookahead

    names = tuple(f"ct_{n:04d}.dcm" for n in range(12, 18))
    first, second = two_pass_series(tmp_path / "scanner", names)
    sent = [p for pair in zip(first, second, strict=True) for p in pair]
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watch = FolderWatch(inbox, poll=0.02, settle=0.1, idle_timeout=1.5)
    ahead = Lookahead(watch, wait=5.0, depth=0)
    live = SliceContext(decode, ahead=ahead, target_mm=3.0)
    got: list[tuple[Path, Decoded]] = []
    t = threading.Thread(target=lambda: got.extend((Path(p), live(p)[0]) for p in ahead))  # the decode stage
    t.start()
    for k, path in enumerate(sent):  # names that sort as they are sent, whether read as landed or as found
        shutil.copy(path, inbox / f"{k:02d}_{path.name}")
    t.join(60)
    assert not t.is_alive() and len(got) == len(sent) and ahead.depth == 2

    replay = FileReplay([p for p, _ in got])
    ordered = SliceContext(decode, replay.slice_order(), target_mm=3.0)
    assert replay.slice_order().count(None) == 2  # two stacks
    for k, (path, d) in enumerate(got):
        own = d.frame.source.dataset.AcquisitionNumber
        assert all(nb is None or nb.source.dataset.AcquisitionNumber == own for nb in d.neighbours), path
        want = ordered(path)[0].neighbours
        if k >= 3:  # from the second pass's second slice on: the depth is known
            # (live: head side first; in order: the one before first; the model's input
            # puts either head first, medrt.analysis.slices.ordered_sides)
            assert sorted(nb.sop_instance_uid if nb else "" for nb in d.neighbours) == \
                sorted(nb.sop_instance_uid if nb else "" for nb in want), path


def test_interleaved_series_do_not_push_each_others_neighbours_out(thin: list) -> None:
    """Six 1 mm series arriving interleaved (a live source without lookahead): each keeps
    its own last slices, so each slice still finds the one 3 mm before it (the model's
    neighbour_mm) once three have come; a pool shared by all series held fewer than three
    of each, and the nearer slice took its place."""
    from medrt.analysis.slices import along_normal

    series = [[replace(f, series_instance_uid=f"9.{s}", sop_instance_uid=f"{f.sop_instance_uid}.{s}") for f in thin]
              for s in range(6)]
    live = SliceContext(lambda item: [Decoded(item, 0.0)], target_mm=3.0)
    for i in range(len(thin)):
        for frames in series:
            here = live(frames[i])[0]
            if i >= 3:
                gaps = [abs(along_normal(nb) - along_normal(frames[i])) for nb in here.neighbours if nb is not None]
                assert gaps == [pytest.approx(3.0)], (i, gaps)


def test_a_live_sequential_ct_numbering_each_slice_stays_one_pass(thin: list) -> None:
    """A sequential CT that gives every slice its own AcquisitionNumber moves on to new
    positions: live, its slices are still each other's neighbours (one stack, as the
    strict rule of medrt.io.stacks keeps it)."""
    numbered = [as_acquisition(f, i + 1) for i, f in enumerate(thin)]
    live = SliceContext(lambda item: [Decoded(item, 0.0)], target_mm=3.0)
    got = [live(f)[0] for f in numbered]
    want = series_neighbours(numbered, 3.0)
    for i in range(3, len(thin)):
        assert got[i].neighbours[0] is want[i][0], i  # the slice 3 mm before it (the next has not come)


def test_decode_hands_on_an_enhanced_cts_frames_head_first_whatever_their_storage_order(tmp_path: Path) -> None:
    """An enhanced CT may store its frames in any order. decode handed them on in frame order,
    and a stream links each frame's lesions to the frame before it (LesionCounter), so a
    shuffled one counted a lesion once per slice it crosses. They now come head first; each
    keeps its own frame_index (results, SEG references and overlays name the stored frame),
    and its neighbours are the slices beside it."""
    from medrt.analysis.slices import along_normal, head_first
    from medrt.phantom import write_enhanced_ct

    (path,) = write_enhanced_ct(tmp_path, 3, n_frames=6, size=64, compress="none", shuffle_frames=True)
    stored = read_frames(path)
    z = [f.geometry.position[2] for f in stored]
    assert z != sorted(z) and z != sorted(z, reverse=True)  # stored out of position order
    out = decode(path)
    assert [d.frame.geometry.position[2] for d in out] == sorted(z, reverse=True)  # head first
    by_index = {f.frame_index: f for f in stored}
    for d in out:  # the same frame, under its own number
        assert d.frame.key == f"{d.frame.sop_instance_uid}#{d.frame.frame_index}"
        np.testing.assert_array_equal(d.frame.pixels, by_index[d.frame.frame_index].pixels)
    assert sorted(d.frame.frame_index for d in out) == list(range(6))
    frames = [d.frame for d in out]
    assert [d.neighbours for d in out] == [(frames[i - 1] if i else None, frames[i + 1] if i < 5 else None)
                                           for i in range(6)]
    # frames without a place each of their own (two stacks at the same positions) keep frame order
    twice = [*stored[:3], *(replace(f, frame_index=f.frame_index + 6) for f in stored[:3])]
    assert head_first(twice) is None and head_first(stored[:1]) is None
    assert [along_normal(stored[i]) for i in head_first(stored)] == sorted(map(along_normal, stored), reverse=True)


def _with_frame_orientations(path: Path, orientations: list[tuple[float, ...]]) -> None:
    """Give each stored frame of an enhanced object its own ImageOrientationPatient."""
    import pydicom
    from pydicom.dataset import Dataset

    ds = pydicom.dcmread(path)
    del ds.SharedFunctionalGroupsSequence[0].PlaneOrientationSequence
    for group, orientation in zip(ds.PerFrameFunctionalGroupsSequence, orientations, strict=True):
        item = Dataset()
        item.ImageOrientationPatient = [f"{v:.6g}" for v in orientation]
        group.PlaneOrientationSequence = [item]
    ds.save_as(path)


@pytest.mark.parametrize("hair, ordered", [
    # cosines 8e-4 short of unit length on every other frame: one orientation to the 1e-3 a
    # series' items are ordered by, but the normals' dot product is 0.998 (< 0.999): the
    # viewer showed the frames head first, decode (stream, batch, the listener) in frame order
    ((0.9992, 0.0, 0.0, 0.0, 0.9992, 0.0), True),
    # turned 0.003 rad in plane on every other frame: the same normal (dot 1.0), cosines 3e-3
    # apart: decode put the frames head first, the viewer left them in frame order
    ((math.cos(0.003), math.sin(0.003), 0.0, -math.sin(0.003), math.cos(0.003), 0.0), False),
])
def test_every_path_orders_a_shuffled_enhanced_cts_frames_alike_whatever_a_hair_in_their_orientations(
        tmp_path: Path, hair: tuple[float, ...], ordered: bool) -> None:
    """An enhanced CT stored out of position order, its frames' orientations differing by a
    hair. The viewer (from the header) and decode (from the decoded frames: batch, stream,
    the listener, the viewer's live source) had a rule each for whether the frames have one
    orientation, so each of these was ordered head first by one and left in frame order by
    the other. One rule (medrt.io.series.head_first_order) now decides for all of them."""
    import pydicom
    from medrt_gui.study import Study

    from medrt.analysis.slices import head_first
    from medrt.io.series import frames_head_first
    from medrt.phantom import write_enhanced_ct

    (path,) = write_enhanced_ct(tmp_path, 3, n_frames=6, size=64, compress="none", shuffle_frames=True)
    _with_frame_orientations(path, [hair if k % 2 else (1.0, 0.0, 0.0, 0.0, 1.0, 0.0) for k in range(6)])
    stored = read_frames(path)
    z = [f.geometry.position[2] for f in stored]
    assert z != sorted(z) and z != sorted(z, reverse=True)  # stored out of position order
    assert {f.geometry.orientation for f in stored} == {(1.0, 0.0, 0.0, 0.0, 1.0, 0.0),
                                                         tuple(float(f"{v:.6g}") for v in hair)}
    want = sorted(range(6), key=lambda i: -z[i]) if ordered else list(range(6))  # head first, or frame order

    header = pydicom.dcmread(path, stop_before_pixels=True)
    assert (frames_head_first(header, 6) or list(range(6))) == want  # the header (None: frame order)
    assert (head_first(stored) or list(range(6))) == want  # the decoded frames
    assert [d.frame.frame_index for d in decode(path)] == want  # batch, stream, the listener
    slots = Study.from_paths([path]).series[0].slots  # the viewer, an opened file
    assert [int(s.key.rsplit("#", 1)[1]) for s in slots] == want


def test_a_slice_whose_cosines_are_a_hair_short_keeps_its_place_and_its_neighbours(tmp_path: Path) -> None:
    """Direction cosines a hair short of unit length (0.9992\\0\\0\\0\\0.9992\\0; one
    orientation with 1\\0\\0\\0\\1\\0 to the 1e-3 a series and a multi-frame object are
    ordered by): along_normal projected the position on row x column as it was, 0.9984
    long, which put such a slice at 500.5 mm below its neighbour at 500 mm (the live viewer
    places a frame by it), and adjacent's dot product of the two normals, 0.998, left the
    two without each other as neighbours. Both now take the normal at unit length."""
    from medrt.analysis.slices import along_normal, head_first
    from medrt.phantom import write_enhanced_ct

    (path,) = write_enhanced_ct(tmp_path, 3, n_frames=2, size=64, compress="none")
    a, b = read_frames(path)
    a = replace(a, geometry=Geometry(position=(0.0, 0.0, 500.0), orientation=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0)))
    b = replace(b, geometry=Geometry(position=(0.0, 0.0, 500.5), orientation=(0.9992, 0.0, 0.0, 0.0, 0.9992, 0.0)))
    assert along_normal(b) == pytest.approx(500.5) and along_normal(b) > along_normal(a)
    assert head_first([a, b]) == [1, 0]  # the order decode hands them on in, and the viewer's
    assert adjacent(a, b) and adjacent(b, a)
