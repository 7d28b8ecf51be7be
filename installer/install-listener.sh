#!/bin/sh
# Install `medrt listen` as a systemd service on a Linux server (run as root):
#
#   sudo installer/install-listener.sh                # /opt/medrt, user medrt, started now
#   sudo installer/install-listener.sh --no-start     # installed and enabled, not started
#   installer/install-listener.sh --root /tmp/stage   # everything under /tmp/stage: no user,
#                                                     # no systemctl (a dry run; the tests use it)
#
# It makes a virtual environment in PREFIX/venv with medrt from this checkout (core only:
# no viewer, no training), the system user medrt, /etc/medrt/listen.env (kept if present:
# the site's options), and /etc/systemd/system/medrt-listen.service. Run it again to
# update medrt; the spool in /var/lib/medrt and the options stay.
#
# Research and demonstration software: not for clinical use.
set -eu

PREFIX=/opt/medrt
ROOT=
START=yes
PYTHON=${PYTHON:-python3}

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "install-listener: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || die "--prefix needs a folder"; PREFIX=$2; shift 2 ;;
        --root) [ $# -ge 2 ] || die "--root needs a folder"; ROOT=$2; shift 2 ;;
        --no-start) START=no; shift ;;
        -h|--help) usage 0 ;;
        *) echo "install-listener: unknown option $1" >&2; usage 2 ;;
    esac
done
case "$PREFIX" in /*) ;; *) die "--prefix must be an absolute path, got $PREFIX" ;; esac
if [ -z "$ROOT" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (or with --root DIR for a staged install)"
fi
SRC=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$SRC/pyproject.toml" ] || die "$SRC is not a medrt checkout"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$PYTHON is older than 3.10 (PYTHON=python3.11 $0 ... picks another)"

echo "install-listener: medrt from $SRC into $ROOT$PREFIX/venv"
install -d -m 0755 "$ROOT$PREFIX"
"$PYTHON" -m venv "$ROOT$PREFIX/venv"
"$ROOT$PREFIX/venv/bin/python" -m pip install --quiet --upgrade pip
# Built from a copy: pip builds a local folder in place (setuptools' build/ and
# medrt.egg-info, root's), which would leave root-owned files in the checkout, or fail
# on a read-only one.
BUILD=$(mktemp -d "${TMPDIR:-/tmp}/medrt-install.XXXXXX")
trap 'rm -rf "$BUILD"' EXIT
tar -C "$SRC" --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./dist \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=./.pytest_cache --exclude=./.hypothesis \
    -cf - . | tar -C "$BUILD" -xf -
"$ROOT$PREFIX/venv/bin/python" -m pip install --quiet "$BUILD"
"$ROOT$PREFIX/venv/bin/medrt" --version

install -d -m 0755 "$ROOT/etc/medrt" "$ROOT/etc/systemd/system"
# 0600, root's: it may hold DICOMweb credentials (systemd reads it before dropping to medrt).
if [ -e "$ROOT/etc/medrt/listen.env" ]; then
    echo "install-listener: keeping $ROOT/etc/medrt/listen.env (the new default is $ROOT/etc/medrt/listen.env.new)"
    install -m 0600 "$SRC/installer/listen.env" "$ROOT/etc/medrt/listen.env.new"
    chmod go-rwx "$ROOT/etc/medrt/listen.env"
else
    install -m 0600 "$SRC/installer/listen.env" "$ROOT/etc/medrt/listen.env"
fi
sed "s|@PREFIX@|$PREFIX|g" "$SRC/installer/medrt-listen.service" > "$ROOT/etc/systemd/system/medrt-listen.service"
chmod 0644 "$ROOT/etc/systemd/system/medrt-listen.service"

if [ -n "$ROOT" ]; then
    install -d -m 0750 "$ROOT/var/lib/medrt"
    echo "install-listener: staged under $ROOT (no user made, systemd not told)"
    exit 0
fi
if ! id medrt >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/medrt --no-create-home --shell /usr/sbin/nologin \
        --comment "medrt PACS listener" medrt
fi
command -v systemctl >/dev/null 2>&1 || die "no systemctl: start it by hand as user medrt: $(
    sed -n 's/^ExecStart=//p' /etc/systemd/system/medrt-listen.service)"
systemctl daemon-reload
if [ "$START" = yes ]; then
    systemctl enable --now medrt-listen.service
    systemctl --no-pager status medrt-listen.service || true
else
    systemctl enable medrt-listen.service
fi
echo "install-listener: done. Options: /etc/medrt/listen.env, then: systemctl restart medrt-listen"
echo "install-listener: log: journalctl -u medrt-listen; queue: sudo -u medrt $PREFIX/venv/bin/medrt spool /var/lib/medrt/spool"
