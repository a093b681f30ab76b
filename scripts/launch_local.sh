#!/usr/bin/env bash
# Usage: scripts/launch_local.sh N [fedjax-dg ARGS...]
#
# Runs `fedjax-dg ARGS...` as N processes of one jax.distributed run on this machine (CPU,
# gloo collectives, the coordinator on localhost at a free port) and waits for all of them.
# Process 0 writes the run directory and the progress bar. Exits 0 when every process
# does; when one fails (an error, a kill), the others are stopped at once (SIGKILL), a
# process killed by a signal gets one line saying so (one that failed with an error has
# printed its own), and the exit status is the failed one's. A refusal of bad input (exit
# status 2: every process refuses it the same way, process 0 alone prints the line) leaves
# the others LAUNCH_LOCAL_GRACE_S seconds (default 30) to exit by themselves first, so the
# line is never lost to a process that refused sooner. SIGTERM and SIGUSR1 to this
# script are passed on: every process finishes its round, saves it and exits with 128 + the
# signal (fedjax_dg.stopping), and so does this script; SIGINT stops every process at once.
#
# Environment: FEDJAX_DG, the command to run (default: `fedjax-dg` if it is on PATH, else
# `python -m fedjax_dg`); PYTHON (default python3), used to find a free port;
# JAX_PLATFORMS (default cpu).
set -u

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/launch_local.sh N [fedjax-dg ARGS...] (N: the number of processes, >= 1)" >&2
  exit 2
fi
n=$1
shift
python=${PYTHON:-python3}
if [ -n "${FEDJAX_DG:-}" ]; then
  read -r -a cmd <<< "$FEDJAX_DG"
elif command -v fedjax-dg > /dev/null; then
  cmd=(fedjax-dg)
else
  cmd=("$python" -m fedjax_dg)
fi
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])') || {
  echo "launch_local.sh: cannot find a free port with $python (set PYTHON)" >&2; exit 2; }
export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}

pids=()
stop_all() {  # SIGKILL: a kill tears no file
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null; done
}
forward() {  # SIGTERM / SIGUSR1: every process finishes its round, saves it and exits (fedjax_dg.stopping)
  local p
  for p in "${pids[@]}"; do kill -"$1" "$p" 2> /dev/null; done
}
trap 'stop_all; exit 130' INT
trap 'forward TERM' TERM
trap 'forward USR1' USR1

for ((i = 0; i < n; i++)); do
  "${cmd[@]}" "$@" --config.distributed.initialize=local \
    --config.distributed.coordinator_address="localhost:$port" \
    --config.distributed.num_processes="$n" --config.distributed.process_id="$i" &
  pids+=($!)
done

status=0
left=$n
killer=
while [ $left -gt 0 ]; do
  done_pid=
  wait -n -p done_pid 2> /dev/null  # bash's own "Killed" notices: the line below says it once
  rc=$?
  if [ -z "${done_pid:-}" ]; then
    [ $rc -eq 127 ] && break  # no process left
    continue                  # a trapped signal interrupted the wait
  fi
  [ "$done_pid" = "$killer" ] && continue  # the grace period below ran out
  left=$((left - 1))
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
    status=$rc
    for ((i = 0; i < n; i++)); do [ "${pids[$i]}" = "$done_pid" ] && who=$i; done
    if [ $rc -eq 143 ] || [ $rc -eq 138 ]; then  # stopped on SIGTERM / SIGUSR1 after a saved round: the
      continue                                   # others stop at the same round (they agree on it)
    fi
    if [ $rc -eq 2 ]; then  # bad input: every process refuses it and exits by itself, and process 0 alone
      ( sleep "${LAUNCH_LOCAL_GRACE_S:-30}"; stop_all ) > /dev/null 2>&1 &  # says why: killing it now could
      # lose its line (the timer holds none of the pipes of this script's caller)
      killer=$!
      continue
    fi
    if [ $rc -gt 128 ]; then  # killed by a signal: the process could not say so itself
      echo "launch_local.sh: process $who was killed (signal $((rc - 128))); stopping the others" >&2
    fi
    stop_all
  fi
done
[ -n "$killer" ] && kill "$killer" 2> /dev/null
wait 2> /dev/null
exit $status
