"""The listener's health and metrics over HTTP, for the monitoring a hospital already runs.

``medrt listen --metrics [HOST:]PORT`` serves two pages (``HOST`` defaults to
127.0.0.1, so nothing is exposed unless asked):

``/metrics``
    Prometheus' text format (prometheus_client): images stored and refused, connections
    refused, series processed by outcome and how long each took, result objects sent and
    refused per destination and the series waiting for each (its lane's backlog), storage
    commitment requests and reports, results folders deleted (``--keep-results-days``),
    and, read from the spool at each scrape, series per state, the age of the oldest
    unfinished series, images and bytes held, the disk's free bytes and the ``--min-free``
    watermark.
``/healthz``
    ``200`` and ``{"status": "ok", ...}``, or ``503`` and ``{"status": "unhealthy",
    "problems": [...]}`` naming each: the DICOM port not served, the series worker, the
    forwarder or the commitment reporter stopped or failing every pass, the spool's index
    unreadable, or the disk below ``--min-free`` (images are refused then). A load balancer's or Nagios' check reads it.

Labels carry AE titles, addresses and states only; nothing here knows a patient.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from medrt import __version__
from medrt.pacs.spool import COMMITMENT_STATES, STATES, Spool

__all__ = ["Monitor", "MonitorServer", "DURATION_BUCKETS"]

log = logging.getLogger(__name__)

# Seconds from a series' claim to done: a few slices take a second, a 4096² radiograph
# series or a 500-slice CT minutes.
DURATION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class Monitor:
    """What a running listener reports: :meth:`observe` each series outcome; the rest is
    read live from ``spool``, ``listener``, ``service`` and ``reporter`` at each scrape."""

    def __init__(self, spool: Spool, *, listener: Any = None, service: Any = None, reporter: Any = None,
                 ae_title: str = "MEDRT") -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.spool = spool
        self.listener = listener
        self.service = service
        self.reporter = reporter
        self.ae_title = ae_title
        self.started = time.time()
        self.registry = CollectorRegistry()
        self._series = Counter("medrt_series_processed", "Series the worker finished since start, by outcome",
                               ["state"], registry=self.registry)
        self._duration = Histogram("medrt_series_duration_seconds", "Seconds from taking a series to its outcome "
                                   "(analysis, waiting to be sent, sending)", buckets=DURATION_BUCKETS,
                                   registry=self.registry)
        self._frames = Counter("medrt_frames_analysed", "Frames of processed series", registry=self.registry)
        self._lesions = Counter("medrt_lesions_found", "Lesions reported in processed series", registry=self.registry)
        self._decode_errors = Counter("medrt_image_errors", "Images of processed series that could not be analysed "
                                      "(named in their series' errors.csv)", registry=self.registry)
        self._sent = Counter("medrt_forwarded_objects", "Result objects (SEG, SR, SC) a destination took",
                             ["destination"], registry=self.registry)
        self._refused = Counter("medrt_forward_refused_objects", "Result objects a destination refused or could "
                                "not take (kept and sent again after --retry)", ["destination"], registry=self.registry)
        for state in ("done", "failed", "unsent"):
            self._series.labels(state)  # present at 0 from the start, so rate() and alerts see them
        self.registry.register(_Live(self))

    def observe(self, outcome: Any) -> None:
        """Count one :class:`~medrt.pacs.service.SeriesOutcome`."""
        self._series.labels(outcome.state).inc()
        self._duration.observe(outcome.elapsed_s)
        if getattr(outcome, "analysed", True):  # a series only sent again was counted when it was analysed
            self._frames.inc(outcome.frames)
            self._lesions.inc(outcome.lesions)
            self._decode_errors.inc(outcome.errors)
        for dest, n in getattr(outcome, "sent", {}).items():
            self._sent.labels(dest).inc(n)
        for dest, n in getattr(outcome, "refused", {}).items():
            self._refused.labels(dest).inc(n)

    # -- health ------------------------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """What stands between this listener and images analysed and results delivered."""
        return [text for text, _ in self._checks()]

    def stuck(self) -> list[str]:
        """The problems a restart would mend (a stopped thread, the port not served): while
        there is one, the systemd watchdog is not told "alive". A full disk is not one."""
        return [text for text, restart in self._checks() if restart]

    def _checks(self) -> list[tuple[str, bool]]:
        found = []  # (problem, whether a restart mends it)
        if self.listener is not None and not self.listener.serving:
            found.append((f"the DICOM port is not served ({self.ae_title} on {self.listener.host}:"
                          f"{self.listener.port})", True))
        if self.service is not None and not self.service.alive:
            found.append(("the series worker has stopped", True))
        if self.service is not None and not self.service.forwarder.alive:
            found.append(("the forwarder has stopped", True))
        if self.reporter is not None and not self.reporter.alive:
            found.append(("the storage commitment reporter has stopped", True))
        # threads alive but every pass failing (a full disk under the index): not mended by a restart
        for name, loop in (("the series worker", self.service),
                           ("the forwarder", getattr(self.service, "forwarder", None)),
                           ("the storage commitment reporter", self.reporter)):
            failing = getattr(loop, "failing", "") if loop is not None else ""
            if failing:
                found.append((f"{name} fails: {failing}", False))
        try:
            self.spool.totals()
        except sqlite3.Error as exc:
            found.append((f"the spool's index cannot be read: {exc}", False))
        try:
            free = self.spool.free_bytes()
        except OSError as exc:
            found.append((f"the spool's disk cannot be read: {exc.strerror or exc}", False))
        else:
            watermark = self.spool.min_free_bytes
            if watermark and free < watermark:
                found.append((f"the spool's disk has {free // 2**20} MiB free, below --min-free "
                              f"{watermark // 2**20} MiB: images are refused", False))
        return found

    def health(self) -> dict[str, Any]:
        problems = self.problems()
        return {"status": "unhealthy" if problems else "ok", "problems": problems, "version": __version__,
                "ae_title": self.ae_title, "uptime_s": round(time.time() - self.started, 1)}

    def status_line(self) -> str:
        """One line for ``systemctl status`` (systemd's STATUS=)."""
        try:
            totals = self.spool.totals()
            free = self.spool.free_bytes()
        except (sqlite3.Error, OSError) as exc:
            return f"the spool cannot be read: {exc}"
        waiting = sum(totals[s] for s in STATES if s != "done")
        stored = self.listener.counts["stored"] if self.listener is not None else 0
        processed = sum(self.service.processed.values()) if self.service is not None else 0
        return (f"{stored} image(s) stored, {processed} series processed, {waiting} waiting, "
                f"{totals['failed']} failed, {totals['unsent']} unsent; {free // 2**20} MiB free")


class _Live:
    """A prometheus_client collector: the figures read at each scrape."""

    def __init__(self, monitor: Monitor) -> None:
        self.m = monitor

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        m = self.m
        yield InfoMetricFamily("medrt_listener", "The listener's version and AE title",
                               value={"version": __version__, "ae_title": m.ae_title})
        up = GaugeMetricFamily("medrt_up", "1 while a part of the listener runs", labels=["component"])
        if m.listener is not None:
            up.add_metric(["dicom_port"], float(m.listener.serving))
        if m.service is not None:
            up.add_metric(["series_worker"], float(m.service.alive))
            up.add_metric(["forwarder"], float(m.service.forwarder.alive))
        if m.reporter is not None:
            up.add_metric(["commitment_reporter"], float(m.reporter.alive))
        yield up
        if m.listener is not None:
            images = CounterMetricFamily("medrt_images_received", "Images (C-STORE requests) by what became of them: "
                                         "stored (on disk, then acknowledged), refused (a status the sender keeps "
                                         "the image on), failed", labels=["result"])
            counts = dict(m.listener.counts)
            for result in ("stored", "refused", "failed"):
                images.add_metric([result], counts.get(result, 0))
            yield images
            yield CounterMetricFamily("medrt_connections_refused", "Connections closed by --allow-from",
                                      value=m.listener.connections_refused)
            yield CounterMetricFamily("medrt_commitment_requests", "Storage commitment requests (N-ACTION) received",
                                      value=counts.get("commitments", 0))
        if m.service is not None:
            backlog = GaugeMetricFamily("medrt_forward_backlog_series", "Series waiting for a destination: queued "
                                        "in its lane or being sent to it (a slow one holds back only its own)",
                                        labels=["destination"])
            for dest, n in m.service.forwarder.backlog().items():
                backlog.add_metric([dest], n)
            yield backlog
            yield CounterMetricFamily("medrt_results_purged", "Series whose results folder --keep-results-days "
                                      "deleted since start", value=getattr(m.service, "results_purged", 0))
        if m.reporter is not None:
            yield CounterMetricFamily("medrt_commitment_reports", "Storage commitment reports delivered",
                                      value=m.reporter.reported)
        yield GaugeMetricFamily("medrt_uptime_seconds", "Seconds since the listener started",
                                value=time.time() - m.started)
        try:
            totals = m.spool.totals()
            oldest = m.spool.oldest_unfinished()
        except sqlite3.Error:  # /healthz says so; the counters above still go out
            return
        states = GaugeMetricFamily("medrt_spool_series", "Series in the spool, by state", labels=["state"])
        for state in STATES:
            states.add_metric([state], totals[state])
        yield states
        reports = GaugeMetricFamily("medrt_spool_commitments", "Storage commitment requests kept, by report state",
                                    labels=["state"])
        for state in COMMITMENT_STATES:
            reports.add_metric([state], totals[f"commitments_{state}"])
        yield reports
        yield GaugeMetricFamily("medrt_spool_images", "Images held in the spool's inbox", value=totals["instances"])
        yield GaugeMetricFamily("medrt_spool_bytes", "Bytes of images held in the spool's inbox", value=totals["bytes"])
        yield GaugeMetricFamily("medrt_spool_oldest_unfinished_seconds", "Age of the first image of the oldest series "
                                "not done yet (0 when none): a queue that does not drain",
                                value=0.0 if oldest is None else time.time() - oldest)
        try:
            free = m.spool.free_bytes()
        except OSError:
            return
        yield GaugeMetricFamily("medrt_spool_disk_free_bytes", "Bytes free on the spool's disk", value=free)
        yield GaugeMetricFamily("medrt_spool_disk_min_free_bytes", "--min-free: below it images are refused",
                                value=m.spool.min_free_bytes)


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class MonitorServer:
    """``/metrics`` and ``/healthz`` for ``monitor`` on ``host:port`` (0: any free port), in
    a thread of its own."""

    def __init__(self, monitor: Monitor, host: str = "127.0.0.1", port: int = 9108) -> None:
        self.monitor = monitor
        self.host = host
        self.requested_port = port
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        return self.requested_port if self._server is None else int(self._server.server_address[1])

    def start(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        monitor = self.monitor

        class Handler(BaseHTTPRequestHandler):
            server_version = f"medrt/{__version__}"

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, CONTENT_TYPE_LATEST, generate_latest(monitor.registry))
                elif path in ("/healthz", "/health"):
                    health = monitor.health()
                    self._reply(200 if health["status"] == "ok" else 503, "application/json",
                                json.dumps(health, indent=1).encode() + b"\n")
                else:
                    self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics or /healthz\n")

            def _reply(self, code: int, content_type: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                log.debug("monitor: %s %s", self.address_string(), format % args)

        server_class = _Server6 if ":" in self.host else ThreadingHTTPServer
        self._server = server_class((self.host, self.requested_port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="medrt-monitor", daemon=True).start()
        log.info("monitor: /metrics and /healthz on http://%s:%d", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
