"""A method builder cannot read another run's numbers: the config it sees refuses seeds and
continuous hyperparameters (`algorithms.static_view`), so a batch can never train every run
with run 0's value while each run's config.json records its own."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from fedjax_dg import algorithms
from fedjax_dg.algorithms.base import erm_objective
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.algorithms.spec import MethodSpec, RunTimeValueError, hparam


@dataclasses.dataclass(frozen=True)
class ScaleHParams:
  c: float = hparam(1.0, "the client loss is multiplied by c", gt=0)


def _scaled(ctx, c):
  base = erm_objective(ctx.model)

  def objective(params, batch, rng):
    loss, aux = base(params, batch, rng)
    return c * loss, aux
  return objective_client(lambda g, extra: objective, ctx.client_opt, ctx.sched)


def right_client(ctx, hp):
  return _scaled(ctx, hp.c)  # the run's own value: an array read when the round runs


def wrong_client(ctx, hp):
  return _scaled(ctx, ctx.config.algorithm.toyscale.c)  # what the hazard looked like


def seeded_client(ctx, hp):
  rng = np.random.default_rng(ctx.config.seed)  # a seed read in a builder: the same hazard
  return _scaled(ctx, float(rng.uniform(0.5, 2.0)))


@pytest.fixture
def toy(monkeypatch):
  def register(client):
    monkeypatch.setitem(algorithms.METHODS, "toyscale", None)
    algorithms.register(MethodSpec("toyscale", "a test", client, ScaleHParams))
  yield register


def _config(tiny_config, c: float):
  tiny_config.algorithm.name = "toyscale"
  tiny_config.algorithm.toyscale = {"c": c}
  tiny_config.client.lr = 0.3
  tiny_config.num_rounds, tiny_config.eval_every, tiny_config.checkpoint_every = 3, 3, 0
  return tiny_config


def test_a_builder_reading_its_hyperparameter_from_the_config_fails_at_build_time(toy, tiny_config, tmp_path):
  from fedjax_dg import experiment
  toy(wrong_client)
  with pytest.raises(RunTimeValueError) as e:
    experiment.train_and_evaluate(_config(tiny_config, 2.0), str(tmp_path / "w"))
  msg = str(e.value)
  assert "\n" not in msg and "algorithm.toyscale.c" in msg and "hp" in msg
  assert not os.path.exists(tmp_path / "w" / "metrics.jsonl")  # nothing trained


def test_a_builder_reading_a_seed_fails_at_build_time(toy, tiny_config, tmp_path):
  from fedjax_dg import experiment
  toy(seeded_client)
  with pytest.raises(RunTimeValueError, match=r"^seed was read by a method's builder .*prepare"):
    experiment.train_and_evaluate(_config(tiny_config, 1.0), str(tmp_path / "w"))


def test_the_view_allows_static_fields_and_zero_tests_and_refuses_the_rest(tiny_config):
  tiny_config.client.momentum = 0.0
  tiny_config.client.weight_decay = 1e-4
  view = algorithms.static_view(tiny_config)
  assert view.num_rounds == tiny_config.num_rounds and view.model.name == tiny_config.model.name
  assert view.client.optimizer == tiny_config.client.optimizer
  assert (view.client.momentum > 0) is False and (view.client.weight_decay > 0) is True
  assert view.client.get("momentum", 0.0) == 0
  for read in (lambda: float(view.client.lr), lambda: view.server.lr * 2, lambda: view.client.lr < 0.5,
               lambda: f"{view.client.lr:.3f}", lambda: view.data.seed + 0, lambda: view.seed == 0):
    with pytest.raises(RunTimeValueError):
      read()
  with pytest.raises(AttributeError):
    view.num_rounds = 3


def _loss_at(workdir, rnd):
  recs = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  return next(r["train_loss"] for r in recs if r["round"] == rnd)


def test_a_builder_reading_hp_gives_batched_runs_equal_to_their_solo_runs(toy, tiny_config, tmp_path):
  """The right way: the batch of c = 0.5 and c = 2.0 trains each run at its own c, equal to
  the run alone (bit for bit on CPU, where the batch loops over its runs with `lax.map`);
  a batch that trained both at run 0's c would give run 1 run 0's losses."""
  import copy
  from fedjax_dg import batch, experiment
  toy(right_client)
  base = _config(tiny_config, 1.0)
  configs = []
  for c in (0.5, 2.0):
    cfg = copy.deepcopy(base)
    cfg.algorithm.toyscale.c = c
    configs.append(cfg)
  out = batch.train_and_evaluate_batch(configs, [str(tmp_path / f"b{i}") for i in range(2)])
  assert all(isinstance(o, dict) for o in out), out
  for i, cfg in enumerate(configs):
    solo = experiment.train_and_evaluate(cfg, str(tmp_path / f"s{i}"))
    assert out[i]["final"]["train_loss"] == solo["final"]["train_loss"]
    assert out[i]["final"]["splits"] == solo["final"]["splits"]
  assert _loss_at(tmp_path / "b1", 3) != _loss_at(tmp_path / "b0", 3)
