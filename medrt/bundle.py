"""Import a 2-D MONAI bundle as an ONNX model and a medrt spec (``medrt models import-bundle``).

A bundle is code, not data (``_target_`` imports, ``$`` expressions, TorchScript), so
nothing in it is loaded without ``trust=True``; without it only its JSON is read, and
the refusal says what would run. ``model.pt`` is always read with ``weights_only=True``.
The graph maps one normalised ``[N, 1, H, W]`` input to one ``[N, 1, H, W]`` output for
the lesion channel (a logit, or a softmax probability for multi-channel networks) and
is checked against torch before the spec is written. Format: ``models/README.md``.
torch, monai and onnx are imported inside functions (``pip install 'medrt[train]'``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrt.engine.registry import ModelError, ModelSpec, load_spec, sha256_file
from medrt.engine.rewrite import cpu_friendly

if TYPE_CHECKING:
    import torch

__all__ = ["BundleInfo", "BundleTrustError", "TRUST_WARNING", "import_bundle", "read_bundle"]

log = logging.getLogger(__name__)

OPSET = 17
TOLERANCE = 1e-4  # max |onnx - torch| accepted on the check inputs
PROBE_MULTIPLES = (1, 2, 4, 8, 16, 32, 64)
BACKGROUND = ("background", "bg", "_background_", "backgrounds")
INPUT_NAME, OUTPUT_NAME = "image", "foreground"
TRUST_WARNING = (
    "MONAI bundles are code, not data: configs/*.json can import any module ('_target_') and "
    "evaluate Python ('$' expressions), and models/model.ts is a TorchScript program. They run "
    "with your permissions. Import only bundles from a source you trust."
)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class BundleTrustError(ModelError):
    """The bundle would run code, and the caller did not say it trusts it."""


@dataclass(frozen=True)
class BundleInfo:
    """What ``configs/metadata.json`` and ``configs/inference.json`` say, read as plain JSON."""

    root: Path
    name: str
    version: str
    description: str
    in_channels: int
    out_channels: int | None
    channel_def: dict[int, str]
    spatial_dims: int | None
    value_range: tuple[float, float] | None
    config_path: Path | None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def torchscript(self) -> Path | None:
        path = self.root / "models" / "model.ts"
        return path if path.is_file() else None

    @property
    def weights(self) -> Path:
        return self.root / "models" / "model.pt"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: missing; a MONAI bundle needs configs/{path.name}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: expected a JSON object at the top level")
    return doc


def _one(table: Any, preferred: str, where: str) -> dict[str, Any]:
    """``table[preferred]``, or the only entry of ``table``."""
    if isinstance(table, dict):
        if isinstance(table.get(preferred), dict):
            return table[preferred]
        if len(table) == 1 and isinstance(next(iter(table.values())), dict):
            return next(iter(table.values()))
    raise ModelError(f"{where}: missing {preferred!r} (network_data_format)")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_bundle(root: str | Path) -> BundleInfo:
    """Read a bundle's metadata and inference config as JSON. Runs nothing from the bundle."""
    root = Path(root)
    if not root.is_dir():
        raise ModelError(f"{root}: not a folder (expected a MONAI bundle folder)")
    meta_path = root / "configs" / "metadata.json"
    meta = _read_json(meta_path)
    ndf = meta.get("network_data_format")
    if not isinstance(ndf, dict):
        raise ModelError(f"{meta_path}: missing 'network_data_format'")
    image = _one(ndf.get("inputs"), "image", f"{meta_path} network_data_format.inputs")
    pred = _one(ndf.get("outputs"), "pred", f"{meta_path} network_data_format.outputs")
    shape = image.get("spatial_shape")
    config_path = root / "configs" / "inference.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    spatial_dims = len(shape) if isinstance(shape, list) and shape else None
    net_def = config.get("network_def")
    if spatial_dims is None and isinstance(net_def, dict):
        dims = net_def.get("spatial_dims", net_def.get("dimensions"))
        spatial_dims = dims if isinstance(dims, int) else None
    vr = [_number(v) for v in image.get("value_range") or []]
    value_range = (vr[0], vr[1]) if len(vr) == 2 and None not in vr else None
    raw_def = pred.get("channel_def") or {}
    if not isinstance(raw_def, dict) or not all(str(k).isdigit() for k in raw_def):
        raise ModelError(f"{meta_path}: outputs channel_def must map channel indices (\"0\", \"1\", ...) to "
                         f"names, not {raw_def!r}")  # fmt: skip
    channel_def = {int(k): str(v) for k, v in raw_def.items()}
    out_ch = pred.get("num_channels")
    return BundleInfo(
        root=root,
        name=str(meta.get("name") or root.name),
        version=str(meta.get("version") or "0"),
        description=" ".join(str(meta.get("description", "")).split()),
        in_channels=int(image.get("num_channels", 1)),
        out_channels=int(out_ch) if isinstance(out_ch, int) else None,
        channel_def=channel_def,
        spatial_dims=spatial_dims,
        value_range=value_range,
        config_path=config_path if config_path.is_file() else None,
        config=config,
    )


def _walk(node: Any) -> list[Any]:
    """``node`` and everything under it, in document order."""
    if isinstance(node, dict):
        return [node] + [n for v in node.values() for n in _walk(v)]
    if isinstance(node, list):
        return [n for v in node for n in _walk(v)]
    return [node]


def _targets(node: Any) -> list[dict[str, Any]]:
    """Every JSON object with a ``_target_`` (a class or function to call) under ``node``."""
    return [n for n in _walk(node) if isinstance(n, dict) and "_target_" in n]


def _what_would_run(info: BundleInfo) -> str:
    if info.torchscript is not None:
        return f"load and run the TorchScript program {info.torchscript}"
    targets = sorted({str(t["_target_"]) for t in _targets(info.config.get("network_def"))})
    return (
        f"build the network from {info.config_path} (network_def imports and calls "
        f"{', '.join(targets) or 'nothing named'}; the config holds {sum(isinstance(n, str) and n.startswith('$') for n in _walk(info.config))} "
        f"'$' Python expressions) and load {info.weights}"
    )


def _import_torch(*, with_monai: bool = False) -> Any:
    try:
        import onnx  # noqa: F401  (torch.onnx.export needs it)
        import torch

        if with_monai:
            import monai.bundle  # noqa: F401
    except ImportError as exc:
        raise ModelError(
            f"importing a MONAI bundle needs torch, monai and onnx ({exc}); "
            "install them with: pip install 'medrt[train]'"
        ) from None
    return torch


def _load_network(info: BundleInfo) -> torch.nn.Module:
    """The bundle's network in eval mode on the CPU. Runs bundle code: call only when trusted."""
    torch = _import_torch()
    if info.torchscript is not None:
        try:
            return torch.jit.load(str(info.torchscript), map_location="cpu").eval()
        except Exception as exc:
            raise ModelError(f"{info.torchscript}: cannot load the TorchScript model ({exc})") from None
    _import_torch(with_monai=True)
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(str(info.config_path))
    parser["bundle_root"] = str(info.root)
    try:
        net = parser.get_parsed_content("network_def", instantiate=True)
    except Exception as exc:
        raise ModelError(f"{info.config_path}: cannot build 'network_def' ({type(exc).__name__}: {exc})") from None
    if not isinstance(net, torch.nn.Module):
        raise ModelError(f"{info.config_path}: 'network_def' is a {type(net).__name__}, not a torch module")
    try:
        state = torch.load(str(info.weights), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ModelError(f"{info.weights}: missing; a bundle without models/model.ts needs model.pt") from None
    except Exception as exc:
        raise ModelError(
            f"{info.weights}: not a plain state dict that loads with weights_only=True ({exc}); "
            "medrt does not unpickle arbitrary objects"
        ) from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a checkpoint {"model": state_dict, ...}
    try:
        net.load_state_dict(state, strict=True)
    except Exception as exc:
        raise ModelError(f"{info.weights}: weights do not fit network_def ({exc})") from None
    return net.eval()


def _probe(net: torch.nn.Module, info: BundleInfo) -> tuple[int, int]:
    """``(multiple_of, out_channels)``: the smallest size step the network maps to its own size."""
    import torch

    last = "no size tried"
    for m in PROBE_MULTIPLES:
        h, w = 3 * m, 5 * m
        try:
            with torch.no_grad():
                y = net(torch.zeros(2, info.in_channels, h, w))  # batch 2: no unbatched 3-D reading
        except Exception as exc:
            last = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        if not isinstance(y, torch.Tensor):
            raise ModelError(f"{info.root}: the network returns a {type(y).__name__}, not one tensor")
        if y.ndim == 4 and y.shape[0] == 2 and tuple(y.shape[-2:]) == (h, w):
            return m, int(y.shape[1])
        last = f"input [2, {info.in_channels}, {h}, {w}] gave output {list(y.shape)}"
    raise ModelError(
        f"{info.root}: the network maps no [N, {info.in_channels}, H, W] input (H, W multiples of up "
        f"to {PROBE_MULTIPLES[-1]}) to an [N, C, H, W] output; only 2-D networks are supported ({last})"
    )


def _check_channel_def(info: BundleInfo, n_out: int, whose: str) -> None:
    """Refuse a ``channel_def`` that does not name exactly the channels ``0 .. n_out - 1``:
    the names, and so the channel exported as the lesion, would be wrong."""
    if not info.channel_def or sorted(info.channel_def) == list(range(n_out)):
        return
    names = ", ".join(f"{i}: {n!r}" for i, n in sorted(info.channel_def.items()))
    raise ModelError(
        f"{info.root / 'configs' / 'metadata.json'}: outputs channel_def names {len(info.channel_def)} "
        f"channel(s) ({names}), but {whose} {n_out} output channel(s), numbered 0 to {n_out - 1}; which "
        "channel is the lesion cannot be told. Make channel_def name each output channel of the network"
    )


def _pick_channel(info: BundleInfo, n_out: int, label: str | None) -> tuple[int, str]:
    names = {i: info.channel_def.get(i, f"channel {i}") for i in range(n_out)}
    if label is not None:
        for i, name in names.items():
            if label == str(i) or label.lower() == name.lower():
                return i, name
        raise ModelError(f"{info.root}: no output channel {label!r} (channels: {names})")
    if n_out == 1:
        return 0, info.channel_def.get(0, "foreground")
    for i, name in names.items():
        if i in info.channel_def and name.lower() not in BACKGROUND:
            return i, name
    log.warning("%s: no channel_def names a foreground channel; exporting channel 1", info.root)
    return 1, names[1]


def _kinds(*bases: str) -> frozenset[str]:
    """MONAI's array and dictionary names of each transform: ``Spacing``, ``Spacingd``, ``SpacingD``..."""
    return frozenset(b + suffix for b in bases for suffix in ("", "d", "D", "Dict"))


SCALERS = _kinds("ScaleIntensityRange")
ZSCORES = _kinds("NormalizeIntensity")
SPACINGS = _kinds("Spacing")
# Steps whose effect medrt's input already has (the image read, one channel first, a float
# tensor) or that only move dictionary keys: nothing to reproduce, nothing to say.
REPRODUCED = _kinds(
    "Compose", "LoadImage", "EnsureChannelFirst", "AddChannel", "AsChannelFirst", "EnsureType", "ToTensor",
    "ToNumpy", "CastToType", "Identity", "ToDevice", "CopyItems", "DeleteItems", "SelectItems",
)  # fmt: skip
SPACING_TOLERANCE = 0.01  # in-plane pixdim values this close (relative) are one spacing


@dataclass
class Preprocessing:
    """What a bundle's preprocessing becomes in the spec and the graph, and notes on what it cannot."""

    norm: dict[str, Any] = field(default_factory=lambda: {"method": "window"})
    scale: float = 1.0  # the network gets ``x * scale + offset`` for medrt's [0, 1] input ``x``
    offset: float = 0.0
    spacing_mm: float | None = None
    notes: list[str] = field(default_factory=list)


def _numbers(value: Any) -> list[float] | None:
    """A literal number or a list of them, as a list; ``None`` for anything else."""
    values = value if isinstance(value, list) else [value]
    numbers = [_number(v) for v in values]
    return [n for n in numbers if n is not None] if values and None not in numbers else None


def _one_value(value: Any) -> float | None:
    """A literal number, or a list of one (a per-channel value for medrt's single channel)."""
    numbers = _numbers(value)
    return numbers[0] if numbers is not None and len(numbers) == 1 else None


def _transforms(info: BundleInfo) -> tuple[list[tuple[str, dict[str, Any]]], bool, list[str]]:
    """The preprocessing's ``(kind, transform)`` pairs in order; whether ``preprocessing`` is
    there (without it the whole config is searched); the transforms given as expressions.

    A plain ``@name`` reference to a top-level entry is followed; a ``$`` expression cannot
    be read without running it.
    """
    config = info.config
    if "preprocessing" not in config:
        return [(str(t["_target_"]).rsplit(".", 1)[-1], t) for t in _targets(config)], False, []
    unread: list[str] = []

    def resolve(node: Any, depth: int = 0) -> Any:
        if isinstance(node, str):
            name = node[1:]
            if depth < 8 and re.fullmatch(r"@[A-Za-z0-9_]+", node) and name in config:
                return resolve(config[name], depth + 1)
            unread.append(node)
            return None
        if isinstance(node, list):
            return [resolve(n, depth + 1) for n in node]
        if isinstance(node, dict):
            return {k: resolve(v, depth + 1) if k == "transforms" else v for k, v in node.items()}
        return node

    pre = resolve(config["preprocessing"])
    return [(str(t["_target_"]).rsplit(".", 1)[-1], t) for t in _targets(pre)], True, unread


def _preprocessing(info: BundleInfo) -> Preprocessing:
    """Read the bundle's preprocessing (as JSON: nothing runs) into what the spec and graph reproduce.

    - ``ScaleIntensityRange(d)`` with literal ``a_min``/``a_max`` becomes a ``fixed_window``;
      its ``b_min``/``b_max`` rescale is baked into the graph.
    - ``NormalizeIntensity(d)`` with literal ``subtrahend`` and ``divisor`` (a z-score by
      fixed statistics) is baked into the graph after that window, or folded into the
      window when it comes before it. One that z-scores each image by its own mean and
      standard deviation cannot be reproduced (medrt feeds crops and tiles, and [0, 1]
      where the network expects zero mean, unit variance): a :class:`ModelError`.
    - ``Spacing(d)`` with a literal isotropic in-plane ``pixdim`` becomes ``spacing_mm``
      (medrt then reduces only much finer frames), with a note that it is not the same.
    - Every other step that changes the image is named in a note: it is not reproduced.
    """
    out = Preprocessing()
    where = info.config_path or info.root
    steps, listed, unread = _transforms(info)
    out.notes += [
        f"preprocessing transform {expr!r} is an expression medrt does not evaluate: "
        "what it does is neither checked nor reproduced"
        for expr in unread
    ]
    window: tuple[float, float] | None = None  # a_min, a_max: the scaler's input range
    scaler = False
    pre_scale, pre_offset = 1.0, 0.0  # what the scaler sees: modality value * pre_scale + pre_offset
    zscores: list[str] = []  # literal z-scores, for the record
    for kind, t in steps:
        if kind in SCALERS:
            if scaler:
                out.notes.append(f"a second {kind} (a_min {t.get('a_min')}, a_max {t.get('a_max')}) is not "
                                 "reproduced: medrt applies the first one only")  # fmt: skip
                continue
            scaler = True
            a_min, a_max = _number(t.get("a_min")), _number(t.get("a_max"))
            b_min, b_max = _number(t.get("b_min")), _number(t.get("b_max"))
            if a_min is None or a_max is None or a_max <= a_min:
                out.notes.append(f"{kind} a_min/a_max are not literal numbers; using the VOI window")
            else:
                window = (a_min, a_max)
            if b_min is not None and b_max is not None:
                out.scale, out.offset = b_max - b_min, b_min
            if not t.get("clip", False):
                out.notes.append(f"{kind} clip=false in the bundle; medrt clips to the window")
        elif kind in ZSCORES:
            sub, div = _one_value(t.get("subtrahend")), _one_value(t.get("divisor"))
            what = f"{kind} (subtrahend {t.get('subtrahend')}, divisor {t.get('divisor')})"
            if sub is None or div is None:
                raise ModelError(
                    f"{where}: {what} z-scores each image by its own mean and standard deviation; medrt "
                    "cannot reproduce that (it feeds the network crops and tiles of a frame, scaled to a "
                    "window), so the network would get inputs on another scale. Refusing the import: give the "
                    "transform literal 'subtrahend' and 'divisor' (e.g. the training images' mean and "
                    "standard deviation after the window) to have them baked into the model"
                )
            if t.get("nonzero", False) is not False:
                raise ModelError(f"{where}: {what} with nonzero={t.get('nonzero')!r} leaves zero pixels as they "
                                 "are, which medrt cannot reproduce; refusing the import")  # fmt: skip
            div = div or 1.0  # as MONAI does
            zscores.append(f"(x - {sub:g}) / {div:g}")
            if scaler:
                out.scale, out.offset = out.scale / div, (out.offset - sub) / div
            else:
                pre_scale, pre_offset = pre_scale / div, (pre_offset - sub) / div
        elif kind in SPACINGS:
            pixdim = _numbers(t.get("pixdim"))
            plane = (pixdim * 2)[:2] if pixdim else []
            if out.spacing_mm is not None:
                out.notes.append(f"a second {kind} (pixdim {t.get('pixdim')}) is not reproduced")
            elif len(plane) != 2 or min(plane) <= 0 or abs(plane[0] - plane[1]) > SPACING_TOLERANCE * max(plane):
                out.notes.append(f"{kind} pixdim {t.get('pixdim')} is not reproduced: medrt runs each frame at "
                                 "its own pixel spacing, not resampled as the bundle does")  # fmt: skip
            else:
                mm = plane[0]
                out.spacing_mm = mm
                out.notes.append(
                    f"{kind} resamples every image to {mm:g} mm pixels; medrt reproduces it only in part: "
                    f"spacing_mm = {mm:g} makes it area-average a frame finer than {mm / 1.5:.3g} mm by a "
                    "whole factor, and run every other frame at its own spacing"
                )
        elif kind in REPRODUCED:
            continue
        elif listed or "Intensity" in kind or "Normalize" in kind:
            out.notes.append(f"bundle preprocessing {kind} is not reproduced: medrt does not apply it")
    if zscores and not scaler:
        raise ModelError(
            f"{where}: NormalizeIntensity {', '.join(zscores)} works on the image's own values, with no "
            "ScaleIntensityRange window before or after it; medrt feeds [0, 1] from a window, so the network "
            "would get inputs on another scale. Refusing the import"
        )
    if window is not None:
        if pre_scale <= 0:
            raise ModelError(f"{where}: a NormalizeIntensity with a negative divisor before the "
                             "ScaleIntensityRange window turns it over; medrt cannot reproduce that")  # fmt: skip
        lo, hi = ((a - pre_offset) / pre_scale for a in window)  # the window in modality units
        out.norm = {"method": "fixed_window", "center": (lo + hi) / 2.0, "width": hi - lo}
    elif not scaler and info.value_range is not None and info.value_range != (0.0, 1.0):
        out.notes.append(f"metadata value_range {list(info.value_range)} differs from medrt's [0, 1] input")
    return out


def _head(net: torch.nn.Module, channel: int, softmax: bool, scale: float, offset: float) -> torch.nn.Module:
    """Wrap ``net``: rescale the [0, 1] input, then output the one channel medrt reads."""
    import torch

    class Head(torch.nn.Module):
        __constants__ = ["channel", "softmax", "scale", "offset"]  # TorchScript folds the branches

        def __init__(self, net: torch.nn.Module, channel: int, softmax: bool, scale: float, offset: float) -> None:
            super().__init__()
            self.net, self.channel, self.softmax, self.scale, self.offset = net, channel, softmax, scale, offset

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.scale != 1.0 or self.offset != 0.0:
                x = x * self.scale + self.offset
            y = self.net(x)
            if self.softmax:
                y = torch.softmax(y, dim=1)
            return y[:, self.channel : self.channel + 1]

    head = Head(net, channel, softmax, scale, offset).eval()
    # A TorchScript network can only be called from a scripted wrapper; a plain one is traced.
    return torch.jit.script(head) if isinstance(net, torch.jit.ScriptModule) else head


def _export(head: torch.nn.Module, path: Path, multiple: int, meta: dict[str, str]) -> float:
    """Write ``head`` as ONNX to ``path``; return the max |onnx - torch| on two random inputs."""
    import warnings

    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    def fit(n: int) -> int:  # the nearest size the network accepts, at least one step
        return multiple * max(1, round(n / multiple))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
        torch.onnx.export(
            head, (torch.rand(1, 1, fit(32), fit(48)),), str(path), dynamo=False, opset_version=OPSET,
            input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "N", 2: "H", 3: "W"}, OUTPUT_NAME: {0: "N", 2: "H", 3: "W"}},
        )  # fmt: skip
    model = onnx.load(str(path))
    # Exact equivalents of PRelu / ConvTranspose that ONNX Runtime's CPU provider runs
    # faster and in INT8 (MONAI's UNets use both); the check below covers the result.
    model, report = cpu_friendly(model)
    if report.changed:
        log.info("%s: %s", path.name, report.summary())
    onnx.helper.set_model_props(model, meta)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for shape in ((1, 1, fit(40), fit(56)), (2, 1, fit(72), fit(24))):
        x = torch.rand(*shape, generator=gen)
        with torch.no_grad():
            expected = head(x).numpy()
        got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
        if got.shape != expected.shape:
            raise ModelError(f"{path}: ONNX output {got.shape} differs from torch {expected.shape} for {shape}")
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def import_bundle(
    bundle_dir: str | Path,
    out_dir: str | Path,
    *,
    name: str | None = None,
    label: str | None = None,
    trust: bool = False,
    force: bool = False,
) -> ModelSpec:
    """Convert a 2-D MONAI bundle to ``<out_dir>/<name>.onnx`` + ``<name>.toml``; return the spec.

    Refuses (:class:`BundleTrustError`) unless ``trust``, since loading runs the
    bundle's code. ``label`` picks the output channel by name or index; the
    default is the first channel whose ``channel_def`` name is not background.
    An existing ``<name>.onnx`` or ``<name>.toml`` in ``out_dir`` is replaced only with
    ``force``. What the bundle's JSON alone shows to be wrong (a ``channel_def`` that does
    not fit ``num_channels``, a preprocessing step medrt cannot reproduce faithfully
    enough, an existing model) is refused before any of its code runs.
    """
    info = read_bundle(bundle_dir)
    if info.spatial_dims is not None and info.spatial_dims != 2:
        raise ModelError(
            f"{info.root}: a {info.spatial_dims}-D network (metadata spatial_shape / network_def "
            "spatial_dims); only 2-D networks are supported"
        )
    if info.in_channels != 1:
        raise ModelError(f"{info.root}: the network takes {info.in_channels} input channels; medrt feeds 1")
    if info.torchscript is None and info.config_path is None:
        raise ModelError(f"{info.root}: neither models/model.ts nor configs/inference.json is there")
    if info.torchscript is None and "network_def" not in info.config:
        raise ModelError(f"{info.config_path}: no 'network_def' to build the network from")
    name = name or re.sub(r"[^A-Za-z0-9_.-]+", "_", info.name.lower()).strip("_.-") or "bundle"
    if not _NAME_RE.match(name):
        raise ModelError(f"model name {name!r}: use letters, digits, '_', '.', '-' only")
    if info.out_channels is not None:
        _check_channel_def(info, info.out_channels, "its num_channels says")
    pre = _preprocessing(info)
    out_dir = Path(out_dir)
    onnx_path, spec_path = out_dir / f"{name}.onnx", out_dir / f"{name}.toml"
    existing = [str(p) for p in (spec_path, onnx_path) if p.exists()]
    if existing and not force:
        raise ModelError(
            f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}: refusing to replace "
            f"model {name!r}; pass --force to replace it, or --name to import under another name"
        )
    if not trust:
        raise BundleTrustError(
            f"{info.root}: refusing to import without --trust: it would {_what_would_run(info)}. "
            + TRUST_WARNING
        )
    log.warning("importing %s as trusted. %s", info.root, TRUST_WARNING)

    torch = _import_torch()
    net = _load_network(info)
    multiple, n_out = _probe(net, info)
    if info.out_channels is not None and info.out_channels != n_out:
        raise ModelError(
            f"{info.root / 'configs' / 'metadata.json'}: says {info.out_channels} output channels, "
            f"the network gives {n_out}"
        )
    _check_channel_def(info, n_out, "the network gives")
    channel, label_name = _pick_channel(info, n_out, label)
    softmax = n_out > 1
    scale, offset, notes = pre.scale, pre.offset, pre.notes
    for note in notes:
        log.warning("%s: %s", info.root, note)

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{name}.onnx.tmp"
    source = f"MONAI bundle {info.name} {info.version}"
    try:
        head = _head(net, channel, softmax, scale, offset)
        meta = {"medrt_name": name, "medrt_version": info.version, "source": source, "channel": label_name}
        diff = _export(head, tmp, multiple, meta)
        if not diff < TOLERANCE:
            raise ModelError(f"{info.root}: ONNX output differs from torch by {diff:.3g} (limit {TOLERANCE:g})")
        os.replace(tmp, onnx_path)
    finally:
        tmp.unlink(missing_ok=True)

    meaning = f"logit of {label_name!r}"
    if softmax:
        meaning = f"softmax probability of {label_name!r} (channel {channel} of {n_out})"
    training: dict[str, Any] = {
        "source": source,
        "bundle_folder": info.root.name,
        "bundle_channel": f"{channel}: {label_name}",
        "network_from": "models/model.ts" if info.torchscript else "configs/inference.json network_def + models/model.pt",
        "export_check": f"onnxruntime vs torch max abs diff {diff:.2e} on 2 random inputs",
        "exported_with": f"torch {torch.__version__}, opset {OPSET}",
    }
    if scale != 1.0 or offset != 0.0:
        training["input_rescale"] = f"x * {scale:g} + {offset:g} baked into the graph"
    if notes:
        training["notes"] = notes
    tables = {
        "[model]": {
            "name": name, "version": info.version, "task": "segmentation", "file": onnx_path.name,
            "sha256": sha256_file(onnx_path), "multiple_of": multiple,
            **({"spacing_mm": pre.spacing_mm} if pre.spacing_mm is not None else {}),
            "description": info.description or source,
        },
        "[[inputs]]": {
            "name": INPUT_NAME, "shape": ["N", 1, "H", "W"], "dtype": "float32",
            "meaning": "frame normalised to [0, 1] (see [normalization])",
        },
        "[[outputs]]": {
            "name": OUTPUT_NAME, "shape": ["N", 1, "H", "W"], "dtype": "float32",
            "meaning": meaning, "activation": "none" if softmax else "sigmoid",
        },
        "[normalization]": pre.norm,
        "[thresholds]": {"probability": 0.5},
        "[training]": training,
    }  # fmt: skip
    header = (
        f"# Written by `medrt models import-bundle` from the {source}.\n"
        "# Research/demo use only; check it on your own data. Format: models/README.md\n"
    )
    body = "".join(f"\n{h}\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in t.items()) for h, t in tables.items())
    tmp_spec = out_dir / f".{name}.toml.tmp"
    try:
        tmp_spec.write_text(header + body, encoding="utf-8")
        os.replace(tmp_spec, spec_path)  # a replaced model's old spec is never left half written
    finally:
        tmp_spec.unlink(missing_ok=True)
    log.info("wrote %s and %s (max |onnx - torch| %.2e)", onnx_path, spec_path, diff)
    return load_spec(spec_path)
