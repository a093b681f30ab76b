"""Sweeps as data: an ml_collections sweep config expanded into jobs (Bai et al. 2024 Sec. 4.3, App. E).

A sweep config (`configs/sweeps/*.py`) holds the base experiment config (`sweep.base`, a
whole `configs/default.py`-style ConfigDict, so `--sweep.base.num_rounds=10` works) and
named grids, each crossing the benchmark's axes:

  methods x client_counts x lams x schedules (num_rounds, local_epochs) x folds x seeds x trials

* `client_counts` entry 1 is the centralised column: the method's centralised counterpart
  from `sweep.centralized` (e.g. FedAvg -> ERM on the pooled training data), run once with
  one client and no lambda; a method without a counterpart is "not applicable" there
  (Bai et al. 2024 Tables 3-5, "-").
* `folds` are (test_domains, val_domains) pairs (`sweep.folds`; empty = the base config's;
  `sweep.leave_one_domain_out` = every domain once, validated as `data.lodo_validation` says).
* `exclude_cells` ((num_clients, lam) pairs, num_clients > 1) leaves those cells of the
  client_counts x lams product out of the grid (`excluded_cells`): a column the sweep cannot
  afford, say, while the others keep every lambda. A seeds grid and its search grid exclude
  the same cells; the report's tables leave the column out.
* `seeds` set the fields named in `sweep.seed_fields` (default the training seed).
* trials: trial 0 runs the defaults; trials 1..n-1 draw hyperparameters at random
  (DomainBed's protocol; Bai et al. 2024 App. D.4 selects them on the held-out domain), from each
  method's declared ranges (`fedjax_dg.algorithms.sample_hparams`, when
  `sweep.search.method_ranges`) and from the sweep's own `sweep.search.distributions`.
  Draws depend on (search seed, trial, algorithm) only, so one trial is one setting of the
  hyperparameters across cells and seeds.

Two phases (Bai et al. 2024 App. D.4: a random search selected on the held-out domain, then seeds
at the chosen values): a grid with `select_from = "<search grid>"` runs its `seeds` at the
trial the search grid's finished runs select for each cell (method, C, lam, fold), by the
mean over the search's seeds of the `select_rule` validation score (`select_winners`). Until
every search job has finished it expands to no jobs and `exp.waiting` says why; `collect`
and `report` refuse such a sweep in one line.

A grid's `local_steps` (> 0) fixes every client's local steps per round
(`client.local_steps`), so steps x rounds is the same at every C (Bai et al. 2024 Fig. 2 with the
step budget held fixed: the clients' effect alone).

A grid with `kind = "difficulty"` expands into the runs of Bai et al. 2024's Table 6 (R_DG and
R_FL; `fedjax_dg.bench.difficulty`).

Every job is one run: its config is the base with the job's dotted overrides, and its
workdir is `<sweep.root>/<key>` where `key` hashes the canonical JSON of the resolved
config (`config_key`). Identical runs from two grids are one job; a finished job is never
run again; a changed config is a new job.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import os
import re
import zlib

import ml_collections
import numpy as np

from fedjax_dg import rundir

# Result-neutral fields (rundir.RESULT_NEUTRAL) never distinguish two jobs. The key scheme was
# fixed while two of them still entered it; they enter every key at the values the committed
# runs were keyed with, so those runs keep their keys.
_NEUTRAL_KEY_VALUES = {"checkpoint_every": 10, "eval_batch_size": 512}
DIFFICULTY_ROLES = ("dg_without", "dg_with", "fl_erm", "fl_fedavg")


class SweepError(ValueError):
  """A sweep config field holds a value the expansion cannot use."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One run: `key` (the hash), its `workdir` and its resolved experiment `config`."""
  key: str
  workdir: str
  config: ml_collections.ConfigDict


@dataclasses.dataclass(frozen=True)
class Entry:
  """A job's place in one grid: the grid's name and the axes values that produced it."""
  grid: str
  key: str
  axes: dict


@dataclasses.dataclass(frozen=True)
class Expansion:
  jobs: dict          # key -> Job, in first-seen order
  entries: list       # Entry, one per (grid, point of the grid)
  waiting: dict = dataclasses.field(default_factory=dict)  # grid -> why it has no jobs yet (`select_from`)


# ---------------------------------------------------------------------------- configs

canonical_json = rundir.canonical_json
json_default = rundir.strict_default
flatten = rundir.flatten
from_json_dict = rundir.config_from_json


KEYED_FIELDS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keyed_fields.json")


@functools.lru_cache(maxsize=None)
def keyed_fields() -> frozenset:
  """The config fields that always enter a job's key: those of the config when the key
  scheme was fixed (`keyed_fields.json`)."""
  with open(KEYED_FIELDS_FILE) as f:
    return frozenset(json.load(f))


def library_defaults() -> dict:
  """The library's default config (`fedjax_dg.default_config()`), flattened (rundir.library_defaults)."""
  return rundir.library_defaults()


def config_key(config: ml_collections.ConfigDict, length: int = 16) -> str:
  """sha256 of the config's fields (canonical JSON), without the result-neutral fields.

  A field added to the library after the key scheme was fixed enters the key only where
  its value differs from its default in `fedjax_dg.default_config()`, so adding a field (with a
  default that keeps earlier behaviour) does not orphan a sweep's finished jobs; any value
  a job sets differently still makes it a new job. A change of a default's value or of
  the code is not seen by the key: rerun the sweep into a new `root` after one."""
  flat = json.loads(canonical_json({k: v for k, v in flatten(config).items()
                                    if k.split(".")[0] not in rundir.RESULT_NEUTRAL}))  # values as JSON reads them
  flat.update(_NEUTRAL_KEY_VALUES)
  keyed, defaults = keyed_fields(), library_defaults()
  kept = {k: v for k, v in flat.items() if k in keyed or k not in defaults or v != defaults[k]}
  return hashlib.sha256(canonical_json(kept).encode()).hexdigest()[:length]


def set_path(config: ml_collections.ConfigDict, path: str, value, what: str = "override") -> None:
  """`config[a][b][c] = value` for `path = "a.b.c"`; a path the config lacks is an error."""
  node, parts = config, path.split(".")
  for i, p in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or p not in node:
      raise SweepError(f"{what} {path!r}: the base config has no field {'.'.join(parts[:i + 1])!r}")
    if i == len(parts) - 1:
      try:
        node[p] = value
      except TypeError as e:
        raise SweepError(f"{what} {path!r}: {e}") from None
    else:
      node = node[p]


def get_path(config, path: str):
  node = config
  for p in path.split("."):
    node = node[p]
  return node


def load_config_file(path: str, fn: str = "get_config") -> ml_collections.ConfigDict:
  """`get_config()` of a config file, as `config_flags` loads it."""
  import importlib.util
  if not os.path.isfile(path):
    raise SweepError(f"no such config file {path!r}")
  spec = importlib.util.spec_from_file_location(f"_sweep_cfg_{zlib.crc32(path.encode())}", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return getattr(mod, fn)()


# ---------------------------------------------------------------------------- search

def _draw(spec, rng: np.random.Generator, path: str):
  """One value from a sweep-level distribution: ("log_uniform", lo, hi), ("uniform", lo, hi),
  ("int_uniform", lo, hi) (inclusive) or ("choice", (v1, v2, ...))."""
  if not (isinstance(spec, (tuple, list)) and spec and isinstance(spec[0], str)):
    raise SweepError(f"sweep.search.distributions.{path}: expected (kind, ...), got {spec!r}")
  kind, args = spec[0], tuple(spec[1:])
  if kind == "choice" and len(args) == 1 and len(args[0]) > 0:
    return args[0][int(rng.integers(len(args[0])))]
  if kind in ("uniform", "log_uniform", "int_uniform") and len(args) == 2:
    lo, hi = args
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in args):
      raise SweepError(f"sweep.search.distributions.{path}: {spec!r}: lo and hi must be finite numbers")
    if kind == "log_uniform" and (lo <= 0 or hi <= 0):
      raise SweepError(f"sweep.search.distributions.{path}: {spec!r}: log_uniform draws exp(uniform(log lo, log hi)), "
                       f"so both bounds must be > 0; got lo = {lo}, hi = {hi}")
    if lo > hi:
      raise SweepError(f"sweep.search.distributions.{path}: {spec!r}: lo ({lo}) must not exceed hi ({hi})")
    if kind == "uniform":
      return float(rng.uniform(lo, hi))
    if kind == "int_uniform":
      return int(rng.integers(lo, hi + 1))
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
  raise SweepError(f"sweep.search.distributions.{path}: unknown or malformed {spec!r}; use "
                   "('uniform'|'log_uniform'|'int_uniform', lo, hi) or ('choice', (values...))")


def stable_int(text: str) -> int:
  return zlib.crc32(text.encode())


def trial_overrides(sweep, algorithm: str, trial: int) -> dict:
  """Dotted overrides of random-search trial `trial` for `algorithm` ({} for trial 0).

  The method's declared ranges first (`fedjax_dg.algorithms.sample_hparams`), then the
  sweep's own distributions, which win where both name a field."""
  search = sweep.get("search", ml_collections.ConfigDict())
  if trial == 0 and search.get("first_trial_default", True):
    return {}
  rng = np.random.default_rng([int(search.get("seed", 0)), int(trial), stable_int(algorithm)])
  out = {}
  if search.get("method_ranges", False):
    try:
      from fedjax_dg.algorithms import sample_hparams
    except ImportError:
      raise SweepError("sweep.search.method_ranges: this fedjax_dg has no algorithms.sample_hparams; "
                       "set it to False and give sweep.search.distributions") from None
    out.update(sample_hparams(algorithm, rng))
  for path, spec in sorted(flatten_distributions(search.get("distributions", {})).items()):
    out[path] = _draw(spec, rng, path)
  return out


def flatten_distributions(tree, prefix: str = "") -> dict:
  """Like `flatten`, but a tuple leaf is a distribution spec."""
  out = {}
  for k, v in (tree.items() if hasattr(tree, "items") else ()):
    path = f"{prefix}{k}"
    if isinstance(v, (dict, ml_collections.ConfigDict)):
      out.update(flatten_distributions(v, path + "."))
    else:
      out[path] = v
  return out


# ---------------------------------------------------------------------------- expansion

def _folds(sweep) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  base = sweep.base
  if sweep.get("leave_one_domain_out", False):
    if base.data.name == "wilds":
      raise SweepError("sweep.leave_one_domain_out: WILDS runs on its official split scheme")
    from fedjax_dg.data import datasets
    from fedjax_dg.data.splits import lodo_domains
    n = datasets.load_dataset(base.data).num_domains
    return lodo_domains(n, base.data.get("lodo_validation", "heldout_domain"))
  folds = sweep.get("folds", ())
  if not folds:
    return [(tuple(base.data.test_domains), tuple(base.data.val_domains))]
  out = []
  for f in folds:
    if len(f) != 2:
      raise SweepError(f"sweep.folds: each entry is (test_domains, val_domains), got {f!r}")
    out.append((tuple(int(d) for d in f[0]), tuple(int(d) for d in f[1])))
  return out


def _make_config(sweep, settings: dict, algorithm: str) -> ml_collections.ConfigDict:
  """The base config with the sweep's per-algorithm overrides, then `settings`."""
  c = ml_collections.ConfigDict(sweep.base.to_dict())
  for path, v in flatten(sweep.get("method_overrides", {}).get(algorithm, {})).items():
    set_path(c, path, v, what=f"sweep.method_overrides.{algorithm}")
  for path, v in settings.items():
    set_path(c, path, v)
  c.resume, c.quiet = True, True
  c.data.leave_one_domain_out = False  # folds are the sweep's jobs
  return c


def _add(exp: Expansion, sweep, grid: str, axes: dict, settings: dict, algorithm: str) -> None:
  config = _make_config(sweep, {"algorithm.name": algorithm, **settings}, algorithm)
  key = config_key(config)
  if key not in exp.jobs:
    config.workdir = os.path.join(sweep.root, key)
    exp.jobs[key] = Job(key, config.workdir, config)
  exp.entries.append(Entry(grid, key, axes))


def _seed_settings(sweep, seed: int) -> dict:
  return {f: int(seed) for f in sweep.get("seed_fields", ("seed",))}


def _fold_settings(fold) -> dict:
  return {"data.test_domains": fold[0], "data.val_domains": fold[1]}


def excluded_cells(g, name: str = "") -> frozenset:
  """The (num_clients, lam) cells a grid leaves out of its client_counts x lams product.

  Args:
    g: the grid (`sweep.grids.<name>`); its optional `exclude_cells` holds (num_clients, lam)
      pairs, each a cell of the product with num_clients > 1 (the centralised column has no lambda).
    name: the grid's name, for the error message.

  Returns:
    The excluded cells as (int num_clients, float lam) pairs.

  Raises:
    SweepError: an entry that is not a pair, or names no cell of the grid.
  """
  where = f"sweep.grids.{name or '<grid>'}.exclude_cells"
  counts = {int(C) for C in g.get("client_counts", ()) if int(C) > 1}
  lams = {float(l) for l in g.get("lams", ())}
  out = set()
  for cell in g.get("exclude_cells", ()) or ():
    if not isinstance(cell, (tuple, list)) or len(cell) != 2:
      raise SweepError(f"{where}: each entry is a (num_clients, lam) pair, got {cell!r}")
    try:
      C, lam = int(cell[0]), float(cell[1])
    except (TypeError, ValueError):
      raise SweepError(f"{where}: each entry is a (num_clients, lam) pair of numbers, got {cell!r}") from None
    if C not in counts or lam not in lams:
      raise SweepError(f"{where}: {cell!r} is no cell of the grid (client_counts > 1: {sorted(counts)}, "
                       f"lams: {sorted(lams)})")
    out.add((C, lam))
  return frozenset(out)


def _expand_grid(exp: Expansion, sweep, name: str, g, winners: dict | None = None) -> None:
  """`winners`: (method, C, lam, fold) -> the trial a `select_from` grid runs its seeds at."""
  base = sweep.base
  centralized = sweep.get("centralized", {})
  schedules = [tuple(s) for s in g.get("schedules", ())] or [(int(base.num_rounds), int(base.client.local_epochs))]
  if g.get("schedules", ()) and base.client.local_steps > 0:
    raise SweepError(f"sweep.grids.{name}.schedules set client.local_epochs, but base.client.local_steps > 0 "
                     "fixes the local steps; set sweep.base.client.local_steps=0")
  steps = int(g.get("local_steps", 0))
  if steps < 0:
    raise SweepError(f"sweep.grids.{name}.local_steps must be >= 0 (0: the schedule's local epochs), got {steps}")
  trials = range(max(1, int(g.get("num_trials", 0)))) if winners is None else (None,)
  skip = excluded_cells(g, name)
  for method, C, (rounds, epochs), fold, seed, trial in itertools.product(
      g.methods, g.client_counts, schedules, _folds(sweep), g.seeds, trials):
    C = int(C)
    if C < 1:
      raise SweepError(f"sweep.grids.{name}.client_counts: counts must be >= 1, got {C}")
    algorithm = centralized.get(method, "") if C == 1 else method
    if not algorithm:
      continue  # not applicable: no centralised counterpart
    for lam in ((None,) if C == 1 else g.lams):
      if lam is not None and (C, float(lam)) in skip:
        continue
      t = trial if winners is None else winners.get((method, C, None if lam is None else float(lam), fold))
      if t is None:
        raise SweepError(f"sweep.grids.{name}: its search grid {g.select_from!r} has no run of {method} at C={C}"
                         f"{'' if lam is None else f', lam={float(lam):g}'}; give both grids the same cells")
      over = trial_overrides(sweep, algorithm, t)
      settings = {"num_clients": C, "num_rounds": int(rounds), "client.local_epochs": int(epochs),
                  **_fold_settings(fold), **_seed_settings(sweep, seed), **over}
      if steps:
        settings["client.local_steps"] = steps
      if lam is not None:
        settings["partition.lam"] = float(lam)
      axes = {"method": method, "algorithm": algorithm, "num_clients": C, "lam": lam, "seed": int(seed),
              "test_domains": list(fold[0]), "val_domains": list(fold[1]), "num_rounds": int(rounds),
              "local_epochs": int(epochs), "trial": int(t), "overrides": over}
      if steps:
        axes["local_steps"] = steps
      _add(exp, sweep, name, axes, settings, algorithm)


# How the launcher records a diverged run's failure: the runner's own message
# (experiment.divergence), not any FloatingPointError (JAX_DEBUG_NANS raises one for a whole batch).
DIVERGED = re.compile(r"FloatingPointError: .+ at round \d+; lower client\.lr \(now ")


def _last_failure(workdir: str) -> str:
  """The error line of the job's "failed" event when that is its last start / done / failed
  event and no live process holds the job's RUNNING lock; "" otherwise (it never failed, it
  is running again, or a rerun started after the failure and was interrupted)."""
  if rundir.lock_is_live(rundir.read_lock(os.path.join(workdir, "RUNNING"))):
    return ""
  ev = [e for e in rundir.read_events(workdir) if e.get("event") in ("start", "done", "failed")]
  return ev[-1].get("error", "") if ev and ev[-1]["event"] == "failed" else ""


def select_winners(exp: Expansion, sweep, name: str, g) -> tuple[dict | None, str]:
  """Bai et al. 2024 App. D.4's second phase: for each cell (method, C, lam, fold) of the search grid
  `g.select_from`, the trial whose mean validation score over the search's seeds is best
  (rule `g.select_rule`, default the held-out domain; lowest trial on ties), or over the
  search seeds `g.select_seeds` alone where given (the winner one search seed would have
  chosen: what a cell reads under another search seed's choice). A trial whose
  run diverged (the runner's `FloatingPointError`, recorded in the job's failed event) has
  finished and never wins, as one whose scores are not finite. Returns (winners, "") when
  every search job has finished, else (None, why)."""
  from fedjax_dg.bench.runs import load_run, rule_scores
  src = g.select_from
  if src not in sweep.grids or sweep.grids[src].get("select_from", ""):
    raise SweepError(f"sweep.grids.{name}.select_from: {src!r} is not a search grid of this sweep")
  rule = g.get("select_rule", "heldout_domain")
  only = g.get("select_seeds", ()) or ()
  if not isinstance(only, (tuple, list)) or not all(isinstance(x, int) for x in only):
    raise SweepError(f"sweep.grids.{name}.select_seeds: a tuple of search seeds, got {only!r}")
  keep = {int(s) for s in only}
  src_seeds = {int(s) for s in sweep.grids[src].get("seeds", ())}
  if keep - src_seeds:
    raise SweepError(f"sweep.grids.{name}.select_seeds: {sorted(keep - src_seeds)} not among the seeds of its search "
                     f"grid {src!r} ({sorted(src_seeds)})")
  metric = sweep.get("report", {}).get("metric", "") or sweep.base.data.get("select_metric", "accuracy")
  scores, missing, failed, total = {}, 0, 0, 0
  for e in grid_entries(exp, src):
    if keep and int(e.axes["seed"]) not in keep:
      continue
    total += 1
    run = load_run(exp.jobs[e.key].workdir)
    s = None
    if run is None:
      error = _last_failure(exp.jobs[e.key].workdir)
      if not DIVERGED.match(error):
        failed += bool(error)
        missing += not error
        continue
    else:
      s = rule_scores(run, rule, metric)
    val = s["val"] if s and s["val"] is not None else float("-inf")  # a diverged trial never wins
    lam = None if e.axes["lam"] is None else float(e.axes["lam"])
    cell = (e.axes["method"], e.axes["num_clients"], lam, tuple(e.axes["test_domains"]),
            tuple(e.axes["val_domains"]))
    scores.setdefault(cell, {}).setdefault(e.axes["trial"], []).append(val)
  if failed:
    return None, (f"sweep.grids.{name} runs seeds at the trials its search grid {src!r} selects, and {failed} of "
                  f"{total} search jobs failed other than by diverging: see `bench status`, then run the sweep again")
  if missing:
    return None, (f"sweep.grids.{name} runs seeds at the trials its search grid {src!r} selects, and {missing} of "
                  f"{total} search jobs have not finished: `bench run` runs its jobs once they have (the local "
                  "launcher in the same command)")
  winners = {}
  for (m, C, lam, test, val), per_trial in scores.items():
    best = max(sorted(per_trial), key=lambda t: float(np.mean(per_trial[t])))
    winners[(m, C, lam, (test, val))] = best
  return winners, ""


def _expand_difficulty(exp: Expansion, sweep, name: str, g) -> None:
  """Bai et al. 2024 Sec. 4.1 / Table 6: ERM without and with `fraction` of the test domain in
  training (both tested on the rest), centralised ERM and FedAvg at each lambda."""
  frac = float(g.get("fraction", 0.2))
  if not 0.0 < frac < 1.0:
    raise SweepError(f"sweep.grids.{name}.fraction must lie in (0, 1), got {frac}")
  erm, fedavg, C = g.centralised, g.federated, int(g.num_clients)
  for fold, seed in itertools.product(_folds(sweep), g.seeds):
    common = {**_fold_settings(fold), **_seed_settings(sweep, seed)}
    runs = [("dg_without", erm, 1, None, {"data.test_domain_train_fraction": frac,
                                           "data.test_domain_train_include": False}),
            ("dg_with", erm, 1, None, {"data.test_domain_train_fraction": frac,
                                        "data.test_domain_train_include": True}),
            ("fl_erm", erm, 1, None, {})]
    runs += [("fl_fedavg", fedavg, C, float(lam), {"partition.lam": float(lam)}) for lam in g.lams]
    for role, alg, n, lam, extra in runs:
      axes = {"role": role, "method": alg, "algorithm": alg, "num_clients": n, "lam": lam, "seed": int(seed),
              "test_domains": list(fold[0]), "val_domains": list(fold[1]), "trial": 0, "overrides": {},
              "fraction": frac}
      _add(exp, sweep, name, axes, {"num_clients": n, **common, **extra}, alg)


def expand(sweep) -> Expansion:
  """Every job and grid entry of a sweep config."""
  for field in ("root", "base", "grids"):
    if field not in sweep:
      raise SweepError(f"sweep.{field} is required")
  from fedjax_dg import plugins
  try:  # the methods, rules and datasets the jobs name may come from plugins (`base.imports`)
    plugins.load(sweep.base)
  except ValueError as e:
    raise SweepError(f"sweep.base.{e}") from None
  exp = Expansion({}, [])
  later = []
  for name, g in sweep.grids.items():
    kind = g.get("kind", "grid")
    if kind == "grid" and g.get("select_seeds", ()) and not g.get("select_from", ""):
      raise SweepError(f"sweep.grids.{name}.select_seeds chooses among a search's seeds, but the grid has no "
                       "select_from")
    if kind == "grid" and g.get("select_from", ""):
      later.append((name, g))  # after the grid it selects from
    elif kind == "grid":
      _expand_grid(exp, sweep, name, g)
    elif kind == "difficulty":
      _expand_difficulty(exp, sweep, name, g)
    else:
      raise SweepError(f"sweep.grids.{name}.kind must be 'grid' or 'difficulty', got {kind!r}")
  for name, g in later:
    winners, why = select_winners(exp, sweep, name, g)
    if winners is None:
      exp.waiting[name] = why
    else:
      _expand_grid(exp, sweep, name, g, winners)
  return exp


def grid_entries(exp: Expansion, grid: str) -> list[Entry]:
  return [e for e in exp.entries if e.grid == grid]


def describe(axes: dict) -> str:
  """One line naming a job by its axes."""
  parts = [axes.get("role") or axes["method"]]
  if axes["algorithm"] != axes["method"] or axes.get("role"):
    parts.append(f"({axes['algorithm']})")
  parts.append(f"C={axes['num_clients']}")
  if axes.get("lam") is not None:
    parts.append(f"lam={axes['lam']:g}")
  if "num_rounds" in axes:
    parts.append(f"R={axes['num_rounds']}xE={axes['local_epochs']}")
  parts.append(f"test={','.join(map(str, axes['test_domains']))}")
  parts.append(f"seed={axes['seed']}")
  if axes.get("trial"):
    parts.append(f"trial={axes['trial']}")
  return " ".join(parts)
