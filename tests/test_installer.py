"""installer/: the systemd unit and the install script of `medrt listen`, used as radiology
IT would use them: the unit passes systemd's own checks, and a staged install runs the
listener with the unit's command line, as an unprivileged user, tells systemd it is ready
(Type=notify) and answers /healthz, stores images sent by DCMTK, stops cleanly on the unit's KillSignal within its TimeoutStopSec, and a second
install (an update) keeps the site's options.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import SAMPLE_DIR, free_port, missing, require_tool

HERE = Path(__file__).resolve().parent
INSTALLER = HERE.parent / "installer"
NOBODY = 65534


def setting(unit: str, key: str) -> str:
    (value,) = re.findall(rf"^{key}=(.*)$", unit, flags=re.MULTILINE)
    return value.strip()


def _build_leftovers() -> dict[str, int]:
    """What a build in the checkout leaves there (setuptools' build/, *.egg-info): path, mtime."""
    repo = INSTALLER.parent
    found = [*repo.glob("build/**/*"), *repo.glob("*.egg-info/*")]
    return {str(p.relative_to(repo)): p.stat().st_mtime_ns for p in found}


def test_the_unit_passes_systemd_analyze(tmp_path):
    analyze = require_tool("systemd-analyze")
    unit = tmp_path / "medrt-listen.service"
    medrt = Path(sys.executable).parent / "medrt"  # where PREFIX/venv/bin/medrt would be
    unit.write_text((INSTALLER / "medrt-listen.service").read_text().replace("@PREFIX@/venv/bin/medrt", str(medrt)))
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    security = subprocess.run([analyze, "security", "--offline=true", str(unit)], capture_output=True, text=True,
                              timeout=120)
    exposure = re.search(r"Overall exposure level for \S+: ([0-9.]+)", security.stdout)
    assert exposure is not None, security.stdout[-2000:] + security.stderr
    assert float(exposure.group(1)) <= 4.0, security.stdout  # systemd rates up to 4.9 "OK"


@pytest.mark.timeout(1200)
def test_a_staged_install_runs_the_listener_as_the_unit_says():
    setpriv = require_tool("setpriv")
    require_tool("storescu")
    if os.geteuid() != 0:
        missing("the service's user is played by uid 65534 (setpriv): needs root (CI runs as root)")
    base = Path(tempfile.mkdtemp(prefix="medrt-install-"))  # not under pytest's 0700 folders: nobody reads it
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        base.chmod(0o755)
        stage = base / "root"
        install = [str(INSTALLER / "install-listener.sh"), "--root", str(stage)]
        before = _build_leftovers()
        run = subprocess.run(install, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert _build_leftovers() == before  # built from a copy: no root-owned build/ in the checkout
        assert "staged under" in run.stdout and (stage / "opt/medrt/venv/bin/medrt").is_file()
        unit = (stage / "etc/systemd/system/medrt-listen.service").read_text()
        assert setting(unit, "ExecStart") == ("/opt/medrt/venv/bin/medrt listen --spool /var/lib/medrt/spool "
                                              "$MEDRT_LISTEN_OPTIONS")
        assert setting(unit, "KillSignal") == "SIGTERM" and setting(unit, "User") == "medrt"

        # The site's edit: another port (11112 may be taken on a test machine), then systemd's
        # expansion: EnvironmentFile, then $MEDRT_LISTEN_OPTIONS split at white space.
        env_file = stage / "etc/medrt/listen.env"
        assert env_file.stat().st_mode & 0o777 == 0o600  # it may hold DICOMweb credentials
        port, metrics = free_port(), free_port()
        env_file.write_text(env_file.read_text().replace("--port 11112", f"--port {port} --bind 127.0.0.1 "
                                                                         f"--metrics {metrics}"))
        options = setting(env_file.read_text(), "MEDRT_LISTEN_OPTIONS").split()
        argv = [str(stage) + a if a.startswith(("/opt/", "/var/")) else a
                for a in setting(unit, "ExecStart").split() if a != "$MEDRT_LISTEN_OPTIONS"] + options
        state = stage / "var/lib/medrt"
        environment = dict(kv.split("=", 1) for kv in setting(unit, "Environment").split())
        environment = {k: v.replace("/var/lib/medrt", str(state)) for k, v in environment.items()}
        for path in [state, *state.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)  # StateDirectory= gives it to the service's user
        # systemd's side of Type=notify: the socket it names in NOTIFY_SOCKET, and WatchdogSec=.
        assert setting(unit, "Type") == "notify" and setting(unit, "NotifyAccess") == "main"
        notify.bind(str(base / "notify"))
        (base / "notify").chmod(0o666)
        notify.settimeout(30)
        environment["NOTIFY_SOCKET"] = str(base / "notify")
        environment["WATCHDOG_USEC"] = str(int(setting(unit, "WatchdogSec")) * 10**6)
        proc = subprocess.Popen([setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={"PATH": "/usr/bin:/bin", **environment}, cwd="/")
        lines: list[str] = []
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(line)
                if "Ctrl-C stops" in line or len(lines) > 200:
                    break
            assert "Ctrl-C stops" in "".join(lines), "".join(lines)
            assert notify.recv(4096).decode().startswith("READY=1\nSTATUS=0 image(s) stored")
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=10) as reply:
                assert reply.status == 200 and json.loads(reply.read())["status"] == "ok"
            files = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[12:14]
            sent = subprocess.run([require_tool("storescu"), "-aec", "MEDRT", "-xt", "-R", "127.0.0.1", str(port),
                                   *map(str, files)], capture_output=True, text=True, timeout=60)
            assert sent.returncode == 0, sent.stderr
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)  # KillSignal=
            rest, _ = proc.communicate(timeout=int(setting(unit, "TimeoutStopSec").rstrip("s")))
            stop_s = time.monotonic() - t0
        finally:
            proc.kill()
        text = "".join(lines) + rest
        assert proc.returncode == 0, text
        assert "medrt listen: stopped; 2 image(s) stored" in text, text
        assert len(list((state / "spool" / "inbox").rglob("*.dcm"))) == 2
        assert all(p.stat().st_uid == NOBODY for p in (state / "spool").rglob("*"))  # written as the service user
        assert stop_s < 60

        # An update: the same script again keeps the site's options and leaves the new default beside them.
        run = subprocess.run(install, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"--port {port}" in env_file.read_text() and (stage / "etc/medrt/listen.env.new").is_file()
        assert "keeping" in run.stdout
    finally:
        notify.close()
        shutil.rmtree(base, ignore_errors=True)


def test_the_install_script_refuses_what_it_cannot_do(tmp_path):
    script = str(INSTALLER / "install-listener.sh")
    bad = subprocess.run([script, "--prefix", "relative/path", "--root", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "--prefix must be an absolute path" in bad.stderr
    unknown = subprocess.run([script, "--frobnicate"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unknown option --frobnicate" in unknown.stderr
    assert "Install `medrt listen` as a systemd service" in unknown.stdout
    assert not any(tmp_path.iterdir())
