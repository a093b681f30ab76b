#!/usr/bin/env bash
# Resumes a long sweep that runs inside this repository, in the background, as one command:
# a worktree of the current commit (WORK/code; GRID_CODE below) runs `bench run` twice, at
# nice 19 (first with FIRST_PASS, e.g. a table's first seeds, then the whole sweep), and
# scripts/commit_sweep_jobs.sh commits each finished job every 10 minutes. Finished jobs under
# the sweep's root are kept: `bench run` goes on from them.
#
# GRID_CODE (an environment variable, default HEAD) is the commit whose code the grid runs:
# pin it to the commit the finished jobs ran once the package has changed on the branch
# since, so that they stay current (`bench status` from that commit; the report is then
# written from WORK/code too, `cd WORK/code && python -m fedjax_dg.bench report --sweep SWEEP
# --sweep.root=ROOT`). SWEEP is read from that commit's tree as well: a sweep file added or
# edited after it is not seen.
#
#   scripts/resume_grid.sh configs/sweeps/report_fmnist3.py experiments/report_fmnist3/runs \
#       /work/grid "--sweep.grids.table.seeds=(1,2,3,4,5,6,7,8,9,10)"
#
# It refuses (exit 1, one line) when a `bench run` of the same sweep is already running, when
# WORK/code exists and is not a worktree of this repository, or when `bench status`, run from
# that worktree's code, fails or lists a stale job: a file in a job's scope differs from the
# code that job ran (the grid's numbers would mix code versions; check out that code, or rerun
# those jobs). Logs: WORK/run.log (the grid), WORK/commit.log (the commits). Stop: kill the
# process group whose id is in WORK/grid.pgid (`kill -- -$(cat WORK/grid.pgid)`).
set -uo pipefail
if [[ $# -lt 3 || $# -gt 4 ]]; then
  echo "usage: $0 SWEEP ROOT WORK [FIRST_PASS_OVERRIDE]" >&2
  exit 2
fi
SWEEP=$1
FIRST=${4:-}
WORK=$(realpath -m -- "$3") || exit 1
REPO=$(git rev-parse --show-toplevel) || exit 1
cd "$REPO" || exit 1
ROOT=$(realpath -m -- "$2") || exit 1
PY=${PYTHON:-$REPO/.venv/bin/python}
if [[ ! -x $PY ]]; then
  echo "error: $PY: no Python (run \`make install\`, or set PYTHON)" >&2
  exit 1
fi
CODE_COMMIT=$(git rev-parse --verify -q --end-of-options "${GRID_CODE:-HEAD}^{commit}") || {
  echo "error: GRID_CODE=${GRID_CODE:-}: not a commit of $REPO" >&2
  exit 1
}
if pgrep -f -- "fedjax_dg.bench run --sweep $SWEEP " > /dev/null; then
  echo "error: a \`bench run --sweep $SWEEP\` is already running (pgrep -af 'bench run')" >&2
  exit 1
fi
if [[ -e $WORK/code ]]; then
  if ! git worktree list --porcelain | grep -qxF "worktree $WORK/code"; then
    echo "error: $WORK/code exists and is not a worktree of $REPO; move it away" >&2
    exit 1
  fi
  git -C "$WORK/code" checkout -q --detach "$CODE_COMMIT" || exit 1
else
  mkdir -p "$WORK" && git worktree add -q --detach "$WORK/code" "$CODE_COMMIT" || exit 1
fi
# The stale check runs the code the grid will run.
status=$(cd "$WORK/code" && PYTHONPATH=$WORK/code "$PY" -m fedjax_dg.bench status --sweep "$SWEEP" \
         "--sweep.root=$ROOT" 2>&1)
if [[ $? != 0 ]]; then
  echo "error: $SWEEP: \`bench status\` failed: $(tail -n 1 <<< "$status")" >&2
  exit 1
fi
stale=$(grep -c '^stale' <<< "$status")
if [[ $stale != 0 ]]; then
  echo "error: $SWEEP: $stale stale job(s) under $ROOT (\`bench status\` lists them); not resuming" >&2
  exit 1
fi
run="$(printf '%q' "$PY") -m fedjax_dg.bench run --sweep $(printf '%q' "$SWEEP") $(printf '%q' "--sweep.root=$ROOT")"
run+=" --workers=${WORKERS:-2}"
cmd="$run"
[[ -n $FIRST ]] && cmd="$run $(printf '%q' "$FIRST") && $run"
[[ -f $WORK/run.log ]] && mv "$WORK/run.log" "$WORK/run.$(date +%s).log"
# In its own session (setsid), the grid puts that session's autogroup at the lowest weight,
# so work in other sessions goes first, and records its process group (its own pid).
rm -f "$WORK/grid.pgid"
cmd="echo 19 > /proc/self/autogroup 2> /dev/null; echo \$\$ > $(printf '%q' "$WORK/grid.pgid"); $cmd"
(cd "$WORK/code" && PYTHONPATH=$WORK/code setsid nohup nice -n 19 bash -c "$cmd" > "$WORK/run.log" 2>&1 &)
for _ in $(seq 50); do [[ -s $WORK/grid.pgid ]] && break; sleep 0.1; done
pid=$(cat "$WORK/grid.pgid" 2> /dev/null || echo "?")
if [[ $ROOT != "$REPO"/* ]]; then
  echo "grid: process group $pid, log $WORK/run.log; $ROOT is outside the repository: nothing is committed"
  exit 0
fi
REL=$(realpath --relative-to="$REPO" -- "$ROOT")
if ! pgrep -f -- "commit_sweep_jobs.sh $REL( |$)" > /dev/null; then
  (setsid nohup bash scripts/commit_sweep_jobs.sh "$REL" 600 > "$WORK/commit.log" 2>&1 &)
fi
echo "grid: process group $pid, log $WORK/run.log; commits every 10 minutes, log $WORK/commit.log"
