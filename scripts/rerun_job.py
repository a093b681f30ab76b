"""Reruns a stored job on this machine, under one or more XLA flag settings, and compares
every evaluation with the stored one bit for bit (docs/reproducibility.md).

  python scripts/rerun_job.py tests/data/repro_fedavg_job.json.gz \
      --flags= --flags=--xla_cpu_max_isa=AVX2 --out rerun_here.json
  python scripts/rerun_job.py JOB --flags= --against rerun_elsewhere.json --out rerun_here.json

JOB is a run's folder (summary.json and metrics.jsonl), or a job's record: one line of a
report's results.jsonl.gz kept as a file (`.json` or `.json.gz`: "config", "summary",
"records"). Each `--flags` value runs the job in a fresh Python (XLA reads `XLA_FLAGS` once,
when a process starts its backend) with `XLA_FLAGS` set to it ("" leaves the environment's);
the package adds its own CPU default (fedjax_dg/xla_cpu.py) as it does for any run. The
output JSON holds, per setting, this machine's `provenance.determinism` record, every
evaluation, and its comparison with the stored job: how many evaluations equal the stored
ones (every metric of every split and the training loss), the first round that differs,
the largest test-accuracy gap in one evaluation, and the selected test accuracy. With
`--against FILE` (this script's output from another machine), each setting is compared
with the same setting there as well: that is how to tell whether a flag makes two machines
compute the same bits.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MAX_JOB_BYTES = 64 << 20  # one job's record (inflated); a 60-round job's takes about 40 kB


def read_json(path: str):
  """A JSON file (gzipped where its name ends in .gz), read with a byte cap; one line naming
  the file when it cannot be read."""
  from fedjax_dg import bounded
  try:
    raw = bounded.read_capped(path, MAX_JOB_BYTES, decompress=path.endswith(".gz"))
    return json.loads(raw)
  except (OSError, ValueError) as e:
    raise SystemExit(f"{path}: cannot read it ({type(e).__name__}: {e})".splitlines()[0]) from None


def load_job(path: str) -> dict:
  """{"config", "summary", "records"} of a run folder or a job record file."""
  from fedjax_dg import rundir
  if os.path.isdir(path):
    summary = read_json(os.path.join(path, "summary.json"))
    return {"config": summary.get("config"), "summary": summary, "records": rundir.read_metrics(path)}
  job = read_json(path)
  if not isinstance(job, dict) or not all(k in job for k in ("config", "summary", "records")):
    raise SystemExit(f"{path}: not a job record (needs 'config', 'summary' and 'records')")
  return job


def flat(record: dict) -> dict:
  """One evaluation as {name: value}: the round, the training loss, every split's metrics."""
  out = {"round": record["round"], "train_loss": record.get("train_loss")}
  for split, metrics in sorted(record.get("splits", {}).items()):
    out.update({f"{split}/{name}": value for name, value in sorted(metrics.items())})
  return out


def compare(new: list[dict], old: list[dict]) -> dict:
  """How evaluations `new` (flat) differ from `old` (flat), value by value (`==`)."""
  pairs = list(zip(new, old))
  gaps = [abs(a["test/accuracy"] - b["test/accuracy"]) for a, b in pairs
          if a.get("test/accuracy") is not None and b.get("test/accuracy") is not None]
  return {"evaluations": len(old), "rerun_evaluations": len(new),
          "equal_evaluations": sum(a == b for a, b in pairs),
          "first_different_round": next((b["round"] for a, b in pairs if a != b), None),
          "largest_test_accuracy_gap": max(gaps, default=0.0)}


def _child(job_path: str, workdir: str) -> None:
  """Runs the job in this process and prints its evaluations, selection and machine as JSON."""
  from fedjax_dg import experiment, provenance, rundir
  job = load_job(job_path)
  config = rundir.config_from_json(job["config"])
  config.workdir, config.resume, config.quiet, config.tensorboard = workdir, False, True, False
  summary = experiment.train_and_evaluate(config, workdir)
  print(json.dumps({"records": rundir.read_metrics(workdir), "selection": summary.get("selection"),
                    "determinism": provenance.determinism(),
                    "xla_flags": os.environ.get("XLA_FLAGS", "")}))


def rerun(job_path: str, flags: str) -> dict:
  """The job rerun in a fresh Python with XLA_FLAGS = `flags` (the environment's for "")."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("FEDJAX_DG_TEST")}
  if flags:
    env["XLA_FLAGS"] = flags
  env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  with tempfile.TemporaryDirectory() as tmp:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", job_path, os.path.join(tmp, "run")],
                         env=env, capture_output=True, text=True)
  if out.returncode != 0:
    raise SystemExit(f"the rerun with XLA_FLAGS={flags!r} failed: " + (out.stderr.strip().splitlines() or ["?"])[-1])
  return json.loads(out.stdout.strip().splitlines()[-1])


def selected_test_accuracy(selection) -> float | None:
  sel = (selection or {}).get("heldout_domain") or {}
  return ((sel.get("test") or {}).get("accuracy")) if isinstance(sel, dict) else None


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("job", help="a run folder, or a job record (.json / .json.gz)")
  p.add_argument("--flags", action="append", default=None, help="an XLA_FLAGS setting; repeat for more ('' = as set)")
  p.add_argument("--against", default="", help="this script's output from another machine")
  p.add_argument("--out", default="", help="write the JSON here")
  a = p.parse_args(argv)
  job = load_job(a.job)
  stored = [flat(r) for r in job["records"]]
  other = read_json(a.against) if a.against else None
  out = {"job": a.job, "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
         "stored": {"selected_test_accuracy": selected_test_accuracy(job["summary"].get("selection")),
                    "determinism": (job["summary"].get("provenance") or {}).get("determinism")},
         "reruns": []}
  for flags in a.flags or [""]:
    r = rerun(a.job, flags)
    new = [flat(x) for x in r["records"]]
    entry = {"flags": flags, "xla_flags": r["xla_flags"], "determinism": r["determinism"],
             "selected_test_accuracy": selected_test_accuracy(r["selection"]),
             "against_stored": compare(new, stored), "records": r["records"]}
    if other is not None:
      there = next((x for x in other.get("reruns", []) if x.get("flags") == flags), None)
      entry["against_other_machine"] = (compare(new, [flat(x) for x in there["records"]]) if there
                                        else f"{a.against} has no rerun with --flags {flags!r}")
    out["reruns"].append(entry)
    c = entry["against_stored"]
    print(f"XLA_FLAGS={r['xla_flags']!r}: {c['equal_evaluations']} / {c['evaluations']} evaluations equal the "
          f"stored ones (first difference at round {c['first_different_round']}), largest test-accuracy gap "
          f"{c['largest_test_accuracy_gap']:.4g}, selected test accuracy {entry['selected_test_accuracy']} "
          f"(stored {out['stored']['selected_test_accuracy']})"
          + (f"; against {a.against}: {entry['against_other_machine']['equal_evaluations']} equal"
             if isinstance(entry.get("against_other_machine"), dict) else ""))
  if a.out:
    with open(a.out, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  if len(sys.argv) == 4 and sys.argv[1] == "--child":
    _child(sys.argv[2], sys.argv[3])
  else:
    main()
