"""The sweep launcher's batches: jobs that share a static configuration run as one batch,
never mixed, sized to a memory budget; a batched sweep gives the scores of one job at a time;
a job failing inside a batch fails alone; an interrupted job resumes inside a batch; the
batch that ran a job is recorded in its folder."""
import contextlib
import copy
import csv
import io
import json
import math
import os

import ml_collections
import pytest

from fedjax_dg import batch, experiment
from fedjax_dg.bench import batches, collect, launch, sweep as sweep_lib
from fedjax_dg.bench import jobs as jobs_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "sweeps", "tiny.py")
DIVERGING_LR = 1e30
SCORE_COLUMNS = [f"{rule}_{f}" for rule in ("heldout_domain", "in_domain", "oracle")
                 for f in ("round", "val", "test", "in_test")] + ["final_round", "final_test"]


def sweep(root, seeds=(0, 1, 2)):
  """configs/sweeps/tiny.py's FedAvg and FedProx at lambda 1 over `seeds` (one static
  configuration per method), a FedAvg trial at a diverging learning rate (FedAvg's static
  configuration too), and a FedAvg job at an invalid lambda."""
  s = sweep_lib.load_config_file(TINY)
  s.root = str(root)
  s.grids = ml_collections.ConfigDict({
      "table": {"methods": ("fedavg", "fedprox"), "client_counts": (4,), "lams": (1.0,), "seeds": seeds},
      "diverge": {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (0,), "num_trials": 2},
      "bad": {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.5,), "seeds": (0,)},
  })
  s.search = ml_collections.ConfigDict({"seed": 0, "method_ranges": False, "first_trial_default": True,
                                        "distributions": {"client": {"lr": ("choice", (DIVERGING_LR,))}}})
  return s


def named(exp) -> dict:
  """{name: job}: "fedavg/0" (method / seed), "diverging", "bad"."""
  out = {}
  for e in exp.entries:
    name = {"diverge": "diverging" if e.axes["trial"] else None, "bad": "bad"}.get(
        e.grid, f"{e.axes['method']}/{e.axes['seed']}")
    if name:
      out[name] = exp.jobs[e.key]
  return out


# One pytest-xdist worker runs the whole file, so the module's fixtures (the two arms: two
# sweeps) are computed once, not once per worker.
pytestmark = pytest.mark.xdist_group("bench_batched")


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
  path = tmp_path_factory.getbasetemp().parent / "fedjax_dg_bench_jax_cache"
  path.mkdir(exist_ok=True)
  return str(path)


@pytest.fixture(scope="module")
def budget_for_two(tmp_path_factory):
  """A memory budget that holds exactly two of the sweep's runs: 2 x the largest estimate,
  below 3 x the smallest."""
  exp = sweep_lib.expand(sweep(tmp_path_factory.mktemp("sizes")))
  sizes = [batch.run_bytes(j.config) for name, j in named(exp).items() if name != "bad"]
  assert 2 * max(sizes) < 3 * min(sizes), sizes
  return 2 * max(sizes)


@pytest.fixture(scope="module")
def arms(tmp_path_factory, jax_cache, budget_for_two):
  """The sweep run batched (2 workers, two runs per batch) and with one job at a time."""
  base = tmp_path_factory.mktemp("arms")
  out = {}
  for arm in ("batched", "alone"):
    s = sweep(base / arm)
    exp = sweep_lib.expand(s)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      if arm == "batched":
        counts = launch.run_batched(exp, workers=2, memory=batches.Memory(nbytes=budget_for_two), cache_dir=jax_cache)
      else:
        counts = launch.run_local(exp, workers=2, cache_dir=jax_cache, quiet=True)
    collect.collect(s, str(base / arm / "results"), exp)
    with open(base / arm / "results" / "jobs.csv") as f:
      rows = {r["key"]: r for r in csv.DictReader(f)}
    out[arm] = dict(sweep=s, exp=exp, counts=counts, rows=rows, jobs=named(exp), printed=printed.getvalue())
  return out


# ---------------------------------------------------------------------------- planning


def test_memory_budget_and_batch_size_flags():
  assert batches.parse_memory("4G") == batches.Memory(nbytes=4 * 2 ** 30)
  assert batches.parse_memory("512MiB") == batches.Memory(nbytes=512 * 2 ** 20)
  assert batches.parse_memory("3e9") == batches.Memory(nbytes=3 * 10 ** 9)
  assert batches.parse_memory("25%") == batches.Memory(share=0.25)
  assert batches.parse_memory(None) == batches.parse_memory("") == batches.Memory()
  assert batches.Memory(share=0.25).budget(1000, workers=2) == 125
  assert batches.Memory().budget(1000, workers=1) == 1000 * batches.DEFAULT_SHARE
  assert batches.Memory(nbytes=7).budget(1000, workers=4) == 7
  for bad in ("abc", "-1G", "0", "0%", "101%", "4X", "1e-9"):
    with pytest.raises(sweep_lib.SweepError, match="--batch-memory") as e:
      batches.parse_memory(bad)
    assert "\n" not in str(e.value)
  for bad in (0, -3, 2.5, True):
    with pytest.raises(sweep_lib.SweepError, match=r"--max-batch \(runs per batch\) must be an integer >= 1"):
      batches.check_max_runs(bad)


def test_grouping_never_mixes_static_keys(tmp_path):
  """tiny.py: 2 methods x 2 lambdas x 2 seeds -> 4 groups of the two seeds of one (method, lambda)."""
  s = sweep_lib.load_config_file(TINY)
  s.root = str(tmp_path)
  exp = sweep_lib.expand(s)
  units, errors = launch.plan(list(exp.jobs.values()))
  assert errors == {}
  axes = {e.key: e.axes for e in exp.entries}
  got = sorted(sorted((axes[j.key]["method"], axes[j.key]["lam"], axes[j.key]["seed"]) for j in u) for u in units)
  expected = sorted([(m, lam, 0), (m, lam, 1)] for m in ("fedavg", "fedprox") for lam in (0.0, 1.0))
  assert got == expected
  # Two workers and one group of two: the group is halved, so both workers run.
  one = [j for j in exp.jobs.values() if axes[j.key]["method"] == "fedavg" and axes[j.key]["lam"] == 1.0]
  assert [len(u) for u in launch.plan(one, workers=2)[0]] == [1, 1]
  assert [len(u) for u in launch.plan(list(exp.jobs.values()), max_runs=1)[0]] == [1] * 8


def test_static_key_sees_structure_not_seeds_or_continuous_values():
  c = experiment_config()
  k = batch.static_key(c)
  same = {"seed": 7, "data.seed": 3, "client.lr": 0.3, "client.momentum": 0.5, "server.lr": 2.0,
          "algorithm.fedprox.mu": 0.5, "workdir": "/elsewhere", "checkpoint_every": 3}
  other = {"client.momentum": 0.0, "model.hidden": (16,), "num_clients": 5, "partition.lam": 0.5, "num_rounds": 4,
           "client.batch_size": 32, "algorithm.name": "fedavg"}
  for path, v in same.items():
    d = copy.deepcopy(c)
    sweep_lib.set_path(d, path, v)
    assert batch.static_key(d) == k, path
  for path, v in other.items():
    d = copy.deepcopy(c)
    sweep_lib.set_path(d, path, v)
    assert batch.static_key(d) != k, path


def experiment_config():
  s = sweep_lib.load_config_file(TINY)
  c = ml_collections.ConfigDict(s.base.to_dict())
  c.algorithm.name = "fedprox"
  c.client.momentum = 0.9
  return c


def test_split_fills_batches_to_the_budget():
  # Independent of the greedy rule: every batch fits, holds at most max_runs, order is kept,
  # and no batch could have taken the next job.
  sizes = [3, 3, 4, 2, 5, 9, 1, 1, 1, 1]
  parts = batches.split(list(range(10)), sizes, budget=8, max_runs=3)
  assert [i for p in parts for i in p] == list(range(10))
  assert parts == [[0, 1], [2, 3], [4], [5], [6, 7, 8], [9]]  # 9 bytes alone: a batch of one
  for p, nxt in zip(parts, parts[1:]):
    assert len(p) == 3 or sum(sizes[i] for i in p) + sizes[nxt[0]] > 8
    assert len(p) == 1 or sum(sizes[i] for i in p) <= 8


# ---------------------------------------------------------------------------- running


def test_batched_sweep_gives_the_scores_of_one_job_at_a_time(arms):
  a, b = arms["batched"]["rows"], arms["alone"]["rows"]
  assert set(a) == set(b) and len(a) == 8
  for key in a:
    assert a[key]["state"] == b[key]["state"], key
    for col in SCORE_COLUMNS:
      x, y = a[key][col], b[key][col]
      assert (x == "") == (y == ""), (key, col)
      if x:
        assert math.isclose(float(x), float(y), rel_tol=0, abs_tol=1e-5), (key, col, x, y)
  done = sum(r["state"] == "done" for r in a.values())
  assert done == 6 and arms["batched"]["counts"] == {"done": 6, "failed": 2, "skipped": 0, "busy": 0, "stopped": 0}


def test_each_job_records_its_batch_and_the_budget_splits_groups(arms):
  jobs = arms["batched"]["jobs"]
  start = {name: [e for e in launch.read_events(j.workdir) if e["event"] == "start"] for name, j in jobs.items()}
  assert start["bad"] == []  # refused before any batch
  ids = {name: ev[-1]["batch"] for name, ev in start.items() if ev}
  members = {}
  for name, bid in ids.items():
    members.setdefault(bid, set()).add(name)
  # Two runs per batch (the budget), in sweep order within each static configuration.
  order = {j.key: i for i, j in enumerate(arms["batched"]["exp"].jobs.values())}
  expected = []
  for method in ("fedavg", "fedprox"):
    group = sorted((n for n in jobs if n.startswith(method) or (method == "fedavg" and n == "diverging")),
                   key=lambda n: order[jobs[n].key])
    expected += [sorted(group[i:i + 2]) for i in range(0, len(group), 2)]
  assert sorted(map(sorted, members.values())) == sorted(expected)
  assert len(expected) == 4 and any("diverging" in e and len(e) == 2 for e in expected)
  for name, ev in start.items():
    if ev:
      assert sorted(ev[-1]["batch_jobs"]) == sorted(jobs[m].key for m in members[ids[name]])
      assert ev[-1]["resumed"] is False
  for name, j in jobs.items():
    if name not in ("bad", "diverging"):
      sm = json.load(open(os.path.join(j.workdir, "summary.json")))
      assert sm["batch"]["size"] == len(members[ids[name]]) and "total_s" in sm["timing"]
  rows = {r["key"]: r for r in launch.status(arms["batched"]["exp"])}
  assert rows[jobs["fedprox/2"].key]["batch"] == ids["fedprox/2"]
  text = launch.status_text(list(rows.values()), verbose=True)
  assert f"{jobs['fedavg/0'].workdir}  (batch {ids['fedavg/0']})" in text
  assert "(batch" not in launch.status_text(launch.status(arms["alone"]["exp"]), verbose=True)


def assert_same_records(batched: list, alone: list) -> None:
  """The evaluations of a job run in a batch equal those it gets alone: every field exactly,
  the training loss to 1e-6 relative (the batched program may sum in another order)."""
  assert len(batched) == len(alone)
  for x, y in zip(batched, alone):
    x, y = dict(x), dict(y)
    lx, ly = x.pop("train_loss"), y.pop("train_loss")
    assert x == y
    assert (lx is None and ly is None) or abs(lx - ly) <= 1e-6 * abs(ly), (x["round"], lx, ly)


def test_a_job_failing_inside_a_batch_fails_alone(arms):
  jobs, alone = arms["batched"]["jobs"], arms["alone"]["jobs"]
  for arm in ("batched", "alone"):
    assert launch.job_state(arms[arm]["jobs"]["diverging"].workdir) == "failed"
  err = open(os.path.join(jobs["diverging"].workdir, "error.txt")).read()
  assert "FloatingPointError" in err and f"client.lr (now {DIVERGING_LR})" in err
  line = lambda j: [e for e in launch.read_events(j.workdir) if e["event"] == "failed"][-1]["error"]
  assert line(jobs["diverging"]) == line(alone["diverging"])  # the line it gets alone
  start = [e for e in launch.read_events(jobs["diverging"].workdir) if e["event"] == "start"][-1]
  mates = [n for n, j in jobs.items() if j.key in start["batch_jobs"] and n != "diverging"]
  assert len(mates) == 1
  for mate in mates:  # done, with the evaluations it gets alone
    assert launch.job_state(jobs[mate].workdir) == "done"
    assert not os.path.exists(os.path.join(jobs[mate].workdir, "error.txt"))
    assert_same_records(collect.read_records(jobs[mate].workdir), collect.read_records(alone[mate].workdir))
  assert "partition.lam must lie in [0, 1], got 1.5" in line(jobs["bad"])
  assert "ConfigError" in open(os.path.join(jobs["bad"].workdir, "error.txt")).read()
  # The launcher's lines name each failed job and say why.
  printed = arms["batched"]["printed"].splitlines()
  for name, why in (("diverging", "FloatingPointError: "), ("bad", "partition.lam must lie in [0, 1]")):
    hit = [l for l in printed if jobs[name].workdir in l]
    assert len(hit) == 1 and "] failed" in hit[0] and why in hit[0] and "fedavg C=4" in hit[0], hit


def test_finished_jobs_are_skipped(arms):
  jobs = {n: j for n, j in arms["batched"]["jobs"].items() if n not in ("bad", "diverging")}
  before = {n: (os.stat(os.path.join(j.workdir, "summary.json")).st_mtime_ns, len(launch.read_events(j.workdir)))
            for n, j in jobs.items()}
  out = launch.execute_batch([j.workdir for j in jobs.values()])
  assert [o for _, o, _ in out] == ["skipped"] * len(jobs)
  after = {n: (os.stat(os.path.join(j.workdir, "summary.json")).st_mtime_ns, len(launch.read_events(j.workdir)))
           for n, j in jobs.items()}
  assert after == before


def test_interrupted_jobs_resume_inside_a_batch(arms, tmp_path, jax_cache):
  """FedProx seeds 0 and 1 stopped after their round-2 checkpoint (3 rounds asked) resume
  in one batch and end with the uninterrupted runs' evaluations."""
  s = sweep(tmp_path / "sweep")
  exp = sweep_lib.expand(s)
  jobs = named(exp)
  picked = {jobs[n].key for n in ("fedprox/0", "fedprox/1")}
  sub = sweep_lib.Expansion({k: j for k, j in exp.jobs.items() if k in picked},
                            [e for e in exp.entries if e.key in picked])
  launch.prepare(sub)
  marker = 123.25
  for key in picked:
    j = exp.jobs[key]
    c = copy.deepcopy(j.config)
    c.num_rounds, c.workdir, c.resume = 2, j.workdir, False
    experiment.train_and_evaluate(c, j.workdir)  # a run killed after its round-2 checkpoint
    os.remove(os.path.join(j.workdir, "summary.json"))
    recs = collect.read_records(j.workdir)
    recs[0]["train_loss"] = marker  # kept only if the rerun starts from the checkpoint
    with open(os.path.join(j.workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in recs)
    jobs_lib.event(j.workdir, "start", resumed=False)
    assert launch.job_state(j.workdir) == "interrupted"
  counts = launch.run_batched(sub, workers=1, cache_dir=jax_cache, quiet=True)
  assert counts["done"] == 2
  ref = arms["alone"]["exp"].jobs
  ids = set()
  for key in picked:
    j = exp.jobs[key]
    starts = [e for e in launch.read_events(j.workdir) if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["resumed"] and sorted(starts[1]["batch_jobs"]) == sorted(picked)
    ids.add(starts[1]["batch"])
    recs, want = collect.read_records(j.workdir), collect.read_records(ref[key].workdir)
    assert [r["round"] for r in recs] == [1, 2, 3]
    assert recs[0]["train_loss"] == marker  # resumed from round 2, not rerun from round 0
    assert_same_records(recs[1:], want[1:])
    assert json.load(open(os.path.join(j.workdir, "summary.json")))["selection"] == \
        json.load(open(os.path.join(ref[key].workdir, "summary.json")))["selection"]
  assert len(ids) == 1


def test_submitit_submits_one_job_per_batch(tmp_path, jax_cache):
  pytest.importorskip("submitit")
  s = sweep(tmp_path / "sweep", seeds=(0, 1))
  s.grids = ml_collections.ConfigDict({"table": {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,),
                                                 "seeds": (0, 1)}})
  exp = sweep_lib.expand(s)
  handles = launch.run_submitit(exp, str(tmp_path / "submitit"), cluster="local", parameters={"timeout_min": 10},
                                quiet=True, cache_dir=jax_cache)
  assert len(handles) == 1  # the two seeds: one batch, one submitit job
  assert [o for _, o, _ in handles[0].result()] == ["done", "done"]
  starts = [[e for e in launch.read_events(j.workdir) if e["event"] == "start"] for j in exp.jobs.values()]
  assert len({ev[0]["batch"] for ev in starts}) == 1 and all(ev[0]["pid"] != os.getpid() for ev in starts)
  assert launch.run_submitit(exp, str(tmp_path / "submitit"), cluster="local", wait=True, quiet=True) == []
