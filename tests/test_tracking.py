"""MLflow tracking (`config.tracking`, `fedjax_dg.eval.tracking`): the field's values, its
one-line errors, and what a run and a sweep leave in a local MLflow store, read back through
MLflow's client and compared with the runs' metrics.jsonl and summary.json."""
import importlib.util
import json
import os

import pytest

from fedjax_dg.eval import tensorboard, tracking


@pytest.mark.parametrize("value, uri", [("", None), ("mlflow", ""), ("mlflow:sqlite:////x/m.db", "sqlite:////x/m.db"),
                                        ("mlflow:http://host:5000", "http://host:5000")])
def test_store_uri(value, uri):
  assert tracking.store_uri(value) == uri


@pytest.mark.parametrize("value", ["wandb", "mlflow:", "MLflow", "mlflow2:x"])
def test_unknown_values_are_one_line_errors(value):
  err = tracking.config_error({"tracking": value})
  assert err.startswith("tracking: unknown") and "\n" not in err


def test_mlflow_missing_is_one_line_naming_the_extra(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
  assert tracking.config_error({"tracking": "mlflow"}) == \
      'tracking: logging to MLflow needs mlflow; pip install "fedjax-dg[tracking]"'
  assert tracking.config_error({"tracking": ""}) is None and tracking.config_error({}) is None


def test_the_default_config_tracks_nothing():
  from fedjax_dg.defaults import default_config
  c = default_config()
  assert c.tracking == "" and tracking.config_error(c) is None
  assert tracking.log_run(c, "/nonexistent") is None  # nothing is read or written


def _run(folder, method, lam, seed, acc, rounds=(1, 2)):
  folder.mkdir(parents=True, exist_ok=True)
  config = {"algorithm": {"name": method}, "partition": {"lam": lam}, "seed": seed, "workdir": str(folder),
            "client": {"lr": 0.1}}
  (folder / "config.json").write_text(json.dumps({"run": "x", "config": config, "fold": {}}))
  recs = [{"round": r, "train_loss": 1.0 / r, "splits": {"test": {"accuracy": acc * r / 4, "n": 5}}} for r in rounds]
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
  (folder / "summary.json").write_text(json.dumps({"config": config, "selection": {
      "heldout_domain": {"round": rounds[-1], "val": {"accuracy": acc - 0.125, "n": 3},
                         "test": {"accuracy": acc, "n": 5}}}}))
  return recs


def _history(client, run_id, key):
  return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_a_sweep_in_a_local_store(tmp_path):
  """Each run once, named by method and the fields that differ; its parameters, every
  evaluation at its round, the selected scores; logging again after a resume adds only the
  new rounds to the same MLflow run."""
  pytest.importorskip("mlflow")
  from mlflow.tracking import MlflowClient
  uri = f"sqlite:///{tmp_path}/mlflow.db"
  root = tmp_path / "sweep"
  runs = {("fedavg", 1.0, 0, 0.5): "k1", ("fedprox", 0.0, 1, 0.75): "k2"}
  recs = {key: _run(root / d, *key) for key, d in runs.items()}
  assert tracking.main([str(root), "--uri", uri, "--experiment", "sweep"]) == 0
  client = MlflowClient(tracking_uri=uri)
  exp = client.get_experiment_by_name("sweep")
  logged = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
  assert sorted(logged) == ["fedavg lam=1.0 seed=0", "fedprox lam=0.0 seed=1"]
  for (method, lam, seed, acc), d in runs.items():
    run = logged[f"{method} lam={lam} seed={seed}"]
    assert run.data.params["algorithm.name"] == method and float(run.data.params["partition.lam"]) == lam
    assert "workdir" not in run.data.params  # where a run is kept is no parameter
    assert run.data.tags["hparam.lam"] == str(lam) and run.data.tags[tracking.WORKDIR_TAG] == str(root / d)
    for tag in ("train/loss", "test/accuracy"):
      want = sorted((r["round"], v) for r in recs[(method, lam, seed, acc)] for t, v in tensorboard.scalars(r) if t == tag)
      assert _history(client, run.info.run_id, tag) == pytest.approx(want)
    assert _history(client, run.info.run_id, "selected/heldout_domain/test_accuracy") == [(2, pytest.approx(acc))]
    assert run.info.status == "FINISHED"
  # the first run resumes to round 3: the same MLflow run gets round 3, rounds 1-2 stay once
  more = _run(root / "k1", "fedavg", 1.0, 0, 0.5, rounds=(1, 2, 3))
  run_id = logged["fedavg lam=1.0 seed=0"].info.run_id
  assert tracking.log_workdir(str(root / "k1"), uri, "sweep") == run_id
  assert _history(client, run_id, "test/accuracy") == pytest.approx([(r["round"], r["splits"]["test"]["accuracy"])
                                                                     for r in more])
  assert len(client.search_runs([exp.experiment_id])) == 2


def test_a_finished_run_is_logged_when_its_config_asks(tiny_config, tmp_path, monkeypatch):
  """`tracking.log_run` on a run the runner wrote: the store holds its metrics.jsonl."""
  pytest.importorskip("mlflow")
  from mlflow.tracking import MlflowClient
  from fedjax_dg import experiment
  monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "one run")
  tiny_config.num_clients, tiny_config.num_rounds, tiny_config.eval_every = 4, 2, 1
  uri = f"sqlite:///{tmp_path}/mlflow.db"
  tiny_config.tracking = f"mlflow:{uri}"
  w = str(tmp_path / "run")
  experiment.train_and_evaluate(tiny_config, w)
  run_id = tracking.log_run(tiny_config, w)
  client = MlflowClient(tracking_uri=uri)
  records = [json.loads(line) for line in open(os.path.join(w, "metrics.jsonl"))]
  got = _history(client, run_id, "heldout_val/accuracy")
  assert got == pytest.approx([(r["round"], r["splits"]["heldout_val"]["accuracy"]) for r in records])
  assert client.get_run(run_id).data.params["algorithm.name"] == tiny_config.algorithm.name
  assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "one run"
