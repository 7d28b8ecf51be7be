"""``medrt listen --spool DIR``: a DICOM C-STORE SCP that analyses each series it receives.

Images are acknowledged only once they are on disk in the spool. A series is complete
when nothing has arrived for it for ``--idle`` seconds; it then goes through the same
batch core as ``medrt batch`` (one analyzer, loaded and warmed once), its results are
written to ``--out/<SeriesInstanceUID>/`` and, with ``--forward AET@HOST:PORT`` (and
``--forward-to-sender``), its SEG and SR (and SC with ``--sc``) are sent there by
C-STORE. With ``--peer``, senders may ask for storage commitment. After a crash or a
restart, the spool's unfinished series are done first. Stop with Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from medrt import sdnotify
from medrt.commands.options import (
    add_engine_options,
    add_seg_options,
    analyzer_config,
    thread_layout,
)

log = logging.getLogger("medrt.listen")


def _ae_title(text: str) -> str:
    value = text.strip()
    if not 0 < len(value) <= 16 or "\\" in value or not value.isprintable():
        raise argparse.ArgumentTypeError(f"an AE title is 1-16 printable characters without '\\', got {text!r}")
    return value


def _destination(text: str) -> Any:
    from medrt.pacs.scu import Destination

    try:
        return Destination.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _forward_target(text: str) -> Any:
    """``AET@HOST:PORT`` (C-STORE) or a DICOMweb URL (STOW-RS)."""
    from medrt.pacs.stow import StowDestination, is_url

    if not is_url(text):
        return _destination(text)
    try:
        return StowDestination.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _network(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an address or network (10.2.0.0/16, 192.168.1.7, "
                                         f"fd00::/8), got {text!r}") from None


def _http_address(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1) or ``HOST:PORT`` (``[::1]:9108`` for IPv6)."""
    host, _, port = text.strip().rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected PORT or HOST:PORT (e.g. 9108 or 0.0.0.0:9108), got {text!r}")
    return host, int(port)


def _peers(values: list[Any] | None) -> dict[str, Any]:
    """The peer table from repeated ``--peer AET@HOST:PORT``; one address per AE title."""
    peers: dict[str, Any] = {}
    for dest in values or ():
        if dest.ae_title in peers and peers[dest.ae_title] != dest:
            raise ValueError(f"--peer {dest}: {dest.ae_title} is already at {peers[dest.ae_title]}")
        peers[dest.ae_title] = dest
    return peers


def _targets(args: argparse.Namespace) -> str:
    names = [str(d) for d in dict.fromkeys(args.forward or ())]
    return ", ".join(names + (["the sender"] if args.forward_to_sender else []))


def _line(outcome: Any) -> str:
    sent = f", {len(outcome.forwarded)} object(s) forwarded" if outcome.forwarded else ""
    if sent and len(outcome.destinations) > 1:
        sent += f" to each of {len(outcome.destinations)} destinations"
    held = [d for d, n in outcome.sent.items() if n == 0]
    if sent and held:  # a retry: these took the results before and were not sent them again
        sent += f" ({', '.join(held)} had them already)"
    detail = f" ({outcome.detail})" if outcome.detail else ""
    return (f"series {outcome.series_uid}: {outcome.state}, {outcome.frames} frame(s), {outcome.lesions} lesion(s), "
            f"{outcome.errors} error(s){sent} in {outcome.elapsed_s:.1f} s{detail} -> {outcome.out}")


def _tls(args: argparse.Namespace) -> tuple[Any, Any]:
    """(the listener's TLS context or None, the forward's or None) from the options."""
    from medrt.pacs.scp import server_tls
    from medrt.pacs.scu import client_tls

    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_ca and not args.tls_cert:
        raise ValueError("--tls-ca (verify the senders' certificates) needs --tls-cert and --tls-key")
    for name in ("tls_cert", "tls_key", "tls_ca", "forward_tls_ca", "forward_tls_cert", "forward_tls_key"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            raise ValueError(f"--{name.replace('_', '-')} {path}: no such file")
    tls = server_tls(args.tls_cert, args.tls_key, args.tls_ca) if args.tls_cert else None
    use = args.forward_tls or args.forward_tls_ca or args.forward_tls_cert
    forward = client_tls(args.forward_tls_ca, args.forward_tls_cert, args.forward_tls_key) if use else None
    return tls, forward


def _with_tls(args: argparse.Namespace) -> list[Any]:
    """The --forward destinations, each DICOMweb one with the --forward-tls-* files (a DIMSE
    one takes them as the forward's ssl context)."""
    from dataclasses import replace

    from medrt.pacs.stow import StowDestination

    return [replace(d, ca=args.forward_tls_ca, cert=args.forward_tls_cert, key=args.forward_tls_key)
            if isinstance(d, StowDestination) else d for d in args.forward or ()]


def _serve(stop: threading.Event, monitor: Any) -> None:
    """Wait for Ctrl-C or SIGTERM, telling systemd (a ``Type=notify`` unit) that the listener
    is ready, how it is doing, and, while its threads run, that it is alive (the watchdog)."""
    sdnotify.notify("READY=1", f"STATUS={monitor.status_line()}")
    interval = sdnotify.watchdog_interval()
    last_status = last_ping = time.monotonic()
    while not stop.wait(0.5):
        now = time.monotonic()
        if interval is not None and now - last_ping >= min(interval, 10.0):
            last_ping = now
            stuck = monitor.stuck()
            if stuck:  # no ping: systemd restarts the service once WatchdogSec= runs out
                log.error("listener: %s; not telling the watchdog all is well", "; ".join(stuck))
            else:
                sdnotify.notify("WATCHDOG=1")
        if now - last_status >= 5.0:
            last_status = now
            sdnotify.notify(f"STATUS={monitor.status_line()}")


def run(args: argparse.Namespace) -> int:
    from medrt.analyzer import load_analyzer
    from medrt.batch import OutputOptions
    from medrt.pacs.commitment import CommitmentReporter
    from medrt.pacs.monitor import Monitor, MonitorServer
    from medrt.pacs.scp import Listener
    from medrt.pacs.service import PacsService
    from medrt.pacs.spool import Spool, SpoolIndexError, SpoolInUseError

    try:
        tls, forward_tls = _tls(args)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: a key that does not match, a bad file
        print(f"medrt listen: TLS: {exc}", file=sys.stderr)
        return 2
    try:
        peers = _peers(args.peer)
    except ValueError as exc:
        print(f"medrt listen: {exc}", file=sys.stderr)
        return 2
    unreachable = [ae for ae in peers if args.allow and ae not in args.allow]
    if unreachable:
        print(f"medrt listen: --peer {', '.join(unreachable)}: not in --allow, so "
              f"{'it' if len(unreachable) == 1 else 'they'} cannot connect at all: no images, no storage commitment "
              f"(add --allow {unreachable[0]})", file=sys.stderr)
    if args.forward_to_sender and not peers:
        print("medrt listen: --forward-to-sender needs the senders' addresses: --peer AET@HOST:PORT for each",
              file=sys.stderr)
        return 2
    if args.min_free < 0:
        print("medrt listen: --min-free takes MiB >= 0", file=sys.stderr)
        return 2
    if not args.keep_days >= 0:  # NaN too
        print("medrt listen: --keep-days takes days >= 0 (0: keep the received images)", file=sys.stderr)
        return 2
    if not args.keep_results_days >= 0:  # NaN too
        print("medrt listen: --keep-results-days takes days >= 0 (0: keep the results for ever)", file=sys.stderr)
        return 2
    if args.forward_timeout <= 0:
        print("medrt listen: --forward-timeout takes seconds > 0", file=sys.stderr)
        return 2
    forward = _with_tls(args)
    try:
        spool = Spool(args.spool, min_free_bytes=int(args.min_free * 2**20))
    except SpoolIndexError as exc:
        print(f"medrt listen: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a spool folder it cannot make or write
        print(f"medrt listen: --spool {args.spool}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else spool.root / "results"
    try:
        spool.take_ownership()  # before recover(): a second listener must not touch a running one's series
        spool.hold_results(out)
    except SpoolInUseError as exc:
        spool.close()
        print(f"medrt listen: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a results folder it cannot make
        spool.close()
        print(f"medrt listen: --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    recovered = spool.recover()
    _, workers = thread_layout(args)
    analyzer = load_analyzer(analyzer_config(args))
    service = PacsService(spool, out, analyzer, forward=forward, peers=peers, to_sender=args.forward_to_sender,
                          calling_ae=args.ae_title, idle_s=args.idle,
                          retry_s=args.retry, workers=workers, forward_timeout_s=args.forward_timeout,
                          keep_s=None if args.keep_days == 0 else args.keep_days * 86400.0, forward_tls=forward_tls,
                          keep_results_s=args.keep_results_days * 86400.0 if args.keep_results_days else None,
                          outputs=OutputOptions(png="none" if args.no_png else "positive", sc=args.sc,
                                                omit_empty_frames=args.omit_empty_frames,
                                                seg_compression=args.seg_compression))
    reporter = CommitmentReporter(spool, peers, ae_title=args.ae_title, retry_s=args.retry, tls=forward_tls,
                                  timeout_s=args.forward_timeout)
    listener = Listener(spool, ae_title=args.ae_title, host=args.bind, port=args.port,
                        allowed_callers=args.allow or (), on_stored=service.notify, tls=tls, peers=peers,
                        on_commitment=reporter.notify, allowed_networks=args.allow_from or ())
    monitor = Monitor(spool, listener=listener, service=service, reporter=reporter if peers else None,
                      ae_title=args.ae_title)

    def on_outcome(outcome: Any) -> None:
        monitor.observe(outcome)  # first: a scrape after the line sees the series
        print(_line(outcome), flush=True)

    service.on_outcome = on_outcome
    web = None if args.metrics is None else MonitorServer(monitor, *args.metrics)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        listener.start()
    except OSError as exc:
        spool.close()
        print(f"medrt listen: cannot listen on {args.bind}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if web is not None:
        try:
            web.start()
        except OSError as exc:
            listener.stop()
            spool.close()
            print(f"medrt listen: --metrics {web.host}:{web.port}: cannot listen: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    service.start()
    if peers:
        reporter.start()
    pending = sum(1 for s in spool.all_series() if s.state not in ("done",))
    free_mib = spool.free_bytes() // 2**20
    if free_mib < args.min_free:
        print(f"medrt listen: the spool's disk has {free_mib} MiB free, below --min-free {args.min_free:.0f} MiB: "
              f"images are refused (0xA700, the senders keep them) until there is room", file=sys.stderr, flush=True)
    print(f"medrt listen: {args.ae_title} on {args.bind}:{listener.port}{' (TLS)' if tls else ''}, spool {spool.root} "
          f"({pending} series to finish{', ' + str(recovered['requeued']) + ' resumed' if recovered['requeued'] else ''}),"
          f" results {out}" + (f", forwarding to {_targets(args)}" if args.forward or args.forward_to_sender else "")
          + (f", storage commitment for {', '.join(peers)}" if peers else "")
          + (f", metrics on http://{web.host}:{web.port}/metrics" if web is not None else "")
          + f"; {free_mib} MiB free on the spool's disk; Ctrl-C stops",
          flush=True)
    try:
        _serve(stop, monitor)
    finally:
        sdnotify.notify("STOPPING=1", "STATUS=stopping: no new images; what is stored stays in the spool")
        listener.stop()  # no new images; what is stored stays in the spool for the next start
        if web is not None:
            web.stop()
        service.stop()
        reporter.stop()
        spool.close()
    c = listener.counts
    print(f"medrt listen: stopped; {c['stored']} image(s) stored, {c['refused']} refused, {c['failed']} not stored, "
          + (f"{listener.connections_refused} connection(s) refused (--allow-from), " if args.allow_from else "")
          + _processed(service)
          + (f", {c['commitments']} storage commitment request(s), {reporter.reported} reported" if peers else ""),
          flush=True)
    return 0


def _processed(service: Any) -> str:
    """What the passes over series ended in since start, by state: outcomes, not series (a
    series retried three times before it was done counts four times, as
    medrt_series_processed_total does)."""
    total = sum(service.processed.values())
    ends = ", ".join(f"{n} {state}" for state, n in sorted(service.processed.items()) if n)
    return f"{total} series outcome(s)" + (f" ({ends})" if ends else "")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("listen", help="DICOM C-STORE listener: analyse each series received, forward SEG/SR",
                       description=__doc__)
    p.add_argument("--spool", required=True, help="the durable inbox (created; reused across restarts)")
    p.add_argument("--out", default=None, help="results folder (default SPOOL/results)")
    p.add_argument("--ae-title", type=_ae_title, default="MEDRT", help="our AE title (default MEDRT)")
    p.add_argument("--bind", default="0.0.0.0", help="address to listen on (default all; 127.0.0.1 for local only)")
    p.add_argument("--port", type=int, default=11112, help="TCP port (default 11112; 0: any free port)")
    p.add_argument("--allow", action="append", type=_ae_title, metavar="AET",
                   help="accept associations only from this calling AE title (repeatable; default: any)")
    p.add_argument("--allow-from", action="append", type=_network, metavar="CIDR",
                   help="accept connections only from this address or network, e.g. 10.2.0.0/16 (repeatable; "
                        "default: any)")
    p.add_argument("--forward", type=_forward_target, action="append", metavar="AET@HOST:PORT|URL",
                   help="send each series' SEG and SR (and SC with --sc) there: by C-STORE, or by STOW-RS to a "
                        "DICOMweb service root such as https://pacs.example.org/dicom-web (credentials from "
                        "MEDRT_DICOMWEB_TOKEN, or MEDRT_DICOMWEB_USER and MEDRT_DICOMWEB_PASSWORD) (repeatable)")
    p.add_argument("--forward-to-sender", action="store_true",
                   help="also send them back to the AE that sent the series, at its --peer address")
    p.add_argument("--peer", action="append", type=_destination, metavar="AET@HOST:PORT",
                   help="a sender's own address: accept storage commitment requests from AE title AET and report "
                        "to HOST:PORT (repeatable)")
    t = p.add_argument_group("DICOM over TLS")
    t.add_argument("--tls-cert", metavar="PEM", help="listen over TLS only, with this certificate (and --tls-key)")
    t.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    t.add_argument("--tls-ca", metavar="PEM", help="accept only senders with a certificate these CAs signed")
    t.add_argument("--forward-tls", action="store_true",
                   help="forward (and send storage commitment reports) over TLS, checking the peer's certificate "
                        "against the system's CAs")
    t.add_argument("--forward-tls-ca", metavar="PEM", help="forward over TLS, trusting these CAs (implies --forward-tls;"
                                                          " for https:// destinations too)")
    t.add_argument("--forward-tls-cert", metavar="PEM", help="our certificate for a destination that asks for one "
                                                            "(https:// destinations too)")
    t.add_argument("--forward-tls-key", metavar="PEM", help="the private key of --forward-tls-cert")
    p.add_argument("--idle", type=float, default=10.0, metavar="S",
                   help="a series is complete after S seconds without a new image (default 10)")
    p.add_argument("--forward-timeout", type=float, default=30.0, metavar="S",
                   help="give up on a destination (and storage commitment receiver) that does not answer "
                        "within S seconds: connecting, associating, each C-STORE (default 30)")
    p.add_argument("--retry", type=float, default=60.0, metavar="S",
                   help="try a failed series (analysis or forwarding) again after S seconds (default 60)")
    p.add_argument("--keep-days", type=float, default=7.0, metavar="D",
                   help="once a series is done, delete its received images D days after the last one arrived"
                        " (its results stay: --keep-results-days; default 7; 0: keep them)")
    p.add_argument("--keep-results-days", type=float, default=0.0, metavar="D",
                   help="delete a series' results folder (OUT/<SeriesInstanceUID>) D days after the series was done"
                        " (results written and sent); never while it waits, fails or is unsent, and never a file "
                        "medrt did not write (default 0: keep the results for ever)")
    p.add_argument("--min-free", type=float, default=1024.0, metavar="MIB",
                   help="refuse images (status 0xA700, the sender keeps them and retries) while fewer than MIB "
                        "mebibytes would stay free on the spool's disk (default 1024; 0: until the disk is full)")
    p.add_argument("--metrics", type=_http_address, metavar="[HOST:]PORT",
                   help="serve /metrics (Prometheus) and /healthz (200 or 503, JSON) over HTTP on PORT "
                        "(HOST default 127.0.0.1; 0.0.0.0:PORT for a monitoring server elsewhere)")
    p.add_argument("--sc", action="store_true", help="also make (and forward) secondary captures with the overlay")
    p.add_argument("--no-png", action="store_true", help="no overlay PNGs in the results folder")
    add_seg_options(p)
    add_engine_options(p)
    p.add_argument("--workers", type=int, default=None, help="inference workers (default: one per core on CPU)")
    p.set_defaults(func=run)
