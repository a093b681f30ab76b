"""How stored inputs reach the model: uint8 images, training augmentation, WILDS folds."""
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dg import experiment
from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.data import augment
from fedjax_dg.data.store import ClientStore
from fedjax_dg.engine import init_round_state, make_round
from fedjax_dg.models import build_model
from helpers import method, sgd_config, tree_max_diff
from test_folders import write_folder
from test_wilds import write_iwildcam


def _image_store(seed=0, clients=4, n=10, size=8):
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 256, (clients, n, size, size, 3)).astype(np.uint8)
  y = rng.integers(0, 3, (clients, n)).astype(np.int32)
  counts = np.array([n, n - 3, n - 1, n - 5][:clients], np.int32)
  return ClientStore(x, y, np.zeros_like(y), counts)


def _rounds(store, sched, rounds=2):
  model = build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (16,)}), store.x.shape[2:], 3)
  alg = method({**sgd_config(0.1), "server.lr": 1.0}, model, sched, store.num_clients)
  state = init_round_state(alg, None, model.init(jax.random.PRNGKey(0)), store.num_clients)
  rf = make_round(alg, store.num_clients, store.num_clients, "vmap")
  st = jax.tree.map(jnp.asarray, store)
  for t in range(rounds):
    state, _ = rf(state, st, jax.random.PRNGKey(t))
  return state.server.params


def test_uint8_images_train_exactly_like_their_float_copy():
  """A uint8 store is read as x / 255 everywhere: same parameters as a float32 store."""
  st = _image_store()
  sched = make_schedule(4, 0, 1, 10, 5)
  p8 = _rounds(st, sched)
  pf = _rounds(st._replace(x=st.x.astype(np.float32) / 255.0), sched)
  assert tree_max_diff(p8, pf) < 1e-6


def test_augmentation_runs_in_the_local_step():
  st = _image_store(seed=1)
  plain = make_schedule(4, 0, 1, 10, 5)
  ident = make_schedule(4, 0, 1, 10, 5, augment=lambda rng, x: x)
  aug = make_schedule(4, 0, 1, 10, 5, augment=lambda rng, x: augment.augment(rng, x, augment.DOMAINBED))
  p0 = _rounds(st, plain, 1)
  assert tree_max_diff(p0, _rounds(st, ident, 1)) == 0.0          # the hook itself changes nothing
  pa, pb = _rounds(st, aug, 1), _rounds(st, aug, 1)
  assert tree_max_diff(pa, pb) == 0.0                               # deterministic per round key
  assert tree_max_diff(p0, pa) > 1e-4                               # and it does augment


def test_image_folder_with_augmentation_trains_end_to_end(tiny_config, tmp_path):
  root = write_folder(tmp_path / "pacs")
  c = tiny_config
  c.data.name, c.data.root, c.data.image_size, c.data.augment = "image_folder", str(root), 8, True
  c.data.test_domains, c.data.val_domains = (2,), (1,)
  c.model.name = "cnn"
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every = 2, 1, 1, 0
  c.client.batch_size = 2
  out = experiment.train_and_evaluate(c, str(tmp_path / "run"))
  assert np.isfinite(out["final"]["train_loss"])
  assert out["domains"]["names"] == ["art_painting", "photo", "sketch"]


def test_wilds_runs_from_the_config_and_selects_on_its_key_metric(tiny_config, tmp_path):
  root = write_iwildcam(str(tmp_path / "iwildcam_v2.0"))
  c = tiny_config
  c.data.name, c.data.dataset, c.data.root, c.data.select_metric = "wilds", "iwildcam", root, "macro_f1"
  c.model.hidden = (8,)
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every = 2, 3, 1, 0
  c.client.batch_size = 2
  out = experiment.train_and_evaluate(c, str(tmp_path / "run"))
  recs = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
  for rule, split in (("heldout_domain", "heldout_val"), ("in_domain", "in_val")):
    best = max(r["splits"][split]["macro_f1"] for r in recs)
    assert out["selection"][rule]["val"]["macro_f1"] == best
