"""Classification metrics on host arrays of predictions, labels and groups."""
from __future__ import annotations

import numpy as np


def accuracy(pred, y) -> float:
  return float(np.mean(np.asarray(pred) == np.asarray(y))) if len(y) else float("nan")


def macro_f1(pred, y, classes: str = "union") -> float:
  """Unweighted mean over classes of `2 TP / (2 TP + FP + FN)`, over the classes that
  occur in the labels or the predictions (`classes="union"`, scikit-learn's
  `f1_score(average="macro")`), or in the labels only (`"labels"`, WILDS's IWildCam metric,
  `f1_score(..., labels=unique(y_true))`)."""
  pred, y = np.asarray(pred), np.asarray(y)
  if not len(y):
    return float("nan")
  f1s = []
  for k in (np.union1d(pred, y) if classes == "union" else np.unique(y)):
    tp = np.sum((pred == k) & (y == k))
    denom = 2 * tp + np.sum((pred == k) & (y != k)) + np.sum((pred != k) & (y == k))
    f1s.append(2 * tp / denom if denom else 0.0)
  return float(np.mean(f1s))


def worst_group_accuracy(pred, y, group) -> float:
  """Minimum accuracy over the groups present (`group` ids per example)."""
  pred, y, group = np.asarray(pred), np.asarray(y), np.asarray(group)
  if not len(y):
    return float("nan")
  return float(min(np.mean(pred[group == g] == y[group == g]) for g in np.unique(group)))


def classification_metrics(pred, y, domain, num_classes: int) -> dict:
  """Accuracy, macro-F1 and worst-group accuracy with groups = (domain, label) pairs."""
  group = np.asarray(domain, np.int64) * num_classes + np.asarray(y, np.int64)
  return {"accuracy": accuracy(pred, y), "macro_f1": macro_f1(pred, y),
          "macro_f1_label_classes": macro_f1(pred, y, "labels"),
          "worst_group_accuracy": worst_group_accuracy(pred, y, group), "n": int(len(y))}
