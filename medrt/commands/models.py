"""``medrt models list|verify|import-bundle|quantize|int8``: the shipped models, your own, MONAI bundles, INT8.

The spec format is documented in ``models/README.md``. Nothing heavy is imported
at start-up: onnxruntime loads in ``verify`` and ``quantize``, torch and monai in ``import-bundle``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from medrt.engine.registry import (
    ModelError,
    ModelSpec,
    TensorSpec,
    find_spec,
    load_spec,
    resolve_spec_path,
    shipped_models_dir,
    size_text,
)

__all__ = ["ModelStatus", "model_status", "register", "verify_model"]

# Spec dtype -> the type onnxruntime reports for a graph input or output.
ORT_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "float64": "tensor(double)",
    "uint8": "tensor(uint8)",
    "int8": "tensor(int8)",
    "int32": "tensor(int32)",
    "int64": "tensor(int64)",
    "bool": "tensor(bool)",
}
# The outputs a task's consumer reads by name (models/README.md).
REQUIRED_OUTPUTS = {"roi_classifier": ("presence", "heatmap")}


@dataclass
class ModelStatus:
    """One spec as ``list``/``verify`` report it."""

    spec: str
    ok: bool
    name: str | None = None
    version: str | None = None
    task: str | None = None
    file: str | None = None
    size_bytes: int | None = None
    error: str | None = None


def _check_tensors(spec: ModelSpec, kind: str, wanted: tuple[TensorSpec, ...], graph: list[Any]) -> None:
    by_name = {node.name: node for node in graph}
    for tensor in wanted:
        node = by_name.get(tensor.name)
        where = f"{spec.spec_path}: [[{kind}s]] {tensor.name!r}"
        if node is None:
            raise ModelError(
                f"{where} is not an {kind} of {spec.path.name} (the graph's {kind}s: {', '.join(by_name)})"
            )
        dims = list(node.shape)
        if len(dims) != len(tensor.shape):
            raise ModelError(f"{where}: shape {list(tensor.shape)} has rank {len(tensor.shape)}, the graph's {dims}")
        for i, (mine, theirs) in enumerate(zip(tensor.shape, dims, strict=True)):
            if isinstance(mine, int) and isinstance(theirs, int) and mine != theirs:
                raise ModelError(f"{where}: dimension {i} is {mine} in the spec, {theirs} in the graph")
        expected = ORT_TYPES.get(tensor.dtype)
        if expected is not None and node.type != expected:
            raise ModelError(f"{where}: dtype {tensor.dtype} in the spec, {node.type} in the graph")


def verify_model(spec_path: str | Path) -> ModelSpec:
    """Load a spec, check the file's sha256, open it with onnxruntime (CPU) and match the IO tensors.

    Raises :class:`ModelError` (naming the file and the reason) at the first problem.
    """
    spec = load_spec(spec_path)
    names = {t.name for t in spec.outputs}
    missing = [n for n in REQUIRED_OUTPUTS.get(spec.task, ()) if n not in names]
    if missing:
        raise ModelError(f"{spec.spec_path}: a {spec.task} needs [[outputs]] named {', '.join(missing)}")
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend

    # The runtime's own loader (it checks the names it feeds and reads), on one CPU thread.
    session = OnnxRuntimeBackend(spec, providers=["CPUExecutionProvider"], threads=1).session
    _check_tensors(spec, "input", spec.inputs, session.get_inputs())
    _check_tensors(spec, "output", spec.outputs, session.get_outputs())
    return spec


def model_status(spec_path: str | Path, *, deep: bool = False) -> ModelStatus:
    """Check one spec (a ``.toml`` path or a shipped model's name): sha256 always; with
    ``deep``, also open it with onnxruntime."""
    status = ModelStatus(spec=str(spec_path), ok=False)
    try:
        spec_path = resolve_spec_path(spec_path)
        status.spec = str(spec_path)
        spec = load_spec(spec_path, verify=False)
        status.name, status.version, status.task = spec.name, spec.version, spec.task
        status.file = str(spec.path)
        status.size_bytes = spec.path.stat().st_size if spec.path.is_file() else None
        if deep:
            verify_model(spec_path)
        else:
            spec.verify()
    except ModelError as exc:
        status.error = str(exc)
        return status
    status.ok = True
    return status


def _print(results: list[ModelStatus], as_json: bool, what: str) -> None:
    if as_json:
        print(json.dumps({"models": [asdict(r) for r in results]}, indent=2))
        return
    for r in results:
        if r.ok:
            print(f"{r.name:<20} {r.version:<10} {r.task:<15} {size_text(r.size_bytes):>9}  {what} ok")
        else:
            print(f"{(r.name or Path(r.spec).name):<20} ERROR: {r.error}")


def run_list(args: argparse.Namespace) -> int:
    folder = shipped_models_dir()
    results = [model_status(p) for p in sorted(folder.glob("*.toml"))]
    _print(results, args.json, "sha256")
    if not results and not args.json:
        print(f"no shipped models (none in {folder}); see models/README.md to bring your own")
    return 1 if any(not r.ok for r in results) else 0


def run_verify(args: argparse.Namespace) -> int:
    results = [model_status(p, deep=True) for p in args.specs]
    if args.json:
        _print(results, True, "")
    else:
        for r in results:
            if r.ok:
                print(f"OK    {r.spec}  ({r.name}@{r.version}, {r.task}, {size_text(r.size_bytes)})")
            else:
                print(f"FAIL  {r.spec}\n      {r.error}")
        failed = sum(not r.ok for r in results)
        print(f"\n{len(results)} spec(s): {len(results) - failed} ok, {failed} failed")
    return 1 if any(not r.ok for r in results) else 0


def run_import(args: argparse.Namespace) -> int:
    from medrt.bundle import import_bundle

    spec = import_bundle(
        args.bundle, args.out, name=args.name, label=args.label, trust=args.trust, force=args.force
    )
    if args.json:
        print(json.dumps({"spec": str(spec.spec_path), "onnx": str(spec.path), "training": spec.training}, indent=2))
        return 0
    print(f"wrote {spec.path}\nwrote {spec.spec_path}")
    print(f"  {spec.ident}: {spec.outputs[0].meaning}, activation {spec.outputs[0].activation}")
    window = f" {spec.window[0]:g}/{spec.window[1]:g}" if spec.window else " (the frame's own VOI window)"
    print(f"  normalisation {spec.normalization}{window}; sizes a multiple of {spec.multiple_of}")
    print(f"  {spec.training.get('export_check', '')}")
    for note in spec.training.get("notes", []):
        print(f"  WARNING: {note}")
    print(f"check it with: medrt models verify {spec.spec_path}")
    return 0


def _calibration(path: Path) -> list[Any]:
    """Normalised calibration inputs from a ``.npy`` (one array, (N, H, W) or (N, 1, H, W)) or ``.npz``."""
    import numpy as np

    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.ndarray):
            arrays = [data]
        else:
            with data:
                arrays = [np.asarray(data[k]) for k in data.files]
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read calibration arrays ({exc})") from None
    out: list[Any] = []
    for arr in arrays:
        out += list(arr) if arr.ndim >= 3 else [arr]  # quantize_int8 takes (H, W), (1, H, W) or NCHW items
    return out


def run_quantize(args: argparse.Namespace) -> int:
    from medrt.engine.gate import compare
    from medrt.engine.quantize import check_int8_target, move_quantized, quantize_int8

    spec = find_spec(args.spec)
    # Before the minutes of work: never the model being quantized; an INT8 model there only with --force.
    check_int8_target(spec, args.out, force=args.force)
    calibration = _calibration(Path(args.calibration)) if args.calibration else None
    args.out.mkdir(parents=True, exist_ok=True)
    # Quantize into a scratch folder: a refused or failed model never reaches --out (nor replaces
    # what is there); an accepted one is renamed into place.
    with tempfile.TemporaryDirectory(dir=args.out, prefix=".medrt-quantize-") as tmp:
        reduced = quantize_int8(
            spec,
            tmp,
            calibration=calibration,
            exclude_first_last=args.keep_first_last,
            calibration_note=f"{args.calibration} ({len(calibration)} inputs)" if calibration else None,
        )
        report = None if args.no_gate else compare(spec, reduced)
        if report is None or report.passed:
            reduced = move_quantized(reduced, args.out, force=args.force)
    result = {
        "spec": str(reduced.spec_path) if report is None or report.passed else None,
        "onnx": str(reduced.path) if report is None or report.passed else None,
        "gate": report.to_json() if report else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    elif report is not None:
        print(f"{spec.ident} -> INT8 on {report.frames} validation phantoms ({report.lesions} lesions), "
              f"{report.seconds:.0f} s")  # fmt: skip
        for name, fig in (("fp32", report.fp32), (report.precision, report.reduced)):
            print(f"  {name:<5} sensitivity {fig.sensitivity:.3f}  Dice {fig.dice:.3f}")
        print(f"  drop  sensitivity {report.drop_points.sensitivity:+.1f} points  "
              f"Dice {report.drop_points.dice:+.1f} points (limit {report.limit_points:g})")  # fmt: skip
    if report is None:
        print(
            "WARNING: --no-gate: this INT8 model was NOT checked against its FP32 original. "
            "It may miss lesions the FP32 model finds. Do not use it before `medrt models quantize` "
            "without --no-gate accepts it.",
            file=sys.stderr,
        )
    elif not report.passed:
        print(f"medrt: {report.message}. Nothing was written to {args.out}.", file=sys.stderr)
        return 1
    if not args.json:
        if report is not None:
            print(report.message)
        print(f"wrote {reduced.path}\nwrote {reduced.spec_path}")
    return 0


def run_int8(args: argparse.Namespace) -> int:
    """List, make or clear the gated INT8 twins ``--precision int8`` uses (medrt.engine.int8cache)."""
    from medrt.engine import int8cache
    from medrt.engine.gate import AccuracyGateError

    root = int8cache.cache_root()
    specs = [find_spec(name) for name in args.models]
    if args.clear:
        removed = int8cache.clear(specs)
        print(json.dumps({"removed": removed}, indent=2) if args.json else
              "\n".join([f"removed {f}" for f in removed] or [f"nothing to remove in {root}"]))
        return 0
    failed = 0
    for spec in specs:  # made now, so the first clinical run does not wait for it
        try:
            int8cache.gated_int8(spec)
        except AccuracyGateError as exc:  # kept in the cache; the analyzer runs this one in fp32
            if not args.json:
                print(f"refused  {spec.ident}: {exc}")
        except ModelError as exc:
            failed += 1
            print(f"ERROR    {spec.ident}: {exc}", file=sys.stderr)
    entries = int8cache.entries()
    if args.json:
        print(json.dumps({"cache": str(root), "models": entries}, indent=2))
    elif not entries:
        print(f"no INT8 models in {root} yet; 'medrt models int8 NAME...' makes them "
              "(or the first --precision int8 run does)")
    else:
        print(f"INT8 models in {root}:")
        for e in entries:
            state = "ERROR" if "error" in e else "ok" if e["passed"] else "refused"
            print(f"  {state:<8} {e.get('source', Path(e['folder']).name):<32} {e.get('message') or e.get('error')}")
    return 1 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "models",
        help="list the shipped models, verify model specs, import a MONAI bundle, quantize to INT8, the INT8 cache",
        description="Models are ONNX files described by a TOML spec (models/README.md). "
        "Shipped models are trained on synthetic phantoms: research/demo use only, not for clinical use.",
    )
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    ls = msub.add_parser(
        "list",
        help="the shipped models and whether their sha256 matches",
        description="One line per shipped model: name, version, task, file size, sha256 check. "
        "Exit status 1 when any shipped model fails its check.",
    )
    ls.add_argument("--json", action="store_true", help="print one JSON object for programs")
    ls.set_defaults(func=run_list)

    ver = msub.add_parser(
        "verify",
        help="check model specs or shipped models: sha256, onnxruntime loads the file, IO names match",
        description="For each SPEC (a .toml file or a shipped model's name): load it, check the model "
        "file's sha256, open the model "
        "with onnxruntime (CPU) and check that the spec's input and output names, ranks and "
        "dtypes are in the graph. Exit status 0 when all pass, 1 when any fails.",
    )
    ver.add_argument("specs", nargs="+", metavar="SPEC", help="model spec files (.toml) or shipped model names")
    ver.add_argument("--json", action="store_true", help="print one JSON object for programs")
    ver.set_defaults(func=run_verify)

    imp = msub.add_parser(
        "import-bundle",
        help="convert a 2-D MONAI bundle to ONNX + a medrt spec (needs medrt[train] and --trust)",
        description="Convert a 2-D MONAI bundle folder (configs/metadata.json, configs/inference.json, "
        "models/model.ts or models/model.pt) to DIR/NAME.onnx and DIR/NAME.toml. The ONNX output is "
        "checked against torch before the spec is written. A bundle is code: its configs import "
        "modules and evaluate Python, and model.ts is a TorchScript program, so nothing is loaded "
        "without --trust. A preprocessing step medrt does not reproduce is named in a warning; a z-score "
        "by each image's own statistics, or a channel_def that does not fit the network, is refused. "
        "An existing DIR/NAME.onnx or .toml is replaced only with --force. "
        "Needs torch and monai: pip install 'medrt[train]'.",
    )
    imp.add_argument("bundle", metavar="BUNDLE_DIR", help="the bundle folder")
    imp.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write NAME.onnx and NAME.toml")
    imp.add_argument("--name", help="model name (default: the bundle's metadata name)")
    imp.add_argument(
        "--label",
        help="output channel to export, by channel_def name or index (default: the first non-background)",
    )
    imp.add_argument(
        "--trust",
        action="store_true",
        help="I trust this bundle: let it run its config code and TorchScript with my permissions",
    )
    imp.add_argument(
        "--force", action="store_true", help="replace an existing DIR/NAME.onnx and DIR/NAME.toml"
    )
    imp.add_argument("--json", action="store_true", help="print one JSON object for programs")
    imp.set_defaults(func=run_import)

    qua = msub.add_parser(
        "quantize",
        help="INT8-quantize a model (ONNX Runtime QDQ) and check it with the accuracy gate",
        description="Quantize SPEC (a .toml file or a shipped model's name) to DIR/NAME_int8.onnx + .toml: "
        "ONNX Runtime static quantization (QDQ, U8S8), calibrated on phantom frames with tiny, faint, "
        "bright and border-crossing lesions and empty frames. The accuracy gate then runs both models on "
        "held-out phantoms; when lesion sensitivity or mean Dice drops by more than 1 point the model "
        "is refused: nothing is written and the exit status is 1. An existing DIR/NAME_int8.onnx or .toml "
        "is replaced only with --force; a DIR where that would write over SPEC's own model is refused.",
    )
    qua.add_argument("spec", metavar="SPEC", help="model spec (.toml) or shipped model name")
    qua.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write NAME_int8.onnx/.toml")
    qua.add_argument("--no-gate", action="store_true", help="skip the accuracy gate (not recommended)")
    qua.add_argument(
        "--force", action="store_true", help="replace an existing DIR/NAME_int8.onnx and DIR/NAME_int8.toml"
    )
    keep = qua.add_mutually_exclusive_group()
    keep.add_argument(
        "--keep-first-last",
        dest="keep_first_last",
        action="store_true",
        default=True,
        help="keep the first and last weight layers in FP32 (default)",
    )
    keep.add_argument(
        "--quantize-all", dest="keep_first_last", action="store_false", help="quantize every layer"
    )
    qua.add_argument(
        "--calibration",
        metavar="FILE",
        help="calibrate on these normalised inputs (.npy (N, H, W) or (N, 1, H, W), or .npz) instead of phantoms",
    )
    qua.add_argument("--json", action="store_true", help="print one JSON object for programs")
    qua.set_defaults(func=run_quantize)

    i8 = msub.add_parser(
        "int8",
        help="list, make or clear the gated INT8 models that --precision int8 runs",
        description="--precision int8 on the CPU runs each model's INT8 twin, quantized and checked by the "
        "accuracy gate on first use and kept in the cache ($MEDRT_CACHE/int8 or ~/.cache/medrt/int8), "
        "refusals included (those models run in fp32). Without MODEL: list the cache. With MODELs: make "
        "their twins now (e.g. at install, so the first clinical run does not wait ~10 s per model). "
        "--clear removes the cache (or the MODELs' entries) so the next run measures again.",
    )
    i8.add_argument("models", nargs="*", metavar="MODEL", help="shipped model names or .toml specs")
    i8.add_argument("--clear", action="store_true", help="remove the cached INT8 models and verdicts")
    i8.add_argument("--json", action="store_true", help="print one JSON object for programs")
    i8.set_defaults(func=run_int8)
