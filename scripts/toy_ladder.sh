#!/usr/bin/env bash
# A CPU-sized scaling ladder for `plelab fit`: 4 trunk widths × 3 token budgets (each budget its own run), the
# baseline and one PLE arm at dP/H = 0.125, 2 seeds each — 48 cpu-tiny-shaped runs, a few minutes on 2 cores.
# Usage: bash scripts/toy_ladder.sh OUT    then: plelab fit OUT
set -euo pipefail
out=${1:?usage: bash scripts/toy_ladder.sh OUT}
for spec in 32:88:4 48:136:6 64:176:8 96:264:12; do
  IFS=: read -r h f dp <<<"$spec"
  for steps in 100 200 400; do
    plelab sweep --preset cpu-tiny --set model.hidden_size="$h" --set model.intermediate_size="$f" \
      --set train.precision=fp32 --set train.eval_every="$steps" --dp 0,"$dp" --seeds 2 --steps "$steps" \
      --jobs 2 --no-report --no-progress --out "$out/H$h-s$steps"
  done
done
