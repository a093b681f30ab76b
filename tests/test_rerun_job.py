"""scripts/rerun_job.py: a job rerun in a fresh Python under the same flags on the same
machine equals itself bit for bit, through both a job record and another machine's output
(`--against`), and its comparison counts equal evaluations, the first differing round and
the test-accuracy gap by hand."""
import gzip
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
  spec = importlib.util.spec_from_file_location("rerun_job", os.path.join(ROOT, "scripts", "rerun_job.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _evals(acc_by_round):
  return [{"round": r, "train_loss": 1.0 / r, "splits": {"test": {"accuracy": a, "n": 10}, "val": {"accuracy": 0.5}}}
          for r, a in acc_by_round.items()]


def test_compare_by_hand():
  R = _script()
  old = [R.flat(e) for e in _evals({2: 0.5, 4: 0.6, 6: 0.7})]
  assert R.compare(old, old) == {"evaluations": 3, "rerun_evaluations": 3, "equal_evaluations": 3,
                                 "first_different_round": None, "largest_test_accuracy_gap": 0.0}
  new = [R.flat(e) for e in _evals({2: 0.5, 4: 0.65, 6: 0.6})]
  c = R.compare(new, old)
  assert (c["equal_evaluations"], c["first_different_round"]) == (1, 4)
  assert abs(c["largest_test_accuracy_gap"] - 0.1) < 1e-12
  other = _evals({2: 0.5, 4: 0.6, 6: 0.7})
  other[2]["train_loss"] = 0.17  # any field, not only accuracy
  c = R.compare([R.flat(e) for e in other], old)
  assert (c["equal_evaluations"], c["first_different_round"], c["largest_test_accuracy_gap"]) == (2, 6, 0.0)


def test_a_rerun_equals_itself_through_a_job_record_and_against(tiny_config, tmp_path):
  from fedjax_dg import experiment
  R = _script()
  tiny_config.num_rounds, tiny_config.eval_every = 4, 2
  experiment.train_and_evaluate(tiny_config, str(tmp_path / "run"))
  first = R.main([str(tmp_path / "run"), "--flags=", "--out", str(tmp_path / "here.json")])
  r1 = first["reruns"][0]
  assert r1["against_stored"]["evaluations"] == 2 and len(r1["records"]) == 2
  assert r1["determinism"]["cpu"] and "simd" in r1["determinism"]["cpu"]
  # The first rerun's evaluations as a stored job (a results file's line, gzipped).
  job = R.load_job(str(tmp_path / "run"))
  job["records"] = r1["records"]
  with gzip.open(tmp_path / "job.json.gz", "wt") as f:
    json.dump(job, f)
  second = R.main([str(tmp_path / "job.json.gz"), "--flags=", "--against", str(tmp_path / "here.json")])
  r2 = second["reruns"][0]
  assert r2["against_stored"]["equal_evaluations"] == 2, r2["against_stored"]
  assert r2["against_other_machine"]["equal_evaluations"] == 2
  assert r2["selected_test_accuracy"] == r1["selected_test_accuracy"] is not None
