#!/bin/bash
#SBATCH -N 2
#SBATCH --gpus-per-node=8

# my job
# --- nuro-sbatch: run metadata and the pinned code; your script continues unchanged below ---
export NURO_CKPT_INTERVAL_S=600
export NURO_CKPT_KEEP=3
export NURO_DATASET=imagenet
export NURO_DATASET_DIGEST=sha256:3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f
export NURO_MAX_REQUEUES=3
export NURO_PREEMPT_SIGNAL=USR1
export NURO_TEAM=perception
export NURO_CODE_REPO=/shared/alice/vision
export NURO_CODE_COMMIT=9c1e2d4b5a6978812233445566778899aabbccdd
export NURO_CODE_PIN=9c1e2d4b5a6978812233445566778899aabbccdd
export NURO_JOB_DIR=/shared/runs/alice/sbatch/"$SLURM_JOB_ID"
export NURO_CODE_DIR="$NURO_JOB_DIR/code"
nuro_fail() { echo "nuro: $*" >&2; exit 1; }
nuro_git() { env -u GIT_DIR -u GIT_WORK_TREE -u GIT_INDEX_FILE -u GIT_OBJECT_DIRECTORY \
  -u GIT_ALTERNATE_OBJECT_DIRECTORIES -u GIT_NAMESPACE -u GIT_CONFIG_PARAMETERS -u GIT_CONFIG_COUNT git "$@"; }
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
cd "$NURO_CODE_DIR"/src || nuro_fail "cannot enter the checkout (src)"
# --- end of the nuro-sbatch preamble ---
srun python train.py
