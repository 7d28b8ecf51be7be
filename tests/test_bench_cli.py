"""``medrt bench`` end to end: the pipeline suites' JSON keys, --compare and --profile-layers."""

from __future__ import annotations

import copy
import json

from conftest import REPO
from medrt.cli import main
from medrt.engine.registry import load_spec


def test_pipeline_suites_json_keys_and_compare(tmp_path, capsys):
    rc = main(["bench", "--only", "pipelined,stream", "--stream-loops", "1", "--stream-frames", "40",
               "--fps", "60", "--repeats", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    pvs = out["pipelined_vs_serial"]
    assert pvs["speedup"] > 0 and pvs["frames"] == 40 and pvs["model_only_ms_per_frame"] > 0
    assert pvs["serial_baseline"] in pvs["fps"]
    s = out["stream_30fps"]
    assert set(s) >= {"fps", "drops", "p99_ms"} and s["frames"] == 40
    assert s["analysed"] + s["drops"] == 40 and s["errors"] == 0

    base = tmp_path / "base.json"
    base.write_text(json.dumps(out))
    assert main(["bench", "--only", "pipelined", "--stream-loops", "1", "--repeats", "3", "--json",
                 "--compare", str(base), "--tolerance", "10"]) == 0  # a 1000 % tolerance never trips
    capsys.readouterr()
    faster = copy.deepcopy(out)
    faster["pipelined_vs_serial"]["speedup"] = pvs["speedup"] * 100  # a baseline we cannot reach
    base.write_text(json.dumps(faster))
    assert main(["bench", "--only", "pipelined", "--stream-loops", "1", "--repeats", "3",
                 "--compare", str(base)]) == 1
    assert "speedup" in capsys.readouterr().out


def test_profile_layers_prints_the_slowest_nodes(capsys):
    assert main(["bench", "--only", "decode", "--size", "256", "--repeats", "3", "--profile-layers",
                 "--profile-size", "256", "--model", "lesion_unet_lite"]) == 0
    out = capsys.readouterr().out
    assert "slowest nodes of lesion_unet_lite" in out and "Conv" in out


def test_precision_int8_runs_the_gated_twins_and_the_engine_table_lists_int8(capsys):
    # lesion_unet: its twin passes the gate of the tests' small set (conftest: one CT series,
    # three radiographs), where lesion_unet_lite 4.0's was refused by one lesion of 29 (it
    # passes the default set, README) and the table would give the refusal as the int8 row's error
    rc = main(["bench", "--only", "engines,stream", "--model", "lesion_unet", "--stream-model", "lesion_unet",
               "--precision", "int8", "--stream-frames", "40", "--fps", "60", "--repeats", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = {(r["backend"], r["device"], r["precision"]): r for r in out["engines"]}
    fp32, int8 = rows[("onnxruntime", "cpu", "fp32")], rows[("onnxruntime", "cpu", "int8")]
    unet = load_spec(REPO / "models" / "lesion_unet.toml").ident
    assert fp32["model"] == unet and int8["model"] == f"{unet}+int8", int8
    assert int8["p50_ms"] > 0 and "error" not in int8
    s = out["stream_30fps"]
    assert s["model"].endswith("+int8") and s["analysed"] + s["drops"] == 40 and s["errors"] == 0
