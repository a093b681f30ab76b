"""The host loop with several host threads calling the clients (`HostLoopExecutor(devices,
threads)`) against the one-thread host loop: the partial sums are added in member order
either way, so every round's result must be the same bit for bit, with dropped-out
members, stragglers, local-step buckets, stacked aggregates and a convolutional model."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.engine import init_round_state, make_round
from fedjax_dg.engine import round as round_lib
from fedjax_dg.engine.executors import HostLoopExecutor
from fedjax_dg.engine.round import buckets_for
from fedjax_dg.models import build_model
from helpers import method, ragged_store, sgd_config, tiny_mlp

STORE = ragged_store(sizes=(9, 5, 12, 7, 3, 10, 8, 11, 4, 6))
C = len(STORE.counts)


def _rounds(monkeypatch, threads, alg, params, store, cohort, rounds=3, **kw):
  """`rounds` rounds of the host loop with `threads` host threads; (state, metrics) of the last."""
  monkeypatch.setattr(round_lib, "executor", lambda *a, **k: HostLoopExecutor(jax.local_devices()[:1], threads))
  rf = make_round(alg, store.counts.shape[0], cohort, "host_loop", **kw)
  state = init_round_state(alg, None, params, store.counts.shape[0])
  for t in range(rounds):
    state, m = rf(state, jax.tree.map(jnp.asarray, store), jax.random.PRNGKey(t))
  return jax.device_get((state, m))


def _bit_identical(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _scaffold(model, sched, cohort):
  return method({"algorithm.name": "scaffold", **sgd_config(0.3), "server.lr": 1.0}, model, sched, C, cohort,
                builder=True)


# "all" in the slow suite: "failures" runs the same rounds on 2 and 3 threads with the members
# that are not dropped, and the buckets test (below) a round without failures on 2 threads.
@pytest.mark.parametrize("kw", [pytest.param({}, marks=pytest.mark.slow), {"dropout": 0.4, "straggler_fraction": 0.5}],
                         ids=["all", "failures"])
def test_threads_give_the_one_thread_rounds_bit_for_bit(monkeypatch, kw):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = make_schedule(4, 3, 0, 12, 1)
  alg = _scaffold(model, sched, 8)
  one = _rounds(monkeypatch, 1, alg, params, STORE, 8, **kw)
  for threads in (2, 3):
    assert _bit_identical(_rounds(monkeypatch, threads, alg, params, STORE, 8, **kw), one)


def test_threads_with_buckets_give_the_one_thread_rounds(monkeypatch):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = make_schedule(2, 0, 2, 12, 1)
  alg = _scaffold(model, sched, 6)
  kw = dict(buckets=buckets_for(sched))
  assert _bit_identical(_rounds(monkeypatch, 2, alg, params, STORE, 6, **kw),
                        _rounds(monkeypatch, 1, alg, params, STORE, 6, **kw))


@pytest.mark.parametrize("how", [("stack", "stack"), ("mean", "mean")])
def test_threads_with_three_exchanges_give_the_one_thread_rounds(monkeypatch, how):
  from test_engine_phases import D, STORE as PSTORE, toy
  alg = toy(*how)
  n = PSTORE.counts.shape[0]
  runs = [_rounds(monkeypatch, t, alg, jnp.ones((D,)), PSTORE, n - 1, dropout=0.3) for t in (1, 2)]
  assert _bit_identical(*runs)


@pytest.mark.slow  # 20-35 s; the default suite checks the threads bit for bit on the MLP (above)
def test_threads_with_the_cnn_give_the_one_thread_rounds(monkeypatch):
  """DomainBed's MNIST CNN (the model the threads are for), 4 clients, 2 local steps, on 8x8
  images: its layers are those of 28x28 MNIST (global average pooling makes the size free),
  at a twelfth of the arithmetic, which the suite's unoptimised XLA would take minutes over."""
  rng = np.random.default_rng(0)
  store = ragged_store(sizes=(4, 4, 4, 4), dim=1, classes=10)
  store = store._replace(x=rng.random((4, 4, 8, 8, 1), dtype=np.float32))
  model = build_model(ml_collections.ConfigDict({"name": "cnn"}), (8, 8, 1), 10)
  params = model.init(jax.random.PRNGKey(0))
  sched = make_schedule(4, 2, 0, 4, 4)
  alg = method({"algorithm.name": "fedavg", **sgd_config(0.05), "server.lr": 1.0}, model, sched, 4, 4, builder=True)
  assert _bit_identical(_rounds(monkeypatch, 2, alg, params, store, 4, rounds=2),
                        _rounds(monkeypatch, 1, alg, params, store, 4, rounds=2))


def test_threads_below_one_are_refused():
  with pytest.raises(ValueError, match="threads"):
    HostLoopExecutor(jax.local_devices(), threads=0)
