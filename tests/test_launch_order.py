"""The local launcher starts the units it expects to take longest first (longest processing
time first), from the sweep's measured time per round; the units themselves are unchanged."""
import json
import os
import sys
import types

from fedjax_dg.bench import collect, launch, sweep as sweep_lib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_report2 import sweep_config, write_run  # noqa: E402


def _jobs(*keys):
  return [types.SimpleNamespace(key=k) for k in keys]


def test_longest_first_by_hand():
  a, b, c, d = _jobs("a", "b", "c", "d"), _jobs("e"), _jobs("f", "g"), _jobs("h")
  units = [a, b, c, d]
  seconds = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 10.0, "f": 2.0, "g": 2.5}  # h unknown: the mean, 2.64
  assert launch.longest_first(units, seconds) == [b, c, a, d]
  assert launch.longest_first(units, {}) == units  # nothing known: the sweep's order
  tie = [_jobs("x"), _jobs("y")]
  assert launch.longest_first(tie, {"x": 1.0, "y": 1.0}) == tie  # ties keep their order


def test_estimates_come_from_finished_runs_with_the_same_work(tmp_path):
  """fedavg's finished run took 4 s for 2 rounds (2 s a round), irm's 12 s (6 s a round):
  every fedavg job of 2 rounds is estimated at 4 s, every irm one at 12 s, and fediir, which
  has no finished run, has no estimate."""
  s = sweep_config(tmp_path / "sweep", methods=("fedavg", "irm", "fediir"), client_counts=(4,), lams=(1.0,),
                   seeds=(0, 1))
  exp = sweep_lib.expand(s)
  by = {(e.axes["method"], e.axes["seed"]): exp.jobs[e.key] for e in exp.entries}
  for (method, seed), job in by.items():
    if seed == 0 and method != "fediir":
      write_run(job.workdir, {1: {"heldout_val": 0.5, "in_val": 0.5, "in_test": 0.5, "test": 0.5}})
      path = os.path.join(job.workdir, "summary.json")
      summary = json.load(open(path))
      summary["wall_time_s"] = {"fedavg": 4.0, "irm": 12.0}[method]
      json.dump(summary, open(path, "w"))
  est = collect.job_seconds(exp)
  assert est == {by[(m, seed)].key: t for m, t in (("fedavg", 4.0), ("irm", 12.0)) for seed in (0, 1)}
  units = [[by[("fedavg", 1)]], [by[("fediir", 1)]], [by[("irm", 1)]]]
  assert launch.longest_first(units, est) == [units[2], units[1], units[0]]  # fediir at the mean, 8 s
