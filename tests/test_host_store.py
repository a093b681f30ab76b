"""Inputs kept in host memory give the in-memory results, for every strategy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.data.host_store import pack_clients_host
from fedjax_dg.data.splits import Split
from fedjax_dg.data.store import pack_clients
from fedjax_dg.engine import init_round_state, make_round
from helpers import method, sgd_config, tiny_mlp, tree_max_diff

LOCAL = {**sgd_config(0.1), "server.lr": 1.0}  # local SGD at 0.1, FedAvg's rule at step 1


def _split_and_parts(seed=0, sizes=(9, 5, 12, 7, 3, 10), dim=6):
  rng = np.random.default_rng(seed)
  n = sum(sizes)
  split = Split(rng.normal(size=(n, dim)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32),
                rng.integers(0, 2, n).astype(np.int32))
  perm = rng.permutation(n)
  parts = np.split(perm, np.cumsum(sizes)[:-1])
  return split, [np.sort(p) for p in parts]


def _run(alg, store, strategy, params, rounds=2):
  state = init_round_state(alg, None, params, store.num_clients)
  rf = make_round(alg, store.num_clients, 4, strategy, chunk_size=2)
  st = jax.tree.map(jnp.asarray, store)
  for t in range(rounds):
    state, m = rf(state, st, jax.random.PRNGKey(t))
  return state.server.params


@pytest.mark.parametrize("strategy", ["vmap", "sequential", pytest.param("chunked", marks=pytest.mark.slow),
                                      pytest.param("host_loop", marks=pytest.mark.slow)])
def test_host_store_equals_the_packed_store(strategy):
  split, parts = _split_and_parts()
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = make_schedule(4, 0, 1, 12, 3)
  algs = [method(LOCAL, model, sched, len(parts)),
          method({"algorithm.name": "fediir", "algorithm.fediir.gamma": 0.1, "algorithm.fediir.ema": 0.95, **LOCAL},
                 model, sched, len(parts))]  # a full pass per client
  for alg in algs:
    a = _run(alg, pack_clients(split, parts), strategy, params)
    b = _run(alg, pack_clients_host(split, parts), strategy, params)
    assert tree_max_diff(a, b) < 1e-6, alg.name


def test_host_rows_fetch_the_right_rows():
  split, parts = _split_and_parts(seed=1)
  store = pack_clients_host(split, parts)
  packed = pack_clients(split, parts)
  rows = jnp.asarray([[0, 11, 1], [2, 0, 0]])  # real rows (padding rows are never read as data)
  got = jax.jit(jax.vmap(lambda x, i: x[i]))(store.x[jnp.asarray([2, 4])], rows)
  np.testing.assert_array_equal(got, packed.x[[2, 4]][np.arange(2)[:, None], rows])
  assert store.x.shape == packed.x.shape


@pytest.mark.parametrize("strategy", ["vmap", "sequential"])
def test_local_steps_are_served_from_the_prefetch(strategy):
  """Every local minibatch comes from the background gather the loop started before its scan."""
  split, parts = _split_and_parts(seed=2)
  model = tiny_mlp()
  sched = make_schedule(4, 0, 1, 12, 3)
  store = pack_clients_host(split, parts)
  _run(method(LOCAL, model, sched, len(store.counts)), store, strategy, model.init(jax.random.PRNGKey(0)))
  source = store.x.source
  assert source.direct == 0
  assert source.prefetched == 2 * 4 * sched.num_steps  # rounds x cohort x steps


def test_client_and_row_indexing_gives_the_packed_stores_examples():
  """`x[c, rows]` (FedDG's amplitude bank reads the inputs this way) used to be an IndexError."""
  split, parts = _split_and_parts(seed=3)
  host, packed = pack_clients_host(split, parts), pack_clients(split, parts)
  for x in (host.x, jax.tree.map(jnp.asarray, host).x):  # as packed, and after the runner's device_put
    for c, n in enumerate(packed.counts):
      rows = np.random.default_rng(c).choice(int(n), 4)
      got = x[c, rows]
      assert isinstance(got, np.ndarray) and got.dtype == packed.x.dtype
      np.testing.assert_array_equal(got, packed.x[c, rows])
    np.testing.assert_array_equal(x[2, 1:4], packed.x[2, 1:4])
    np.testing.assert_array_equal(x[np.array([0, 3]), np.array([2, 1])], packed.x[np.array([0, 3]), np.array([2, 1])])
  traced = jax.jit(lambda c, r: host.x[c, r])(2, jnp.asarray([0, 11, 1]))  # inside a trace: from the host
  np.testing.assert_array_equal(traced, packed.x[2, [0, 11, 1]])
  with pytest.raises(IndexError, match=r"host-store inputs take two indices \(client, rows\), got 3"):
    host.x[0, 1, 2]


def test_feddg_amplitude_bank_from_the_host_store_equals_the_packed_one():
  from fedjax_dg.algorithms.feddg import amplitude_bank
  rng = np.random.default_rng(4)
  n = 40
  split = Split(rng.integers(0, 256, (n, 6, 6, 3)).astype(np.uint8), rng.integers(0, 3, n).astype(np.int32),
                np.zeros(n, np.int32))
  parts = [np.arange(0, 12), np.arange(12, 15), np.arange(15, 40)]  # one client smaller than the bank
  want = amplitude_bank(pack_clients(split, parts), 5, seed=7)
  got = amplitude_bank(pack_clients_host(split, parts), 5, seed=7)
  assert got.shape == want.shape == (3, 5, 6, 6, 3)
  np.testing.assert_array_equal(got, want)


def test_file_rows_read_from_disk_give_the_in_memory_round(tmp_path):
  """Examples in a raw file read by row (`FileRows`, no mapping) index like the array and
  give the packed store's round."""
  from fedjax_dg.data.host_store import FileRows
  split, parts = _split_and_parts(seed=5)
  path = tmp_path / "x.f32"
  split.x.tofile(path)
  rows = FileRows(str(path), split.x.dtype, split.x.shape[1:])
  assert rows.shape == split.x.shape and len(rows) == len(split.x)
  for idx in (np.array([3, 0, 3]), np.array([[5, 1], [2, 40]]), np.array(7)):
    np.testing.assert_array_equal(rows[idx], split.x[idx])
  with pytest.raises(IndexError):
    rows[np.array([len(split.x)])]
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = method(LOCAL, model, make_schedule(4, 0, 1, 12, 3), len(parts))
  a = _run(alg, pack_clients(split, parts), "sequential", params)
  b = _run(alg, pack_clients_host(Split(rows, split.y, split.domain), parts), "sequential", params)
  assert tree_max_diff(a, b) == 0.0
