"""TensorBoard event files from metrics.jsonl, read back through the TFRecord framing and
the Event protobuf (no TensorBoard or TensorFlow needed to check them)."""
import json
import os
import struct

import pytest

pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2  # noqa: E402

from fedjax_dg.eval import tensorboard  # noqa: E402


def read_events(folder):
  """{(tag, step): value} from every event file in `folder` (TFRecord: u64 length, u32 crc,
  payload, u32 crc)."""
  out = {}
  for name in sorted(os.listdir(folder)):
    data = open(os.path.join(folder, name), "rb").read()
    i = 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      for v in ev.summary.value:
        assert (v.tag, ev.step) not in out, "a step written twice"
        out[(v.tag, ev.step)] = v.simple_value
  return out


RECORDS = [{"round": 2, "train_loss": 0.75, "splits": {"test": {"accuracy": 0.5, "n": 10},
                                                        "heldout_val": {"accuracy": 0.25, "macro_f1": 0.125, "n": 4}}},
           {"round": 4, "train_loss": 0.5, "clients_reported": 7,
            "splits": {"test": {"accuracy": 0.625, "n": 10}, "heldout_val": {"accuracy": 0.375, "macro_f1": 0.25,
                                                                               "n": 4}}}]


def test_convert_writes_every_metric_once_per_round(tmp_path):
  run = tmp_path / "sweep" / "abc"
  run.mkdir(parents=True)
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + '{"round": 6, "tr')
  assert tensorboard.main([str(tmp_path / "sweep")]) == 0
  assert tensorboard.main([str(tmp_path / "sweep")]) == 0  # converting again replaces, never duplicates
  got = read_events(run / "tensorboard")
  want = {}
  for r in RECORDS:
    want[("train/loss", r["round"])] = r["train_loss"]
    for split, vals in r["splits"].items():
      for k, v in vals.items():
        if k != "n":
          want[(f"{split}/{k}", r["round"])] = v
  want[("train/clients_reported", 4)] = 7
  assert got == pytest.approx(want)  # the torn last line of a killed run is left out


def test_convert_errors_in_one_line(tmp_path, capsys):
  assert tensorboard.main([str(tmp_path / "missing")]) == 2
  assert tensorboard.main([str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: no such folder {str(tmp_path / 'missing')!r}", f"error: no metrics.jsonl under {str(tmp_path)!r}"]


def test_a_run_writes_its_records_as_events(tiny_config, tmp_path):
  """`config.tensorboard`: the run's event files hold exactly metrics.jsonl's numbers, each
  round once, also after a resume that re-evaluates rounds."""
  from fedjax_dg import experiment
  tiny_config.num_clients, tiny_config.num_rounds, tiny_config.eval_every = 4, 2, 1
  tiny_config.checkpoint_every, tiny_config.tensorboard = 1, True
  w = str(tmp_path / "run")
  experiment.train_and_evaluate(tiny_config, w)
  tiny_config.num_rounds, tiny_config.resume = 3, True
  experiment.train_and_evaluate(tiny_config, w)
  records = [json.loads(l) for l in open(os.path.join(w, "metrics.jsonl"))]
  assert [r["round"] for r in records] == [1, 2, 3]
  want = {(tag, r["round"]): v for r in records for tag, v in tensorboard.scalars(r)}
  assert read_events(os.path.join(w, "tensorboard")) == pytest.approx(want)
  assert ("test/accuracy", 3) in want and ("train/loss", 1) in want


def read_hparams(folder):
  """The hparams plugin's session-start record of `folder`'s event files: {name: value}."""
  from tensorboardX.proto import plugin_hparams_pb2
  found = {}
  for name in sorted(os.listdir(folder)):
    data = open(os.path.join(folder, name), "rb").read()
    i = 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      for v in ev.summary.value:
        if v.tag == "_hparams_/session_start_info":
          info = plugin_hparams_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content).session_start_info
          for k, val in info.hparams.items():
            kind = val.WhichOneof("kind")
            found[k] = getattr(val, kind)
  return found


def _fake_run(folder, method, lam, seed, acc):
  folder.mkdir(parents=True)
  config = {"algorithm": {"name": method, "fedprox": {"mu": 0.01}}, "partition": {"lam": lam}, "seed": seed,
            "workdir": str(folder), "client": {"lr": 0.1}}
  (folder / "config.json").write_text(json.dumps({"run": "x", "config": config, "fold": {}}))
  recs = [{"round": r, "train_loss": 1.0 / r, "splits": {"test": {"accuracy": acc * r / 2, "n": 5}}} for r in (1, 2)]
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
  (folder / "summary.json").write_text(json.dumps({"config": config, "selection": {
      "heldout_domain": {"round": 2, "val": {"accuracy": acc - 0.1, "n": 3}, "test": {"accuracy": acc, "n": 5}}}}))
  return recs


def test_a_sweep_is_shown_by_method_and_hyperparameters(tmp_path):
  """A sweep root's `tensorboard/` holds one folder per run, named by its method and the
  fields that differ between the runs, with the hparams plugin's record of them and the
  summary's selected scores; each run's curves are its metrics.jsonl's numbers."""
  root = tmp_path / "sweep"
  runs = {("fedavg", 1.0, 0, 0.5): "k1", ("fedprox", 1.0, 0, 0.625): "k2", ("fedprox", 0.0, 1, 0.75): "k3"}
  recs = {key: _fake_run(root / d, *key) for key, d in runs.items()}
  assert tensorboard.main([str(root)]) == 0
  assert tensorboard.main([str(root)]) == 0  # a second conversion rewrites, never duplicates
  out = root / "tensorboard"
  assert sorted(os.listdir(out)) == ["fedavg lam=1.0 seed=0", "fedprox lam=0.0 seed=1", "fedprox lam=1.0 seed=0"]
  for (method, lam, seed, acc), d in runs.items():
    folder = out / f"{method} lam={lam} seed={seed}"
    assert read_hparams(folder) == pytest.approx({"method": method, "lam": lam, "seed": seed})
    got = {k: v for k, v in read_events(folder).items() if not k[0].startswith("_hparams_/")}
    want = {(tag, r["round"]): v for r in recs[(method, lam, seed, acc)] for tag, v in tensorboard.scalars(r)}
    want.update({("selected/heldout_domain/round", 2): 2, ("selected/heldout_domain/val_accuracy", 2): acc - 0.1,
                 ("selected/heldout_domain/test_accuracy", 2): acc})
    assert got == pytest.approx(want)
    assert (root / d / "tensorboard").is_dir()  # each run's own event files as before


def test_run_names_use_the_shortest_unambiguous_field_names():
  configs = [{"algorithm.name": "fedprox", "algorithm.fedprox.mu": 0.1, "client.lr": 0.1, "server.lr": 1.0,
              "workdir": "a"},
             {"algorithm.name": "fedprox", "algorithm.fedprox.mu": 0.2, "client.lr": 0.3, "server.lr": 0.5,
              "workdir": "b"}]
  fields = tensorboard.varying_fields(configs)
  assert fields == ["algorithm.fedprox.mu", "client.lr", "server.lr"]  # the workdir names no hyperparameter
  hp = tensorboard.run_hparams(configs[1], fields)
  assert hp == {"method": "fedprox", "mu": 0.2, "client.lr": 0.3, "server.lr": 0.5}
  assert tensorboard.run_name(hp) == "fedprox mu=0.2 client.lr=0.3 server.lr=0.5"


def test_a_run_is_not_converted_as_a_sweep(tmp_path):
  _fake_run(tmp_path / "run", "fedavg", 1.0, 0, 0.5)
  with pytest.raises(ValueError, match="is a run, not a folder of runs"):
    tensorboard.convert_sweep(str(tmp_path / "run"))
  assert tensorboard.main([str(tmp_path / "run")]) == 0
  assert os.listdir(tmp_path / "run" / "tensorboard")[0].startswith("events.out.tfevents")
