"""How the analyzer runs: :class:`AnalyzerConfig`, the settings every face (viewer, batch,
stream, bench) passes to :func:`medrt.analyzer.load_analyzer`, and the fine sweep as an
analyzer of a config runs it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from medrt.analysis.recheck import RecheckConfig
from medrt.analysis.sweep import SweepConfig

__all__ = ["MODES", "AnalyzerConfig", "sweep_config"]

MODES = ("auto", "roi", "full")


@dataclass(frozen=True)
class AnalyzerConfig:
    """How to analyse frames. Models are shipped names or paths to ``.toml`` specs."""

    # "roi": the ROI classifier's crops; "full": sliding window over the whole frame;
    # "auto": per frame, the whole frame where the frame is much finer than the
    # segmenter's spacing (radiographs: at 0.5 mm a 4096² radiograph is one network
    # window, and the fine sweep covers it all; the classifier's crops held 73 % of
    # the held-out nodules), fits in one crop (a 512² CT slice: the ROI path can only
    # skip it, and that cost more than it saved), or no ROI classifier is for its
    # modality; else the ROI path. See Analyzer.mode_for.
    mode: str = "auto"
    backend: str = "auto"
    device: str = "auto"
    precision: str = "fp32"
    # ROI classifiers, comma-separated: a frame goes to the first whose spec lists its
    # modality ([model] modalities), else to the first that lists none. Radiographs go
    # to roi_classifier_dx, which covers ~3x the nodules the general one does on them.
    roi_model: str = "roi_classifier,roi_classifier_dx"
    # Segmenters, comma-separated, routed like the ROI classifiers: CT slices go to the
    # 2.5-D lesion_unet_lite (its spec lists CT; on CT it finds as many lesions as
    # lesion_unet at a third fewer false positives), radiographs to lesion_unet_dx
    # (lesion_unet's network trained on radiographs only with faint small nodules drawn in;
    # 1.2 averages two trained on 640 radiographs: 143 of 150 validation nodules against
    # 1.1's 140 and lesion_unet's 130). lesion_unet, trained on both, takes either when named.
    seg_model: str = "lesion_unet_lite,lesion_unet_dx"
    recheck: bool = True
    recheck_config: RecheckConfig = field(default_factory=RecheckConfig)
    # The fine sweep, for frames much finer than the segmenter (medrt.analysis.sweep): it
    # replaces the first pass and the recheck there. None: off. Runs when the recheck does.
    sweep: SweepConfig | None = field(default_factory=SweepConfig)
    crop: int = 1024
    overlap: float = 0.25
    threshold: float | None = None  # None: the segmenter spec's probability threshold
    # Lesions shorter than this (longest diameter) are not reported. Ground truth is
    # scored from 2 mm; on the validation CT series (seeds 5100-5107) most false marks
    # under 1.5 mm were specks of one or two pixels: 0.172 -> 0.144 false positives per
    # slice for lesion_unet_lite 2.0 at 0.8 (one 2-5 mm lesion fewer), 0.241 -> 0.150
    # for 3.0 at 0.9 (no lesion fewer). Radiographs: the fine sweep views and keeps
    # components from this length too (it replaces SweepConfig.min_diameter_mm here, so a
    # lower setting does reach the radiographs' smaller components).
    min_diameter_mm: float = 1.5
    presence_threshold: float | None = None  # None: the ROI classifier spec's
    heatmap_threshold: float | None = None
    max_crops: int = 8
    # 1024² crops, 512² CT slices, and 1024² radiograph crops at 1/4 scale (spacing
    # normalisation), without and with their 32-pixel context on each side
    warmup_shapes: tuple[tuple[int, int], ...] = ((1024, 1024), (512, 512), (320, 320), (256, 256))
    threads: int | None = None
    # per-backend constructor options, e.g. {"torch": {"cuda_graph": True, "max_graphs": 64}}
    backend_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Routing by the header (medrt.engine.routing): a site's own BodyPartExamined words read
    # as the terms the specs list ({"TORAX": "CHEST"}; upper-cased), and whether an image
    # whose header names no body part or view is refused where a model lists some (by
    # default it is taken: many rooms leave BodyPartExamined empty).
    body_part_aliases: Mapping[str, str] = field(default_factory=dict)
    strict_routing: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f'Argument "mode" must be one of {MODES}, got {self.mode!r}.')
        if not 0.0 <= self.overlap < 1.0:
            raise ValueError(f'Argument "overlap" must be in [0, 1), got {self.overlap!r}.')
        if not self.min_diameter_mm >= 0.0:
            raise ValueError(f'Argument "min_diameter_mm" must be >= 0, got {self.min_diameter_mm!r}.')
        aliases = {}
        for local, term in dict(self.body_part_aliases).items():
            key, value = (" ".join(str(x).split()).upper() for x in (local, term))
            if not key or not value:
                raise ValueError(f'Argument "body_part_aliases" maps words to terms, got {local!r}: {term!r}.')
            aliases[key] = value
        object.__setattr__(self, "body_part_aliases", aliases)


def sweep_config(config: AnalyzerConfig) -> SweepConfig | None:
    """The fine sweep as an analyzer of ``config`` runs it: ``config.sweep`` with the
    analyzer's ``min_diameter_mm`` (None: no sweep)."""
    if config.sweep is None:
        return None
    return replace(config.sweep, min_diameter_mm=config.min_diameter_mm)
