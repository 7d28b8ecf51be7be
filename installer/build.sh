#!/bin/sh
# Build dist/medrt/ (installer/medrt.spec): `medrt` and `medrt-viewer` with everything they
# need, to copy to a machine without Python. Run from a checkout whose environment has medrt
# with the gui extra and PyInstaller (make .venv/.medrt-dev has both):
#
#   installer/build.sh                 # uses .venv
#   PYTHON=/path/to/python installer/build.sh
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -m PyInstaller --version >/dev/null 2>&1 || {
    echo "build: no PyInstaller in $PYTHON's environment (pip install pyinstaller, or make .venv/.medrt-dev)" >&2
    exit 1
}
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "${DISTPATH:-dist}" --workpath "${WORKPATH:-build/pyinstaller}" installer/medrt.spec
echo "build: $(du -sh "${DISTPATH:-dist}/medrt" | cut -f1) in ${DISTPATH:-dist}/medrt/ (medrt, medrt-viewer)"
