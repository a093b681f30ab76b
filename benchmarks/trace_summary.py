"""Where a traced program's time goes: a JAX profiler trace summed by operation.

`jax.profiler.trace(folder, create_perfetto_trace=True)` writes a Chrome-format trace
(`perfetto_trace.json.gz`) beside its XPlane file. `summarize_trace` reads it and sums the
complete events ("ph": "X") by name, per process: on a GPU the device's processes hold its
kernels (one event per kernel launch), the host's the Python and runtime calls. The result
is small enough to keep in a benchmark's JSON, so the trace itself need not travel.

    python benchmarks/trace_summary.py FOLDER_OR_FILE [--rounds N] [--top K]

prints the summary as JSON.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os

MAX_TRACE_BYTES = 512 * 2**20  # uncompressed; a larger trace is refused, not read
# The profiler's own bracketing calls on the host thread that started it.
PROFILER_FRAMES = ("$profiler.py", "$contextlib.py", "$<unknown> __exit__")


def find_trace(folder: str) -> str:
  """The newest `perfetto_trace.json.gz` under `folder` (a file path is returned as it is)."""
  if os.path.isfile(folder):
    return folder
  found = glob.glob(os.path.join(folder, "**", "perfetto_trace.json.gz"), recursive=True)
  if not found:
    raise FileNotFoundError(f"{folder}: no perfetto_trace.json.gz (trace with create_perfetto_trace=True)")
  return max(found, key=os.path.getmtime)


def read_events(path: str) -> list:
  """The trace's events, reading at most `MAX_TRACE_BYTES` of its uncompressed JSON."""
  with gzip.open(path, "rb") as f:
    raw = f.read(MAX_TRACE_BYTES + 1)
  if len(raw) > MAX_TRACE_BYTES:
    raise ValueError(f"{path}: over {MAX_TRACE_BYTES // 2**20} MiB uncompressed; trace fewer rounds")
  doc = json.loads(raw)
  return doc["traceEvents"] if isinstance(doc, dict) else doc


def summarize_trace(path: str, rounds: int = 1, top: int = 25) -> dict:
  """The trace at `path` (a file, or a folder searched by `find_trace`) summed by name.

  Args:
    path: the trace file or the folder given to `jax.profiler.trace`.
    rounds: how many rounds the trace covers; per-round figures divide by it.
    top: how many operations to list per process.

  Returns:
    {"file", "rounds", "processes": [{"name", "is_device", "events", "events_per_round",
    "busy_us_per_round" (the sum of its events' durations over the rounds, which counts
    overlapping streams twice), "span_us" (first start to last end), "top": [{"name",
    "count_per_round", "us_per_round", "share"}]}]}: device processes first, then the
    host, each listing its `top` names by total duration. On the host the profiler's own
    calls are left out.
  """
  path = find_trace(path)
  events = read_events(path)
  names = {e["pid"]: e.get("args", {}).get("name", str(e["pid"])) for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  per = collections.defaultdict(lambda: {"dur": collections.Counter(), "count": collections.Counter(),
                                         "start": float("inf"), "end": float("-inf")})
  for e in events:
    if e.get("ph") != "X" or "dur" not in e:
      continue
    proc = names.get(e["pid"], str(e["pid"]))
    if e["name"].startswith(PROFILER_FRAMES):
      continue
    p = per[proc]
    p["dur"][e["name"]] += float(e["dur"])
    p["count"][e["name"]] += 1
    p["start"] = min(p["start"], float(e["ts"]))
    p["end"] = max(p["end"], float(e["ts"]) + float(e["dur"]))
  out = []
  for proc, p in per.items():
    busy = sum(p["dur"].values())
    out.append({
        "name": proc, "is_device": "/device:" in proc, "events": sum(p["count"].values()),
        "events_per_round": sum(p["count"].values()) / rounds, "busy_us_per_round": busy / rounds,
        "span_us": p["end"] - p["start"],
        "top": [{"name": n, "count_per_round": p["count"][n] / rounds, "us_per_round": d / rounds,
                 "share": d / busy if busy else 0.0} for n, d in p["dur"].most_common(top)]})
  out.sort(key=lambda r: (not r["is_device"], -r["busy_us_per_round"]))
  return {"file": os.path.basename(path), "rounds": rounds, "processes": out}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("path", help="the folder given to jax.profiler.trace, or its perfetto_trace.json.gz")
  p.add_argument("--rounds", type=int, default=1)
  p.add_argument("--top", type=int, default=25)
  args = p.parse_args(argv)
  print(json.dumps(summarize_trace(args.path, args.rounds, args.top), indent=1))


if __name__ == "__main__":
  main()
