"""Sweep expansion (fedjax_dg.bench.sweep) and R_DG's test-domain carve (data.splits)."""
import os
import sys

import ml_collections
import numpy as np
import pytest

import helpers

from fedjax_dg.bench import sweep as sweep_lib
from fedjax_dg.data import splits
from fedjax_dg.data.datasets import DomainDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from fedjax_dg.bench import sweep_helpers as sweep_common  # noqa: E402


def small_sweep(root, **grid):
  s = sweep_common.skeleton("t", str(root))
  s.base.model.name = "mlp"
  g = {"methods": ("fedavg", "irm", "fedprox"), "client_counts": (1, 5), "lams": (1.0, 0.0), "seeds": (0, 1),
       "num_trials": 0}
  g.update(grid)
  s.grids = ml_collections.ConfigDict({"table": g})
  return s


def test_grid_counts_centralised_column_and_dedup(tmp_path):
  s = small_sweep(tmp_path)
  exp = sweep_lib.expand(s)
  # C = 5: 3 methods x 2 lambdas x 2 seeds; C = 1: fedavg -> erm and irm -> irm (fedprox has none), 2 seeds.
  assert len(exp.entries) == 3 * 2 * 2 + 2 * 2 == len(exp.jobs)
  c1 = [e for e in exp.entries if e.axes["num_clients"] == 1]
  assert {(e.axes["method"], e.axes["algorithm"]) for e in c1} == {("fedavg", "erm"), ("irm", "irm")}
  assert all(e.axes["lam"] is None and exp.jobs[e.key].config.num_clients == 1 for e in c1)
  # A second grid naming the same runs adds entries, not jobs.
  s.grids.again = dict(s.grids.table.to_dict(), methods=("fedavg",))
  exp2 = sweep_lib.expand(s)
  assert len(exp2.jobs) == len(exp.jobs) and len(exp2.entries) == len(exp.entries) + 2 * 2 + 2
  job = exp.jobs[c1[0].key]
  assert job.workdir == os.path.join(str(tmp_path), job.key)


def test_excluded_cells_leave_the_grid_and_the_table(tmp_path):
  from fedjax_dg.bench import collect
  full = sweep_lib.expand(small_sweep(tmp_path, client_counts=(1, 5, 8)))
  s = small_sweep(tmp_path, client_counts=(1, 5, 8), exclude_cells=((8, 0.0),))
  exp = sweep_lib.expand(s)
  cells = {(e.axes["num_clients"], e.axes["lam"]) for e in exp.entries}
  assert cells == {(1, None), (5, 1.0), (5, 0.0), (8, 1.0)}
  # Only the excluded cell's runs are gone, and every other job keeps its key.
  gone = {k for k, j in full.jobs.items() if (j.config.num_clients, j.config.partition.lam) == (8, 0.0)}
  assert len(gone) == 3 * 2 and set(exp.jobs) == set(full.jobs) - gone
  assert collect.table_columns(s.grids.table) == ((1, None), (5, 1.0), (5, 0.0), (8, 1.0))
  for bad, why in (((8, 0.5),), "no cell of the grid"), (((1, 1.0),), "no cell of the grid"), ((8,), "pair"):
    with pytest.raises(sweep_lib.SweepError, match=r"sweep.grids.table.exclude_cells: .*" + why):
      sweep_lib.expand(small_sweep(tmp_path, client_counts=(1, 5, 8), exclude_cells=bad))


def test_key_is_stable_and_follows_the_config(tmp_path):
  s = small_sweep(tmp_path)
  keys = list(sweep_lib.expand(s).jobs)
  assert keys == list(sweep_lib.expand(small_sweep(tmp_path)).jobs)
  # Run-control fields do not change a job; anything else does.
  c = next(iter(sweep_lib.expand(s).jobs.values())).config
  c2 = ml_collections.ConfigDict(c.to_dict())
  c2.workdir, c2.quiet, c2.resume = "elsewhere", False, False
  assert sweep_lib.config_key(c2) == sweep_lib.config_key(c)
  c2.client.lr = c.client.lr * 2
  assert sweep_lib.config_key(c2) != sweep_lib.config_key(c)
  s.base.client.lr = 0.05
  assert not set(sweep_lib.expand(s).jobs) & set(keys)
  # A field added to the library later (absent from keyed_fields.json) keys only off its default.
  c3 = ml_collections.ConfigDict(c.to_dict())
  c3.engine.some_new_field = 0.0
  defaults = dict(sweep_lib.library_defaults(), **{"engine.some_new_field": 0.0})
  monkey = sweep_lib.library_defaults
  sweep_lib.library_defaults = lambda: defaults
  try:
    assert sweep_lib.config_key(c3) == sweep_lib.config_key(c)
    c3.engine.some_new_field = 0.5
    assert sweep_lib.config_key(c3) != sweep_lib.config_key(c)
    # A field of the frozen list enters the key even at its default value.
    c4 = ml_collections.ConfigDict(c.to_dict())
    del c4["seed"]
    assert sweep_lib.config_key(c4) != sweep_lib.config_key(c)
  finally:
    sweep_lib.library_defaults = monkey
  # A job's config round-trips through job.json's JSON form to the same key.
  import json
  back = sweep_lib.from_json_dict(json.loads(json.dumps(c.to_dict())))
  assert sweep_lib.config_key(back) == sweep_lib.config_key(c) and isinstance(back.data.test_domains, tuple)


def test_overrides_schedules_folds_and_seed_fields(tmp_path):
  s = small_sweep(tmp_path, methods=("fedadam",), client_counts=(4,), lams=(0.1,), seeds=(3,),
                  schedules=((20, 1), (10, 2)))
  s.folds = (((5,), (0,)), ((4,), (5,)))
  s.seed_fields = ("seed", "data.seed")
  exp = sweep_lib.expand(s)
  got = sorted((j.config.num_rounds, j.config.client.local_epochs, tuple(j.config.data.test_domains),
                tuple(j.config.data.val_domains)) for j in exp.jobs.values())
  assert got == [(10, 2, (4,), (5,)), (10, 2, (5,), (0,)), (20, 1, (4,), (5,)), (20, 1, (5,), (0,))]
  for j in exp.jobs.values():
    assert j.config.server.lr == 0.01  # sweep_common.METHOD_OVERRIDES["fedadam"]
    assert j.config.seed == 3 and j.config.data.seed == 3 and j.config.partition.lam == 0.1
    assert j.config.resume and j.config.quiet and not j.config.data.leave_one_domain_out


def test_leave_one_domain_out_folds(tmp_path):
  s = small_sweep(tmp_path, methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0,))
  s.leave_one_domain_out = True
  folds = sorted((e.axes["test_domains"][0], e.axes["val_domains"][0]) for e in sweep_lib.expand(s).entries)
  assert folds == [(t, (t + 1) % 6) for t in range(6)]  # six rotation domains


def test_random_search_draws(tmp_path):
  s = small_sweep(tmp_path, methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0, 1), num_trials=4)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1), "batch_size": ("choice", (16, 32))},
                            "server": {"momentum": ("uniform", 0.0, 0.5)}}
  exp = sweep_lib.expand(s)
  assert len(exp.jobs) == 4 * 2
  by_trial = {}
  for e in exp.entries:
    by_trial.setdefault(e.axes["trial"], []).append(e)
  assert by_trial[0][0].axes["overrides"] == {}  # trial 0: the defaults
  for t in (1, 2, 3):
    o = by_trial[t][0].axes["overrides"]
    assert by_trial[t][1].axes["overrides"] == o  # one setting per trial, shared by the seeds
    assert 1e-3 <= o["client.lr"] <= 1e-1 and o["client.batch_size"] in (16, 32) and 0 <= o["server.momentum"] <= 0.5
    cfg = exp.jobs[by_trial[t][0].key].config
    assert (cfg.client.lr, cfg.client.batch_size, cfg.server.momentum) == (o["client.lr"], o["client.batch_size"],
                                                                           o["server.momentum"])
  # The draws are the documented stream: rng([search seed, trial, crc32(algorithm)]), fields in sorted order.
  rng = np.random.default_rng([0, 2, sweep_lib.stable_int("fedavg")])
  bs = (16, 32)[int(rng.integers(2))]
  lr = float(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1))))
  assert by_trial[2][0].axes["overrides"]["client.batch_size"] == bs
  assert by_trial[2][0].axes["overrides"]["client.lr"] == lr
  # Log-uniform: log10(lr) of many trials spreads over [-3, -1].
  logs = [np.log10(sweep_lib.trial_overrides(s, "fedavg", t)["client.lr"]) for t in range(1, 400)]
  assert min(logs) < -2.8 and max(logs) > -1.2 and abs(np.mean(logs) + 2) < 0.1


def test_search_with_the_methods_declared_ranges(tmp_path):
  from fedjax_dg.algorithms import sample_hparams
  s = small_sweep(tmp_path, methods=("fedprox", "fediir+omg"), client_counts=(4,), lams=(1.0,), seeds=(0,),
                  num_trials=3)
  s.search.method_ranges = True
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-2, 1e-1)}}
  exp = sweep_lib.expand(s)
  for e in exp.entries:
    m, t = e.axes["algorithm"], e.axes["trial"]
    if t == 0:
      assert e.axes["overrides"] == {}
      continue
    # The method's draws from its declared ranges, then the sweep's, from the same stream.
    rng = np.random.default_rng([0, t, sweep_lib.stable_int(m)])
    expected = dict(sample_hparams(m, rng))
    expected["client.lr"] = float(np.exp(rng.uniform(np.log(1e-2), np.log(1e-1))))
    assert e.axes["overrides"] == expected and len(expected) >= 2
    cfg = exp.jobs[e.key].config
    for path, v in expected.items():
      assert sweep_lib.get_path(cfg, path) == v


def test_bad_sweep_fields_are_one_line_errors(tmp_path):
  s = small_sweep(tmp_path)
  s.method_overrides = {"fedavg": {"client": {"no_such_field": 1}}}
  with pytest.raises(sweep_lib.SweepError, match=r"sweep.method_overrides.fedavg 'client.no_such_field'"):
    sweep_lib.expand(s)
  s = small_sweep(tmp_path, num_trials=2)
  s.search.distributions = {"client": {"lr": ("gaussian", 0, 1)}}
  with pytest.raises(sweep_lib.SweepError, match=r"sweep.search.distributions.client.lr"):
    sweep_lib.expand(s)
  s = small_sweep(tmp_path)
  s.grids.table.kind = "other"
  with pytest.raises(sweep_lib.SweepError, match="sweep.grids.table.kind"):
    sweep_lib.expand(s)


def test_difficulty_grid_runs(tmp_path):
  s = small_sweep(tmp_path)
  s.grids = ml_collections.ConfigDict({"difficulty": {"kind": "difficulty", "centralised": "erm", "federated": "fedavg",
                                                      "num_clients": 5, "lams": (1.0, 0.0), "seeds": (0, 1),
                                                      "fraction": 0.2}})
  exp = sweep_lib.expand(s)
  roles = [(e.axes["role"], e.axes["seed"]) for e in exp.entries]
  assert sorted(roles) == sorted((r, sd) for sd in (0, 1) for r in ("dg_without", "dg_with", "fl_erm",
                                                                     "fl_fedavg", "fl_fedavg"))
  d = {(e.axes["role"], e.axes["seed"], e.axes["lam"]): exp.jobs[e.key].config for e in exp.entries}
  assert d[("dg_without", 0, None)].data.test_domain_train_fraction == 0.2
  assert not d[("dg_without", 0, None)].data.test_domain_train_include
  assert d[("dg_with", 0, None)].data.test_domain_train_include
  assert d[("fl_erm", 0, None)].data.test_domain_train_fraction == 0.0
  assert d[("fl_fedavg", 1, 0.0)].num_clients == 5 and d[("fl_fedavg", 1, 0.0)].partition.lam == 0.0


def _id_dataset(sizes=(40, 50, 61)):
  """Every example's input is its unique id."""
  xs, ys, start = [], [], 0
  for n in sizes:
    xs.append(np.arange(start, start + n, dtype=np.float32)[:, None])
    ys.append(np.arange(n) % 3)
    start += n
  return DomainDataset("ids", tuple(f"d{i}" for i in range(len(sizes))), tuple(xs), tuple(ys), 3)


def test_carved_test_domain_never_tested_on():
  ds = _id_dataset()
  ids = lambda s: set(s.x[:, 0].astype(int).tolist())
  plain = splits.make_fold(ds, [2], [0], seed=3)
  cut = splits.make_fold(ds, [2], [0], seed=3, test_domain_train_fraction=0.2)
  aside = splits.make_fold(ds, [2], [0], seed=3, test_domain_train_fraction=0.2, test_domain_train_include=False)
  domain2 = ids(plain.test)
  moved = ids(cut.train) - ids(plain.train)
  assert len(moved) == round(0.2 * 61) == 12 and moved <= domain2
  assert not moved & ids(cut.test)                 # the moved 20% is never tested on
  assert moved | ids(cut.test) == domain2          # and with the 80% it is the whole test domain
  assert np.all(cut.train.domain[np.isin(cut.train.x[:, 0], sorted(moved))] == 2)
  assert cut.train_domains == (1, 2) and plain.train_domains == (1,)
  # Without include: training exactly as the plain fold, tested on the same 80%.
  assert np.array_equal(aside.train.x, plain.train.x) and aside.train_domains == plain.train_domains
  assert np.array_equal(aside.test.x, cut.test.x)
  for f in ("in_val", "in_test", "heldout_val"):  # nothing else moves
    assert np.array_equal(getattr(cut, f).x, getattr(plain, f).x)
  cfg = ml_collections.ConfigDict({"test_domains": (2,), "val_domains": (0,), "in_val_fraction": 0.1,
                                   "in_test_fraction": 0.1, "seed": 3, "test_domain_train_fraction": 0.2,
                                   "test_domain_train_include": True})
  assert np.array_equal(splits.fold_from_config(ds, cfg).test.x, cut.test.x)
  with pytest.raises(ValueError, match=r"data.test_domain_train_fraction must lie in \[0, 1\), got 1.0"):
    splits.make_fold(ds, [2], [0], test_domain_train_fraction=1.0)


def test_help_prints_the_config_flags_and_main_fields():
  import subprocess
  out = subprocess.run([sys.executable, "-m", "fedjax_dg", "--help"], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT)), timeout=120)
  assert out.returncode == 0, out.stderr
  for text in ("--config: Path to an ml_collections config file.", "--workdir", "partition.lam", "algorithm.name",
               "--config.<field>"):
    assert text in out.stdout
  assert "Try --helpfull" not in out.stdout
  out = subprocess.run([sys.executable, "-m", "fedjax_dg.bench", "--help"], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT)), timeout=120)
  assert out.returncode == 0 and "--sweep: Path to a sweep config" in out.stdout and "collect" in out.stdout


def test_carve_on_a_wilds_fold(tmp_path):
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  from test_wilds import data_config, write_camelyon17
  from fedjax_dg.data import wilds
  root = write_camelyon17(str(tmp_path / "camelyon17_v1.0"))
  plain = wilds.load_fold(data_config(root, "camelyon17"))
  cut = wilds.load_fold(data_config(root, "camelyon17", test_domain_train_fraction=0.5))
  rows = lambda s: sorted(x.tobytes() + bytes([int(y)]) for x, y in zip(s.x, s.y))
  n, k = len(plain.test), round(0.5 * len(plain.test))
  assert n >= 2 and len(cut.test) == n - k and len(cut.train) == len(plain.train) + k
  moved = cut.train.x[len(plain.train):]
  assert np.array_equal(cut.train.x[:len(plain.train)], plain.train.x) and np.all(cut.train.domain[-k:] == 2)
  # The moved rows and the rows still tested on are, together, the test hospital's rows.
  assert sorted(rows(splits.Split(moved, cut.train.y[-k:], cut.train.domain[-k:])) + rows(cut.test)) == rows(plain.test)
  assert cut.train_domains == (0, 2, 3, 4)


def test_provenance_versions_and_commit():
  import subprocess
  import jax
  from fedjax_dg.bench import provenance
  p = provenance.provenance()
  assert p["versions"]["jax"] == jax.__version__ and p["versions"]["numpy"] == np.__version__
  head = subprocess.run(["git", "log", "-1", "--format=%H"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
  assert p["git"]["commit"] == (head or None)
  assert provenance.git_state("/")["commit"] is None  # not a checkout
