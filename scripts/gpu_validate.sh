#!/usr/bin/env bash
# The prepared device run, on a GPU machine with a CUDA torch: no venv, no network.
#
#   python3 scripts/gpu_validate.py --plan                           the one device call and its time budget
#   bash scripts/gpu_validate.sh OUT                                 the call's phases, in its order
#   bash scripts/gpu_validate.sh --phases smoke,resume --budget 200 OUT   chosen phases within 200 s
#   DRY=1 bash scripts/gpu_validate.sh OUT                           the same plan on the CPU at tiny (CI)
#
# OUT receives record.json and record.md only; run folders and logs live in a temporary folder.
# The whole run is under `timeout` (the budget + 30 s, else TIMEOUT, default 900 s): SIGTERM at the
# end, SIGKILL 10 s later; a phase dies with its driver either way. PY chooses the interpreter
# (default python3); PIP=1 tries `pip install` of missing packages first; KEEP=1 keeps the
# temporary folder. The phases are in scripts/gpu_validate.py; docs/gpu/README.md has the call.
set -euo pipefail
usage="usage: [DRY=1] bash scripts/gpu_validate.sh [--phases a,b,...] [--budget SECONDS] OUT"
args=() budget="" out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --phases) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }; args+=(--phases "$2"); shift 2 ;;
    --budget) [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }; budget=$2; args+=(--budget "$2"); shift 2 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) [[ -z "$out" ]] || { echo "$usage" >&2; exit 2; }; out=$1; shift ;;
  esac
done
[[ -n "$out" ]] || { echo "$usage" >&2; exit 2; }
total=${TIMEOUT:-900}
if [[ -n "$budget" ]]; then
  [[ "$budget" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "gpu_validate: --budget takes seconds, got $budget" >&2; exit 2; }
  total=$(( ${budget%.*} + 30 ))
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY=${PY:-$(command -v python3 || command -v python)}
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec timeout --kill-after=10 "$total" "$PY" "$here/scripts/gpu_validate.py" "${args[@]}" "$out"
