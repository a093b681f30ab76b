"""Metrics against scikit-learn / direct counts; selection never looks at the test split."""
import numpy as np
import pytest
from sklearn.metrics import f1_score

from fedjax_dg.eval.evaluate import select
from fedjax_dg.eval.metrics import accuracy, classification_metrics, macro_f1, worst_group_accuracy


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_matches_sklearn(seed):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 6, 200)
  pred = np.where(rng.random(200) < 0.6, y, rng.integers(0, 7, 200))  # includes a class absent from y
  assert macro_f1(pred, y) == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-12)
  # WILDS's IWildCam form: classes of the labels only
  assert macro_f1(pred, y, "labels") == pytest.approx(
      f1_score(y, pred, average="macro", labels=np.unique(y)), abs=1e-12)


def test_worst_group_and_accuracy_by_hand():
  y = np.array([0, 0, 1, 1, 1, 0])
  pred = np.array([0, 1, 1, 1, 0, 0])
  group = np.array([0, 0, 1, 1, 1, 2])
  assert accuracy(pred, y) == pytest.approx(4 / 6)
  assert worst_group_accuracy(pred, y, group) == pytest.approx(0.5)  # group 0: 1/2, group 1: 2/3, group 2: 1
  m = classification_metrics(pred, y, np.zeros(6, int), 2)  # groups = labels here
  assert m["worst_group_accuracy"] == pytest.approx(min(2 / 3, 2 / 3))


def _rec(r, hv, iv, te):
  split = lambda a: {"accuracy": a}
  return {"round": r, "splits": {"heldout_val": split(hv), "in_val": split(iv), "test": split(te)}}


def test_selection_uses_validation_only_and_first_best():
  recs = [_rec(1, 0.5, 0.9, 0.99), _rec(2, 0.7, 0.6, 0.1), _rec(3, 0.7, 0.95, 0.2), _rec(4, 0.6, 0.8, 0.98)]
  h = select(recs, "heldout_domain")
  assert h["round"] == 2 and h["test"]["accuracy"] == 0.1   # ties -> earliest; test never looked at
  i = select(recs, "in_domain")
  assert i["round"] == 3 and i["test"]["accuracy"] == 0.2
