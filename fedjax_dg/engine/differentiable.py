"""Differentiating through federated rounds.

A round is a pure function of the round state, the data, a key and (optionally) the
per-client aggregation weights, so `jax.grad` of any loss after one or more rounds with
respect to the weights, or to an array in the state such as a hyperparameter in
`state.hparams` (learning rates, penalty weights: `with_server_lr`), is plain autodiff through the local `lax.scan`s and the server
update. Use a jitted strategy ("vmap", "chunked", "sequential").

`fedjax_dg.meta` builds on this: hypergradients through K rematerialised rounds (exact,
truncated, one-step) with respect to named hyperparameters, per-client and per-domain
aggregation weights and a shrink factor, on an outer objective that may read only
validation splits.
"""
from __future__ import annotations

from typing import Sequence

import jax

from fedjax_dg.algorithms.base import set_learning_rate


def run_rounds(round_fn, state, store, keys: Sequence[jax.Array], client_weights=None):
  """Applies `round_fn` once per key; differentiable in `state` and `client_weights`."""
  for k in keys:
    state, _ = round_fn(state, store, k, client_weights)
  return state


def with_server_lr(state, lr):
  """The round state with the server step size `eta_g` replaced by `lr`: in the run-time
  hyperparameters (`state.hparams["server"]["lr"]`) when the state has them, else in an
  injected optimizer state (`set_learning_rate`)."""
  if isinstance(state.hparams, dict) and "server" in state.hparams:
    return state._replace(hparams={**state.hparams, "server": {**state.hparams["server"], "lr": lr}})
  server = state.server
  return state._replace(server=server._replace(opt_state=set_learning_rate(server.opt_state, lr)))
