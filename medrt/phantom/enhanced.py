"""The CT phantom as one Enhanced multi-frame object, frames optionally stored out of order.

Many scanners and PACS conversions store a CT series as one Enhanced (or Legacy Converted
Enhanced) CT object: the slices are its frames, each with its own position in the Per-frame
Functional Groups, and nothing requires frame order to be slice order. medrt reads such an
object, orders its frames by position where that matters (the 2.5-D neighbours, the lesion
count, the viewer), and scores it against a ground truth whose frames each keep their own
key (``UID#n``, :func:`medrt.phantom.truth.truth_key`). This writes that case from the same
phantom as :func:`medrt.phantom.folders.write_ct_series`, so the two can be compared frame for
frame: the same pixels, positions and lesions, one file.

The conversion is highdicom's :class:`~highdicom.legacy.LegacyConvertedEnhancedCTImage`
(the single-frame headers of :func:`medrt.phantom.dicom_write.ct_dataset` made into one
object, as a PACS converts a series), not hand-built functional groups. Its instance creation
date and time are fixed afterwards, and its UIDs derive from the seed, so the same arguments
give the same bytes. Two values the conversion copies from the single-frame headers are put in
an enhanced CT's terms: the window's name (SOFT_TISSUE) and the Image Flavor (VOLUME, not AXIAL).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian

from medrt.allocator import trim
from medrt.phantom.ct import generate_ct_series
from medrt.phantom.dicom_write import (
    COMPRESSIONS,
    ct_dataset,
    fixed_times,
    phantom_uid,
    write_dataset,
)
from medrt.phantom.frame import CT
from medrt.phantom.truth import TruthEntry, TruthWriter
from medrt.types import SpacingSource

__all__ = ["ENHANCED_CT_NAME", "write_enhanced_ct", "shuffled_order"]

log = logging.getLogger(__name__)

ENHANCED_CT_NAME = "ct_enhanced.dcm"


def shuffled_order(seed: int, n: int) -> list[int]:
    """The slice indices in the order a shuffled object stores them: drawn from ``seed``,
    never in position order either way (for three slices or more; two have no other order)."""
    order = [int(i) for i in np.random.default_rng([seed, 0x5EED]).permutation(n)]
    steps = np.diff(order)
    if n > 2 and (np.all(steps > 0) or np.all(steps < 0)):  # drawn in order: move the first to the middle
        order.insert(n // 2, order.pop(0))
    return order


def _flavor_volume(values: Sequence[str]) -> list[str]:
    """An Image Type or Frame Type with value 3 AXIAL made VOLUME, the other values kept."""
    out = [str(v) for v in values]
    if len(out) > 2 and out[2] == "AXIAL":
        out[2] = "VOLUME"
    return out


def write_enhanced_ct(
    out_dir: str | Path, seed: int, n_frames: int = 40, size: int = 512, compress: str = "rle",
    *, shuffle_frames: bool = False, thickness_mm: float | None = None,
) -> list[Path]:
    """Write the CT phantom of ``seed`` (:func:`medrt.phantom.generate_ct_series`) as one
    Legacy Converted Enhanced CT object, :data:`ENHANCED_CT_NAME`, plus its ground truth (one
    entry per frame, with its ``frame_index``); return ``[path]``. Frames are stored in slice
    order (highdicom's Dimension Index by position), or with ``shuffle_frames`` in the order
    :func:`shuffled_order` draws from the seed and without a Dimension Index, as a conversion
    that keeps arrival order stores them."""
    if compress not in COMPRESSIONS:
        raise ValueError(f'Argument "compress" must be one of {", ".join(COMPRESSIONS)}, got {compress!r}.')
    import highdicom as hd

    out = Path(out_dir)
    frames = generate_ct_series(seed, n_frames=n_frames, size=size, thickness_mm=thickness_mm)
    legacy: list[Dataset] = []
    for i, f in enumerate(frames):
        ds, values = ct_dataset(f)
        ds.file_meta = FileMetaDataset()
        ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds.PixelData = values.tobytes()
        legacy.append(ds)
        # The slice's float32 HU (twice its stored values) is not read again: the ground
        # truth takes each frame's labels, lesions and shape. A NaN of the same shape (no
        # memory) stands in, so a read of it would show.
        frames[i] = replace(f, pixels=np.broadcast_to(np.float32(np.nan), f.shape))
    # Hand the pages freed so far (those HU slices, generate_ct_series' tissue maps) back to
    # the system before highdicom's first SOP class loads its IOD tables (a 22 MB JSON file,
    # +110 MB while decoded, about 65 MB kept): they were free but still resident, and Python
    # takes its objects' memory from new pages, not from malloc's free ones. With the line
    # above, a 40-slice 512² phantom's peak fell from 418 to 366-374 MB (docs/performance-log.md).
    trim()
    order = shuffled_order(seed, len(frames)) if shuffle_frames else list(range(len(frames)))
    parts = ("shuffled",) if shuffle_frames else ()
    mf = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=[legacy[i] for i in order],
        series_instance_uid=phantom_uid(seed, CT, "enhanced-series", *parts),
        series_number=2,
        sop_instance_uid=phantom_uid(seed, CT, "enhanced", *parts),
        instance_number=1,
        include_dimension_index=not shuffle_frames,  # with one, highdicom puts the frames in order
    )
    fixed_times(mf)
    for item in (*mf.get("DimensionOrganizationSequence", ()), *mf.get("DimensionIndexSequence", ())):
        # (highdicom draws a new one each time)
        item.DimensionOrganizationUID = phantom_uid(seed, CT, "dimension-organization", *parts)
    # Image Type and Frame Type value 3, the Image Flavor: highdicom copies the single-frame
    # CT's AXIAL (a defined term of the CT Image, PS3.3 C.8.2.1.1.1), which is none of an
    # enhanced CT's (C.8.16.1.3, C.8.15.2.1.1.3; dciodvfy warns). The slices, parallel and
    # evenly spaced, are a VOLUME ("a set of frames that define a regularly sampled volume").
    # Value 4, Derived Pixel Contrast, stays NONE, as C.8.16.1.4 requires of ORIGINAL frames.
    mf.ImageType = _flavor_volume(mf.ImageType)
    for group in (*mf.SharedFunctionalGroupsSequence, *mf.PerFrameFunctionalGroupsSequence):
        for kind in group.get("CTImageFrameTypeSequence", ()):
            kind.FrameType = _flavor_volume(kind.FrameType)
    for group in (*mf.SharedFunctionalGroupsSequence, *mf.PerFrameFunctionalGroupsSequence):
        for voi in group.get("FrameVOILUTSequence", ()):
            # free text in a CT Image ("SOFT TISSUE"); a CT Frame VOI LUT has defined terms
            if voi.get("WindowCenterWidthExplanation") == "SOFT TISSUE":
                voi.WindowCenterWidthExplanation = "SOFT_TISSUE"
    # which slice each stored frame is: highdicom names each frame's source image
    sources = [group.ConversionSourceAttributesSequence[0].ReferencedSOPInstanceUID
               for group in mf.PerFrameFunctionalGroupsSequence]
    by_uid = {ds.SOPInstanceUID: f for ds, f in zip(legacy, frames, strict=True)}
    placed = [by_uid[uid] for uid in sources]
    # highdicom lists the source slices in the Referenced Series Sequence from a set, so in an
    # order that follows the process's string hashing (PYTHONHASHSEED): list them in frame order
    frame_of = {uid: k for k, uid in enumerate(sources)}
    for series in mf.get("ReferencedSeriesSequence", ()):
        series.ReferencedInstanceSequence = sorted(
            series.ReferencedInstanceSequence,
            key=lambda item: (frame_of.get(item.ReferencedSOPInstanceUID, len(frame_of)), item.ReferencedSOPInstanceUID))
    # The single-frame datasets are converted: free their pixels (one copy of the volume)
    # before encoding, and encode the frames highdicom joined, in its order, without
    # another copy (write_dataset replaces the joined bytes by the encoded ones).
    del legacy, by_uid
    pixels = np.frombuffer(mf.PixelData, np.uint16).reshape(len(placed), *frames[0].shape)
    path = write_dataset(mf, pixels, out / ENHANCED_CT_NAME, compress)
    with TruthWriter(out, seed, CT) as truth:
        for k, f in enumerate(placed):
            truth.add(TruthEntry(f, ENHANCED_CT_NAME, mf.SOPInstanceUID, mf.PhotometricInterpretation,
                                 SpacingSource.PIXEL_SPACING.value, frame_index=k))
    log.info("wrote %d CT slices as the frames of %s%s", len(placed), path,
             " (stored out of position order)" if shuffle_frames else "")
    return [path]

