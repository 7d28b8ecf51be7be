"""What hospital IT's monitoring sees of a running listener: ``/metrics`` (Prometheus),
``/healthz``, and systemd's notification protocol (READY, STATUS, WATCHDOG, STOPPING).

DCMTK's storescu sends, DCMTK's storescp takes the results, prometheus_client's own parser
reads the page, and a datagram socket stands where systemd's would be.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pydicom
import pytest
from test_pacs import CT, fill, storescu

from medrt import __version__
from medrt.pacs.monitor import Monitor, MonitorServer
from medrt.pacs.scp import Listener
from medrt.pacs.spool import Spool


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on /metrics: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def health(port: int) -> tuple[int, dict]:  # type: ignore[type-arg]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_healthz_names_what_is_wrong(tmp_path):
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:2])
    spool.min_free_bytes = 2**60  # more than any disk
    listener = Listener(spool, host="127.0.0.1", port=0)
    monitor = Monitor(spool, listener=listener)
    web = MonitorServer(monitor, "127.0.0.1", 0)
    web.start()
    try:
        listener.start()
        code, body = health(web.port)
        assert code == 503 and body["status"] == "unhealthy" and len(body["problems"]) == 1
        assert re.match(r"the spool's disk has \d+ MiB free, below --min-free \d+ MiB: images are refused",
                        body["problems"][0])
        assert monitor.stuck() == []  # a full disk is not mended by a restart
        spool.min_free_bytes = 0
        code, body = health(web.port)
        assert code == 200 and body["status"] == "ok" and body["problems"] == [] and body["version"] == __version__
        values = scrape(web.port)
        assert values[("medrt_up", (("component", "dicom_port"),))] == 1.0
        assert values[("medrt_spool_series", (("state", "receiving"),))] == 1.0
        assert values[("medrt_spool_images", ())] == 2.0 and values[("medrt_spool_bytes", ())] > 0
        assert values[("medrt_spool_oldest_unfinished_seconds", ())] > 1e9  # fill() dated them 1970
        listener.stop()
        code, body = health(web.port)
        assert code == 503 and body["problems"] == [f"the DICOM port is not served (MEDRT on 127.0.0.1:{listener.port})"]
        assert monitor.stuck() == body["problems"]
        assert scrape(web.port)[("medrt_up", (("component", "dicom_port"),))] == 0.0
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{web.port}/", timeout=10)
    finally:
        web.stop()
        listener.stop()
        spool.close()


def test_a_worker_whose_every_pass_fails_is_named_and_logged_once_a_minute(tmp_path, caplog):
    """The index's disk full made every pass of the series worker fail, twice a second, each
    with a traceback in the log, while /healthz said "ok". Now the first failure is logged
    with its traceback, repeats once a minute, and the health page names it."""
    from medrt.pacs.service import PacsService

    caplog.set_level("INFO", logger="medrt")
    spool = Spool(tmp_path / "spool")
    fill(spool, CT[:1])
    service = PacsService(spool, tmp_path / "out", None)
    monitor = Monitor(spool, service=service)
    service.start(tick_s=0.02)
    try:
        spool.close()  # every pass now fails on the index
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "3 pass(es)" not in service.failing:
            time.sleep(0.02)
        problems = monitor.problems()
        assert any(p.startswith("the series worker fails: ProgrammingError: Cannot operate on a closed database")
                   for p in problems), problems
        assert monitor.stuck() == []  # not mended by a restart
        for thread in ("medrt-listener-worker", "medrt-listener-forwarder"):  # each logs its traceback once
            assert caplog.text.count(f"{thread}: pass failed; trying again") == 1
        assert caplog.text.count("Traceback") == 2 and "passes still failing" not in caplog.text
    finally:
        service.stop()


def test_medrt_listen_reports_to_prometheus_and_to_systemd(tmp_path, storescp):
    dest, pacs = storescp
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(0.2)
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "2000000"}
    cmd = [sys.executable, "-m", "medrt", "listen", "--spool", str(tmp_path / "spool"), "--bind", "127.0.0.1",
           "--port", "0", "--idle", "2", "--forward", str(dest), "--threads", "1", "--workers", "1",
           "--metrics", "127.0.0.1:0", "--keep-results-days", "30"]  # --idle 2: one association, one outcome
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    messages: list[str] = []

    def drain() -> None:
        while True:
            try:
                messages.append(notify.recv(4096).decode())
            except TimeoutError:
                return

    lines = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Ctrl-C stops" in line:
                break
        start = lines[-1]
        port = int(re.search(r"on 127\.0\.0\.1:(\d+)", start)[1])  # type: ignore[index]
        web = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", start)[1])  # type: ignore[index]
        drain()
        assert messages and messages[0].startswith("READY=1\nSTATUS=0 image(s) stored, 0 series processed")

        assert storescu(port, CT[:3]).returncode == 0
        uid = pydicom.dcmread(CT[0], stop_before_pixels=True).SeriesInstanceUID
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith(f"series {uid}:"):
                break
        values = scrape(web)
        assert values[("medrt_images_received_total", (("result", "stored"),))] == 3.0
        assert values[("medrt_images_received_total", (("result", "refused"),))] == 0.0
        assert values[("medrt_series_processed_total", (("state", "done"),))] == 1.0, "".join(lines)
        assert values[("medrt_series_processed_total", (("state", "failed"),))] == 0.0
        assert values[("medrt_series_duration_seconds_count", ())] == 1.0
        assert values[("medrt_frames_analysed_total", ())] == 3.0
        assert values[("medrt_forwarded_objects_total", (("destination", str(dest)),))] == 2.0
        assert values[("medrt_spool_series", (("state", "done"),))] == 1.0
        assert values[("medrt_spool_oldest_unfinished_seconds", ())] == 0.0
        assert values[("medrt_up", (("component", "series_worker"),))] == 1.0
        assert values[("medrt_up", (("component", "forwarder"),))] == 1.0
        assert values[("medrt_listener_info", (("ae_title", "MEDRT"), ("version", __version__)))] == 1.0
        assert values[("medrt_spool_disk_free_bytes", ())] > 0
        assert values[("medrt_results_purged_total", ())] == 0.0  # results done just now are kept
        assert (tmp_path / "spool" / "results" / uid / "report.json").is_file()
        assert health(web)[0] == 200
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("3 image(s) stored, 1 series processed" in m for m in messages):
            drain()
        assert any(m.startswith("STATUS=3 image(s) stored, 1 series processed, 0 waiting, 0 failed, 0 unsent")
                   for m in messages), messages
        assert "WATCHDOG=1" in messages
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    drain()
    notify.close()
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert messages[-1].startswith("STOPPING=1\n")
    assert len(list(pacs.iterdir())) == 2



def test_a_stopped_forwarder_is_a_problem_a_restart_mends(tmp_path):
    from medrt.pacs.service import PacsService

    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer=None)  # nothing due: never analyses
    monitor = Monitor(spool, service=service)
    service.start(tick_s=0.1)
    try:
        assert monitor.problems() == []
        service.forwarder.stop()  # as if its thread had died
        assert monitor.stuck() == ["the forwarder has stopped"] and service.alive
        collected = {s.labels["component"]: s.value for family in monitor.registry.collect()
                     if family.name == "medrt_up" for s in family.samples}
        assert collected == {"series_worker": 1.0, "forwarder": 0.0}
    finally:
        service.stop()
        spool.close()


def test_sd_notify_follows_the_protocol(tmp_path, monkeypatch):
    from medrt import sdnotify

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False  # not under systemd: nothing to do
    name = f"medrt-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)  # systemd may name a socket in the abstract namespace: "@name"
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("STATUS=busy", "WATCHDOG=1") is True
        assert sock.recv(4096) == b"STATUS=busy\nWATCHDOG=1"
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert sdnotify.notify("READY=1") is False  # systemd went away: the listener goes on
    monkeypatch.setenv("WATCHDOG_USEC", "120000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() == 60.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval() is None  # meant for another process
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    monkeypatch.setenv("WATCHDOG_USEC", "0")
    assert sdnotify.watchdog_interval() is None


ALERTS = Path(__file__).resolve().parent.parent / "installer" / "medrt-alerts.yml"
PROMTOOL_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'medrt_spool_series{{state="failed", instance="a", job="medrt"}}'
        values: '0 1x40'
      - series: 'medrt_spool_series{{state="unsent", instance="a", job="medrt"}}'
        values: '0 2x40'
      - series: 'medrt_spool_disk_free_bytes{{instance="a", job="medrt"}}'
        values: '500x40'
      - series: 'medrt_spool_disk_min_free_bytes{{instance="a", job="medrt"}}'
        values: '1000x40'
      - series: 'medrt_forward_refused_objects_total{{destination="PACS@pacs:104", instance="a", job="medrt"}}'
        values: '0+2x60'
      - series: 'medrt_forwarded_objects_total{{destination="PACS@pacs:104", instance="a", job="medrt"}}'
        values: '0x60'
      - series: 'medrt_forward_refused_objects_total{{destination="VNA@vna:104", instance="a", job="medrt"}}'
        values: '0+1x60'
      - series: 'medrt_forwarded_objects_total{{destination="VNA@vna:104", instance="a", job="medrt"}}'
        values: '0+2x60'
      - series: 'medrt_forward_backlog_series{{destination="VNA@vna:104", instance="a", job="medrt"}}'
        values: '1 2 3 4 5x60'
      - series: 'medrt_forward_backlog_series{{destination="WS@ws:104", instance="a", job="medrt"}}'
        values: '0 1 3 0 1 2 3 1 0 4 2 0 1x50'
    alert_rule_test:
      - eval_time: 5m
        alertname: MedrtSeriesFailed
        exp_alerts: []
      - eval_time: 20m
        alertname: MedrtSeriesFailed
        exp_alerts:
          - exp_labels: {{severity: warning, state: failed, instance: a, job: medrt}}
            exp_annotations:
              summary: "1 series failed on a (analysis)"
              description: "They are analysed again every --retry; medrt spool SPOOL --state failed says why."
      - eval_time: 20m
        alertname: MedrtResultsUnsent
        exp_alerts: []
      - eval_time: 35m
        alertname: MedrtResultsUnsent
        exp_alerts:
          - exp_labels: {{severity: warning, state: unsent, instance: a, job: medrt}}
            exp_annotations:
              summary: "2 series' results on a not taken by a destination"
              description: "They are kept and sent again every --retry; medrt spool SPOOL --state unsent names the destination and why."
      - eval_time: 5m
        alertname: MedrtRefusingImages
        exp_alerts:
          - exp_labels: {{severity: critical, instance: a, job: medrt}}
            exp_annotations:
              summary: "medrt on a refuses images: its spool's disk is below --min-free"
              description: "Senders keep the images and retry (status 0xA700); free space on the spool's disk."
      - eval_time: 40m
        alertname: MedrtDestinationTakesNothing
        exp_alerts:
          - exp_labels: {{severity: warning, destination: "PACS@pacs:104", instance: a, job: medrt}}
            exp_annotations:
              summary: "PACS@pacs:104 took none of medrt's results for 30 minutes"
              description: "It is down, unreachable or refusing them; the results are kept and sent again."
      - eval_time: 25m
        alertname: MedrtDestinationBehind
        exp_alerts: []
      - eval_time: 45m
        alertname: MedrtDestinationBehind
        exp_alerts:
          - exp_labels: {{severity: warning, destination: "VNA@vna:104", instance: a, job: medrt}}
            exp_annotations:
              summary: "VNA@vna:104 has been over 2 series behind for 30 minutes"
              description: "It takes medrt's results more slowly than they are made (the other destinations are not held back); check its load and the network. medrt spool SPOOL --state forwarding lists the series waiting."
"""


def test_the_alert_rules_pass_promtool_and_name_only_metrics_the_listener_serves(tmp_path):
    """installer/medrt-alerts.yml: valid PromQL, each alert firing when it should (promtool's
    own rule tests), and no metric name in it that /metrics does not serve."""
    from conftest import require_tool
    from medrt.pacs.commitment import CommitmentReporter
    from medrt.pacs.scu import Destination
    from medrt.pacs.service import PacsService, SeriesOutcome

    promtool = require_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    (tmp_path / "tests.yml").write_text(PROMTOOL_TESTS.format(rules=json.dumps(str(ALERTS))))
    run = subprocess.run([promtool, "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr

    spool = Spool(tmp_path / "spool")
    service = PacsService(spool, tmp_path / "out", analyzer=None, forward=Destination("PACS", "pacs", 104))
    monitor = Monitor(spool, listener=Listener(spool, host="127.0.0.1", port=0), service=service,
                      reporter=CommitmentReporter(spool, {}))
    monitor.observe(SeriesOutcome("1.2.3", "done", frames=3, lesions=1, sent={"PACS@pacs:104": 2},
                                  refused={"PACS@pacs:104": 0}, elapsed_s=1.5))
    web = MonitorServer(monitor, "127.0.0.1", 0)
    web.start()
    try:
        served = {name for name, _ in scrape(web.port)}
    finally:
        web.stop()
        spool.close()
    named = set(re.findall(r"\bmedrt_[a-z0-9_]+", ALERTS.read_text()))
    assert len(named) >= 8 and named <= served, named - served
