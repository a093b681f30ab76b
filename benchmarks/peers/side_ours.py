"""fedjax-dg's side of the peer comparison: the workload through the library, as a user
writes it (`fedjax_dg.make_round` with the engine's `auto` choice of strategy and local-loop
unrolling, or `--variant <strategy>`). See common.py for the workloads and the protocol."""
from __future__ import annotations

import os
import sys
import time

_T_START = time.time()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def read_aligned(path: str, empty):
  """A `.npy` file read into `empty(shape, dtype)` (one copy in memory, no page cache kept mapped)."""
  import numpy as np
  with open(path, "rb") as f:
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(f)
    assert not fortran
    out = empty(shape, dtype)
    f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
  return out


def npy_offset(path: str) -> int:
  """Where a `.npy` file's data start (the header's length)."""
  import numpy as np
  with open(path, "rb") as f:
    version = np.lib.format.read_magic(f)
    (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)
    return f.tell()


def main(argv=None):
  args = common.side_args(argv)
  common.emit("start", t=_T_START)
  w = args.w
  strategy, *options = (args.variant or "auto").split("+")  # e.g. host_loop+gemm, auto+host, auto+dev2, auto+ynn, auto+thread1
  where = "host" if "host" in options else ""
  if "ynn" in options:  # jaxlib's own XLA:CPU choice (YNNPACK convolutions): the package's default off
    os.environ["FEDJAX_DG_XLA_CPU_DEFAULTS"] = "off"
  devices = next((int(o[3:]) for o in options if o.startswith("dev")), 0)
  if devices:  # N CPU devices of one thread each: the host loop runs N clients at a time
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
                               " --xla_cpu_multi_thread_eigen=false").strip()
  import jax
  import jax.numpy as jnp
  import numpy as np
  import fedjax_dg
  if "thread1" in options:  # the host loop's clients called from one host thread (the CPU default: 2)
    from fedjax_dg.engine import executors
    executors.host_loop_threads = lambda devices: 1
  from fedjax_dg import algorithms
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.data import store as store_lib
  from fedjax_dg.data.store import ClientStore
  from fedjax_dg.engine.measured import default_unroll, engine_defaults, model_family
  common.emit("imported", t=time.time())

  C, n = w["clients"], w["examples"]
  y = read_aligned(args.y, store_lib.aligned_empty).reshape(C, n).astype(np.int32)
  if where == "host":  # the inputs stay in the file, read by row when a client trains (host_store)
    from fedjax_dg.data.host_store import FileRows, pack_clients_host
    from fedjax_dg.data.splits import Split
    rows = FileRows(args.x, np.float32, common.INPUT_SHAPE, offset=npy_offset(args.x))
    split = Split(rows, y.reshape(-1), np.zeros(C * n, np.int32))
    store = store_lib.to_device(pack_clients_host(split, [np.arange(c * n, (c + 1) * n) for c in range(C)]))
  else:
    # The client store, read into aligned host arrays that become the device arrays without a
    # copy on a CPU (store.to_device): the data set is held once.
    x = read_aligned(args.x, store_lib.aligned_empty).reshape((C, n) + common.INPUT_SHAPE)
    store = store_lib.to_device(ClientStore(x, y, np.zeros((C, n), np.int32), np.full((C,), n, np.int32)))
  common.emit("data", t=time.time())

  config = fedjax_dg.default_config()  # FedAvg, server step 1
  config.model.name = w["model"]
  config.model.hidden = (200, 200)
  if "gemm" in options:  # the convolutions as im2col matrix products (models/conv.py)
    config.model.conv_impl = "gemm"
  config.client.lr, config.client.momentum = w["lr"], 0.0
  config.client.batch_size, config.client.local_steps, config.client.local_epochs = w["batch"], w["steps"], w["epochs"]
  model = fedjax_dg.build_model(config.model, common.INPUT_SHAPE, common.NUM_CLASSES)
  family = model_family(model, common.INPUT_SHAPE)
  strategy = engine_defaults(family).strategy if strategy == "auto" else strategy
  steps = common.local_steps(w)
  sched = make_schedule(w["batch"], w["steps"], w["epochs"], n, n, unroll=default_unroll(family, steps))
  alg = algorithms.build_algorithm(config, model, sched, C, w["cohort"])
  round_fn = fedjax_dg.make_round(alg, C, w["cohort"], strategy)
  key = jax.random.PRNGKey(0)
  params = model.init(key)
  state = fedjax_dg.init_round_state(alg, key, params, C)
  store = round_fn.place(store)
  common.emit("built", t=time.time(), strategy=strategy, family=family, unroll=str(sched.unroll))

  for r in range(w["rounds"]):
    t0 = time.time()
    state, metrics = round_fn(state, store, jax.random.fold_in(key, r))
    jax.block_until_ready(state)
    common.emit("round", round=r, t0=t0, t1=time.time(), train_loss=float(metrics["train_loss"]))

  xe, ye = common.load_data(args.x, args.y)
  k = min(common.EVAL_EXAMPLES, len(ye))
  params = alg.params_of(state.server)
  logits = jax.jit(model.apply)(params, jnp.asarray(xe[:k]))
  logp = jax.nn.log_softmax(logits)
  loss = -float(jnp.mean(jnp.take_along_axis(logp, jnp.asarray(ye[:k], jnp.int32)[:, None], axis=1)))
  common.emit("done", t=time.time(), loss=loss, strategy=strategy, jax=jax.__version__)


if __name__ == "__main__":
  main()
