"""Evaluation of every split, and model selection (Bai et al. 2024 Sec. 4).

Selection rules pick the evaluation round with the best validation `data.select_metric`
(accuracy by default; earliest on ties) and report the test metrics there; the test domain
is never used to select.
  "heldout_domain": validation on the held-out validation domain(s).
  "in_domain":      validation on the in-domain validation split of the training domains.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dg.eval.metrics import classification_metrics

SELECTION_RULES = {"heldout_domain": "heldout_val", "in_domain": "in_val"}


class Evaluator:
  """Predicts every split in fixed-size batches with one compiled program per split size,
  and scores the predictions with the dataset's own metric `metrics(pred, split) -> dict`
  (`Fold.metrics`: WILDS's CivilComments worst-group accuracy, Py150's class and method
  token accuracy), or `classification_metrics` over (domain, label) groups when None.
  Predictions are `[N]`, or `[N, T]` for a per-token model (GPT-2 on Py150).

  Under `jax.distributed` each of the P processes predicts its own 1/P of every split's
  batches on its own devices, and the predictions are gathered (`process_allgather`), so
  every split is predicted once, not once per process; each process then scores them."""

  def __init__(self, model, splits: dict, num_classes: int, batch_size: int = 512, metrics=None):
    self.num_classes = num_classes
    self.metrics = metrics
    self.splits = {k: v for k, v in splits.items() if len(v)}
    self._padded = {}
    procs, me = jax.process_count(), jax.process_index()
    self._multi = procs > 1
    for name, s in self.splits.items():
      nb = math.ceil(math.ceil(len(s) / batch_size) / procs) * procs  # batches, a multiple of the processes
      x = np.zeros((nb * batch_size,) + s.x.shape[1:], s.x.dtype)
      x[:len(s)] = s.x
      mine = nb // procs  # this process's contiguous share
      self._padded[name] = jnp.asarray(x.reshape((nb, batch_size) + s.x.shape[1:])[me * mine:(me + 1) * mine])

    @jax.jit
    def predict(params, xb):
      pred = jax.lax.map(lambda x: jnp.argmax(model.apply(params, x), -1), xb)  # [batches, B, ...]
      return pred.reshape((-1,) + pred.shape[2:])
    self._predict = predict

  def __call__(self, params) -> dict:
    if self._multi:  # this process's copy of the (replicated) parameters; its batches only
      from fedjax_dg.engine.host_state import host_value
      params = jax.tree.map(host_value, params)
    preds = {k: self._predict(params, xb) for k, xb in self._padded.items()}
    out = {}
    for k, p in preds.items():
      s = self.splits[k]
      if self._multi:  # [processes, share, ...] in process order: the split's batches in order
        from jax.experimental import multihost_utils
        p = np.asarray(multihost_utils.process_allgather(p))
        p = p.reshape((-1,) + p.shape[2:])
      p = np.asarray(p)[:len(s)]
      out[k] = (self.metrics(p, s) if self.metrics is not None
                else classification_metrics(p, s.y, s.domain, self.num_classes))
    return out


def select(records: list[dict], rule: str, test_split: str = "test", metric: str = "accuracy") -> dict | None:
  """`{"round", "val": metrics, "test": metrics}` at the round with the best validation
  `metric` (WILDS: macro_f1 for IWildCam, worst_group_accuracy for CelebA), or None when
  no record has the rule's validation split."""
  val_split = SELECTION_RULES[rule]
  best = None
  for r in records:
    v = r.get("splits", {}).get(val_split)
    if v is None or not np.isfinite(v[metric]):
      continue
    if best is None or v[metric] > best["splits"][val_split][metric]:
      best = r
  if best is None:
    return None
  return {"round": best["round"], "val": best["splits"][val_split],
          "test": best["splits"].get(test_split)}
