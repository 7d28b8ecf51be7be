"""``medrt spool SPOOL``: what a listener's spool holds, and series put back in its queue.

For the people who run ``medrt listen``: one line per series (state, images, modality,
the AE title that sent it, when its last image came, attempts, the reason of a failure,
and how many result objects each destination has taken), the totals, the disk, and
storage commitment reports not yet delivered. ``--requeue UID`` puts a series back in
the queue, ``--requeue-failed`` every failed or unsent one; a running listener takes them
at its next pass (analysis resumes what is unchanged, the results are forwarded again, to
every destination). Safe while the listener runs: the spool's index is SQLite in WAL
mode. Series are named by UID, callers by AE title; nothing here reads a patient's name
or ID.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from medrt.pacs.spool import STATES


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _row(state: Any, now: float, delivered: dict[str, int]) -> dict[str, Any]:
    return {"series_uid": state.series_uid, "study_uid": state.study_uid, "state": state.state,
            "instances": state.instances, "modality": state.modality, "calling_ae": state.calling_ae,
            "first_received": state.first_received, "last_received": state.last_received,
            "idle_s": round(now - state.last_received, 1), "attempts": state.attempts, "detail": state.detail,
            "delivered": delivered}


def run(args: argparse.Namespace) -> int:
    from medrt.pacs.spool import Spool, SpoolIndexError

    try:
        spool = Spool(args.spool, create=False)
    except SpoolIndexError as exc:
        print(f"medrt spool: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"medrt spool: {args.spool}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        requeue = list(args.requeue or [])
        if args.requeue_failed:
            requeue += [s.series_uid for s in spool.all_series() if s.state in ("failed", "unsent")]
        problems = 0
        for uid in requeue:
            try:
                was = spool.requeue(uid)
            except KeyError:
                problems += 1
                print(f"medrt spool: series {uid}: not in this spool (never received, or its images were purged)",
                      file=sys.stderr)
            except ValueError as exc:
                problems += 1
                print(f"medrt spool: {exc}; not requeued", file=sys.stderr)
            else:
                print(f"series {uid}: {was} -> requeued", file=sys.stderr if args.json else sys.stdout)
        now = time.time()
        delivered = spool.delivery_counts()
        rows = [_row(s, now, delivered.get(s.series_uid, {})) for s in spool.all_series()
                if not args.state or s.state in args.state]
        totals = spool.totals()
        free = spool.free_bytes()
        commitments = [{"transaction_uid": c.transaction_uid, "calling_ae": c.calling_ae, "state": c.state,
                        "instances": len(c.refs), "received": c.received, "attempts": c.attempts, "detail": c.detail}
                       for c in spool.all_commitments()]
    finally:
        spool.close()
    if args.json:
        print(json.dumps({"spool": str(spool.root), "series": rows, "totals": totals, "free_bytes": free,
                          "commitments": commitments}, indent=1))
        return 1 if problems else 0
    if rows:
        print(f"{'state':<11} {'images':>6} {'mod':<4} {'from':<16} {'last image':>10} {'tries':>5}  series / detail")
        for r in rows:
            print(f"{r['state']:<11} {r['instances']:>6} {r['modality'][:4]:<4} {r['calling_ae'][:16]:<16} "
                  f"{_age(r['idle_s']) + ' ago':>10} {r['attempts']:>5}  {r['series_uid']}"
                  + (f"\n{'':>57}{r['detail']}" if r["detail"] else "")
                  + (f"\n{'':>57}sent: " + ", ".join(f"{d} ({n})" for d, n in r["delivered"].items())
                     if r["delivered"] else ""))
    states = ", ".join(f"{totals[s]} {s}" for s in STATES if totals[s])
    print(f"{spool.root}: {sum(totals[s] for s in STATES)} series ({states or 'none'}), {totals['instances']} "
          f"image(s), {totals['bytes'] / 2**20:.1f} MiB in the inbox; {free // 2**20} MiB free on its disk")
    waiting = [c for c in commitments if c["state"] != "reported"]
    if commitments:
        print(f"storage commitment: {totals['commitments_reported']} report(s) sent, "
              f"{totals['commitments_pending']} pending, {totals['commitments_failed']} failed (retried)")
    for c in waiting:
        print(f"  {c['state']:<8} {c['calling_ae']:<16} {c['instances']:>5} instance(s)  {c['transaction_uid']}"
              + (f"  {c['detail']}" if c["detail"] else ""))
    return 1 if problems else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("spool", help="what a listener's spool holds; requeue done or failed series",
                       description=__doc__)
    p.add_argument("spool", help="the folder given to medrt listen --spool")
    p.add_argument("--state", action="append", choices=STATES, help="list only series in this state (repeatable)")
    p.add_argument("--requeue", nargs="+", metavar="UID",
                   help="put these done, failed or unsent series back in the queue")
    p.add_argument("--requeue-failed", action="store_true",
                   help="put every failed (analysis) or unsent (forwarding) series back in the queue")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=run)
