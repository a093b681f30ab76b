"""FedLOE (seed 000): Federated DG via Locally Overfit Ensembles.

Stage 1 is FedAvg with infrequent communication: `T1` local Adam steps in total, averaged
at `|T1_sync|` synchronisation points, i.e. `fedavg` with `local_steps = T1 / |T1_sync|`
for `|T1_sync|` rounds ("Our FedAvg" of Tables 2-4 is this stage alone).

Stage 2 (App. C, Alg. 1), with the featurizer `g_theta` frozen, repeated `|T2_sync|` times:
  2.1 every client trains only its own linear head `psi_c` (SGD, from its previous head;
      all heads start from the stage-1 head) on its training split;
  2.2 every client `c'` computes the logits of every head on its tuning split
      (10% of its data), `yhat_{c', c} = g(x_{c'}^tune) psi_c`, and sends them with labels;
      the server solves eq. (11)
          phi* = argmin_phi sum_c' p_c' E_c'[CE(sum_c phi_c yhat_{c', c}, y)] + lambda r(phi)
      with `r` one of (App. C.1, clients as domains, R_c' the client's mean CE):
          irm:  sum_c' (d/dw R_c'(w * logits) at w = 1)^2
          fish: -sum_{c' != c''} <grad_phi R_c', grad_phi R_c''>
          rex:  variance over clients of R_c'
      and the new head is `psi = sum_c phi*_c psi_c` (exact: the heads are linear, so the
      combined logits are the logits of the combined head).
The server's problem is solved by `solver_steps` of Adam from uniform `phi = 1/C`
(App. C.1 gives the objective, not the solver). Fish is used in the penalty form that
App. C.1 writes (cheap here: `phi` has C entries), not DomainBed's first-order meta
update. With `lambda = 0` and no solver steps, stage 2 is plain head averaging.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import ClientData, LocalSchedule, in_chunks, local_train, masked_cross_entropy
from fedjax_dg.objectives import vrex_penalty

PENALTIES = ("none", "irm", "fish", "rex")


class Stage2State(NamedTuple):
  heads: dict      # every client's head psi_c, stacked [C, ...]
  head: dict       # the combined head psi
  phi: jax.Array   # [C] the last combination weights


def client_logits(model, featurizer_params, heads, x, chunk: int = 256):
  """`yhat[i, c] = h_{psi_c}(g(x_i))`: logits of every head on one client's rows, `[N, C, K]`."""
  z = in_chunks(lambda xb: model.module.featurizer.apply({"params": featurizer_params}, xb), x, chunk)
  return jax.vmap(lambda psi: model.head(psi, z), out_axes=1)(heads)


def per_client_losses(phi, logits, y, mask):
  """`R_c'(phi)` for every client: the mean CE of the combined logits on its tuning rows."""
  combined = jnp.einsum("c,mnck->mnk", phi, logits)
  return jax.vmap(masked_cross_entropy)(combined, y, mask)


def invariance_penalty(kind: str, phi, logits, y, mask):
  if kind == "none":
    return jnp.asarray(0.0)
  if kind == "irm":
    def scaled(w):
      return per_client_losses(w * phi, logits, y, mask)
    g = jax.jacfwd(scaled)(jnp.asarray(1.0))           # [C'] d/dw R_c' at w = 1
    return jnp.sum(g ** 2)
  if kind == "rex":
    r = per_client_losses(phi, logits, y, mask)
    return r.shape[0] * vrex_penalty(r)                 # sum_c' (R_c' - mean R)^2
  if kind == "fish":
    grads = jax.jacrev(lambda f: per_client_losses(f, logits, y, mask))(phi)   # [C', C]
    gram = grads @ grads.T
    return -(jnp.sum(gram) - jnp.trace(gram))
  raise ValueError(f"algorithm.loe_penalty: unknown {kind!r}; choose one of {PENALTIES}")


def manager_objective(phi, logits, y, mask, weights, kind: str, lam: float):
  """Eq. (11): the weighted mean of the clients' losses plus `lam * r`."""
  r = per_client_losses(phi, logits, y, mask)
  p = weights / jnp.sum(weights)
  return jnp.sum(p * r) + lam * invariance_penalty(kind, phi, logits, y, mask)


def solve_manager(logits, y, mask, weights, kind: str, lam: float, steps: int, lr: float):
  """`phi*` by Adam from the uniform combination."""
  C = logits.shape[2]
  opt = optax.adam(lr)
  phi = jnp.full((C,), 1.0 / C)
  grad = jax.grad(manager_objective)

  def step(carry, _):
    phi, st = carry
    upd, st = opt.update(grad(phi, logits, y, mask, weights, kind, lam), st)
    return (optax.apply_updates(phi, upd), st), None

  (phi, _), _ = jax.lax.scan(step, (phi, opt.init(phi)), None, length=steps)
  return phi


def combine_heads(phi, heads):
  return jax.tree.map(lambda h: jnp.tensordot(phi, h, axes=1), heads)


def make_stage2(model, sched: LocalSchedule, lr: float, kind: str, lam: float, solver_steps: int = 200,
                solver_lr: float = 0.05):
  """Returns `stage2_round(state, featurizer_params, train_store, tune_store, rng) -> state`,
  one jitted synchronisation (2.1 then 2.2) for all clients, vectorised with `vmap`."""
  if kind not in PENALTIES:
    raise ValueError(f"algorithm.loe_penalty: unknown {kind!r}; choose one of {PENALTIES}")
  opt = optax.sgd(lr)

  def train_head(featurizer_params, head, data: ClientData, rng):
    def objective(psi, batch, rng_):
      z = model.module.featurizer.apply({"params": featurizer_params}, batch.x)
      return masked_cross_entropy(model.head(psi, z), batch.y, batch.mask), {}
    head, _ = local_train(head, objective, opt, data, rng, sched)
    return head

  @jax.jit
  def stage2_round(state: Stage2State, featurizer_params, train_store, tune_store, rng):
    C = train_store.counts.shape[0]
    rngs = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(C))
    data = ClientData(train_store.x, train_store.y, train_store.domain, train_store.counts, jnp.arange(C))
    heads = jax.vmap(train_head, in_axes=(None, 0, 0, 0))(featurizer_params, state.heads, data, rngs)   # 2.1
    logits = jax.vmap(lambda x: client_logits(model, featurizer_params, heads, x))(tune_store.x)         # 2.2
    mask = (jnp.arange(tune_store.y.shape[1])[None] < tune_store.counts[:, None]).astype(jnp.float32)
    phi = solve_manager(logits, tune_store.y, mask, tune_store.counts.astype(jnp.float32), kind, lam,
                        solver_steps, solver_lr)
    return Stage2State(heads, combine_heads(phi, heads), phi)

  return stage2_round


def init_stage2(head, num_clients: int) -> Stage2State:
  heads = jax.tree.map(lambda h: jnp.broadcast_to(h, (num_clients,) + h.shape).copy(), head)
  return Stage2State(heads, head, jnp.full((num_clients,), 1.0 / num_clients))
