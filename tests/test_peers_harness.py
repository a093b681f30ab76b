"""The peer comparison's harness (benchmarks/peers), at toy size and for our side only: the
peers themselves (Flower, pfl-research) never run in the test suite."""
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "peers"))
import common  # noqa: E402
import run as peers_run  # noqa: E402


def test_data_labels_are_the_teachers_argmax(tmp_path):
  w = common.workload("A", clients=3, rounds=1)
  xp, yp = common.write_data(str(tmp_path), w, seed=5, chunk=7)
  x, y = common.load_data(xp, yp)
  assert x.shape == (3 * 20, 28, 28, 1) and x.dtype == np.float32 and y.shape == (60,)
  assert 0.0 <= float(x.min()) and float(x.max()) < 1.0
  teacher = np.random.default_rng(6).standard_normal((784, 10)).astype(np.float32).astype(np.float64)
  scores = (np.asarray(x, np.float64).reshape(60, 784) - 0.5) @ teacher
  top2 = np.sort(scores, axis=1)[:, -2:]
  clear = top2[:, 1] - top2[:, 0] > 1e-3  # float32 and float64 may differ on near ties only
  np.testing.assert_array_equal(np.asarray(y)[clear], scores.argmax(axis=1)[clear])
  assert common.write_data(str(tmp_path), w, seed=5) == (xp, yp)  # written once


def test_local_steps():
  assert common.local_steps(common.workload("A")) == 2  # 1 epoch of 20 examples in batches of 10
  assert common.local_steps(common.workload("B")) == 5
  assert common.local_steps(dict(common.WORKLOADS["A"], examples=21)) == 3


def test_tree_memory_counts_children():
  script = "import numpy as np, time; a = np.ones(50_000_000 // 8); print('up', flush=True); time.sleep(30)"
  parent = subprocess.Popen([sys.executable, "-c",
                             f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {script!r}]); p.wait()"])
  try:
    deadline = time.time() + 60
    kb = 0
    while time.time() < deadline and kb < 50_000:
      kb = peers_run._tree_pss_kb(parent.pid)
      time.sleep(0.2)
    assert kb >= 50_000  # the grandchild's 50 MB array, counted in the parent's tree
  finally:
    parent.kill()
    parent.wait()


def _rec(system, wall, rnd, mem, loss=2.0, variant=""):
  return {"system": system, "variant": variant or ("auto" if system == "ours" else ""), "workload": "A",
          "clients": 10, "rounds": 3, "wall_s": wall, "round_s_median": rnd, "peak_memory_gb": mem,
          "startup_s": 1.0, "first_round_s": 1.0, "final_loss": loss}


def test_summary_takes_medians_and_ratios_to_ours():
  recs = [_rec("ours", 10, 0.1, 1.0, variant="auto@warm"), _rec("ours", 30, 0.3, 3.0, variant="auto@warm"),
          _rec("ours", 20, 0.2, 2.0, variant="auto@warm"), _rec("ours", 100, 0.2, 2.0, variant="auto@fresh"),
          _rec("pfl", 40, 1.0, 1.0), _rec("pfl", 60, 1.0, 1.0), {**_rec("pfl", 1, 1, 1), "error": "x"}]
  (row,) = peers_run.summarise(recs)["table"]
  ours, pfl = row["systems"]["ours:auto@warm"], row["systems"]["pfl"]
  assert (ours["wall_s"], ours["round_s_median"], ours["peak_memory_gb"], ours["runs"]) == (20, 0.2, 2.0, 3)
  assert pfl["runs"] == 2 and pfl["wall_s"] == 50
  ratio = pfl["over"]["ours:auto@warm"]
  assert math.isclose(ratio["wall"], 2.5) and math.isclose(ratio["round"], 5.0) and math.isclose(ratio["memory"], 0.5)
  assert math.isclose(pfl["over"]["ours:auto@fresh"]["wall"], 0.5)
  assert ours["range_wall_s"] == [10, 30]


def test_our_side_runs_a_toy_workload(tmp_path, monkeypatch):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)  # the suite's own cache would win
  w = common.workload("A", clients=4, rounds=2)
  w["cohort"] = 2
  xp, yp = common.write_data(str(tmp_path), w)
  rec = peers_run.run_one("ours", sys.executable, w, xp, yp, 2, "", timeout=300, cache=str(tmp_path / "cache"))
  assert "error" not in rec, rec
  assert os.listdir(tmp_path / "cache")  # our side compiled into the cache it was given
  assert rec["variant"] == "auto" and rec["versions"]["strategy"] in ("sequential", "vmap", "chunked", "host_loop")
  assert 0 < rec["startup_s"] < rec["to_first_round_end_s"] <= rec["wall_s"]
  assert len(rec["round_s"]) == 1 and rec["peak_memory_gb"] > 0.05
  assert math.isfinite(rec["final_loss"]) and 1.0 < rec["final_loss"] < 4.0  # near ln 10 after 2 rounds
  json.dumps(rec)
