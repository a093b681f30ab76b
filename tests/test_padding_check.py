"""A client objective that reads the padding rows of its batch is refused when the method is
built; the library's own methods and a masked objective pass."""
import dataclasses

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import fedjax_dg
from fedjax_dg import algorithms
from fedjax_dg.algorithms.base import check_padding, make_schedule, masked_cross_entropy, padding_probe
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.defaults import default_config
from helpers import ragged_store, tiny_mlp


def _config(name):
  config = default_config()
  config.algorithm.name = name
  return config


def _build(config, store=None, num_domains=3):
  model = algorithms.model_for(config, tiny_mlp())
  return algorithms.build_algorithm(config, model, make_schedule(4, 2, 1, 12, 3), 6, 6, num_domains=num_domains,
                                    store=store)


def _unmasked_client(ctx, hp):
  def objective(params, batch, rng):  # the PyTorch habit: a mean over every row of the batch
    logits = ctx.model.apply(params, batch.x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch.y).mean(), {}
  return objective_client(lambda g, extra: objective, ctx.client_opt, ctx.sched)


def _masked_client(ctx, hp):
  def objective(params, batch, rng):
    ce = optax.softmax_cross_entropy_with_integer_labels(ctx.model.apply(params, batch.x), batch.y)
    return jnp.sum(ce * batch.mask) / jnp.maximum(jnp.sum(batch.mask), 1.0), {}
  return objective_client(lambda g, extra: objective, ctx.client_opt, ctx.sched)


@pytest.fixture
def registered():
  names = ("padmean_unmasked", "padmean_masked")
  for name, client in zip(names, (_unmasked_client, _masked_client)):
    algorithms.register(fedjax_dg.MethodSpec(name, "a test", client))
  yield names
  for name in names:
    algorithms.METHODS.pop(name)


def test_an_unmasked_mean_is_refused_in_one_line(registered):
  with pytest.raises(ValueError) as err:
    _build(_config("padmean_unmasked"), ragged_store())
  msg = str(err.value)
  assert "\n" not in msg and "'padmean_unmasked'" in msg and "batch.mask" in msg


def test_the_same_loss_with_the_mask_passes(registered):
  alg = _build(_config("padmean_masked"), ragged_store())
  assert alg.name == "padmean_masked"


def test_a_method_composed_with_another_rule_is_refused_too(registered):
  with pytest.raises(ValueError, match="padmean_unmasked.*batch.mask"):
    _build(_config("padmean_unmasked+adam"))


def test_every_library_method_passes(tiny_config):
  """Every registered method's objective (where the check reads one) ignores the padded
  rows; a run skips the check for the library's own methods, so this test is where they
  are held to it."""
  from fedjax_dg.algorithms.base import make_schedule as sched_of
  model = tiny_mlp(dim=64, classes=10)
  store = ragged_store(dim=64)._replace(x=np.zeros((6, 12, 8, 8, 1), np.float32))  # FedDG's bank needs images
  val = (np.zeros((4, 8, 8, 1), np.float32), np.zeros(4, np.int32))  # the learned rule's held-out domain
  checked = []
  for name in algorithms.ALGORITHMS:
    tiny_config.algorithm.name = name
    ctx = algorithms.context(tiny_config, algorithms.model_for(tiny_config, model), sched_of(4, 2, 1, 10, 5), 8, 8,
                             num_domains=4, store=store, heldout_val=val)
    builder = algorithms.Builder(ctx)
    client = builder._client_side(builder.hparams)
    algorithms.padding_check(name, client, builder.ctx)  # the library's own methods are checked here, not per run
    if client.objective is not None:
      checked.append(name)
  assert {"fedavg", "erm", "fedprox", "fedsam", "irm", "vrex", "coral", "mmd", "mixup", "afl", "fediir"} <= set(checked)


def test_probe_batches_differ_only_in_their_padding_rows():
  a, b = padding_probe((5,), (), num_classes=3, num_domains=4)
  np.testing.assert_array_equal(a.mask, [1, 1, 0, 0])
  for field in ("x", "y", "domain"):
    fa, fb = np.asarray(getattr(a, field)), np.asarray(getattr(b, field))
    np.testing.assert_array_equal(fa[:2], fb[:2])
    assert np.all(fa[2:] != fb[2:]), field
  assert set(np.unique(np.asarray(a.x))) | set(np.unique(np.asarray(b.x))) <= {1.0, 2.0, 3.0}
  assert np.asarray(b.y).max() < 3 and np.asarray(b.domain).max() < 4


def test_the_check_compares_the_losses_of_the_two_probes():
  """An independent reading: the unmasked mean's loss on each probe, in NumPy, differs."""
  model = tiny_mlp(dim=5)
  import jax
  params = model.init(jax.random.PRNGKey(0))
  a, b = padding_probe((5,), (), num_classes=3)
  unmasked = lambda p, batch, rng: (optax.softmax_cross_entropy_with_integer_labels(model.apply(p, batch.x),
                                                                                    batch.y).mean(), {})
  masked = lambda p, batch, rng: (masked_cross_entropy(model.apply(p, batch.x), batch.y, batch.mask), {})

  def np_ce(batch, rows):
    logits = np.asarray(model.apply(params, batch.x), np.float64)[rows]
    y = np.asarray(batch.y)[rows]
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    return float(np.mean(logz - logits[np.arange(len(y)), y]))

  assert abs(np_ce(a, slice(None)) - np_ce(b, slice(None))) > 1e-3  # the probes do tell the two apart
  assert np_ce(a, slice(0, 2)) == pytest.approx(float(masked(params, a, None)[0]), rel=1e-5)
  check_padding("masked", masked, params, (5,), num_classes=3)
  with pytest.raises(ValueError, match="'unmasked'.*batch.mask"):
    check_padding("unmasked", unmasked, params, (5,), num_classes=3)
