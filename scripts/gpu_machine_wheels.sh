#!/usr/bin/env bash
# Wheels for the lent GPU machine (../.library/device): its Python 3.12 has torch and numpy 2 but no
# emulator, ZeroMQ or Gymnasium, and it cannot reach a package registry. Run here, in the repo root;
# the wheels land in .whl/ (git-ignored through .git/info/exclude) and travel with `carry: [".whl"]`.
#
# The emulator: nes-py 8.2.1 breaks under numpy 2 and nes-py 9 publishes only a cp313 wheel (its sdist
# says requires-python >= 3.13 but builds and runs on 3.12), so nes-py 9.0.1 is built here from its sdist
# for cp312 against the machine's numpy. gym-super-mario-bros 9.1.0 is pure Python.
#
# On the machine, first thing in every command:
#   python3 -m pip install -q --no-index --no-deps --ignore-requires-python --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
PY312="${PY312:-$(PYENV_VERSION=3.12.1 pyenv which python3.12)}"
NUMPY="${NUMPY:-2.5.2}"  # the machine's numpy (KINDS.md); the extension is built against it
mkdir -p .git/info .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude

"$PY312" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
  -d .whl pyzmq==27.3.0 gymnasium==1.4.0 farama-notifications==0.0.6
"$PY312" -m pip download -q --no-deps --only-binary=:all: --python-version 3.13 -d .whl gym-super-mario-bros==9.1.0

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
"$PY312" -m venv "$build/venv"
"$build/venv/bin/pip" install -q "cython>=3" "numpy==$NUMPY" setuptools wheel scikit-build-core cmake ninja
"$build/venv/bin/pip" download -q --no-deps --no-binary nes-py --no-build-isolation --python-version 3.13 \
  -d "$build" nes-py==9.0.1
tar xzf "$build"/nes_py-9.0.1.tar.gz -C "$build"
sed -i 's/requires-python *= *">=3.13"/requires-python = ">=3.12"/' "$build/nes_py-9.0.1/pyproject.toml"
"$build/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w .whl "$build/nes_py-9.0.1"
ls -la .whl
