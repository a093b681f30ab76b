"""`data.lodo_validation`: how a leave-one-domain-out fold validates.

"heldout_domain" (Bai et al.) holds out the next domain; "in_domain" (the FedLOE, FedOMG, FedIIR and FedDIM
papers) trains on every non-test domain and selects on its in-domain split. Fold contents are
checked against counts computed from the dataset's domain sizes."""
import os

import numpy as np
import pytest

from fedjax_dg import config as config_lib, experiment
from fedjax_dg.bench import sweep as sweep_lib
from fedjax_dg.data import splits
from fedjax_dg.data.datasets import DomainDataset


def _dataset(sizes=(40, 30, 50, 20), classes=3, seed=0):
  rng = np.random.default_rng(seed)
  xs = [rng.normal(size=(n, 4)).astype(np.float32) + d for d, n in enumerate(sizes)]
  ys = [rng.integers(0, classes, n).astype(np.int32) for n in sizes]
  return DomainDataset("toy", tuple(f"d{d}" for d in range(len(sizes))), tuple(xs), tuple(ys), classes)


def test_lodo_domains_per_rule():
  assert splits.lodo_domains(4) == [((0,), (1,)), ((1,), (2,)), ((2,), (3,)), ((3,), (0,))]
  assert splits.lodo_domains(4, "in_domain") == [((t,), ()) for t in range(4)]
  with pytest.raises(ValueError, match="lodo_validation"):
    splits.lodo_domains(4, "next")
  with pytest.raises(ValueError, match="at least 3 domains"):
    splits.lodo_domains(2)
  assert splits.lodo_domains(2, "in_domain") == [((0,), ()), ((1,), ())]


@pytest.mark.parametrize("rule", splits.LODO_VALIDATION)
def test_folds_train_on_the_rule_s_domains(rule):
  sizes = (40, 30, 50, 20)
  ds = _dataset(sizes)
  folds = splits.leave_one_domain_out(ds, validation=rule, in_val_fraction=0.1, in_test_fraction=0.0, seed=3)
  assert len(folds) == 4
  for t, f in enumerate(folds):
    held = [] if rule == "in_domain" else [(t + 1) % 4]
    train = [d for d in range(4) if d != t and d not in held]
    assert f.test_domains == (t,) and f.val_domains == tuple(held) and f.train_domains == tuple(train)
    assert set(f.test.domain) == {t} and len(f.test) == sizes[t]
    assert len(f.heldout_val) == sum(sizes[d] for d in held)
    # 90 / 10 of every training domain: round(0.1 n_d) validation rows, the rest train
    for d in train:
      n_val = int(round(0.1 * sizes[d]))
      assert int((f.in_val.domain == d).sum()) == n_val
      assert int((f.train.domain == d).sum()) == sizes[d] - n_val
    assert len(f.in_test) == 0
    # train and validation rows are disjoint and together are the training domains
    rows = lambda s: {(int(d), x.tobytes()) for d, x in zip(s.domain, s.x)}
    assert not rows(f.train) & rows(f.in_val)
    assert rows(f.train) | rows(f.in_val) == {(d, x.tobytes()) for d in train for x in ds.xs[d]}


def test_config_validates_the_rule(tiny_config):
  tiny_config.data.lodo_validation = "in_domain"
  tiny_config.data.leave_one_domain_out = True
  config_lib.validate(tiny_config)
  tiny_config.data.lodo_validation = "nearest"
  with pytest.raises(config_lib.ConfigError, match="data.lodo_validation"):
    config_lib.validate(tiny_config)
  tiny_config.data.lodo_validation = "in_domain"
  tiny_config.data.in_val_fraction = 0.0
  with pytest.raises(config_lib.ConfigError, match="in_val_fraction"):
    config_lib.validate(tiny_config)


def test_train_and_evaluate_passes_the_rule_to_its_folds(tiny_config, tmp_path, monkeypatch):
  """The experiment builds its folds with the configured rule, and the summary averages only
  the selection rules that have a validation split (no held-out domain under in_domain)."""
  seen = []

  def fake_run_fold(config, fold, workdir):
    os.makedirs(workdir, exist_ok=True)
    seen.append((fold.test_domains, fold.val_domains, len(fold.heldout_val)))
    acc = {"test": {"accuracy": 0.5 + 0.1 * fold.test_domains[0]}}
    return {"selection": {"in_domain": acc, "heldout_domain": acc if fold.val_domains else None}}
  monkeypatch.setattr(experiment, "run_fold", fake_run_fold)
  tiny_config.data.name = "spurious"
  tiny_config.data.correlations = (0.9, 0.8, 0.1)
  tiny_config.data.n_per_domain = 30
  tiny_config.data.leave_one_domain_out = True
  tiny_config.data.lodo_validation = "in_domain"
  out = experiment.train_and_evaluate(tiny_config, str(tmp_path / "a"))
  assert seen == [((t,), (), 0) for t in range(3)]
  assert set(out["selection"]) == {"in_domain"}
  assert out["selection"]["in_domain"]["test"]["accuracy"] == pytest.approx(np.mean([0.5, 0.6, 0.7]))
  seen.clear()
  tiny_config.data.lodo_validation = "heldout_domain"
  out = experiment.train_and_evaluate(tiny_config, str(tmp_path / "b"))
  assert seen == [((t,), ((t + 1) % 3,), 30) for t in range(3)]
  assert set(out["selection"]) == {"in_domain", "heldout_domain"}


def test_sweep_folds_follow_the_rule(tmp_path):
  from fedjax_dg.bench import sweep_helpers as sweep_common
  s = sweep_common.skeleton("t", str(tmp_path))
  s.base.model.name = "mlp"
  s.leave_one_domain_out = True
  s.base.data.lodo_validation = "in_domain"
  assert sweep_lib._folds(s) == [((t,), ()) for t in range(6)]  # six rotation domains
