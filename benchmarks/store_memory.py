"""What placing a client store on the CPU device costs in host memory, by how it is placed.

For each way, a new process makes a float32 host array of `--mb` megabytes (NumPy's own
allocation, or 64-byte aligned as `pack_clients` makes it: `store.aligned_empty`), places
it (`jnp.asarray`, as the runner and the old README did, or `jax.device_put`, as
`store.to_device` does), and reports the growth of its resident set and of its peak
resident set (`ru_maxrss`) over the host array alone. Repeats are interleaved.

    python benchmarks/store_memory.py --out benchmarks/results/store_memory_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAYS = ("numpy+asarray", "numpy+device_put", "aligned+asarray", "aligned+device_put")

_CHILD = r"""
import json, resource, sys
import numpy as np, jax, jax.numpy as jnp
from fedjax_dg.data import store
way, mb = sys.argv[1], int(sys.argv[2])
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
jnp.zeros(1).block_until_ready()
n = mb * 1_000_000 // 4
host = store.aligned_empty((n,), np.float32) if way.startswith("aligned") else np.empty((n,), np.float32)
host[:] = 1.0
r0, p0 = rss(), peak()
dev = jnp.asarray(host) if way.endswith("asarray") else jax.device_put(host)
dev.block_until_ready()
assert float(dev[n - 1]) == 1.0
same = dev.unsafe_buffer_pointer() == host.ctypes.data
print(json.dumps({"rss_growth_mb": rss() - r0, "peak_growth_mb": peak() - p0, "shares_host_memory": same,
                  "host_aligned_64": host.ctypes.data % 64 == 0}))
"""


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--mb", type=int, default=400)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  records = []
  for rep in range(args.repeats):
    for way in WAYS:
      r = subprocess.run([sys.executable, "-c", _CHILD, way, str(args.mb)], capture_output=True, text=True, env=env)
      if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1])
      rec = dict(json.loads(r.stdout.strip().splitlines()[-1]), way=way, repeat=rep)
      records.append(rec)
      print(f"#{rep} {way:20s} resident +{rec['rss_growth_mb']:7.1f} MB, peak +{rec['peak_growth_mb']:7.1f} MB "
            f"(array {args.mb} MB; shares host memory: {rec['shares_host_memory']})", flush=True)
  median = {w: {k: statistics.median(r[k] for r in records if r["way"] == w) for k in ("rss_growth_mb", "peak_growth_mb")}
            for w in WAYS}
  if args.out:
    import jax
    with open(args.out, "w") as f:
      json.dump({"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "jax": jax.__version__},
                 "array_mb": args.mb, "records": records, "median": median}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
