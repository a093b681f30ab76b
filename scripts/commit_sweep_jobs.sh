#!/usr/bin/env bash
# Commits the finished jobs of a sweep that runs inside this repository, so that a long grid
# survives the loss of the machine it runs on: every INTERVAL seconds (once, without one), each
# job folder under ROOT holding summary.json (done) or error.txt (failed) has its summary.json,
# metrics.jsonl, events.jsonl, job.json and error.txt committed, and nothing else (checkpoints,
# selected models and logs stay on the machine: ROOT is git-ignored). Running and interrupted
# jobs are left out: `bench run` reruns them. Only ROOT's paths go into these commits
# (`git commit --only`), whatever else is staged.
#
#   scripts/commit_sweep_jobs.sh experiments/report_fmnist3/runs 1200 &
#
# On a fresh clone the committed jobs are in place and `bench run --sweep.root=ROOT` goes on
# from them: they are `done` (or `failed`) as they were.
set -uo pipefail
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 ROOT [INTERVAL_SECONDS]" >&2
  exit 2
fi
ROOT=${1%/}
INTERVAL=${2:-0}
cd "$(git rev-parse --show-toplevel)" || exit 1
if [[ ! -d $ROOT ]]; then
  echo "error: $ROOT: no such folder (run from the repository, ROOT relative to it)" >&2
  exit 1
fi

commit_once() {
  local files=() d f
  for d in "$ROOT"/*/; do
    d=${d%/}
    [[ -f $d/summary.json || -f $d/error.txt ]] || continue
    for f in summary.json metrics.jsonl events.jsonl job.json error.txt; do
      [[ -f $d/$f ]] && files+=("$d/$f")
    done
  done
  if ((${#files[@]})); then
    printf '%s\0' "${files[@]}" | xargs -0 -n 2000 git add -f -- || return 1
  fi
  # `--only` commits ROOT's tracked files as they are now: an error.txt committed earlier
  # whose job has since succeeded goes with the commit that adds its summary.
  if git diff --cached --quiet -- "$ROOT" && git diff --quiet -- "$ROOT"; then
    return 0
  fi
  local done failed
  done=$(git diff --cached --name-only --diff-filter=A -- "$ROOT" | grep -c '/summary.json$')
  failed=$(git diff --cached --name-only --diff-filter=A -- "$ROOT" | grep -c '/error.txt$')
  local total
  total=$(git ls-files -- "$ROOT" | grep -c '/summary.json$')
  git commit -q --only -m "Sweep jobs under $ROOT: $done more finished, $failed more failed ($total done in all)" -- "$ROOT"
}

while true; do
  commit_once || echo "$(date -u +%FT%TZ) commit failed; trying again next time" >&2
  ((INTERVAL > 0)) || break
  sleep "$INTERVAL"
done
