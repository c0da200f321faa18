#!/usr/bin/env bash
# GPU check of the pipeline engine (not run in CI; under 8 minutes).
#
#   G >= 2 GPUs: a short 2bw vs 1f1b comparison with NCCL, one GPU per stage, on the 135m
#                preset with byte tokens and untied embeddings (about 100M parameters); prints
#                tokens/s per GPU and the bubble fraction of each, and 2bw's speed-up next to
#                the ideal (M+P-1)/M.
#   one GPU:     the cost model at that size instead, from per-stage costs measured on the GPU
#                (`delaylab llm advise`).
#
# Environment: PY (default .venv/bin/python), OUT (default runs/gpu_validate), STAGES (default:
# min(G, 4)), M (8), STEPS (30), BATCH (4), BLOCK (1024), PRESET (135m). DRY=1 runs the same
# steps on CPU with the small preset and gloo, to check the script itself without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu_validate}
M=${M:-8}
STEPS=${STEPS:-30}
BATCH=${BATCH:-4}
BLOCK=${BLOCK:-1024}
PRESET=${PRESET:-135m}
DEVICE=auto
if [[ "${DRY:-0}" == 1 ]]; then
  G=2; PRESET=small; BLOCK=64; BATCH=2; STEPS=6; M=4; DEVICE=cpu
else
  G=$("$PY" -c "import torch; print(torch.cuda.device_count())")
fi
if [[ "$G" -lt 1 ]]; then
  echo "gpu_validate: no CUDA device found (use DRY=1 to check the script on CPU)" >&2
  exit 2
fi
STAGES=${STAGES:-$(( G < 4 ? G : 4 ))}
echo "gpu_validate: $G device(s), preset $PRESET, M=$M, microbatch ${BATCH}x${BLOCK}, $STEPS steps"

if [[ "$G" -ge 2 ]]; then
  rm -rf "$OUT"; mkdir -p "$OUT"
  for sched in 2bw 1f1b; do
    # timeout: a hung NCCL rank must not eat the machine; 3 minutes per schedule at most.
    timeout 180 "$PY" -m delaylab llm pipeline --stages "$STAGES" --schedule "$sched" --preset "$PRESET" \
      --microbatches "$M" --batch-size "$BATCH" --block-size "$BLOCK" --steps "$STEPS" --warmup 3 \
      --optimizer adamw --eval-batches 2 --log-every 10 --ckpt-every 0 --timeout 120 --device "$DEVICE" \
      --out "$OUT/$sched" --json > "$OUT/$sched.json"
  done
  "$PY" - "$OUT" "$STAGES" "$M" <<'EOF'
import json, sys
out, P, M = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {s: json.load(open(f"{out}/{s}.json")) for s in ("2bw", "1f1b")}
for s, r in runs.items():
    bubble = "n/a" if r["bubble"] is None else f"{r['bubble']:.1%}"
    print(f"  {s:<5} backend {r['backend']}: {r['tokens_per_s'] / P:10.0f} tokens/s per GPU, "
          f"{r['seconds_per_batch'] * 1e3:8.1f} ms/batch, bubble {bubble}, val_loss {r['val_loss']:.3f}")
speedup = runs["1f1b"]["seconds_per_batch"] / runs["2bw"]["seconds_per_batch"]
print(f"  2bw over 1f1b: {speedup:.3f} per batch (ideal (M+P-1)/M = {(M + P - 1) / M:.3f})")
EOF
else
  "$PY" -m delaylab llm advise --preset "$PRESET" --stages 4 --microbatches "$M" \
    --batch-size "$BATCH" --block-size "$BLOCK"
fi
