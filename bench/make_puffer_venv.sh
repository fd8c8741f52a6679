#!/usr/bin/env bash
# Builds a venv with PufferLib 3.0.0 for `python -m shmvec.bench --puffer-python VENV/bin/python`.
#
# PufferLib pins numpy<2 and gymnasium<=0.29.1, so it cannot live beside shmvec's own environment.
# Its sdist's setup.py downloads raylib and Box2D at build time; NO_OCEAN=1 skips them (and the C
# envs, which its multiprocessing vectorization does not need) but then fails on an undefined
# `c_extension_paths`, defined here before the build.  Usage: bench/make_puffer_venv.sh [VENV]
set -euo pipefail
VENV="${1:-$HOME/.venvs/puffer}"
CONSTRAINTS="$(cd "$(dirname "$0")/.." && pwd)/constraints.txt"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q -c "$CONSTRAINTS" "numpy<2" setuptools wheel Cython "gymnasium==0.29.1" "gym==0.23" \
    "pettingzoo<=1.24.1" "shimmy[gym-v21]" psutil torch
# pip download prepares the sdist's metadata (which fails); --no-clean keeps the unpacked source.
TMPDIR="$WORK" "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation --no-clean \
    pufferlib==3.0.0 -d "$WORK/sdist" >/dev/null 2>&1 || true
SRC="$(find "$WORK" -maxdepth 2 -type d -name 'pufferlib_*' | head -1)"
if [ -z "$SRC" ] && [ -f "$WORK/sdist/pufferlib-3.0.0.tar.gz" ]; then
    tar xzf "$WORK/sdist/pufferlib-3.0.0.tar.gz" -C "$WORK" && SRC="$WORK/pufferlib-3.0.0"
fi
[ -n "$SRC" ] || { echo "could not fetch the pufferlib 3.0.0 sdist" >&2; exit 1; }
"$PY" - "$SRC/setup.py" <<'PYEOF'
import sys
path = sys.argv[1]
s = open(path).read()
if "c_extension_paths = []\nif not NO_OCEAN:" not in s:
    s = s.replace("c_extensions = []\nif not NO_OCEAN:", "c_extensions = []\nc_extension_paths = []\nif not NO_OCEAN:", 1)
open(path, "w").write(s)
PYEOF
(cd "$SRC" && NO_OCEAN=1 NO_TRAIN=1 "$PY" -m pip install -q --no-build-isolation --no-deps .)
"$PY" -c "import pufferlib.vector, pufferlib.emulation; print('PufferLib ready:', '$PY')"
