"""What the sweep configs share: Bai et al.'s table rows, the centralised counterparts of
its C = 1 column, display names, per-method settings, and an empty sweep skeleton.

Every sweep config (`configs/sweeps/*.py`) is data for `fedjax_dg.bench.sweep` (its
docstring describes each field); `python -m fedjax_dg.bench --help` lists the commands.
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import default  # noqa: E402  (configs/default.py)

# Bai et al. 2024, Tables 3-5: B (baseline), DG adapted, FL, FDG (federated DG); then "other FDG
# papers": the methods of the FedLOE, FedOMG, FedIIR and FedDIM papers and FedGA. Only the
# methods a grid runs are shown.
GROUPS = (
    ("B", ("fedavg",)),
    ("DG adapted", ("irm", "fish", "mixup", "mmd", "coral", "groupdro", "vrex")),
    ("FL", ("fedprox", "scaffold", "afl", "fedavgm", "fedadam", "fedyogi", "fedsam")),
    ("FDG", ("feddg", "fedadg", "fedsr", "fedgma")),
    ("other FDG papers", ("fediir", "feddim", "fedomg", "fediir+omg", "fedprox+omg", "fedsam+omg", "fedsr+omg",
                          "fedloe", "fedga")),
)

DISPLAY = {"fedavg": "FedAvg-ERM", "irm": "IRM", "fish": "Fish", "mixup": "Mixup", "mmd": "MMD",
           "coral": "DeepCoral", "groupdro": "GroupDRO", "vrex": "VREx", "fedprox": "FedProx",
           "scaffold": "Scaffold", "afl": "AFL", "fedavgm": "FedAvgM", "fedadam": "FedAdam", "fedyogi": "FedYogi",
           "fedsam": "FedSAM", "feddg": "FedDG", "fedadg": "FedADG", "fedsr": "FedSR", "fedgma": "FedGMA",
           "fediir": "FedIIR", "feddim": "FedDIM", "fedomg": "FedOMG", "fediir+omg": "FedIIR+OMG",
           "fedprox+omg": "FedProx+OMG", "fedsam+omg": "FedSAM+OMG", "fedsr+omg": "FedSR+OMG",
           "fedloe": "FedLOE", "fedga": "FedGA"}

# The C = 1 (centralised) column: FedAvg-ERM is ERM on the pooled training data; the DG
# methods run their objective on one client holding every training domain; the FL and
# federated DG methods have no centralised form ("-", as in Bai et al., ICLR 2024).
CENTRALIZED = {"fedavg": "erm", "irm": "irm", "fish": "fish", "mixup": "mixup", "mmd": "mmd", "coral": "coral",
               "groupdro": "groupdro", "vrex": "vrex"}

# Settings a method needs on top of the shared config (experiments/sweep.py's ADJUST).
METHOD_OVERRIDES = {
    "fedadam": {"server": {"lr": 0.01}}, "fedyogi": {"server": {"lr": 0.01}},
    "scaffold": {"client": {"momentum": 0.0}},
    "fedloe": {"client": {"optimizer": "adam", "lr": 0.01}},
}


def skeleton(name: str, root: str) -> ml_collections.ConfigDict:
  """A sweep with the default base config, no grids, and Bai et al.'s table layout."""
  s = ml_collections.ConfigDict()
  s.name = name
  s.root = root                   # job workdirs: <root>/<key>
  s.base = default.get_config()   # the experiment every job starts from
  s.seed_fields = ("seed",)       # fields a trial seed sets (add "data.seed" to vary the splits)
  s.folds = ()                    # (test_domains, val_domains) pairs; () = the base config's
  s.leave_one_domain_out = False  # every domain as the test domain once (the next one validates)
  s.centralized = dict(CENTRALIZED)
  s.method_overrides = {k: dict(v) for k, v in METHOD_OVERRIDES.items()}
  s.search = ml_collections.ConfigDict({"seed": 0, "method_ranges": False, "first_trial_default": True,
                                        "distributions": {}})
  s.grids = ml_collections.ConfigDict()
  s.table = ml_collections.ConfigDict({"grid": "table", "groups": GROUPS, "display": dict(DISPLAY)})
  s.figures = ml_collections.ConfigDict({"clients_grid": "", "clients_steps_grid": "", "rounds_grid": "",
                                         "curves_grid": "",
                                         "per_run_grid": "", "per_run_methods": (), "per_run_seeds": ()})
  s.report = ml_collections.ConfigDict({"metric": "", "std_ddof": 1, "digits": 3, "out": "", "title": name,
                                        "sweep_file": "", "baseline": "fedavg", "dg_group": "DG adapted",
                                        "reading": "", "dataset": ""})
  # JAX's persistent compilation cache (jobs of one shape compile once); "" = <root>/.jax_cache.
  # Jobs of one static configuration run as batches (`vectorize`) within `batch_memory` (bytes
  # such as "4G", or a share of the device's memory such as "50%"; "" = the default share) and
  # `max_batch` runs; `bench run --no-vectorize / --batch-memory / --max-batch` override them.
  # `tasks_per_job` > 1 (submitit only; `bench run --tasks_per_job`) runs each job as that many
  # submitit tasks, the processes of one jax.distributed run (docs/multi_process.md).
  s.launch = ml_collections.ConfigDict({"workers": 1, "compilation_cache": True, "compilation_cache_dir": "",
                                        "submitit": {"timeout_min": 60}, "vectorize": True, "batch_memory": "",
                                        "max_batch": 64, "tasks_per_job": 1})
  return s
