"""benchmarks/sweep_speed.py on a few jobs: the batched arm (a loop over each batch's runs on
CPU) and the one-process-per-job arm finish every job with identical jobs.csv scores, and
the JSON carries the ratio, the machine's load and the Amdahl bound's inputs."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep_speed():
  spec = importlib.util.spec_from_file_location("sweep_speed", os.path.join(ROOT, "benchmarks", "sweep_speed.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.slow
def test_batched_and_one_process_per_job_give_identical_scores(tmp_path):
  out = _sweep_speed().main(["--jobs", "3", "--rounds", "2", "--arms", "batched,process", "--keep", str(tmp_path / "k"),
                             "--out", str(tmp_path / "speed.json")])
  for arm in ("batched", "process"):
    rec = out["arms"][arm]
    assert rec["counts"] == {"done": 3, "failed": 0, "skipped": 0, "busy": 0, "stopped": 0}, (arm, rec["counts"])
    assert len(rec["load_average_before"]) == 3 and rec["wall_s"] > 0
  same = out["scores_process"]
  assert same["same_scores"] and same["max_abs_difference"] == 0.0, same  # CPU: map is the run alone, bit for bit
  assert out["speedup_process_over_batched"] == out["arms"]["process"]["wall_s"] / out["arms"]["batched"]["wall_s"]
  assert os.path.exists(tmp_path / "speed.json")


def test_a_missing_sweep_config_is_one_line_before_anything_runs(tmp_path, capsys):
  with pytest.raises(SystemExit):
    _sweep_speed()._args(["--sweep", str(tmp_path / "nope.py")])
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].endswith(f"--sweep: no sweep config at {tmp_path / 'nope.py'}")
