"""What the activity records cost: a round of each method with and without them.

For each method it builds the same client twice, on a local schedule with
`LocalSchedule.activity` True (the penalty's loss share every step and its gradient share
at the round's first step, IRM/VREx's weight-at-target share, Fish's and FedSAM's step
deviation) and False (no client record; the update is bitwise the same), both composed
with FedAvg's rule (which adds `activity/rule_deviation`; the plain arm drops it), runs
`--rounds` timed rounds of each after one compiling round, alternating the two arms, and
prints the median round time of each and their ratio, with the machine's load average
before and after.

    python benchmarks/activity_overhead.py --out benchmarks/results/activity_overhead_cpu.json

Default job: 20 clients of 64 rows with 3 domains each, an MLP (one hidden layer of 128)
on 28 x 28 inputs, batch 32, K local steps of SGD per round (`--steps`, default 1 and 5:
the gradient share costs one more backward pass of the penalty a round, so one step a
round is the worst case), the "vmap" strategy.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--methods", default="irm,coral,fediir,fedprox,fish,fedsam", help="comma separated")
  p.add_argument("--steps", default="1,5", help="local steps per round K, comma separated")
  p.add_argument("--clients", type=int, default=20)
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--out", default="", help="write the JSON here")
  return p.parse_args(argv)


def _store(clients: int, rows: int):
  import numpy as np
  from fedjax_dg.data.store import ClientStore
  rng = np.random.default_rng(0)
  x = rng.normal(size=(clients, rows, 28 * 28)).astype(np.float32)
  y = rng.integers(0, 10, (clients, rows)).astype(np.int32)
  dom = np.tile(np.arange(rows) % 3, (clients, 1)).astype(np.int32)
  return ClientStore(x, y, dom, np.full(clients, rows, np.int32))


def _client(method: str, ctx):
  """The method's client side; it records its activity where `ctx.sched.activity` says."""
  from fedjax_dg.algorithms import dg, fediir, fedprox, fedsam, fish
  from fedjax_dg.algorithms.fedavg import objective_client
  if method in dg.KINDS:
    return dg.dg_client(ctx.model, ctx.sched, ctx.client_opt, method, 10.0, 3, 0)
  if method == "fedprox":
    make = fedprox.proximal_objective(ctx.model, 0.1)
    return objective_client(lambda g, extra: make(g), ctx.client_opt, ctx.sched, record=True)
  if method == "fediir":
    return fediir.fediir_client(ctx.model, ctx.sched, ctx.client_opt, 0.01)
  if method == "fish":
    return fish.fish_client(ctx.model, ctx.sched, ctx.client_opt, 0.5, 3, "random")
  if method == "fedsam":
    return fedsam.sam_client(ctx, fedsam.HParams(rho=0.05))
  raise ValueError(f"--methods: no benchmark arm for {method!r}")


def measure(method: str, steps: int, args) -> dict:
  import jax
  import jax.numpy as jnp
  import ml_collections
  import optax
  from fedjax_dg.algorithms.base import LocalSchedule
  from fedjax_dg.algorithms.fedavg import optax_rule
  from fedjax_dg.algorithms.spec import Context, compose
  from fedjax_dg.engine import init_round_state, make_round
  from fedjax_dg.models import build_model
  model = build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (128,), "head_hidden": ()}), (28 * 28,), 10)
  store = jax.tree.map(jnp.asarray, _store(args.clients, args.rows))
  params = model.init(jax.random.PRNGKey(0))
  arms = {}
  for record in (True, False):
    sched = LocalSchedule(num_steps=steps, batch_size=32, epochs=0, passes=steps, unroll=1, activity=record)
    ctx = Context(model, sched, optax.sgd(0.05), None)
    alg = compose(method, _client(method, ctx), optax_rule(optax.sgd(1.0)))
    alg = alg if record else alg._replace(server_activity=None)
    rf = make_round(alg, args.clients, args.clients, "vmap")
    state = init_round_state(alg, None, params, args.clients)
    state, m = rf(state, store, jax.random.PRNGKey(0))  # compiles
    jax.block_until_ready(state)
    arms[record] = [rf, state, [], sorted(k for k in m if k.startswith("activity/"))]
  assert not arms[False][3], arms[False][3]
  for t in range(args.rounds):
    for record in (True, False):  # alternate, so drifts of the machine hit both arms
      rf, state, times, _ = arms[record]
      t0 = time.perf_counter()
      state, _ = rf(state, store, jax.random.PRNGKey(1 + t))
      jax.block_until_ready(state)
      times.append(time.perf_counter() - t0)
      arms[record][1] = state
  on, off = statistics.median(arms[True][2]), statistics.median(arms[False][2])
  return {"method": method, "local_steps": steps, "round_s_recording": on, "round_s_plain": off,
          "ratio": on / off, "records": arms[True][3]}


def main(argv=None):
  args = _args(argv)
  import jax
  load_before = os.getloadavg()
  rows = []
  for method in args.methods.split(","):
    for steps in map(int, args.steps.split(",")):
      r = measure(method, steps, args)
      rows.append(r)
      print(f"{method:8s} K={steps:<3d} round {r['round_s_plain'] * 1e3:8.2f} ms plain, "
            f"{r['round_s_recording'] * 1e3:8.2f} ms recording: ratio {r['ratio']:.3f}", flush=True)
  out = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "clients": args.clients,
         "rows": args.rows, "rounds": args.rounds, "cpus": os.cpu_count(),
         "load_average_before": load_before, "load_average_after": os.getloadavg(), "results": rows}
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
