#!/usr/bin/env bash
# The one prepared GPU check (issue 57 item 6): at most 8 minutes on one H100 / H200, one JSON at the end.
#
#   bash bench/gpu_kit.sh OUT            # on a machine with one CUDA GPU; writes OUT/gpu_kit.json
#   GPU_KIT_SMOKE=1 bash bench/gpu_kit.sh OUT   # the same steps on CPU at cpu-tiny (the test suite runs this)
#
# 1. throughput: gpu-125m at dP 0 / 64 / 256 under bf16 autocast + torch.compile — tokens/s, MFU against the
#    device's dense bf16 peak, peak memory, each dP's step time over dP 0 — then the table kept on the host
#    (train.table_device=cpu, row-sparse) against the on-device table, and eval's memory-mapped table against the
#    in-memory one (bench/gpu_throughput.py);
# 2. FSDP2 on one GPU through torchrun (NCCL): 20 steps straight, and 10 steps + a resume from the sharded
#    checkpoint to 20; the two loss curves and whether they are equal;
# 3. a short verdict rung above the calibrated range (gpu-125m: H = 768): dP 64 trained on the real ids at two seeds
#    and on i.i.d. ids (the null control), 200 steps each, and `plelab diagnose` of the real run with its second
#    seed and the null — what the verdict says at a width the CPU benchmark never reached (outside its range).
# Each step has its own time limit; a step that fails or runs out of time is recorded as such and the kit goes on.
set -uo pipefail

OUT=${1:?usage: bash bench/gpu_kit.sh OUT}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
if [ "${GPU_KIT_SMOKE:-0}" = 1 ]; then
  PRESET=cpu-tiny; DEVICE=cpu; RUNG_STEPS=16; FSDP_STEPS=4
  THROUGHPUT=(--device cpu --preset cpu-tiny --no-compile --steps 6 --warmup 2)
  LIMITS=(600 300 600)
else
  PRESET=gpu-125m; DEVICE=cuda; RUNG_STEPS=200; FSDP_STEPS=20
  THROUGHPUT=(--preset gpu-125m --dp 0,64,256 --steps 60 --warmup 20)
  LIMITS=(210 110 150)
fi
export OUT PY PRESET DEVICE RUNG_STEPS FSDP_STEPS
record() { # step name, exit code -> OUT/status-NAME.txt
  case "$2" in 0) echo ok ;; 124) echo "timed out" ;; *) echo "failed (exit $2)" ;; esac > "$OUT/status-$1.txt"
}
# each step runs under timeout, which stops the step's whole process group (torchrun's workers included)
fsdp() {
  set -e
  local common=(--preset "$PRESET" --no-progress --set "train.device=$DEVICE" --set train.diag_every=0)
  local half=$((FSDP_STEPS / 2))
  local fsdp=(--dp 64 --set train.parallel=fsdp --set "train.checkpoint_every=$half" --set "train.eval_every=$half")
  local run=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m plelab train "${common[@]}" "${fsdp[@]}")
  "${run[@]}" --steps "$FSDP_STEPS" --out "$OUT/fsdp-whole"
  "${run[@]}" --steps "$half" --out "$OUT/fsdp-part"
  "${run[@]}" --steps "$FSDP_STEPS" --out "$OUT/fsdp-part" --resume
}
rung() {
  set -e
  local common=(--preset "$PRESET" --no-progress --set "train.device=$DEVICE" --set train.diag_every=0 --dp 64
                --steps "$RUNG_STEPS" --set "train.checkpoint_every=$RUNG_STEPS"
                --set "train.eval_every=$((RUNG_STEPS / 4))")
  "$PY" -m plelab train "${common[@]}" --seed 0 --out "$OUT/rung-real"
  "$PY" -m plelab train "${common[@]}" --seed 1 --out "$OUT/rung-real-seed1"
  "$PY" -m plelab train "${common[@]}" --seed 0 --set ple.ids=iid --out "$OUT/rung-iid"
  "$PY" -m plelab diagnose "$OUT/rung-real" --reference "$OUT/rung-real-seed1" --null "$OUT/rung-iid" --json \
    --no-progress > "$OUT/rung-real.json"
}
export -f fsdp rung

echo "== 1/3 throughput"
timeout "${LIMITS[0]}" "$PY" "$HERE/gpu_throughput.py" "${THROUGHPUT[@]}" --json "$OUT/throughput.json" \
  > "$OUT/throughput.log" 2>&1
record throughput $?
echo "== 2/3 FSDP2 + sharded-checkpoint resume"
timeout "${LIMITS[1]}" bash -c fsdp > "$OUT/fsdp.log" 2>&1
record fsdp $?
echo "== 3/3 verdict rung at $PRESET"
timeout "${LIMITS[2]}" bash -c rung > "$OUT/rung.log" 2>&1
record rung $?

"$PY" "$HERE/gpu_kit_report.py" "$OUT"
