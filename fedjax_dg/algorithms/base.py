"""The algorithm contract and the pieces every algorithm shares.

An algorithm is a record of pure functions, like `optax.GradientTransformation` one
level up (see docs/concepts/algorithm-contract.md):

  server_init(rng, params)                             -> server_state
  client_init(params)                                  -> client_state   (one client)
  broadcast(server_state)                              -> broadcast      (what clients receive)
  client_update(broadcast, client_state, data, rng)    -> ClientOutput(message, state, metrics)
  server_update(server_state, aggregate)               -> server_state
  params_of(server_state)                              -> model parameters to evaluate
  client_stat, server_prepare                          (optional pre-round phase, below)

`aggregation` says what `server_update` receives:
  "mean":  the weighted mean over the cohort of the clients' messages (a pytree without
           a client axis). Because it is a sum, the engine may compute it in chunks, on
           several devices, or client by client with a carried partial sum.
  "stack": `Stacked(messages, weights)` with a leading cohort axis, for server rules that
           need every update (e.g. FedOMG's Gram matrix). Padding members have weight 0.
`weighting` is "examples" (`p_c = n_c / sum n`) or "uniform".
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dg.data.augment import to_float
from fedjax_dg.data.store import minibatch_reader
from fedjax_dg.objectives import domain_slots, slot_mask


class ClientData(NamedTuple):
  """One client's padded examples; rows `>= count` are padding.

  Every client holds `N_max` rows (the largest client's count) so that clients stack into
  one array; a full pass over a client's data (a statistic, a loss) must weight its rows by
  `mask` (or read only the first `count`).

  Attributes:
    x: inputs `[N_max, ...]` (uint8 images, floats, or token ids).
    y: labels `[N_max]` (or `[N_max, T]`: per-token labels, `IGNORE` where none).
    domain: each row's domain id `[N_max]`.
    count: the number of real rows (a scalar int); rows `>= count` are padding.
    client_id: the client's index in `[0, C)`.
    work: a straggler's share of its local work (`engine.straggler_fraction`): with
      `work = u` in [0, 1] the client takes only its first `floor(u K_c) + 1` steps that
      touch data (`real_steps`); None (or 1): all of them.
    step_cap: epoch mode: compile only the first `step_cap` steps of each epoch (a Python
      int, set by the engine inside the traced client function for local-step buckets), or
      None: all. The engine sets a cap >= `ceil(count / B)`, so the steps left out are
      exactly the no-op steps past the client's data: the same result at the cost of the
      client's own steps.
    mask: (property) `[N_max]` float, 1 for the real rows, 0 for padding.
  """
  x: jax.Array
  y: jax.Array
  domain: jax.Array
  count: jax.Array
  client_id: Any = 0
  work: Any = None
  step_cap: Any = None

  @property
  def mask(self):
    """1 for the real rows, 0 for padding."""
    return (jnp.arange(self.y.shape[0]) < self.count).astype(jnp.float32)


class Batch(NamedTuple):
  """One local step's minibatch, as a client objective `objective(params, batch, rng)` sees it.

  A batch always has `B` rows (the compiled loop's shape), so where a client's data runs
  out (the last batch of an epoch, a client smaller than `B`) some rows are padding: their
  `mask` is 0 and their values are a copy of another row. A loss must weight every
  per-example term by `mask`, e.g. `jnp.sum(ce * batch.mask) / jnp.maximum(jnp.sum(batch.mask), 1.0)`
  (`masked_cross_entropy`), never a plain `ce.mean()`; the library refuses, when a method is
  built, a client objective whose loss depends on the padded rows (`check_padding`).

  Attributes:
    x: inputs `[B, ...]`, as floats (uint8 images scaled to [0, 1]), augmented if the run augments.
    y: labels `[B]` (or `[B, T]` per-token labels).
    domain: domain ids `[B]`.
    mask: `[B]` float, 1 for real examples, 0 for padding.
    step: the local step index within the round (for annealed penalties).
  """
  x: jax.Array
  y: jax.Array
  domain: jax.Array
  mask: jax.Array
  step: Any = 0


class ClientOutput(NamedTuple):
  """What `client_update` returns.

  Attributes:
    message: sent to the server (counted for communication): `Delta_c`, or
      `(Delta_c, side_message)`.
    state: the client's new persistent state (stays on the client).
    metrics: a dict of scalars, averaged over the cohort with the aggregation's weights.
  """
  message: Any
  state: Any
  metrics: Any


class Stacked(NamedTuple):
  """The aggregate a `"stack"` server rule receives: every cohort member's message.

  Attributes:
    messages: the members' messages, each leaf with a leading cohort axis `[M, ...]`.
    weights: `[M]` aggregation weights; padding members have weight 0.
    extras: per-client side messages a rule may read (FedGA's gaps), when sent; else None.
  """
  messages: Any
  weights: jax.Array
  extras: Any = None


class Algorithm(NamedTuple):
  """The engine's contract: a record of pure functions (the module docstring lists their
  signatures; docs/concepts/algorithm-contract.md describes them in full).

  Attributes:
    name: the `algorithm.name` it was built from.
    server_init: `(rng, params) -> server_state`.
    client_init: `(params) -> client_state` of one client.
    broadcast: `(server_state) -> broadcast`, what clients receive.
    client_update: `(broadcast, client_state, data: ClientData, rng) -> ClientOutput`.
    server_update: `(server_state, aggregate) -> server_state`.
    params_of: `(server_state) -> model parameters` to evaluate.
    aggregation: what `server_update` receives: "mean" (the weighted mean of the messages)
      or "stack" (`Stacked`).
    weighting: "examples" (`p_c = n_c / sum n`) or "uniform".
    client_stat: optional pre-round phase, for methods whose local objective needs a
      cohort statistic at the current global model (FedIIR's mean head gradient): every
      sampled client computes `client_stat(broadcast, client_state, data, rng)`, the
      engine takes the uniform mean over the cohort, and `server_prepare(server_state,
      mean_stat)` runs before the round's broadcast. It costs one extra exchange per round.
    server_prepare: see `client_stat`.
    sends: what a client sends beyond the model and its update, for the communication and
      privacy table (docs/methods/index.md; Bai, Bagchi and Inouye, "Benchmarking
      Algorithms for Federated Domain Generalization", ICLR 2024, Table 12's "free of leakage").
    receives: what a client receives beyond the model.
    leaks_data: sends something computed per example (e.g. amplitude spectra).
    setup_bytes: a one-off exchange before training (FedDG's amplitude bank).
    stat_aggregation: how the pre-round stats reach `server_prepare`: "mean" (uniform over
      the real members) or "stack" (`Stacked(stats, weights)`, weight 1 per real member,
      0 for padding).
    client_report: optional post-round phase (FedLOE's stage 2: logits of every collected
      head): after `server_update`, every member computes `client_report(broadcast(new
      server_state), its new client_state, data, rng')` (`rng'` = `fold_in(rng, 1)`),
      aggregated as `report_aggregation` says ("mean" or "stack", as `stat_aggregation`),
      and `server_finish(server_state, aggregate)` ends the round. One more exchange per round.
    server_finish: see `client_report`.
    report_aggregation: see `client_report`.
  """
  name: str
  server_init: Callable
  client_init: Callable
  broadcast: Callable
  client_update: Callable
  server_update: Callable
  params_of: Callable
  aggregation: str = "mean"
  weighting: str = "examples"
  client_stat: Callable | None = None
  server_prepare: Callable | None = None
  sends: tuple[str, ...] = ()
  receives: tuple[str, ...] = ()
  leaks_data: bool = False
  setup_bytes: int = 0
  stat_aggregation: str = "mean"
  client_report: Callable | None = None
  server_finish: Callable | None = None
  report_aggregation: str = "mean"
  # Optional activity of the server step: `server_activity(server_state, aggregate,
  # new_server_state) -> {"activity/<name>": scalar}`, added to the round's metrics by the
  # engine's update phase (a composed method's `activity/rule_deviation`, `spec.compose`).
  server_activity: Callable | None = None


class ServerRule(NamedTuple):
  """How the server turns the cohort's updates `Delta_c` into new parameters.

  `init(params) -> rule_state`; `apply(rule_state, params, aggregate) -> (params, rule_state)`,
  where `aggregate` is the weighted mean of the updates (`aggregation="mean"`) or
  `Stacked(updates, weights)` (`"stack"`). FedAvg/FedOpt, FedOMG, ... are rules; any
  client objective pairs with any rule.

  Attributes:
    init: `(params) -> rule_state`.
    apply: `(rule_state, params, aggregate) -> (params, rule_state)`.
    aggregation: "mean" or "stack", what `apply` receives.
    name: the rule's name (`+<name>` in `algorithm.name`).
    needs: per-client signals the rule reads from `Stacked.extras` (FedGA's rule: the
      generalisation gap); a client side that does not provide them is refused.
    weighting: overrides the client side's weighting (FedOMG: data fractions); None keeps it.
  """
  init: Callable
  apply: Callable
  aggregation: str = "mean"
  name: str = ""
  needs: tuple[str, ...] = ()
  weighting: str | None = None


class LocalSchedule(NamedTuple):
  """Static description of a client's local loop.

  `epochs > 0`: every client makes `epochs` passes over its own data, each in a fresh
  random order and cut into `ceil(n_c / B)` batches (the last one partial), so it takes
  `epochs * ceil(n_c / B)` real steps. The compiled loop has
  `num_steps = epochs * ceil(N_max / B)` steps (`num_steps // epochs` per epoch); a step
  past the client's data in an epoch is an exact no-op.
  `epochs == 0`: exactly `num_steps` steps of `B` examples for every client, read from a
  stream of fresh permutations of its data. `passes` is the static number of
  permutations drawn.

  Attributes:
    num_steps: the compiled loop's length (local steps per round of the largest client).
    batch_size: `B`, rows per local step.
    epochs: local epochs (`> 0`), or 0 for a fixed number of steps.
    passes: the static number of permutations of a client's data drawn per round.
    unroll: `lax.scan`'s `unroll` for the local loop.
    augment: `(rng, x) -> x` on float images, applied to every training batch; None: none.
    activity: the clients record how much the method's own term acted (`activity/<name>`
      metrics, docs/activity.md); False skips every client record, the training itself
      unchanged.
  """
  num_steps: int
  batch_size: int
  epochs: int
  passes: int
  unroll: int | bool
  augment: Callable | None = None
  activity: bool = True


def make_schedule(batch_size: int, local_steps: int, local_epochs: int, n_max: int, n_min: int,
                  unroll: int | bool = 1, augment: Callable | None = None, activity: bool = True) -> LocalSchedule:
  """The local loop's `LocalSchedule`: `local_steps` steps, or `local_epochs` epochs.

  Args:
    batch_size: `B`, rows per local step.
    local_steps: steps per round for every client (`> 0`), or 0 for epochs.
    local_epochs: passes over each client's data per round (with `local_steps = 0`).
    n_max: the largest client's example count (the compiled loop's length in epoch mode).
    n_min: the smallest client's example count (the permutations a step stream needs).
    unroll: `lax.scan`'s `unroll`.
    augment: `(rng, x) -> x` on every training batch, or None.
    activity: the clients record their activity (`LocalSchedule.activity`).

  Returns:
    The `LocalSchedule`.
  """
  if local_steps > 0:
    return LocalSchedule(local_steps, batch_size, 0, math.ceil(local_steps * batch_size / n_min), unroll, augment,
                         activity)
  return LocalSchedule(local_epochs * math.ceil(n_max / batch_size), batch_size, local_epochs,
                       local_epochs, unroll, augment, activity)


def batch_indices(rng, count, n_max: int, sched: LocalSchedule):
  """Index and mask arrays `[num_steps, B]` for one client with `count` examples."""
  keys = jax.random.split(rng, sched.passes)
  valid_rows = jnp.arange(n_max) < count

  def one_perm(k):  # a uniformly random order of the first `count` rows, padding last
    return jnp.argsort(jnp.where(valid_rows, jax.random.uniform(k, (n_max,)), 2.0))

  perms = jax.vmap(one_perm)(keys)                               # [passes, N_max]
  B = sched.batch_size
  step = jnp.arange(sched.num_steps)[:, None]
  j = jnp.arange(B)[None, :]
  if sched.epochs > 0:
    per_epoch = sched.num_steps // sched.epochs
    epoch, within = step // per_epoch, (step % per_epoch) * B + j
    mask = within < count
    idx = perms[epoch, jnp.minimum(within, n_max - 1)]
  else:  # a stream of permutations: position p is example p % n of pass p // n
    pos = step * B + j
    idx = perms[jnp.minimum(pos // count, sched.passes - 1), pos % count]
    mask = jnp.ones(idx.shape, bool)
  return jnp.where(mask, idx, 0), mask.astype(jnp.float32)


def real_steps(count, sched: LocalSchedule, work=None):
  """The number of local steps that touch data, `K_c` (SCAFFOLD's K); for a straggler
  doing a share `work` of its steps (`ClientData.work`), `min(K_c, floor(work K_c) + 1)`."""
  if sched.epochs > 0:
    k = sched.epochs * ((count + sched.batch_size - 1) // sched.batch_size)
  else:
    k = jnp.asarray(sched.num_steps)
  if work is not None:
    k = jnp.minimum(k, jnp.floor(work * k).astype(jnp.int32) + 1)
  return k


def tree_sq_dist(a, b):
  """`||a - b||^2` summed over every leaf of two same-shaped pytrees."""
  return sum(jnp.sum((x - y) ** 2) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def tree_norm(tree):
  """The Euclidean norm of all of a pytree's leaves together."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def rule_deviation(old_params, new_params, mean_delta):
  """`||step - mean_delta|| / ||mean_delta||`, `step = new_params - old_params`: how far a
  server rule's step is from the plain weighted average of the updates (0 for FedAvg at
  server step 1; 1 for a step of size 0 or of twice the average). 0 when the average is 0
  (a round without reporters)."""
  step_off = jax.tree.map(lambda n, o, d: (n - o) - d, new_params, old_params, mean_delta)
  norm = tree_norm(mean_delta)
  return jnp.where(norm > 0, tree_norm(step_off) / jnp.where(norm > 0, norm, 1.0), 0.0)


def tree_where(cond, a, b):
  return jax.tree.map(lambda x, y: jnp.where(cond, x, y), a, b)


IGNORE = -100  # a per-token label no loss, penalty or statistic reads (models.text.IGNORE)


def tokens_as_examples(labels, mask, *outputs, domain=None):
  """Per-token labels `[B, T]` (Py150) seen as `B * T` examples: `(labels, mask, outputs,
  domain)` with every array flattened over its token axis, the mask 0 at padded rows and
  at `IGNORE` labels (which become class 0, never read), the domain repeated per token.
  Model outputs `[B, T, ...]` (logits, per-token features) flatten alike. So every loss,
  penalty and statistic written for one label per example reads exactly the labelled
  tokens of the real rows, token-weighted as WILDS's Py150 loss (a domain's risk is the
  mean over its labelled tokens; WILDS's CORAL also flattens features over tokens).
  One label per example: everything is returned unchanged."""
  if labels.ndim == 1:
    return labels, mask, outputs, domain
  b, t = labels.shape[:2]
  valid = (labels != IGNORE) & (mask.reshape((b,) + (1,) * (labels.ndim - 1)) > 0)
  flat = lambda a: a.reshape((b * t,) + a.shape[2:])
  outputs = tuple(flat(o) for o in outputs)
  domain = None if domain is None else jnp.repeat(domain, t)
  return flat(jnp.where(valid, labels, 0)), flat(valid.astype(mask.dtype)), outputs, domain


def example_view(batch: "Batch", *outputs):
  """`(batch', outputs')`: `tokens_as_examples` on a batch (its `x` is left as it is)."""
  y, mask, outputs, domain = tokens_as_examples(batch.y, batch.mask, *outputs, domain=batch.domain)
  return batch._replace(y=y, mask=mask, domain=domain), outputs


def slot_view(batch: "Batch", num_domains: int):
  """`(batch', S)`: the batch with each row's domain id replaced by its slot among the
  domains present (`objectives.domain_slots`, ascending id, `S = min(B, num_domains)`), for
  the per-batch penalties, which then cost O(B) whatever `num_domains` is. Rows whose id
  is outside `0..num_domains - 1` get mask 0 (the per-domain sums always ignored them).
  Apply it before `example_view`: the slots are the rows', repeated over their tokens."""
  slot, ids = domain_slots(batch.domain, batch.mask, num_domains)
  return batch._replace(domain=slot, mask=slot_mask(batch.domain, batch.mask, num_domains)), ids.shape[0]


def masked_cross_entropy(logits, labels, mask):
  """Mean cross-entropy over the real examples of a padded batch (`R_c(theta; zeta)`);
  per-token labels `[B, T]`: over the labelled tokens of the real rows (WILDS's Py150 loss).

  Args:
    logits: `[B, K]` (or `[B, T, V]`).
    labels: `[B]` integer labels (or `[B, T]`, `IGNORE` where unlabelled).
    mask: `[B]`, 1 for real rows, 0 for padding (`Batch.mask`).

  Returns:
    `sum(ce * mask) / max(sum(mask), 1)`, a scalar.
  """
  labels, mask, (logits,), _ = tokens_as_examples(labels, mask, logits)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def erm_objective(model):
  """`R_c(theta; zeta)`: the plain local objective, the masked cross-entropy of the model.

  Every client objective has the signature `objective(params, batch, rng) -> (loss,
  aux_dict)`, and its loss must weight each row by `batch.mask` (`Batch`).

  Args:
    model: the `Model`.

  Returns:
    `objective(params, batch, rng) -> (loss, {})`.
  """
  def objective(params, batch, rng):
    del rng
    return masked_cross_entropy(model.apply(params, batch.x), batch.y, batch.mask), {}
  return objective


def padding_probe(input_shape, label_shape=(), num_classes: int = 2, num_domains: int = 1) -> tuple:
  """Two batches that differ only in their padding rows, for `check_padding`.

  Each batch has four rows: the same two real rows (`mask` 1) and two padding rows
  (`mask` 0) filled with different inputs, labels and domains in the two batches. Inputs
  are integer-valued floats in {1, 2, 3} (valid pixels and valid token ids alike).

  Args:
    input_shape: the shape of one input row (`Model.input_shape`).
    label_shape: the shape of one label row: `()`, or `(T,)` for per-token labels.
    num_classes: classes of the head; labels are drawn below it.
    num_domains: domains of the data set; domain ids are drawn below it.

  Returns:
    `(batch_a, batch_b)`, two `Batch`es of four rows (NumPy arrays) with `mask = [1, 1, 0, 0]`.
  """
  rng = np.random.default_rng(0)
  real, pad_a, pad_b = (rng.integers(1, 4, (2,) + tuple(input_shape)).astype(np.float32) for _ in range(3))
  pad_b = np.where(pad_b == pad_a, pad_a % 3 + 1, pad_b)  # every padded value differs between the batches
  last_class, last_domain = max(num_classes - 1, 0), max(num_domains - 1, 0)
  labels = lambda *v: np.broadcast_to(np.asarray(v, np.int32).reshape((-1,) + (1,) * len(label_shape)),
                                      (len(v),) + tuple(label_shape))
  mask = np.asarray([1.0, 1.0, 0.0, 0.0], np.float32)
  real_y, real_d = (0, min(1, last_class)), (0, min(1, last_domain))
  batch = lambda pad, y_pad, d_pad: Batch(np.concatenate([real, pad]), labels(*real_y, y_pad, y_pad),
                                          np.asarray(real_d + (d_pad, d_pad), np.int32), mask, 0)
  return batch(pad_a, 0, 0), batch(pad_b, last_class, last_domain)


def check_padding(name: str, objective, params, input_shape, label_shape=(), num_classes: int = 2,
                  num_domains: int = 1) -> None:
  """Refuses a client objective whose loss reads the padding rows of its batch.

  The engine's batches have a fixed size, so a batch holds padding rows (`batch.mask`
  0) wherever a client's data runs out; a loss written as a plain `.mean()` over the rows
  trains on them. This evaluates `objective` on the two batches of `padding_probe` (the
  same real rows, different padding), as one compiled program for both (run eagerly, every
  primitive compiles its own program: 1.4 s against 0.16 s for an MLP at XLA's default
  level), and compares the losses: a masked objective gives equal losses (the padded terms
  are multiplied by 0), an unmasked one does not. The two losses must agree to a relative
  1e-5: an unmasked mean moves by a share of order 1/2 of a per-row loss difference, far
  beyond rounding. If either loss is not finite the check cannot tell, and passes.

  Args:
    name: the method's `algorithm.name`, for the error.
    objective: `objective(params, batch, rng) -> (loss, aux)`.
    params: concrete parameters the objective trains.
    input_shape: the shape of one input row.
    label_shape: the shape of one label row (`(T,)` for per-token labels).
    num_classes: classes of the head.
    num_domains: domains of the data set.

  Raises:
    ValueError: one line naming the method and `batch.mask`, when the loss depends on
      the padded rows.
  """
  batch_a, batch_b = padding_probe(input_shape, label_shape, num_classes, num_domains)
  rng = jax.random.PRNGKey(0)
  loss = jax.jit(lambda p, b: objective(p, b, rng)[0])  # one program for both probes, not one per primitive
  loss_a, loss_b = (float(loss(params, b)) for b in (batch_a, batch_b))
  if math.isfinite(loss_a) and math.isfinite(loss_b) and abs(loss_a - loss_b) <= 1e-5 * max(1.0, abs(loss_a)):
    return
  if not (math.isfinite(loss_a) or math.isfinite(loss_b)):
    return
  raise ValueError(f"algorithm.name={name!r}: the client objective's loss depends on the padding rows of its batch "
                   f"({loss_a:.6g} vs {loss_b:.6g} with different padding): weight every per-example term by "
                   "batch.mask (1 for real rows, 0 for padding), e.g. jnp.sum(ce * batch.mask) / "
                   "jnp.maximum(jnp.sum(batch.mask), 1.0) instead of ce.mean()")


def in_chunks(fn, x, chunk: int = 256):
  """`fn` applied to `x` in row chunks (`lax.map`), for full passes over a client's data.
  Rows are read by index (`x[rows]`), so `x` may also be a host-resident `HostRows`; the
  last chunk repeats the last row and the repeats are dropped."""
  n = x.shape[0]
  chunk = min(chunk, n)
  rows = jnp.minimum(jnp.arange(-(-n // chunk) * chunk), n - 1).reshape(-1, chunk)
  out = jax.lax.map(lambda r: fn(x[r]), rows)
  return jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:])[:n], out)


def full_pass_loss(model, params, data: ClientData, chunk: int = 256):
  """`R_c(theta)`: mean cross-entropy over all of a client's real examples (labelled
  tokens, for per-token labels). Each chunk reduces to a loss sum and a count, so the
  logits of one chunk at a time exist (`[chunk, T, V]` for a language model)."""
  n = data.y.shape[0]
  c = min(chunk, n)
  rows = jnp.arange(-(-n // c) * c).reshape(-1, c)

  def sums(r):
    keep = (r < n).astype(jnp.float32)
    r = jnp.minimum(r, n - 1)
    y, m, (logits,), _ = tokens_as_examples(data.y[r], data.mask[r] * keep, model.apply(params, data.x[r]))
    return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, y) * m), jnp.sum(m)

  total, count = jax.lax.map(sums, rows)
  return jnp.sum(total) / jnp.maximum(jnp.sum(count), 1.0)


def local_loop(carry, step_fn, data: ClientData, rng, sched: LocalSchedule):
  """The local loop as a `lax.scan` over the schedule's steps; returns `(carry, mean_loss)`.

  `step_fn(carry, batch, rng) -> (carry, loss)` is one local step (a gradient step for
  most methods; Fish's inner-outer step; GroupDRO's step with its group weights in the
  carry). A step whose batch has no real example leaves the carry unchanged (so Adam's
  moments, momentum and client state do not drift on padding).
  """
  carry, loss, _ = local_loop_recording(carry, lambda c, b, k: (*step_fn(c, b, k), {}), data, rng, sched)
  return carry, loss


def local_loop_recording(carry, step_fn, data: ClientData, rng, sched: LocalSchedule, first_step_fn=None):
  """`local_loop` for a step that also records: `step_fn(carry, batch, rng) -> (carry,
  loss, record)` with `record = {name: (value, counts)}`, `counts` 0 or 1 (whether the
  step's value enters the mean). Returns `(carry, mean_loss, {name: mean value})`, the
  mean over the steps with data that count (0 where none does).

  `first_step_fn` (same signature) takes the round's first step instead of `step_fn`, for
  a record taken once a round (`recording_step`'s gradient share): that step runs ahead of
  the scanned loop rather than behind a `lax.cond` inside it, because a conditional whose
  operands are the parameters, the batch and the gradient costs about as much as its
  branch on XLA:CPU even where the branch is not taken. A name may appear in either
  step's record or in both."""
  n_max = data.y.shape[0]
  k_order, k_steps = jax.random.split(rng)
  idx, mask = batch_indices(k_order, data.count, n_max, sched)
  if data.work is not None:  # a straggler: only its first real_steps(count, sched, work) steps with data
    real = (jnp.sum(mask, 1) > 0).astype(jnp.int32)
    mask = mask * (jnp.cumsum(real) <= real_steps(data.count, sched, data.work))[:, None]
  steps = jnp.arange(sched.num_steps)
  cap = data.step_cap
  if cap is not None and sched.epochs > 0 and cap < sched.num_steps // sched.epochs:
    per_epoch = sched.num_steps // sched.epochs  # keep each epoch's first `cap` steps (the rest are no-ops)
    steps = (jnp.arange(sched.epochs)[:, None] * per_epoch + jnp.arange(cap)[None, :]).ravel()
    idx, mask = idx[steps], mask[steps]
  step_keys = jax.vmap(lambda s: jax.random.fold_in(k_steps, s))(steps)
  read = minibatch_reader(data.x, idx)  # host-resident inputs start gathering the plan here

  def step_with(fn):
    def step(carry, inp):
      i, m, k, s, pos = inp
      x = to_float(read(i, pos))  # pos: the plan's row (= s unless capped); uint8 -> [0, 1]
      if sched.augment is not None:
        x = sched.augment(jax.random.fold_in(k, 1 << 20), x)
      new_carry, loss, record = fn(carry, Batch(x, data.y[i], data.domain[i], m, s), k)
      real = (jnp.sum(m) > 0).astype(jnp.float32)
      record = {n: (jax.lax.stop_gradient(v) * c * real, c * real) for n, (v, c) in record.items()}
      return tree_where(jnp.sum(m) > 0, new_carry, carry), (loss * jnp.sum(m), jnp.sum(m), record)
    return step

  inputs = (idx, mask, step_keys, steps, jnp.arange(steps.shape[0]))
  parts = []
  if first_step_fn is not None:
    carry, out = step_with(first_step_fn)(carry, jax.tree.map(lambda a: a[0], inputs))
    parts.append(jax.tree.map(lambda a: a[None], out))
    inputs = jax.tree.map(lambda a: a[1:], inputs)
  carry, out = jax.lax.scan(step_with(step_fn), carry, inputs, unroll=sched.unroll)
  parts.append(out)
  total = lambda arrays: jnp.sum(jnp.concatenate(arrays))  # one sum over every step, as without a first step
  losses, seen = total([p[0] for p in parts]), total([p[1] for p in parts])
  names = sorted({n for p in parts for n in p[2]})
  means = {n: total([p[2][n][0] for p in parts if n in p[2]])
              / jnp.maximum(total([p[2][n][1] for p in parts if n in p[2]]), 1.0) for n in names}
  return carry, losses / jnp.maximum(seen, 1.0), means


def gradient_step(objective, optimizer, grad_correction: Callable | None = None):
  """`step_fn` for `local_loop`: one optimizer step on `objective`, carry `(params, opt_state)`.
  `grad_correction` maps the raw gradient to the one the optimizer sees (SCAFFOLD's `- c_i + c`)."""
  grad_fn = jax.value_and_grad(objective, has_aux=True)

  def step_fn(carry, batch, rng):
    p, opt_state = carry
    (loss, _), g = grad_fn(p, batch, rng)
    if grad_correction is not None:
      g = grad_correction(g)
    updates, opt_state = optimizer.update(g, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), loss
  return step_fn


def _share(part, whole):
  return jnp.abs(part) / jnp.maximum(jnp.abs(whole), 1e-12)


def recording_step(objective, optimizer, grad_share: bool = False):
  """`gradient_step` that also records what the objective's own term did, read from the
  objective's aux: `penalty_term` (the weighted penalty, a part of the loss), `at_target`
  (1 where a scheduled weight is at its target) and `plain_grad` (the plain gradient at
  the same point and batch, for an objective that changes the gradient itself: SAM's).
  Records, per local step, those whose aux entry is present:

    penalty_loss_share   |penalty_term| / |loss|                         every step
    weight_at_target     at_target                                       every step
    penalty_grad_share   ||grad penalty_term|| / ||grad loss||           with `grad_share` only
    step_deviation       ||grad loss - plain_grad|| / ||plain_grad||     every step

  The gradient share costs one more backward pass of the penalty, so `recorded_train`
  takes it at the round's first step only (`local_loop_recording`'s `first_step_fn`).

  Args:
    objective: `objective(params, batch, rng) -> (loss, aux)`.
    optimizer: the local optax optimizer.
    grad_share: also record `penalty_grad_share` at this step.

  Returns:
    `step_fn(carry, batch, rng) -> ((params, opt_state), loss, record)`.
  """
  grad_fn = jax.value_and_grad(objective, has_aux=True)

  def step_fn(carry, batch, rng):
    p, opt_state = carry
    (loss, aux), g = grad_fn(p, batch, rng)
    record = {}
    if "penalty_term" in aux:
      record["penalty_loss_share"] = (_share(aux["penalty_term"], loss), 1.0)
      if grad_share:
        g_pen = jax.grad(lambda q: objective(q, batch, rng)[1]["penalty_term"])(p)
        record["penalty_grad_share"] = (_share(optax.tree.norm(g_pen), optax.tree.norm(g)).astype(jnp.float32), 1.0)
    if "at_target" in aux:
      record["weight_at_target"] = (aux["at_target"], 1.0)
    if "plain_grad" in aux:
      record["step_deviation"] = (relative_distance(g, aux["plain_grad"]), 1.0)
    updates, opt_state = optimizer.update(g, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), loss, record
  return step_fn


def relative_distance(a, b):
  """`||a - b|| / ||b||` over all leaves of two same-shaped pytrees (0 where `b` is 0)."""
  norm = tree_norm(b)
  return jnp.where(norm > 0, tree_norm(jax.tree.map(jnp.subtract, a, b)) / jnp.where(norm > 0, norm, 1.0), 0.0)


def recorded_train(params, opt_state, objective, optimizer, data: ClientData, rng, sched: LocalSchedule):
  """`local_train_from` on an objective whose aux says what its own term did
  (`recording_step`, the gradient share at the round's first step); returns `(params,
  opt_state, mean_loss, {"activity/<name>": mean})`. With `sched.activity` False it is
  `local_train_from` and records nothing."""
  if not sched.activity:
    return (*local_train_from(params, opt_state, objective, optimizer, data, rng, sched), {})
  (params, opt_state), loss, record = local_loop_recording(
      (params, opt_state), recording_step(objective, optimizer), data, rng, sched,
      first_step_fn=recording_step(objective, optimizer, grad_share=True))
  return params, opt_state, loss, {f"activity/{n}": v for n, v in record.items()}


PENALTY_ACTIVITY = ("penalty_loss_share", "penalty_grad_share")


def local_train(params, objective, optimizer, data: ClientData, rng, sched: LocalSchedule,
                grad_correction: Callable | None = None):
  """Local training by `optimizer` on `objective` from a fresh optimizer state (FedAvg's
  client: every round restarts momentum and Adam's moments).

  A client side that calls `local_train` itself (rather than through
  `fedavg.objective_client`) is not checked for reading padded rows: its objective must
  weight every row by `batch.mask`.

  Args:
    params: the parameters training starts from (the broadcast model).
    objective: `objective(params, batch, rng) -> (loss, aux)`.
    optimizer: the local optax optimizer.
    data: the client's padded data.
    rng: the key of the batch order and each step's randomness.
    sched: the local schedule.
    grad_correction: maps the raw gradient to the one the optimizer sees (SCAFFOLD's
      `- c_i + c`), or None.

  Returns:
    `(params, mean_loss)`: the trained parameters and the loss averaged over the real rows seen.
  """
  params, _, loss = local_train_from(params, optimizer.init(params), objective, optimizer, data, rng, sched,
                                     grad_correction)
  return params, loss


def local_train_from(params, opt_state, objective, optimizer, data: ClientData, rng, sched: LocalSchedule,
                     grad_correction: Callable | None = None):
  """Local training that continues from `opt_state` (centralised training, where one
  client's rounds are one run); returns `(params, opt_state, mean_loss)`."""
  (params, opt_state), loss = local_loop((params, opt_state), gradient_step(objective, optimizer, grad_correction),
                                         data, rng, sched)
  return params, opt_state, loss


def optimizer_values(opt_config, given=()) -> dict:
  """The run-time numbers of an optimizer config (`{optimizer, lr, momentum, b1, b2, eps,
  weight_decay}`): every float field, with the optimizers' defaults where one is absent.
  Fields named in `given` are left out (and not read)."""
  name = opt_config.get("optimizer", "sgd")
  fields = {"lr": lambda: float(opt_config.lr), "momentum": lambda: float(opt_config.get("momentum", 0.0)),
            "weight_decay": lambda: float(opt_config.get("weight_decay", 0.0)),
            "b1": lambda: float(opt_config.get("b1", 0.9)), "b2": lambda: float(opt_config.get("b2", 0.999)),
            "eps": lambda: float(opt_config.get("eps", 1e-3 if name == "yogi" else 1e-8))}
  return {k: read() for k, read in fields.items() if k not in given}


def make_optimizer(opt_config, inject: bool = False, values=None) -> optax.GradientTransformation:
  """Client or server optimizer from `{optimizer, lr, momentum, b1, b2, eps, weight_decay}`.

  `values` (optional, `optimizer_values`' keys) gives the numbers, as arrays or tracers read
  when the optimizer runs (the round state's hyperparameters); the config decides only the
  structure: the optimizer, and whether momentum (`momentum > 0`) and weight decay
  (`weight_decay > 0`) are present (0 in the config removes them; any positive value is a
  run-time value, so runs may vary it in one program).
  With `inject`, the step size is an array in the optimizer state
  (`optax.inject_hyperparams`), so it can be read, changed and differentiated
  (`set_learning_rate`).
  """
  name = opt_config.optimizer
  v = {**optimizer_values(opt_config, given=tuple(values or ())), **(values or {})}
  lr = v["lr"]
  wrap = optax.inject_hyperparams if inject else (lambda f: f)
  if name == "sgd":
    opt = wrap(optax.sgd)(learning_rate=lr, momentum=v["momentum"] if opt_config.get("momentum", 0.0) > 0 else None)
  elif name == "adam":
    opt = wrap(optax.adam)(learning_rate=lr, b1=v["b1"], b2=v["b2"], eps=v["eps"])
  elif name == "yogi":
    opt = wrap(optax.yogi)(learning_rate=lr, b1=v["b1"], b2=v["b2"], eps=v["eps"])
  else:
    raise ValueError(f"optimizer: unknown {name!r}; choose sgd, adam or yogi")
  if opt_config.get("weight_decay", 0.0) > 0:
    opt = optax.chain(optax.add_decayed_weights(v["weight_decay"], mask=decay_mask), opt)
  return opt


def decay_mask(params):
  """False at frozen batch-norm statistics (`running_mean`, `running_var`, which live in the
  parameters behind `stop_gradient`; see models/resnet.py), True elsewhere."""
  def keep(path, _):
    last = path[-1]
    return getattr(last, "key", getattr(last, "name", None)) not in ("running_mean", "running_var")
  return jax.tree_util.tree_map_with_path(keep, params)


def set_learning_rate(opt_state, lr):
  """Returns an `inject_hyperparams` optimizer state with its step size replaced by `lr`."""
  return opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": lr})


def unrolled(step: Callable, carry, xs, remat: bool = True):
  """`lax.scan(step, carry, xs)`'s final carry, each step a `jax.checkpoint` when `remat`:
  the backward pass then recomputes one step's forward at a time, so memory holds the
  carries (one per step) rather than every step's intermediates. `step(carry, x) -> (carry, _)`.
  Used for whole rounds (`fedjax_dg.meta.rounds`) and for the learned rule's replay of its last K
  aggregations (`algorithms/learned.py`)."""
  body = jax.checkpoint(step) if remat else step
  return jax.lax.scan(body, carry, xs)[0]
