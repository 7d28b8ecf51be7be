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
    channel_def = {int(k): str(v) for k, v in (pred.get("channel_def") or {}).items() if str(k).isdigit()}
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


def _normalization(info: BundleInfo) -> tuple[dict[str, Any], float, float, list[str]]:
    """The spec's [normalization], the (scale, offset) baked in front of the network, and notes.

    A literal ``ScaleIntensityRange(d)`` in the preprocessing becomes a ``fixed_window``
    (its ``b_min``/``b_max`` rescale is baked into the graph); anything else falls
    back to the frame's own VOI ``window``, with a note that the bundle's own
    intensity transform is not reproduced.
    """
    notes: list[str] = []
    pre = info.config.get("preprocessing", info.config)
    found = [(str(t["_target_"]).rsplit(".", 1)[-1], t) for t in _targets(pre)]
    scalers = [t for kind, t in found if kind in ("ScaleIntensityRange", "ScaleIntensityRanged")]
    norm: dict[str, Any] = {"method": "window"}
    scale, offset = 1.0, 0.0
    if scalers:
        t = scalers[0]
        a_min, a_max = _number(t.get("a_min")), _number(t.get("a_max"))
        b_min, b_max = _number(t.get("b_min")), _number(t.get("b_max"))
        if a_min is None or a_max is None or a_max <= a_min:
            notes.append("ScaleIntensityRange a_min/a_max are not literal numbers; using the VOI window")
        else:
            norm = {"method": "fixed_window", "center": (a_min + a_max) / 2.0, "width": a_max - a_min}
            if b_min is not None and b_max is not None:
                scale, offset = b_max - b_min, b_min
            if not t.get("clip", False):
                notes.append("ScaleIntensityRange clip=false in the bundle; medrt clips to the window")
    else:
        intensity = [kind for kind, _ in found if "Intensity" in kind or "Normalize" in kind]
        if intensity:
            notes.append(f"bundle preprocessing {', '.join(intensity)} is not reproduced; medrt feeds the VOI window")
        if info.value_range is not None and info.value_range != (0.0, 1.0):
            notes.append(f"metadata value_range {list(info.value_range)} differs from medrt's [0, 1] input")
    for note in notes:
        log.warning("%s: %s", info.root, note)
    return norm, scale, offset, notes


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
) -> ModelSpec:
    """Convert a 2-D MONAI bundle to ``<out_dir>/<name>.onnx`` + ``<name>.toml``; return the spec.

    Refuses (:class:`BundleTrustError`) unless ``trust``, since loading runs the
    bundle's code. ``label`` picks the output channel by name or index; the
    default is the first channel whose ``channel_def`` name is not background.
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
    channel, label_name = _pick_channel(info, n_out, label)
    softmax = n_out > 1
    norm, scale, offset, notes = _normalization(info)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path, spec_path = out_dir / f"{name}.onnx", out_dir / f"{name}.toml"
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
            "sha256": sha256_file(onnx_path), "multiple_of": multiple, "description": info.description or source,
        },
        "[[inputs]]": {
            "name": INPUT_NAME, "shape": ["N", 1, "H", "W"], "dtype": "float32",
            "meaning": "frame normalised to [0, 1] (see [normalization])",
        },
        "[[outputs]]": {
            "name": OUTPUT_NAME, "shape": ["N", 1, "H", "W"], "dtype": "float32",
            "meaning": meaning, "activation": "none" if softmax else "sigmoid",
        },
        "[normalization]": norm,
        "[thresholds]": {"probability": 0.5},
        "[training]": training,
    }  # fmt: skip
    header = (
        f"# Written by `medrt models import-bundle` from the {source}.\n"
        "# Research/demo use only; check it on your own data. Format: models/README.md\n"
    )
    body = "".join(f"\n{h}\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in t.items()) for h, t in tables.items())
    spec_path.write_text(header + body, encoding="utf-8")
    log.info("wrote %s and %s (max |onnx - torch| %.2e)", onnx_path, spec_path, diff)
    return load_spec(spec_path)
