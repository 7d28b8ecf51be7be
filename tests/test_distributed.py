"""``medrt batch --ray``: the batch on a real Ray cluster of two nodes (two raylets on this
machine, ``ray.cluster_utils.Cluster``), against a local run of the same input; a worker
killed mid-run; bad files; a cluster that cannot run the batch."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, SAMPLE_DIR, pydicom_test_dir, require_module
from medrt.batch import EXIT_ERRORS, BatchConfig, run_batch
from medrt.batch.plan import MANIFEST
from medrt.cli import main

CT = SAMPLE_DIR / "ct_stream"
RADIOGRAPHS = SAMPLE_DIR / "radiographs"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each: the driver's worker placement, object transfer and
    node affinity run as on two machines."""
    require_module("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _input(tmp_path: Path) -> Path:
    """Six CT slices with lesions, one more slice of that series cut short (it does not
    decode), the three sample radiographs (each its own series) and an MR image no model is for."""
    src = tmp_path / "in"
    (src / "ct").mkdir(parents=True)
    slices = sorted(CT.glob("*.dcm"))
    for p in slices[14:20]:
        shutil.copy(p, src / "ct" / p.name)
    (src / "ct" / "truncated.dcm").write_bytes(slices[0].read_bytes()[:4000])
    shutil.copytree(RADIOGRAPHS, src / "dx")
    shutil.copy(pydicom_test_dir() / "MR_small.dcm", src / "mr.dcm")
    return src


def _records(out: Path) -> dict[tuple[str, int], list[float]]:
    """(file, frame) -> the lesions' diameters, from results.jsonl."""
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return {(r["file"], r["frame_index"]): sorted(les["diameter_mm"] for les in r["lesions"]) for r in recs}


def _errors(out: Path) -> dict[str, dict[str, str]]:
    return {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}


def test_two_nodes_give_what_a_local_run_gives_and_a_local_rerun_resumes(cluster, tmp_path):
    src = _input(tmp_path)
    out = tmp_path / "ray"
    proc = subprocess.run([sys.executable, "-m", "medrt", "batch", str(src), "--out", str(out), "--ray",
                           cluster.address, "--json", "--quiet"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == EXIT_ERRORS, proc.stderr[-3000:]  # the cut-short slice
    # --quiet holds on the workers too: pydicom's warning on the cut-short slice is in
    # errors.csv, not on the console
    assert "End of file" not in proc.stderr and "truncated" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["counts"]["series"] == 4 and report["counts"]["series_analysed"] == 4
    workers = report["cluster"]["workers"]
    assert len(workers) == 2 and len({w["node_id"] for w in workers}) == 2  # one worker per node
    assert all(w["series"] >= 1 and w["cpus"] == 1 for w in workers)  # both did work
    assert sum(w["frames"] for w in workers) == 6 + 1 + 3  # the cut-short slice counts as sent
    assert report["timings_ms"]["total"]["n"] == 9 and report["throughput_fps"] > 0

    errors = _errors(out)
    assert (errors["ct/truncated.dcm"]["kind"], errors["ct/truncated.dcm"]["stage"]) == ("error", "decode")
    assert (errors["mr.dcm"]["kind"], errors["mr.dcm"]["stage"]) == ("skipped", "plan")

    local = tmp_path / "local"
    assert run_batch(BatchConfig(src, local, workers=1)).exit_code == EXIT_ERRORS
    ray_records, local_records = _records(out), _records(local)
    assert ray_records.keys() == local_records.keys() and len(ray_records) == 9
    assert sum(map(len, ray_records.values())) > 5  # lesions were found
    for k, sizes in local_records.items():  # same models, same frames: the same lesions
        assert len(ray_records[k]) == len(sizes), k
        assert all(abs(a - b) < 0.5 for a, b in zip(ray_records[k], sizes, strict=True)), k
    assert _errors(local) == errors

    for folder in (out / "series").iterdir():  # each series folder came back whole
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest["lesions"]:
            assert (folder / "seg.dcm").is_file() and (folder / "sr.dcm").is_file() and any((folder / "png").iterdir())
    # the outputs are the local run's: a local rerun finds every series finished
    summary = run_batch(BatchConfig(src, out, workers=1))
    assert (summary.series_resumed, summary.series_analysed) == (4, 0)
    assert _records(out) == ray_records


def test_a_killed_worker_s_series_are_analysed_by_another(cluster, tmp_path):
    import ray

    from medrt.distributed import RayOptions, run_distributed

    src = _input(tmp_path)
    out = tmp_path / "out"
    events: list[dict] = []
    pids: dict[int, int] = {}

    def on_event(event: dict) -> None:
        events.append(event)
        if event["event"] == "started":
            pids.update({i: w["pid"] for i, w in enumerate(event["workers"])})
        elif event["event"] == "joined":  # a worker slower to load its models than the grace
            pids[event["worker"]] = event["pid"]
        elif event["event"] == "series" and not any(e["event"] == "lost" for e in events) and len(pids) == 2:
            # at the first series done, the other worker still holds the series it was sent
            # (two each, analysed in order): kill its process as the OOM killer would
            os.kill(pids[1 - event["worker"]], signal.SIGKILL)

    summary = run_distributed(BatchConfig(src, out), RayOptions(address=cluster.address), on_event=on_event)
    assert not ray.is_initialized()  # the driver's session ends with the run
    lost = [e for e in events if e["event"] == "lost"]
    assert len(lost) == 1
    cl = summary.report["cluster"]
    assert cl["workers_lost"] == 1 and cl["series_sent_again"] >= 1
    assert summary.series_analysed == 4 and summary.frames == 9
    assert summary.exit_code == EXIT_ERRORS  # only the cut-short slice
    assert [r["file"] for r in csv.DictReader((out / "errors.csv").open()) if r["kind"] == "error"] == \
        ["ct/truncated.dcm"]
    # the dead worker's node was alive, so a replacement was started there
    assert len(cl["workers"]) == 3 and sum(w["lost"] for w in cl["workers"]) == 1


def test_local_cluster_for_one_run(tmp_path):
    require_module("ray")
    out = tmp_path / "out"
    # a process of its own, as from a shell: this test process is a driver of the
    # two-node cluster, and Ray keeps one session per process
    proc = subprocess.run([sys.executable, "-m", "medrt", "batch", str(RADIOGRAPHS), "--out", str(out), "--ray",
                           "local", "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["series_analysed"] == 3 and report["cluster"]["address"] == "local"
    assert "## Ray cluster (local)" in (out / "report.md").read_text()
    # the latency histogram a local run writes: the frames' analysis time on the workers
    assert report["files"]["histogram"] == "latency.png"
    assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![analysis time per frame on the Ray workers](latency.png)" in (out / "report.md").read_text()


def test_sigterm_stops_a_ray_batch_as_ctrl_c_does(tmp_path):
    """ray.init puts in a SIGTERM handler of its own (sys.exit): a Ray batch stopped by
    systemd or a scheduler died with Ray's crash dump, no report and exit 1. Ours is put
    back: exit 130, finished series kept, the report marked interrupted."""
    require_module("ray")
    src, out = _input(tmp_path), tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "medrt", "batch", str(src), "--out", str(out), "--ray", "local",
                             "--quiet"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not list(out.glob(f"series/*/{MANIFEST}")):
        time.sleep(0.1)  # a series finished: its manifest is written last
    assert proc.poll() is None, "the batch ended before the first series was finished"
    proc.send_signal(signal.SIGTERM)
    said, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted; run the same command again" in err and "SIGTERM received" not in err
    report = json.loads((out / "report.json").read_text())
    assert report["interrupted"] is True and report["counts"]["frames"] >= 1  # the finished series kept


def test_a_port_that_is_not_a_ray_head_is_refused_not_waited_on():
    """An open port that is not Ray's (a typo, another service): ray.init would wait on it
    for good; the head is asked for gRPC first."""
    require_module("ray")
    from medrt.distributed.cluster import ClusterError, _reachable

    with socket.create_server(("127.0.0.1", 0)) as server:  # accepts, never answers
        port = server.getsockname()[1]
        with pytest.raises(ClusterError, match=f"127.0.0.1:{port} accepts connections but does not answer as a Ray"):
            _reachable(f"127.0.0.1:{port}", timeout_s=1.0)


def test_the_batch_starts_with_the_workers_that_are_ready(cluster, tmp_path):
    """Three workers of one CPU asked of two CPUs: the third cannot be placed (as on a cluster
    whose autoscaler has not added its node yet). The run goes on with the two; the third
    is reported as never started."""
    from medrt.distributed import RayOptions, run_distributed

    options = RayOptions(address=cluster.address, actors=3, cpus_per_actor=1, join_grace_s=2)
    summary = run_distributed(BatchConfig(RADIOGRAPHS, tmp_path / "out"), options)
    assert summary.exit_code == 0 and summary.series_analysed == 3
    workers = summary.report["cluster"]["workers"]
    assert len(workers) == 3 and sum(w["host"] is None for w in workers) == 1
    assert sum(w["series"] for w in workers) == 3 and not any(w["lost"] for w in workers)


def test_workers_that_cannot_be_placed_fail_fast_and_say_why(cluster, tmp_path):
    from medrt.distributed import ClusterError, RayOptions, run_distributed

    options = RayOptions(address=cluster.address, actors=1, cpus_per_actor=8, start_timeout_s=5)
    with pytest.raises(ClusterError, match=r"did not start within 5 s .*'num_cpus': 8"):
        run_distributed(BatchConfig(RADIOGRAPHS, tmp_path / "out"), options)


def test_workers_that_differ_are_refused_naming_the_nodes():
    from medrt.distributed.cluster import ClusterError, agree

    a = {"medrt": "0.1.0", "host": "node-a", "settings": {"models": ["m@1:aa"], "backend": "onnxruntime"}}
    b = {"medrt": "0.1.0", "host": "node-b", "settings": {"models": ["m@1:bb"], "backend": "onnxruntime"}}
    assert agree([a, dict(a, host="node-c")]) == a["settings"]
    with pytest.raises(ClusterError, match=r"node-a and node-b differ in models"):
        agree([a, b])
    with pytest.raises(ClusterError, match=r"differ in medrt"):
        agree([a, dict(a, medrt="0.2.0", host="node-d")])


def test_cli_refuses_what_cannot_work(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["batch", str(RADIOGRAPHS), "--out", out, "--ray", "local", "--processes", "2"]) == 2
    assert "not with --ray" in capsys.readouterr().err
    require_module("ray")
    assert main(["batch", str(RADIOGRAPHS), "--out", out, "--ray", "127.0.0.1:1"]) == 2
    assert "cannot reach the Ray cluster's head at 127.0.0.1:1" in capsys.readouterr().err
    assert main(["batch", str(RADIOGRAPHS), "--out", out, "--ray", "head-without-port"]) == 2
    assert "expected 'local', 'auto', HOST:PORT" in capsys.readouterr().err


def test_a_node_that_joins_mid_run_gets_a_worker(cluster, tmp_path):
    """`ray start --address` on another machine while a batch runs: the driver notices the
    node and starts a worker there (it takes series once its models are loaded)."""
    from medrt.distributed import RayOptions, run_distributed

    added = []

    def on_event(event: dict) -> None:
        if event["event"] == "series" and not added:  # the CT series is still being analysed
            added.append(cluster.add_node(num_cpus=1))

    try:
        summary = run_distributed(BatchConfig(SAMPLE_DIR, tmp_path / "out"),
                                  RayOptions(address=cluster.address, node_scan_s=0.5, in_flight=1),
                                  on_event=on_event)
    finally:
        for node in added:
            cluster.remove_node(node)
    assert summary.exit_code == 0 and summary.series_analysed == 4
    workers = summary.report["cluster"]["workers"]
    assert len(workers) == 3 and workers[2]["node_id"] == added[0].node_id
