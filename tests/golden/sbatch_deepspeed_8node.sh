#!/bin/bash
# nuro run llm-z3: rendered by nuro.render from a checked job spec; do not edit, re-render instead.
#SBATCH --job-name=llm-z3
#SBATCH --account=perception
#SBATCH --qos=g-perception
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=2-00:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR2@600
#SBATCH --open-mode=append
#SBATCH --output=/shared/runs/alice/llm-z3/slurm-%j.out
# The run record (team, dataset digest, commit, ...) is the job comment, given on sbatch's command line.
set -uo pipefail

# 1. run metadata for the training processes and the SDK
export NURO_RUN_NAME=llm-z3
export NURO_TEAM=perception
export NURO_DATASET=imagenet
export NURO_DATASET_DIGEST=sha256:3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f
export NURO_CODE_REPO=/shared/alice/vision
export NURO_CODE_COMMIT=9c1e2d4b5a6978812233445566778899aabbccdd
export NURO_CODE_PIN=9c1e2d4b5a6978812233445566778899aabbccdd
export NURO_JOB_DIR=/shared/runs/alice/llm-z3/"$SLURM_JOB_ID"
export NURO_CODE_DIR="$NURO_JOB_DIR/code"
export NURO_CKPT_INTERVAL_S=1800
export NURO_CKPT_KEEP=3
# the node agent uploads the checkpoints (this job's record names its team and run): the job ends once its
# last save is on local disk and its epilog hands the upload over (NURO_UPLOAD=inline at submit: job uploads)
export NURO_UPLOAD="${NURO_UPLOAD:-agent}"
# the node-local staging dir the prolog created for this job (checkpoints are written here, then uploaded)
case "${NURO_STAGING_ROOT:-}" in *"{node}"*) ;; *)
  export NURO_STAGING_DIR="${NURO_STAGING_DIR:-${NURO_STAGING_ROOT:-/var/tmp/nuro-staging}/$SLURM_JOB_ID}" ;;
esac
export NURO_MAX_REQUEUES=3
export NURO_PREEMPT_SIGNAL=USR1
export NURO_DEEPSPEED_CONFIG=llm/ds_z3.json
export NURO_STOP_SIGNAL=USR2
export NURO_EXIT_REQUEUE=75
nuro_fail() { echo "nuro: $*" >&2; exit 1; }
nuro_git() { env -u GIT_DIR -u GIT_WORK_TREE -u GIT_INDEX_FILE -u GIT_OBJECT_DIRECTORY \
  -u GIT_ALTERNATE_OBJECT_DIRECTORIES -u GIT_NAMESPACE -u GIT_CONFIG_PARAMETERS -u GIT_CONFIG_COUNT git "$@"; }
# done, requeue within the budget (T6: decided here, so it works with the controller down), or fail
nuro_finish() {
  if [ "$1" -eq 0 ]; then echo "nuro: run finished"; exit 0; fi
  if [ "$1" -ne "$NURO_EXIT_REQUEUE" ] && [ -z "$NURO_STOP_REASON" ]; then
    echo "nuro: training exited with status $1: a failure, not a stop; not requeued" >&2
    exit "$1"
  fi
  nuro_restarts=${SLURM_RESTART_COUNT:-0}
  nuro_reason=${NURO_STOP_REASON:-exit $1}
  if [ "$nuro_restarts" -ge "$NURO_MAX_REQUEUES" ]; then
    echo "nuro: requeue budget spent ($nuro_restarts of $NURO_MAX_REQUEUES); stopping ($nuro_reason)" >&2
    exit "$NURO_EXIT_REQUEUE"
  fi
  echo "nuro: requeue $((nuro_restarts + 1)) of $NURO_MAX_REQUEUES ($nuro_reason)"
  timeout 60 scontrol requeue "$SLURM_JOB_ID" || nuro_fail "scontrol requeue failed"
  exit "$NURO_EXIT_REQUEUE"
}

# 2. stop signals, trapped from the start: USR1 = preemption (the controller signals the steps itself), USR2 = time limit near (forwarded to the step once)
NURO_STOP_REASON=
NURO_STEP_PID=
trap 'NURO_STOP_REASON=preempted' USR1
trap 'NURO_STOP_REASON=time_limit; [ -z "$NURO_STEP_PID" ] || kill -USR2 "$NURO_STEP_PID"' USR2

# 3. code: exactly 9c1e2d4b5a6978812233445566778899aabbccdd (git archive; read-only on the repository)
mkdir -p "$NURO_JOB_DIR" || nuro_fail "cannot create the job directory $NURO_JOB_DIR"
if [ "$(cat "$NURO_JOB_DIR/code.pin" 2>/dev/null)" != "$NURO_CODE_PIN" ]; then
  nuro_tmp="$NURO_JOB_DIR/.code.tmp"
  rm -rf "$nuro_tmp" "$nuro_tmp.tar" "$nuro_tmp.patch" && mkdir -p "$nuro_tmp" || nuro_fail "cannot prepare $nuro_tmp"
  nuro_git -C "$NURO_CODE_REPO" archive --format=tar -o "$nuro_tmp.tar" "$NURO_CODE_COMMIT" \
    || nuro_fail "git archive of commit $NURO_CODE_COMMIT from $NURO_CODE_REPO failed (was it garbage-collected?)"
  nuro_got=$(cd / && nuro_git get-tar-commit-id < "$nuro_tmp.tar")
  [ "$nuro_got" = "$NURO_CODE_COMMIT" ] || nuro_fail "the archive holds commit '$nuro_got', not $NURO_CODE_COMMIT"
  tar -x -f "$nuro_tmp.tar" -C "$nuro_tmp" || nuro_fail "unpacking commit $NURO_CODE_COMMIT failed"
  rm -f "$nuro_tmp.tar"
  rm -rf "$NURO_CODE_DIR" && mv "$nuro_tmp" "$NURO_CODE_DIR" || nuro_fail "cannot move the checkout into place"
  printf '%s\n' "$NURO_CODE_PIN" > "$NURO_JOB_DIR/code.pin"
  echo "nuro: checked out commit $nuro_got (id verified from the archive) into $NURO_CODE_DIR"
else
  echo "nuro: reusing the checkout of $NURO_CODE_PIN in $NURO_CODE_DIR (requeued job)"
fi
[ -z "$NURO_STOP_REASON" ] || nuro_finish "$NURO_EXIT_REQUEUE"  # stopped before the launch

# 4. launch: nuro-launch per node (srun) starts the workers, rendezvous on the first node of the allocation;
#    nuro-launch --step folds the nodes' verdicts: 0 done, 75 restart me, else the training's failure
NURO_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
NURO_RDZV_ADDR=$(scontrol show node -o "$NURO_RDZV_HOST" | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
: "${NURO_RDZV_ADDR:=$NURO_RDZV_HOST}"
NURO_RDZV_PORT=$((${NURO_RDZV_PORT_BASE:-29500} + SLURM_JOB_ID % ${NURO_RDZV_PORT_SPAN:-1000}))
export NURO_RDZV_ADDR NURO_RDZV_PORT NURO_LAUNCH_DIR="$NURO_JOB_DIR/launch"
cd "$NURO_CODE_DIR" || nuro_fail "cannot enter $NURO_CODE_DIR"
python3 -m nuro.wrappers.launch --step -- \
  srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
  python3 -m nuro.wrappers.launch --launcher=direct --nproc-per-node=8 -- \
    llm/pretrain.py --deepspeed --deepspeed_config llm/ds_z3.json &
NURO_STEP_PID=$!

# 5. wait (a trapped signal interrupts wait: keep waiting while the step runs), then finish
while :; do
  nuro_rc=0; wait "$NURO_STEP_PID" || nuro_rc=$?
  if [ "$nuro_rc" -gt 128 ] && kill -0 "$NURO_STEP_PID" 2>/dev/null; then continue; fi
  break
done
nuro_finish "$nuro_rc"
