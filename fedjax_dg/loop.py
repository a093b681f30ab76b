"""The round loop, written once, over a program of one run or of R runs stacked.

Every run, alone or inside a batch, goes through `run(program, books, comm, params)`:
open each run's directory (resume from its newest checkpoint), train the rounds, and write
its summary. Each round of the loop does the same steps in the same order for every run:

  1. runs whose resume starts at this round join (one whose evaluation of that round was
     lost evaluates it again);
  2. at a stage's first round, the state moves to that stage (FedLOE's stage 2);
  3. the round trains (round `t` of run `r` draws the key `fold_in(k_rounds[r], t)`);
  4. the run's reporters and activity values are kept for its next record;
  5. a stop signal (SIGTERM / SIGUSR1, `fedjax_dg.stopping`) turns this round into the last,
     with a checkpoint of it;
  6. a run due for an evaluation or a checkpoint is checked for divergence first (the loss,
     then the model, then the whole round state); a diverged run stops alone with its
     one-line error, the others go on;
  7. evaluation, then checkpoint.

A program is what differs between one run and a batch (`Solo`, `Stacked`): how a round
runs, how the runs' states are stacked and picked apart, and how the splits are predicted.
"""
from __future__ import annotations

import contextlib
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjax_dg import checkpoint as ckpt_lib
from fedjax_dg import rundir
from fedjax_dg import stopping
from fedjax_dg.algorithms.base import tree_where
from fedjax_dg.data import store as store_lib
from fedjax_dg.errors import ConfigError
from fedjax_dg.eval.evaluate import Evaluator
from fedjax_dg.eval.metrics import classification_metrics
from fedjax_dg.runbook import Timing, communication, divergence, progress_val


# ----------------------------------------------------------------------------- programs

class Solo:
  """The program of one run: its stages' round functions on its own store (placed as each
  round function asks, e.g. one copy per device), evaluated by the runner's `Evaluator`.

  Args:
    prepared: the run's `plan.PreparedRun`.
    fold: its data splits.
    book: its `RunBook` (for its keys and its next stage's state).
    store: the training store on the device.
  """
  runs = 1

  def __init__(self, prepared, fold, book, store):
    self.stages, self.book = prepared.stages, book
    self.desc = "round"
    self.placed = [getattr(st.round_fn, "place", lambda x: x)(store) for st in self.stages]
    self.evaluator = Evaluator(prepared.model, fold.eval_splits(), fold.num_classes, book.config.eval_batch_size,
                               metrics=fold.metrics)

  def stack(self, states):
    return states[0]

  def pick(self, state, r: int):
    return state

  def put(self, state, r: int, one):
    return one

  def enter_stage(self, k: int, state):
    return self.book.next_stage_state(k, state)

  def round(self, k: int, state, t: int, active):
    """`(state, {metric: [value]})` after round `t` of stage `k`."""
    state, metrics = self.stages[k].round_fn(state, self.placed[k], jax.random.fold_in(self.book.k_rounds, t))
    loss = float(metrics["train_loss"])  # waits for the round: the bar times work, not dispatch
    return state, {**{name: np.asarray(v)[None] for name, v in metrics.items()}, "train_loss": np.asarray([loss])}

  def finite(self, k: int, state):
    """Per run, (model finite, round state finite), each a callable: one transfer, when asked."""
    params = self.stages[k].algorithm.params_of(state.server)
    return [lambda: ckpt_lib.all_finite(params)], [lambda: ckpt_lib.all_finite(state)]

  def scores(self, k: int, state, runs) -> dict:
    return {0: self.evaluator(self.stages[k].algorithm.params_of(state.server))}


def stack(trees):
  """The trees stacked on a new leading run axis."""
  return jax.tree.map(lambda *a: jnp.stack(a), *trees)


@jax.jit
def _take(tree, r):
  return jax.tree.map(lambda a: a[r], tree)


def pick(tree, r: int):
  """Run `r`'s slice of every leaf of the stacked `tree`: one compiled gather for the whole
  tree, not one dispatch per leaf."""
  return _take(tree, jnp.int32(r))


def put(tree, r: int, one):
  """The stacked `tree` with run `r`'s slice replaced by `one`."""
  return jax.tree.map(lambda a, x: a.at[r].set(x), tree, one)


@jax.jit
def _finite_flags(params, state):
  """Per run: whether its model parameters, and its whole round state, are finite."""
  def one(p, st):
    flag = lambda t: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(t)
                                        if jnp.issubdtype(x.dtype, jnp.inexact)] or [jnp.bool_(True)]))
    return flag(p), flag(st)
  return jax.vmap(one)(params, state)


@jax.jit
def _round_keys(k_rounds, rounds):
  """`[runs, rounds, 2]`: every run's key of every round, `fold_in(k_rounds[r], t)` (as a
  single run draws it), in one call instead of one per run and round."""
  return jax.vmap(lambda k: jax.vmap(lambda t: jax.random.fold_in(k, t))(rounds))(k_rounds)


def batched_round(round_fn, store_axis, axis: str = "vmap"):
  """`step(states, store, keys, active) -> (states, metrics)`: the round over the run axis,
  `vmap`ped or (`axis="map"`) looped with `jax.lax.map`; a run not active (waiting for its
  start, or failed) keeps its state."""
  if axis == "map":
    def step(state, store, keys, active):
      def one(x):
        st, k, a = x[:3]
        new, metrics = round_fn(st, store if store_axis is None else x[3], k)
        return tree_where(a, new, st), metrics
      return jax.lax.map(one, (state, keys, active) if store_axis is None else (state, keys, active, store))
    return jax.jit(step)

  def step(state, store, keys, active):
    new, metrics = jax.vmap(lambda st, sto, k: round_fn(st, sto, k), in_axes=(0, store_axis, 0))(state, store, keys)
    return jax.vmap(tree_where)(active, new, state), metrics
  return jax.jit(step)


class BatchEvaluator:
  """Every split's predictions for every run of a batch in one call per split (`vmap` of the
  runner's `Evaluator` prediction over the run axis, or `lax.map` of it); the data shared by
  all runs when their splits are equal, stacked per run otherwise. Metrics as `Evaluator`."""

  def __init__(self, model, folds: list, batch_size: int, axis: str = "vmap"):
    self.folds = folds
    self.shared = len(folds) == 1
    self.splits = [{k: v for k, v in f.eval_splits().items() if len(v)} for f in folds]
    self.padded = {}
    for name in self.splits[0]:
      xs = []
      for sp in self.splits:
        s = sp[name]
        nb = math.ceil(len(s) / batch_size)
        x = np.zeros((nb * batch_size,) + s.x.shape[1:], s.x.dtype)
        x[:len(s)] = s.x
        xs.append(x.reshape((nb, batch_size) + s.x.shape[1:]))
      self.padded[name] = jnp.asarray(xs[0] if self.shared else np.stack(xs))

    def predict(params, xb):
      pred = jax.lax.map(lambda x: jnp.argmax(model.apply(params, x), -1), xb)  # [batches, B, ...]
      return pred.reshape((-1,) + pred.shape[2:])
    if axis == "map":  # each run's predictions through the single run's program (`Evaluator`)
      if self.shared:
        self._predict = jax.jit(lambda params, xb: jax.lax.map(lambda p: predict(p, xb), params))
      else:
        self._predict = jax.jit(lambda params, xb: jax.lax.map(lambda a: predict(*a), (params, xb)))
    else:
      self._predict = jax.jit(jax.vmap(predict, in_axes=(0, None if self.shared else 0)))

  def __call__(self, params, runs) -> dict:
    """`{run: {split: metrics}}` for the runs `runs` of the stacked `params`."""
    preds = {k: np.asarray(self._predict(params, xb)) for k, xb in self.padded.items()}
    out = {}
    for r in runs:
      f = self.folds[0 if self.shared else r]
      sp = self.splits[0 if self.shared else r]
      res = {}
      for k, p in preds.items():
        s = sp[k]
        p = p[r][:len(s)]
        res[k] = f.metrics(p, s) if f.metrics is not None else classification_metrics(p, s.y, s.domain, f.num_classes)
      out[r] = res
    return out


class Stacked:
  """The program of R runs that share one compiled round: their states stacked on a leading
  run axis, the round looped over it (`axis="map"`, each run's arithmetic the single run's)
  or vmapped (`"vmap"`).

  Args:
    preps: each run's `plan.PreparedRun` (equal plans but for run-time values and seeds).
    folds: each run's data splits (the same object where the runs share them).
    books: each run's `RunBook`.
    store: the training store, shared, or stacked on the run axis (`store_axis=0`).
    store_axis: None (shared) or 0 (one store per run).
    axis: "map" or "vmap" (`batch.run_axis`).
  """

  def __init__(self, preps, folds, books, store, store_axis, axis: str):
    self.runs = len(books)
    self.books, self.stages = books, preps[0].stages
    self.desc = f"round (batch of {self.runs})"
    self.store = store
    self.steps = [batched_round(st.round_fn, store_axis, axis) for st in self.stages]
    same = all(f is folds[0] for f in folds)
    self.evaluator = BatchEvaluator(preps[0].model, [folds[0]] if same else list(folds),
                                    books[0].config.eval_batch_size, axis)
    total = books[0].total
    self.keys = np.asarray(_round_keys(jnp.stack([b.k_rounds for b in books]), jnp.arange(total)))

  stack = staticmethod(stack)

  def pick(self, state, r: int):
    return pick(state, r)

  def put(self, state, r: int, one):
    return put(state, r, one)

  def enter_stage(self, k: int, state):
    return stack([b.next_stage_state(k, pick(state, r)) for r, b in enumerate(self.books)])

  def round(self, k: int, state, t: int, active):
    state, metrics = self.steps[k](state, self.store, jnp.asarray(self.keys[:, t]), jnp.asarray(active))
    return state, {name: np.asarray(v) for name, v in metrics.items()}  # waits for the round

  def finite(self, k: int, state):
    return tuple(map(np.asarray, _finite_flags(jax.vmap(self.stages[k].algorithm.params_of)(state.server), state)))

  def scores(self, k: int, state, runs) -> dict:
    return self.evaluator(jax.vmap(self.stages[k].algorithm.params_of)(state.server), runs)


# ----------------------------------------------------------------------------- the loop

def train(program, books, live, starts, states, timing: Timing, quiet: bool):
  """The rounds of the live runs, from the smallest start round among them (the steps of
  the module docstring). Returns `(signal, round)` when a signal stopped them, else None."""
  R = program.runs
  plan = books[0].plan
  stages, total = books[0].stages, plan.total_rounds
  t0 = min(starts[r] for r in live)
  ref = next(r for r in live if starts[r] == t0)
  state = program.stack([states[r] if (r in live and starts[r] == t0) else states[ref] for r in range(R)])
  active = np.zeros(R, bool)
  bar = tqdm(total=total, initial=t0, desc=program.desc, dynamic_ncols=True, disable=quiet or not rundir.is_writer())
  phase = lambda what: bar.set_description(f"{program.desc} ({what})")
  compiled = set()

  def evaluate(done, k, runs, losses):
    since = time.time()
    scores = program.scores(k, state, runs)
    for r in runs:
      loss = None if losses[r] is None else float(losses[r])
      rec = books[r].record(done, k, program.pick(state, r), loss, scores[r])
      if R == 1:
        bar.set_postfix(loss=f"{loss:.3f}" if loss is not None else "-", val=progress_val(rec["splits"]))
    timing.add("eval_s", since)

  def join(t):  # runs whose own start is round t enter (and evaluate a lost evaluation again)
    nonlocal state
    new = [r for r in live if starts[r] == t and not active[r]]
    for r in new:
      if t != t0:
        state = program.put(state, r, states[r])
      active[r] = True
    again = [r for r in new if books[r].again]
    if again:  # the loss saved with the checkpoint, as the uninterrupted run recorded it
      phase("evaluating")
      evaluate(t, plan.stage_of(t), again, {r: books[r].saved_loss(t) for r in again})

  with contextlib.closing(bar), stopping.StopRequest() as stop:
    for t in range(t0, total):
      join(t)
      if not active.any() and not any(starts[r] > t for r in live):
        break  # every run failed
      k = plan.stage_of(t + 1)
      if k > 0 and t == stages[k].first:
        state = program.enter_stage(k, state)
      phase("training" if k in compiled else "compiling")
      since = time.time()
      state, metrics = program.round(k, state, t, active)
      losses = metrics["train_loss"]
      timing.add("train_s" if k in compiled else "compile_s", since)
      compiled.add(k)
      done = t + 1
      running = [r for r in range(R) if active[r]]
      for r in running:
        books[r].add_round({name: v[r] for name, v in metrics.items()})
      due = {r: books[r].checks_due(done) for r in running}
      signame = stop.requested() if done < total else None
      if signame:  # stop after this round: every running run saves it (its own checkpoint cadence aside)
        due = {r: (due[r][0], bool(books[r].config.checkpoint_every)) for r in running}
      checked = [r for r in running if any(due[r])]
      if checked:  # never evaluate or save a diverged state
        params_finite, state_finite = program.finite(k, state)
        for r in checked:
          err = divergence(float(losses[r]), params_finite[r], state_finite[r], done, books[r].config)
          if err:
            books[r].failed = FloatingPointError(err)
            books[r].close(failed=True)
            active[r] = False
      ev = [r for r in checked if active[r] and due[r][0]]
      if ev:
        phase("evaluating")
        evaluate(done, k, ev, losses)
      saves = [r for r in checked if active[r] and due[r][1]]
      if saves:
        phase("saving")
        since = time.time()
        for r in saves:
          books[r].save(done, program.pick(state, r), float(losses[r]))
        timing.add("checkpoint_s", since)
      bar.update(1)
      if signame:
        return signame, done
    else:
      join(total)  # a run already finished: its lost last evaluation
  return None


def run(program, books, initial_states, comm: dict, params, batch: list | None = None) -> list:
  """Opens every run's directory, trains, and writes each run's summary.

  Args:
    program: a `Solo` or `Stacked` program over the runs of `books`.
    books: each run's `RunBook`.
    initial_states: each run's round state at round 0.
    comm: the round's communication (`runbook.communication`).
    params: each run's initial parameters.
    batch: each run's `{"size", "index"}` inside a batch, or None for a single run.

  Returns:
    Per run, its summary dict, or the exception that ended it (`FloatingPointError` for a
    run that diverged, `ConfigError` / `ValueError` for a run directory that cannot be
    resumed).

  Raises:
    stopping.Stopped: a signal stopped the runs after a round (each saved it).
  """
  R = len(books)
  timing = Timing()
  out: list = [None] * R
  starts, states, opened = [None] * R, [None] * R, []
  try:
    for r, b in enumerate(books):
      try:
        starts[r], states[r] = b.open(initial_states[r])
        opened.append(r)
      except (ConfigError, ValueError) as e:  # this run's directory cannot be resumed; the others go on
        out[r] = e
    live = [r for r in range(R) if out[r] is None]
    quiet = all(b.config.get("quiet", False) for b in books)
    stopped = train(program, books, live, starts, states, timing, quiet) if live else None
  except BaseException:  # finish or remove the background saves, never hide the error
    for r in opened:
      books[r].close(failed=True)
    raise
  if stopped:  # every run's checkpoint of the stop round written, nothing summarised
    for r in opened:
      books[r].close()
    raise stopping.Stopped(*stopped, saved=all(bool(b.config.checkpoint_every) for b in books))
  for r in range(R):
    if out[r] is None and books[r].failed is None:
      since = time.time()
      books[r].close()
      timing.add("checkpoint_s", since)
  summary_timing = timing.summary()
  for r in range(R):
    if out[r] is None and books[r].failed is None:
      out[r] = books[r].summary(comm, params[r], summary_timing, batch=None if batch is None else batch[r])
    elif out[r] is None:
      out[r] = books[r].failed
  return out


def run_one(prepared, fold, book) -> dict:
  """One run alone (`Solo`) through `run`; raises the error that ended it."""
  params = book.initial_params()
  state = book.initial_state(params)
  store = store_lib.to_device(prepared.packed)  # aligned host arrays: placed without a copy on a CPU
  comm = communication(prepared.stages[0].algorithm, ckpt_lib.device_view(state), store, prepared.cohort,
                       book.k_rounds)
  [out] = run(Solo(prepared, fold, book, store), [book], [state], comm, [params])
  if isinstance(out, BaseException):
    raise out
  return out
