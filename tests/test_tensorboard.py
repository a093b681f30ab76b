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
