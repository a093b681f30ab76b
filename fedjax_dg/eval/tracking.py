"""MLflow tracking of runs, offline by default.

With `config.tracking = "mlflow"` a run is logged to MLflow when it finishes: its config as
parameters (every field but where and how the run is kept), every evaluation of its
`metrics.jsonl` as metrics at step `round` (the same names as TensorBoard's: `train/loss`,
`<split>/<metric>`), and the scores of the models its summary selected
(`selected/<rule>/<split>_<metric>`). A resumed run that finishes again adds its new
rounds to the same MLflow run (found by its run directory), so each round is logged once.

`"mlflow"` uses MLflow's own store: `MLFLOW_TRACKING_URI` when set, else MLflow's default
(a local SQLite file, `mlflow.db` in the current directory, for MLflow 3); nothing leaves
the machine unless that URI names a server. `"mlflow:URI"` names the store, e.g.
`mlflow:sqlite:////data/mlflow.db` or `mlflow:http://host:5000`. The experiment is
`MLFLOW_EXPERIMENT_NAME`, else `fedjax-dg`. Finished runs and whole sweeps are logged
afterwards by

    python -m fedjax_dg.eval.tracking WORKDIR_OR_SWEEP_ROOT [...] [--uri URI] [--experiment NAME]

which names each run of a sweep by its method and the config fields that differ between
the sweep's runs (as `python -m fedjax_dg.eval.tensorboard` does) and records those as the
run's tags `hparam.<name>`. Then `mlflow ui --backend-store-uri URI`.
Needs the `tracking` extra (`pip install "fedjax-dg[tracking]"`, MLflow).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from fedjax_dg.eval import tensorboard

KIND = "mlflow"
EXPERIMENT = "fedjax-dg"
WORKDIR_TAG = "fedjax_dg.workdir"
LAST_ROUND_TAG = "fedjax_dg.last_round"
MAX_PARAM_CHARS = 500  # MLflow's oldest stores keep 500 characters of a parameter's value
BATCH = 100            # parameters per request (MLflow's limit); metrics go 1000 at a time


def store_uri(value: str) -> str | None:
  """What `config.tracking` asks for.

  Args:
    value: the field's value: `""` (no tracking), `"mlflow"` or `"mlflow:URI"`.

  Returns:
    None for no tracking; `""` for MLflow's own store (`MLFLOW_TRACKING_URI`, else its
    default); else the URI after `mlflow:`.

  Raises:
    ValueError: one line naming `tracking`, for any other value.
  """
  if not isinstance(value, str):
    raise ValueError(f"tracking must be a text: '', 'mlflow' or 'mlflow:URI', got {value!r}")
  if value == "":
    return None
  kind, sep, uri = value.partition(":")
  if kind != KIND or (sep and not uri):
    raise ValueError(f"tracking: unknown {value!r}; choose '' (none), 'mlflow' or 'mlflow:URI' "
                     "(e.g. mlflow:sqlite:////data/mlflow.db)")
  return uri


def config_error(config: Any) -> str | None:
  """What is wrong with `config.tracking`, checked before anything runs.

  Args:
    config: a run's config (a missing `tracking` field means no tracking).

  Returns:
    One line naming `tracking` (an unknown value, or MLflow not installed), or None when
    the field is fine.
  """
  try:
    uri = store_uri(config.get("tracking", ""))
  except ValueError as e:
    return str(e)
  import importlib.util
  if uri is not None and importlib.util.find_spec("mlflow") is None:
    return "tracking: logging to MLflow needs mlflow; pip install \"fedjax-dg[tracking]\""
  return None


def _client(uri: str):
  try:
    from mlflow.tracking import MlflowClient
  except ImportError as e:
    raise ImportError("tracking: logging to MLflow needs mlflow; pip install \"fedjax-dg[tracking]\"") from e
  return MlflowClient(tracking_uri=uri or None)


def _experiment_id(client, name: str) -> str:
  exp = client.get_experiment_by_name(name)
  if exp is not None:
    return exp.experiment_id
  try:
    return client.create_experiment(name)
  except Exception:  # pylint: disable=broad-except  # another process created it first
    exp = client.get_experiment_by_name(name)
    if exp is None:
      raise
    return exp.experiment_id


def params_of(config: dict) -> dict:
  """A run's MLflow parameters.

  Args:
    config: the run's flattened config (`tensorboard.run_config`).

  Returns:
    `{"a.b.c": text}` for every field but the `tensorboard.NEUTRAL` ones, each value cut to
    `MAX_PARAM_CHARS` characters.
  """
  return {k: str(v)[:MAX_PARAM_CHARS] for k, v in sorted(config.items()) if k.split(".")[0] not in tensorboard.NEUTRAL}


def log_workdir(workdir: str, uri: str = "", experiment: str = "", name: str = "", hparams: dict | None = None) -> str:
  """Logs one run directory to MLflow, adding only the rounds not logged before.

  Args:
    workdir: the run directory (its metrics.jsonl, and config.json and summary.json when
      present).
    uri: the tracking URI; `""` for MLflow's own (`MLFLOW_TRACKING_URI`, else its default).
    experiment: the MLflow experiment; `""` for `MLFLOW_EXPERIMENT_NAME`, else `fedjax-dg`.
    name: the MLflow run's name when it is created; `""` for `<method> <folder name>`.
    hparams: recorded as tags `hparam.<name>` (the fields that tell a sweep's runs apart).

  Returns:
    The MLflow run's id.
  """
  from mlflow.entities import Metric, Param, RunTag
  from fedjax_dg import rundir
  workdir = os.path.abspath(workdir)
  config = tensorboard.run_config(workdir)
  records = rundir.read_metrics(workdir)
  client = _client(uri)
  exp_id = _experiment_id(client, experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", "") or EXPERIMENT)
  quoted = workdir.replace("'", "\\'")
  found = client.search_runs([exp_id], filter_string=f"tags.`{WORKDIR_TAG}` = '{quoted}'", max_results=1)
  if found:
    run_id = found[0].info.run_id
    last = int(found[0].data.tags.get(LAST_ROUND_TAG, "0") or 0)
  else:
    method = config.get("algorithm.name", "")
    run = client.create_run(exp_id, run_name=name or " ".join(x for x in (method, os.path.basename(workdir)) if x),
                            tags={WORKDIR_TAG: workdir})
    run_id, last = run.info.run_id, 0
    params = [Param(k, v) for k, v in params_of(config).items()]
    for i in range(0, len(params), BATCH):
      client.log_batch(run_id, params=params[i:i + BATCH])
  now = int(time.time() * 1000)
  metrics = [Metric(tag, value, now, int(r["round"])) for r in records if int(r["round"]) > last
             for tag, value in tensorboard.scalars(r)]
  end = max([last] + [int(r["round"]) for r in records])
  metrics += [Metric(tag, value, now, end) for tag, value in tensorboard.selected_metrics(workdir).items()]
  for i in range(0, len(metrics), 10 * BATCH):
    client.log_batch(run_id, metrics=metrics[i:i + 10 * BATCH])
  tags = [RunTag(LAST_ROUND_TAG, str(end))] + [RunTag(f"hparam.{k}", str(v)) for k, v in (hparams or {}).items()]
  client.log_batch(run_id, tags=tags)
  client.set_terminated(run_id, "FINISHED")
  return run_id


def log_run(config: Any, workdir: str) -> str | None:
  """Logs a finished run to MLflow when its config asks for it (`config.tracking`).

  The runner calls this once a run's summary is written; it does nothing on processes
  other than the one that writes the run directory, or when `tracking` is `""`.

  Args:
    config: the run's config.
    workdir: its run directory.

  Returns:
    The MLflow run's id, or None when nothing was logged.
  """
  from fedjax_dg import rundir
  uri = store_uri(config.get("tracking", ""))
  if uri is None or not rundir.is_writer():
    return None
  return log_workdir(workdir, uri)


def log_sweep(root: str, uri: str = "", experiment: str = "") -> dict:
  """Logs every run under `root` to MLflow, each named by its method and the config fields
  that differ between the runs.

  Args:
    root: a run directory or a folder of them.
    uri: the tracking URI (`""`: MLflow's own).
    experiment: the MLflow experiment (`""`: `MLFLOW_EXPERIMENT_NAME`, else `fedjax-dg`).

  Returns:
    `{run directory: MLflow run id}`.
  """
  runs = tensorboard.run_dirs(root)
  configs = [tensorboard.run_config(d) for d in runs]
  fields = tensorboard.varying_fields([c for c in configs if c])
  out = {}
  for d, config in zip(runs, configs):
    hp = tensorboard.run_hparams(config, fields)
    out[d] = log_workdir(d, uri, experiment, name=tensorboard.run_name(hp) if len(runs) > 1 else "", hparams=hp)
  return out


def main(argv=None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  if not args or args[0] in ("-h", "--help"):
    print(__doc__.strip())
    return 0 if args else 2
  opts = {"--uri": "", "--experiment": ""}
  roots = []
  while args:
    a = args.pop(0)
    key, eq, val = a.partition("=")
    if key in opts:
      if not eq:
        if not args:
          print(f"error: {key} needs a value", file=sys.stderr)
          return 2
        val = args.pop(0)
      opts[key] = val
    else:
      roots.append(a)
  for root in roots:
    if not os.path.isdir(root):
      print(f"error: no such folder {root!r}", file=sys.stderr)
      return 2
    if not tensorboard.run_dirs(root):
      print(f"error: no metrics.jsonl under {root!r}", file=sys.stderr)
      return 2
  for root in roots:
    logged = log_sweep(root, opts["--uri"], opts["--experiment"])
    print(f"{root}: {len(logged)} run(s) -> MLflow ({opts['--uri'] or 'MLflow default store'})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
