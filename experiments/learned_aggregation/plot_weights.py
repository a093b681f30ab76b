"""The figure of the per-domain weights `exp(a_d)` that `learned_agg` learns over rounds,
against each domain's shift (its rotation angle), from the committed weight files
(`experiments/learned_aggregation*/weights_*.json`, written by
`experiments/learned_weights_over_rounds.py`):

    python experiments/learned_aggregation/plot_weights.py

One panel per weight file (data, lambda, K, seed in its title): a line per training domain,
coloured by its rotation angle; the last panel: each run's weights after its last round
against the rotation angle, with the held-out validation domain's and the test domain's
angles marked. The PNG's bytes depend only on the JSON files and the matplotlib version
(no date or software name in its metadata).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GLOB = os.path.join(os.path.dirname(HERE), "learned_aggregation*", "weights_*.json")
DEFAULT_OUT = os.path.join(HERE, "figures", "learned_weights.png")


def angle(name: str) -> float:
  """The rotation angle of a domain named like `15deg`."""
  m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*deg", name)
  if not m:
    raise ValueError(f"domain {name!r}: not a rotation angle (expected a name like '15deg')")
  return float(m.group(1))


def load(paths):
  runs = []
  for path in paths:
    with open(path) as f:
      r = json.load(f)
    for field in ("domains", "train_domains", "val_domains", "test_domains", "weights_after_round"):
      if field not in r:
        raise ValueError(f"{path}: no {field!r} (write it with experiments/learned_weights_over_rounds.py)")
    r["path"] = path
    runs.append(r)
  key = lambda r: (r.get("data", ""), r.get("unroll", 1), -r.get("lam", 0), r.get("seed", 0), r["path"])
  return sorted(runs, key=key)


def title(r) -> str:
  k = r.get("unroll", 1)
  rule = "one-step" if k == 1 else f"K = {k}"
  lam = f"{r['lam']:g}" if isinstance(r.get("lam"), (int, float)) else "?"
  return f"{r.get('data', '?')}, λ = {lam}, {rule}, seed {r.get('seed', '?')}"


def plot(runs, out: str) -> None:
  angles = sorted({angle(d) for r in runs for d in r["train_domains"]})
  cmap = plt.get_cmap("viridis")
  colour = lambda a: cmap((a - angles[0]) / max(angles[-1] - angles[0], 1e-9))
  n = len(runs) + 1
  cols = min(n, 3)
  rows = -(-n // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
  axes = axes.ravel()
  for ax, r in zip(axes, runs):
    w = r["weights_after_round"]
    rounds = range(1, len(w) + 1)
    for d in r["train_domains"]:
      j = r["domains"].index(d)
      ax.plot(rounds, [row[j] for row in w], color=colour(angle(d)), label=f"{angle(d):g}°")
    ax.set_yscale("log")
    ax.set_title(title(r), fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel("weight exp(a_d)")
    ax.legend(fontsize=7, title="train domain", title_fontsize=7)
  ax = axes[len(runs)]
  for k, r in enumerate(runs):
    last = r["weights_after_round"][-1]
    xs = [angle(d) for d in r["train_domains"]]
    ys = [last[r["domains"].index(d)] for d in r["train_domains"]]
    ax.plot(xs, ys, marker="o", color=plt.get_cmap("tab10")(k % 10), label=title(r), lw=1)
  for names, style, what in ((("val_domains",), ":", "validation"), (("test_domains",), "--", "test")):
    for a in sorted({angle(d) for r in runs for f in names for d in r[f]}):
      ax.axvline(a, color="grey", ls=style, lw=1)
      ax.text(a, 1, f" {what}", rotation=90, fontsize=7, va="bottom", transform=ax.get_xaxis_transform())
  ax.set_yscale("log")
  ax.set_xlabel("rotation angle (°)")
  ax.set_ylabel("weight after the last round")
  ax.set_title("final weight against the domain's shift", fontsize=9)
  ax.legend(fontsize=6)
  for ax in axes[len(runs) + 1:]:
    ax.axis("off")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=110, metadata={"Software": None})
  plt.close(fig)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("files", nargs="*", help=f"weight files (default: {os.path.relpath(DEFAULT_GLOB)})")
  p.add_argument("--out", default=DEFAULT_OUT)
  args = p.parse_args(argv)
  paths = args.files or sorted(glob.glob(DEFAULT_GLOB))
  if not paths:
    raise SystemExit(f"no weight files ({DEFAULT_GLOB}); write them with experiments/learned_weights_over_rounds.py")
  plot(load(paths), args.out)
  print(f"figure in {args.out}")


if __name__ == "__main__":
  main()
