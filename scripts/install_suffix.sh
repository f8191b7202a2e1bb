#!/usr/bin/env bash
# vLLM's in-tree `suffix` speculative method needs the `arctic-inference` package, which
# PyPI ships only as a source distribution for the versions vLLM 0.32 uses (0.1.x and
# later; the wheels there are 0.0.x). This builds its one native part, the suffix-tree
# extension (C++, nanobind; no CUDA), in a throw-away build venv and installs the
# package into .cache/suffix/site, outside the project venv: arctic-inference also
# registers a vLLM general plugin, which must never load into the plugin's own engines
# or tests. The serving benchmark puts that folder on PYTHONPATH for the `suffix`
# server only (with VLLM_PLUGINS="" as for every in-tree method, so the Arctic plugin
# stays unloaded there too).
#
# Needs cmake's inputs from PyPI (cmake, ninja, nanobind), gcc with C++20, and the
# torch 2.13.0 file the machine has on disk (setup.py imports torch). ~3 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${ARCTIC_INFERENCE_VERSION:-0.3.0}
dest=.cache/suffix
if [ -f "$dest/site/.installed-$VERSION" ]; then
  echo "[suffix] arctic-inference $VERSION already in $dest/site"; exit 0
fi
PY=${PYTHON:-python3}
rm -rf "$dest/build-venv" "$dest/site" "$dest/dist"
"$PY" -m venv "$dest/build-venv"
pip() { "$dest/build-venv/bin/pip" -q --disable-pip-version-check "$@" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
pip install torch==2.13.0 "nanobind==2.9.2" ninja cmake setuptools wheel grpcio-tools numpy
# No build isolation: isolation would fetch a CUDA torch (several GB) to satisfy
# arctic-inference's build requirement on torch.
# CMake's own Python lookup would find the base interpreter, which lacks nanobind.
CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/$dest/build-venv/bin/python" \
  pip wheel --no-deps --no-build-isolation -w "$dest/dist" "arctic-inference==$VERSION"
"$dest/build-venv/bin/pip" install -q --disable-pip-version-check --no-deps \
  --target "$dest/site" "$dest"/dist/arctic_inference-*.whl
PYTHONPATH="$dest/site" .venv/bin/python -c \
  "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(8, 10)"
rm -rf "$dest/build-venv"
touch "$dest/site/.installed-$VERSION"
echo "[suffix] arctic-inference $VERSION installed in $dest/site"
