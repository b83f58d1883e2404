#!/usr/bin/env bash
# Everything that needs a CUDA GPU, from the repository root, without network:
#   check     python -m ropetut check (every kernel against the float64 reference)
#   chapters  execute every chapter in place, storing its outputs
#   nbval     strict pytest --nbval over the executed chapters
#   tests     the whole test suite, GPU tests included; its summary line, with the commit
#             ($ROPETUT_COMMIT in a copy without .git), torch and triton, goes to
#             results/gpu_tests_h100.txt (one line per GPU and Triton version; to $OUT)
#   bench     python -m ropetut bench --quick -> results/bench_h100.json, then
#             scripts/draw_headline.py draws book/_static/headline.png from that JSON
#   probe     scripts/probe_tiles.py -> results/probe_h100.txt (tile sizes and warps against Liger)
#   env       results/ENVIRONMENT.md: where those outputs came from
#   fresh     scripts/check_fresh_outputs.py: no chapter's sources changed after the run that
#             made its stored outputs (needs the git history; it fails, not passes, without it)
# and four that run only when asked for in STEPS:
#   host      scripts/host_before_after.py $BASELINE: host time per call, an older ropetut/ in
#             $BASELINE against this one, taking turns (git archive <ref> ropetut | tar -x -C DIR)
#   triton371 the test suite again under Triton 3.7.1 (requirements.txt's pin), staged into
#             /tmp/triton371 by scripts/triton-install.sh (four calls, see there). The machine's
#             torch 2.11 is built for Triton 3.6, so torch.compile tests may fail there for
#             reasons outside ropetut: compare with the tests step's counts.
#   study     issue 27's training runs (results/training_h100/STUDY_PLAN.md): STUDIES (e.g.
#             "budget", or with a study's own seeds "seed_regime:0,1,2 budget:4") and SEEDS
#             (default "0 1 2 3 4") trained into /tmp/study beside the committed
#             results/training_h100/study/*.json, which the runner skips, for at most
#             STUDY_SECONDS (default 520); on every GPU at once (GPUS: how many, default
#             all; RUNNERS_PER_GPU runners on each, default 1), the (study, seed) pairs
#             dealt to the runners in turn, the runners' logs in
#             $OUT/study-gpus.log; every run there, old and new, comes back as
#             $OUT/study.tgz: unpack it as results/training_h100/STUDY_PLAN.md says (into
#             study/ only with chapter 09 re-executed), then run scripts/study_verdicts.py.
#             A study stopped by the time (the runner says how many runs are left) is
#             simply called again
#   hf        scripts/hf_step_time.py -> results/hf_dropin_<h100|h200>.json (to $OUT): the
#             Hugging Face drop-in against unpatched transformers and Liger on 8B-like stacks;
#             installs .hf-wheels/ (scripts/hf-wheels.sh: transformers) into /tmp/site first,
#             so carry ".whl .hf-wheels", e.g. STEPS=hf bash scripts/gpu-validate.sh; HF_ARGS
#             passes options (--layers 4, --repeats 3, ...)
# STEPS picks some of them, e.g. STEPS="check bench" bash scripts/gpu-validate.sh; CHAPTERS
# (paths) limits the chapters and nbval steps to those notebooks. With OUT set, the chapters
# step leaves $OUT/chapters.tgz (notebooks, results/ledger, results/training_h100). A later
# call carries the working tree again and overwrites what the machine had: unpack the archive
# here before the next call, or the next call's ledger files are this tree's older ones.
# Wheels in .whl/ (scripts/device-wheels.sh: Liger, nbformat, nbval, ipykernel, ...) are
# installed into /tmp/site first; carry ".whl" (with a Triton part it is over the 64 MiB a call
# carries: then export PYTHONPATH=/tmp/site on the still-warm machine instead). CuTeDSL, for
# impl="cute" and the appendix, is optional: on a machine without network, stage it into /tmp/site
# first with scripts/cute-install.sh (three calls, see there); without it, its tests and cells skip.
# With OUT set, the log is also written to $OUT/gpu-validate.log.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-check chapters nbval tests bench probe env fresh}"
if [[ -n "${OUT:-}" ]]; then
  exec > >(tee -a "$OUT/gpu-validate.log") 2>&1
fi

export PYTHONPATH="${PYTHONPATH:-}"
if [[ -d .whl ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
if [[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ]]; then   # pip --target skips CuTeDSL's .pth
  PYTHONPATH="/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH"
fi
PYTHONPATH="$PWD:$PYTHONPATH"

# Stored outputs and the suite's record name the commit that ran (ropetut.book.provenance).
# The device tool copies the working tree beside the .git of the session's start, so there
# git's HEAD can be an older commit than the tree: name the tree's commit in ROPETUT_COMMIT.
if [[ -z "${ROPETUT_COMMIT:-}" && " $STEPS " =~ \ (chapters|tests|study)\  ]] \
   && [[ -n "$(git status --porcelain -- ropetut chapters tests 2>/dev/null)" ]]; then
  echo "gpu-validate: ropetut/, chapters/ or tests/ differ from git's HEAD" \
       "($(git rev-parse --short=10 HEAD 2>/dev/null || echo none)): set ROPETUT_COMMIT to" \
       "the commit this tree is (add +dirty for uncommitted changes)" >&2
  exit 2
fi

echo "== environment"
nvidia-smi -L
python3 -c 'import platform, torch, triton, ropetut.bench as b, ropetut.kernels as kernels
print("python", platform.python_version(), "| torch", torch.__version__, "| triton", triton.__version__,
      "| liger", b.liger_version(), "| cuda available", torch.cuda.is_available(),
      "| cute", kernels.unavailable("cute") or "available")'

failed=()
step() {  # step NAME COMMAND...: run it if NAME is in STEPS, then print one summary line
  local name=$1; shift
  [[ " $STEPS " == *" $name "* ]] || return 0
  python3 -c 'import triton; print("   (triton", triton.__version__ + ")")'
  echo "== $name: $*"
  local start=$SECONDS
  if "$@"; then
    echo "-- $name: ok ($((SECONDS - start)) s)"
  else
    echo "-- $name: FAILED ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
}

read -r -a chapters <<< "${CHAPTERS:-chapters/}"
nbval_opts=(-q --nbval -p no:cacheprovider --nbval-cell-timeout 120)
if [[ -f chapters/nbval_sanitize.cfg ]]; then
  nbval_opts+=(--nbval-sanitize-with chapters/nbval_sanitize.cfg)
fi

write_environment() {
  python3 - <<'EOF'
import datetime, platform, subprocess
from pathlib import Path
import torch, triton
from ropetut.bench import liger_version
from ropetut.book.provenance import commit

driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.split("\n")[0] or "unknown"
facts = {"GPU": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
         "triton": triton.__version__, "liger-kernel": liger_version() or "not installed",
         "python": platform.python_version(), "ropetut commit": commit(),
         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
lines = ["| what | value |", "| --- | --- |"]   # included under a heading of the book
lines += [f"| {key} | {value} |" for key, value in facts.items()]
Path("results").mkdir(exist_ok=True)
Path("results/ENVIRONMENT.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
}

step check python3 -m ropetut check
# shellcheck disable=SC2086
step chapters python3 scripts/execute_chapters.py ${CHAPTERS:-}
# the device tool brings back at most 8 files from $OUT: the executed notebooks, their
# verdicts and training runs come back as one archive (tar -xzf chapters.tgz at the root)
if [[ -n "${OUT:-}" && " $STEPS " == *" chapters "* ]]; then
  tar -czf "$OUT/chapters.tgz" chapters/*.ipynb results/ledger results/training_h100
fi
# nbval re-executes the chapters: their verdicts go to a scratch folder, so the ledger page is
# compared with the verdicts of the run that stored the outputs, not with this re-run's timings
# NBVAL_JOBS=N: N pytest processes, each over every Nth notebook. Outputs checked by nbval
# never hold timings (those cells are tagged nbval-ignore-output), so sharing the GPU is safe.
nbval_parallel() {
  local jobs=${NBVAL_JOBS:-1} notebooks pids=() status=0 i
  mapfile -t notebooks < <(find "${chapters[@]}" -name '*.ipynb' | sort)
  for ((i = 0; i < jobs; i++)); do
    local mine=()
    for ((n = i; n < ${#notebooks[@]}; n += jobs)); do mine+=("${notebooks[n]}"); done
    (( ${#mine[@]} )) || continue
    python3 -m pytest "${nbval_opts[@]}" "${mine[@]}" > "/tmp/nbval.$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[i]}" || status=1; tail -3 "/tmp/nbval.$i.log"; done
  [[ -z "${OUT:-}" ]] || cat /tmp/nbval.*.log > "$OUT/nbval.log"
  return $status
}
ROPETUT_LEDGER_DIR="$(mktemp -d)" step nbval nbval_parallel
# suite: the whole test suite, every module collected (-rs lists each skip's reason), then
# its summary line into results/gpu_tests_h100.txt, replacing the line of the same GPU and Triton version
suite() {
  local log versions status=0
  log=$(mktemp)
  # shellcheck disable=SC2086  # JOBS=N: N pytest-xdist workers sharing the GPU
  python3 -m pytest -q -rfEs --durations=20 -p no:cacheprovider ${JOBS:+-n $JOBS} tests/ 2>&1 \
    | tee "$log" || status=1
  versions=$(python3 -c 'import torch, triton
from ropetut.book.provenance import commit
print(f"commit {commit()} | {torch.cuda.get_device_name()} | torch {torch.__version__}"
      f" | triton {triton.__version__}")')
  local summary
  summary=$(tail -n 1 "$log" | tr -d '=' | xargs)
  if ! [[ "$summary" =~ (passed|failed|error) ]]; then   # pytest died: keep the last record
    echo "no pytest summary line (the run was cut short): $summary"
    return 1
  fi
  local line="$versions | $(date -u +%Y-%m-%d) | $summary"
  local record=results/gpu_tests_h100.txt
  mkdir -p results && touch "$record"
  local triton_field=${versions##*| } gpu_field
  gpu_field=$(cut -d'|' -f2 <<< "$versions" | xargs)
  {   # comments, then this run (the latest first), then other GPUs' and versions' lines
    grep '^#' "$record" || true
    echo "$line"
    grep -v '^#' "$record" | awk -F' [|] ' -v gpu="$gpu_field" -v tri="$triton_field" \
      '!($2 == gpu && $4 == tri)' || true
  } > "$record.new"
  mv "$record.new" "$record"
  [[ -z "${OUT:-}" ]] || cp "$record" "$OUT/"
  echo "$line"
  return $status
}
step tests suite
study() {
  local end=$(($(date +%s) + ${STUDY_SECONDS:-520})) count gpus entry name seeds seed i
  local n=0 status=0 pids=() jobs=() visible=() packer log
  if [[ -z "${STUDIES:-}" ]]; then
    echo "study: set STUDIES, e.g. STUDIES=budget" >&2
    return 1
  fi
  mkdir -p /tmp/study /tmp/study-logs
  cp -n results/training_h100/study/*.json /tmp/study/ 2>/dev/null || true
  # runs kept out of the chapter's folder until chapter 09 is re-executed (results/pending)
  cp -n results/pending/training_h100_study/*.json /tmp/study/ 2>/dev/null || true
  count=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  gpus=${GPUS:-$count}
  if (( gpus < 1 || gpus > count )); then
    echo "study: GPUS=$gpus, but this machine has $count GPU(s)" >&2
    return 1
  fi
  # the GPUs as the machine numbers them, where CUDA_VISIBLE_DEVICES already picks some
  IFS=, read -r -a visible <<< "${CUDA_VISIBLE_DEVICES:-}"
  # (study, seed) pairs dealt to the runners in turn, RUNNERS_PER_GPU (default 1) a GPU,
  # runner r on GPU r mod gpus: each seed's runs in one runner, so a paired comparison
  # (by seed) compares no two GPUs within a call. Two runners on one GPU share it: their
  # time per step is each other's company too (the chapter says so where it compares it)
  local runners=$((gpus * ${RUNNERS_PER_GPU:-1})) gpu
  for entry in $STUDIES; do
    name=${entry%%:*} seeds=${SEEDS:-0 1 2 3 4}
    [[ $entry != *:* ]] || seeds=${entry#*:}
    for seed in ${seeds//,/ }; do
      jobs[n % runners]+="$name:$seed "
      n=$((n + 1))
    done
  done
  for ((i = 0; i < runners; i++)); do
    [[ -n "${jobs[i]:-}" ]] || continue
    gpu=$((i % gpus))
    echo "study: runner $i on GPU $gpu: ${jobs[i]}"
    # shellcheck disable=SC2086
    study_on_gpu "${visible[gpu]:-$gpu}" "$end" ${jobs[i]} \
      > "/tmp/study-logs/runner$i.log" 2>&1 &
    pids+=($!)
  done
  # the archive and the logs refreshed while they train: a call cut short still returns
  # what finished
  (while sleep 20; do pack_study; done) > /dev/null 2>&1 &
  packer=$!
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || status=1
  done
  kill "$packer"
  wait "$packer" 2>/dev/null || true
  pack_study
  for log in /tmp/study-logs/runner*.log; do
    echo "-- $log" && tail -n 12 "$log"
  done
  return $status
}
pack_study() {  # /tmp/study's runs, old and new, as $OUT/study.tgz; the logs as one file
  [[ -n "${OUT:-}" ]] || return 0
  (
    flock 9
    tail -n +1 /tmp/study-logs/runner*.log > "$OUT/study-gpus.log" 2>/dev/null
    cd /tmp/study && tar -czf "$OUT/.study.tgz" -- *.json \
      && mv "$OUT/.study.tgz" "$OUT/study.tgz"
    rm -f "$OUT/.study.tgz"
  ) 9> /tmp/study-pack.lock
}
study_on_gpu() {  # GPU END STUDY:SEED...: one runner a study, with that study's seeds
  local gpu=$1 end=$2 name pair left seeds
  shift 2
  for name in $(printf '%s\n' "${@%%:*}" | awk '!seen[$0]++'); do
    seeds=()
    for pair in "$@"; do
      [[ ${pair%%:*} != "$name" ]] || seeds+=("${pair#*:}")
    done
    left=$((end - $(date +%s)))
    # a runner starts its first run whatever time is left: start a study only with time
    # for the longest run (STUDY_RUN_SECONDS, the seed regime's 3.5 minutes)
    if (( left < ${STUDY_RUN_SECONDS:-210} )); then
      echo "study: no time left for $name on GPU $gpu" >&2
      return 1
    fi
    PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=$gpu python3 -m ropetut train \
      --study "$name" --seeds "${seeds[@]}" \
      --out /tmp/study --max-minutes "$(python3 -c "print($left / 60)")" || return 1
  done
}
step study study
step host python3 scripts/host_before_after.py "${BASELINE:-.baseline}"
hf_dropin() {
  local status=0 json gpu
  gpu=$(python3 -c 'import torch; n = torch.cuda.get_device_name()
print(next((g for g in ("h100", "h200") if g.upper() in n), "gpu"))')
  json=results/hf_dropin_$gpu.json
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .hf-wheels/*.whl || return 1
  mkdir -p results
  # shellcheck disable=SC2086
  PYTHONPATH="/tmp/site:$PYTHONPATH" python3 scripts/hf_step_time.py --json "$json" \
    ${HF_ARGS:-} || status=1
  [[ -z "${OUT:-}" || ! -f "$json" ]] || cp "$json" "$OUT/"
  return $status
}
step hf hf_dropin
PYTHONPATH="/tmp/triton371:$PYTHONPATH" step triton371 suite
step bench bash -c 'python3 -m ropetut bench --quick --json results/bench_h100.json &&
  python3 scripts/draw_headline.py --json results/bench_h100.json --out book/_static/headline.png'
probe() { mkdir -p results && python3 scripts/probe_tiles.py | tee results/probe_h100.txt; }
step probe probe
step env write_environment
step fresh python3 scripts/check_fresh_outputs.py

if (( ${#failed[@]} )); then
  echo "gpu-validate: FAILED: ${failed[*]}"
  exit 1
fi
echo "gpu-validate: all of [$STEPS] ok"
