"""Stopping a run between rounds on a signal: a cluster's time limit or preemption.

SIGTERM (Slurm at a time limit, preemption or `scancel`; `kill`; a container's stop) and
SIGUSR1 (`sbatch --signal=USR1@120`, a warning before the limit) ask a run to stop: it
finishes the round it is in, evaluates that round if it is due, saves a checkpoint of it and
raises `Stopped`. Resuming the run (`config.resume`, which `bench run` sets for every job)
continues from that round, so a stop loses only the time to start again, not the rounds
since the last scheduled checkpoint. A batch of runs stops all its runs at the same round;
the processes of one `jax.distributed` run agree on the round (a signal to any process stops
all of them; JAX's own preemption notice, `multihost_utils.reached_preemption_sync_point`,
covers SIGTERM only and needs `jax.distributed`, so one small all-gather per round does it
here). SIGINT keeps Python's meaning (KeyboardInterrupt); SIGKILL cannot be caught, and
loses the rounds since the last checkpoint.

The handlers are installed only while a run's rounds are running, and only in the main
thread (Python delivers signals there); the previous handlers come back afterwards. A signal
that arrives during a long compiled round is acted on when the round returns.
"""
from __future__ import annotations

import os
import signal
import threading

import numpy as np

SIGNALS = ("SIGTERM", "SIGUSR1")
ENV = "FEDJAX_DG_STOP_SIGNAL"  # set in a process once it got one: a sweep worker then starts no further job


def signals() -> list:
  return [getattr(signal, name) for name in SIGNALS if hasattr(signal, name)]


def stop_signal() -> str | None:
  """The signal this process got while it was running a run or waiting as a sweep worker
  (`record_signals`), if any."""
  return os.environ.get(ENV) or None


def record_signal(signum, frame=None) -> None:
  """A signal handler: records the signal for `stop_signal`."""
  del frame
  os.environ[ENV] = signal.Signals(signum).name


def record_signals() -> None:
  """For a sweep's worker process: SIGTERM and SIGUSR1 between runs are recorded
  (`stop_signal`) instead of ending the process, so the worker finishes cleanly and starts
  nothing new; during a run `StopRequest` takes them."""
  for sig in signals():
    signal.signal(sig, record_signal)


class Stopped(Exception):
  """A run stopped on a signal after round `round`, with a checkpoint of it (`saved`)."""

  def __init__(self, signame: str, round_: int, saved: bool):
    self.signame, self.round, self.saved = signame, round_, saved
    then = (f"its checkpoint of round {round_} is saved: a resumed run (config.resume) continues from it" if saved
            else "no checkpoint is saved (checkpoint_every = 0): a rerun starts over")
    super().__init__(f"stopped by {signame} after round {round_}; {then}")


class StopRequest:
  """A context manager: while active, SIGTERM and SIGUSR1 are recorded instead of ending the
  process; `requested()` says whether to stop after the current round."""

  def __init__(self):
    self.signame = None
    self._previous = {}

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():
      for sig in signals():
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, previous in self._previous.items():  # None: a handler not set from Python (JAX's preemption
      signal.signal(sig, signal.SIG_DFL if previous is None else previous)  # notifier), not restorable
    self._previous = {}

  def _handle(self, signum, frame) -> None:
    del frame
    self.signame = self.signame or signal.Signals(signum).name
    record_signal(signum)

  def requested(self) -> str | None:
    """The signal's name once this process, or with `jax.distributed` any process of the run,
    got one; None otherwise. With several processes every process must call it at the same
    round (it is a collective)."""
    import jax
    if jax.process_count() == 1:
      return self.signame
    from jax.experimental import multihost_utils
    mine = np.int32(SIGNALS.index(self.signame) + 1 if self.signame in SIGNALS else 0)
    every = np.asarray(multihost_utils.process_allgather(mine)).ravel()
    got = [int(v) for v in every if v]
    return SIGNALS[got[0] - 1] if got else None
