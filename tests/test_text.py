"""CivilComments and Py150 in their WILDS release layouts, the tokenizer round trip, the
WILDS metrics against plain loops, errors, and CivilComments training from its config."""
import csv
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg import experiment
from fedjax_dg.data import civilcomments, py150, text, wilds
from fedjax_dg.data.splits import Split
from fedjax_dg.models import build_model
from fedjax_dg.models import text as text_models

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
import civilcomments as civil_config  # noqa: E402
import py150 as py150_config  # noqa: E402

WORDS = ("the movie was good bad awful great people they said this is not what we want kind rude idiot "
         "nice thanks terrible stupid love hate article comment agree men women gay christian muslim "
         "jewish black white").split()


# ----------------------------------------------------------------- tokenizer

def train_tokenizer(path, corpus):
  """A WordLevel tokenizer trained on the fixture text, with DistilBERT-style specials."""
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
  tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.normalizer = normalizers.Lowercase()
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
  tok.save(str(path))
  return str(path)


def comments(n, seed=0):
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, rng.integers(2, 14))) for _ in range(n)]


def test_tokenizer_round_trips_and_truncates(tmp_path):
  texts = comments(50)
  path = train_tokenizer(tmp_path / "tokenizer.json", texts)
  tok = text.load_tokenizer(path)
  ids = text.encode(tok, texts, 16)
  assert ids.dtype == np.int32 and ids.shape == (50, 16)
  cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  for t, row in zip(texts, ids):
    n = len(t.split())
    real = row[row != text.PAD]
    assert real[0] == cls and real[-1] == sep and len(real) == min(n + 2, 16)
    if n + 2 <= 16:
      assert text.decode(tok, row) == t
    else:  # truncation keeps [CLS] ... [SEP] around the first 14 words
      assert text.decode(tok, row) == " ".join(t.split()[:14])
  (tmp_path / "bad.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"bad.json: not a tokenizer.json"):
    text.load_tokenizer(str(tmp_path / "bad.json"))


# ----------------------------------------------------------------- CivilComments

HEADER = ["", "id", "comment_text", "split", "toxicity", "severe_toxicity", "obscene", "threat", "insult",
          "identity_attack", "sexual_explicit", *civilcomments.IDENTITIES, "identity_any"]


def write_civilcomments(root, n=300, seed=0, drop_split=None, drop_column=None):
  """`all_data_with_identities.csv` as WILDS ships it (an unnamed index column first)."""
  rng = np.random.default_rng(seed)
  os.makedirs(root, exist_ok=True)
  texts = comments(n, seed)
  rows, truth = [], []
  for k, t in enumerate(texts):
    split = ("train", "train", "train", "val", "test")[k % 5]
    if split == drop_split:
      split = "train"
    tox = float(rng.choice([0.0, 0.2, 0.5, 0.7, 1.0]))
    ident = [float(rng.choice([0.0, 0.0, 0.3, 0.5, 1.0])) for _ in civilcomments.IDENTITIES]
    cells = [f"{v:g}" for v in ident]
    if k % 17 == 0:
      cells[6] = ""  # an empty identity cell is "absent", as pandas' NaN >= 0.5
      ident[6] = 0.0
    rows.append([k, 1000 + k, t, split, f"{tox:g}", 0, 0, 0, 0, 0, 0, *cells, 0])
    truth.append((t, split, int(tox >= 0.5), [v >= 0.5 for v in ident]))
  header = list(HEADER)
  if drop_column:
    i = header.index(drop_column)
    header.pop(i)
    rows = [r[:i] + r[i + 1:] for r in rows]
  with open(os.path.join(root, civilcomments.FILE), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)
  return truth


def civil_config_for(root, tokenizer):
  c = civil_config.get_config()
  c.data.root, c.data.tokenizer, c.data.max_tokens = str(root), tokenizer, 12
  return c


def test_civilcomments_official_split_labels_domains_tokens(tmp_path):
  truth = write_civilcomments(tmp_path / "civilcomments_v1.0")
  tok_path = train_tokenizer(tmp_path / "tokenizer.json", [t for t, *_ in truth])
  c = civil_config_for(tmp_path / "civilcomments_v1.0", tok_path)
  fold = wilds.load_fold(c.data)
  tok = text.load_tokenizer(tok_path)
  tok.enable_truncation(12)
  for field, name in (("train", "train"), ("heldout_val", "val"), ("test", "test")):
    rows = [r for r in truth if r[1] == name]
    s = getattr(fold, field)
    assert len(s) == len(rows) and s.x.shape == (len(rows), 12)
    np.testing.assert_array_equal(s.y, [r[2] for r in rows])
    np.testing.assert_array_equal(s.meta, [r[3] for r in rows])
    # domain = (black, y): 2 * black + y
    np.testing.assert_array_equal(s.domain, [2 * r[3][6] + r[2] for r in rows])
    for (t, *_), ids in zip(rows[:20], s.x):
      want = tok.encode(t).ids
      np.testing.assert_array_equal(ids[:len(want)], want)
      assert np.all(ids[len(want):] == text.PAD)
  assert len(fold.in_val) == 0 and len(fold.in_test) == 0
  assert fold.domain_names == ("black=0,y=0", "black=0,y=1", "black=1,y=0", "black=1,y=1")
  assert fold.metrics is civilcomments.wilds_metrics and fold.num_classes == 2
  # a second load reads the token cache and never touches the tokenizer
  orig = text.load_tokenizer
  text.load_tokenizer = lambda path: (_ for _ in ()).throw(AssertionError("tokenized twice"))
  try:
    again = wilds.load_fold(c.data)
  finally:
    text.load_tokenizer = orig
  np.testing.assert_array_equal(again.test.x, fold.test.x)


def test_civilcomments_metric_is_wilds_worst_group():
  rng = np.random.default_rng(0)
  n = 400
  y = rng.integers(0, 2, n)
  ident = rng.random((n, 8)) < 0.3
  ident[:, 5] = False  # an identity with no comment: its groups are skipped
  pred = np.where(rng.random(n) < 0.7, y, 1 - y)
  out = civilcomments.wilds_metrics(pred, Split(np.zeros((n, 3)), y, np.zeros(n, np.int32), ident))
  accs = []
  for k in range(8):
    for label in (0, 1):
      members = [i for i in range(n) if ident[i, k] and y[i] == label]
      if members:
        accs.append(sum(pred[i] == y[i] for i in members) / len(members))
  assert len(accs) == 14
  assert out["worst_group_accuracy"] == pytest.approx(min(accs))
  assert out["accuracy"] == pytest.approx(np.mean(pred == y))
  assert "accuracy_other_religions_toxic" not in out and out["count_other_religions_toxic"] == 0


def test_civilcomments_errors_name_the_file(tmp_path):
  tok = train_tokenizer(tmp_path / "tokenizer.json", comments(20))
  root = tmp_path / "c"
  with pytest.raises(FileNotFoundError, match=r"data.root: no folder"):
    wilds.load_fold(civil_config_for(root, tok).data)
  write_civilcomments(root, n=40, drop_column="black")
  with pytest.raises(ValueError, match=rf"{root / civilcomments.FILE}: no column 'black'"):
    wilds.load_fold(civil_config_for(root, tok).data)
  write_civilcomments(root, n=40, drop_split="test")
  with pytest.raises(ValueError, match=rf"{root / civilcomments.FILE}: the 'test' split is empty"):
    wilds.load_fold(civil_config_for(root, tok).data)
  os.remove(root / civilcomments.FILE)
  with pytest.raises(FileNotFoundError, match=rf"{root / civilcomments.FILE}: not found"):
    wilds.load_fold(civil_config_for(root, tok).data)
  write_civilcomments(root, n=40)
  with pytest.raises(FileNotFoundError, match=r"data.tokenizer: no such file"):
    wilds.load_fold(civil_config_for(root, str(tmp_path / "missing.json")).data)


def tiny_hf_config(tmp_path, name, vocab, positions):
  cfg = ({"vocab_size": vocab, "max_position_embeddings": positions, "dim": 16, "n_layers": 1, "n_heads": 2,
          "hidden_dim": 32} if name == "distilbert" else
         {"vocab_size": vocab, "n_positions": positions, "n_embd": 16, "n_layer": 1, "n_head": 2, "n_inner": 32})
  path = tmp_path / f"{name}_config.json"
  path.write_text(json.dumps(cfg))
  return str(path)


def _civilcomments_methods():
  """Every method (and reported composition) that applies to text with DistilBERT."""
  from fedjax_dg import algorithms
  return [m for m in algorithms.ALGORITHMS if algorithms.METHODS[m.partition("+")[0]].not_for_text is None]


@pytest.mark.parametrize("method", [m if m == "fedavg" else pytest.param(m, marks=pytest.mark.slow)
                                    for m in _civilcomments_methods()])
def test_civilcomments_trains_from_its_config(tmp_path, method):
  truth = write_civilcomments(tmp_path / "civilcomments_v1.0")
  tok_path = train_tokenizer(tmp_path / "tokenizer.json", [t for t, *_ in truth])
  c = civil_config_for(tmp_path / "civilcomments_v1.0", tok_path)
  c.model.hf_config = tiny_hf_config(tmp_path, "distilbert", text.load_tokenizer(tok_path).get_vocab_size(), 12)
  c.algorithm.name = method
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every, c.quiet = 4, 2, 1, 0, True
  c.client.lr = 1e-3
  if method == "scaffold":  # SCAFFOLD's option II needs plain SGD
    c.client.optimizer, c.client.momentum = "sgd", 0.0
  summary = experiment.train_and_evaluate(c, str(tmp_path / "run"))
  assert summary["config"]["engine"]["host_store"] is True
  assert summary["domains"]["train"] == [0, 1, 2, 3] and summary["num_clients"] == (1 if method == "erm" else 4)
  sel = summary["selection"]["heldout_domain"]
  assert sel is not None and np.isfinite(sel["test"]["worst_group_accuracy"])
  # the Fold's WILDS metric (16 identity x label groups), not the (domain, label) groups
  assert "count_black_toxic" in sel["test"] and "macro_f1_label_classes" not in sel["test"]
  n_test = sum(1 for r in truth if r[1] == "test")
  assert sel["test"]["n"] == n_test
  assert_selected_on(tmp_path / "run", summary, "worst_group_accuracy")


def assert_selected_on(workdir, summary, metric):
  """The selected round is the first with the best held-out validation `metric` in metrics.jsonl
  (within the final stage of a multi-stage method)."""
  with open(workdir / "metrics.jsonl") as f:
    recs = [json.loads(line) for line in f]
  last = max(r.get("stage", 1) for r in recs)
  recs = [r for r in recs if r.get("stage", 1) == last]
  vals = [r["splits"]["heldout_val"][metric] for r in recs]
  vals = [v if np.isfinite(v) else -np.inf for v in vals]
  assert summary["selection"]["heldout_domain"]["round"] == recs[int(np.argmax(vals))]["round"]


# ----------------------------------------------------------------- Py150

SPLIT_NAMES = ("train", "IDval", "OODval", "IDtest", "OODtest")
REPOS = {"train": ["alice/web", "bob/cli", "carol/ml"], "IDval": ["alice/web", "bob/cli"],
         "IDtest": ["carol/ml", "alice/web"], "OODval": ["dave/parser"], "OODtest": ["erin/game", "frank/db"]}
L = 12


def write_py150(root, seed=0, ragged=None, unknown_repo=False):
  """The WILDS py150_v1.0 layout: processed/*_input.json, *_input_tok_type.json,
  metadata/repo_file_names/*.txt and repo_ids.csv. Chunks start with <s> = 0, end with
  </s> = 2 and right-padding with <pad> = 1 (token type -100 = masked)."""
  rng = np.random.default_rng(seed)
  os.makedirs(os.path.join(root, "processed"), exist_ok=True)
  meta = os.path.join(root, "metadata", "repo_file_names")
  os.makedirs(meta, exist_ok=True)
  repo_ids = {"alice/web": 11, "bob/cli": 4, "carol/ml": 30, "dave/parser": 7, "erin/game": 19, "frank/db": 2}
  with open(os.path.join(meta, "repo_ids.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "repo_name"])
    w.writerows([[i, r] for r, i in repo_ids.items() if not (unknown_repo and r == "frank/db")])
  truth = {}
  for s in SPLIT_NAMES:
    inputs, types, names = [], [], []
    for k in range(6):
      repo = REPOS[s][k % len(REPOS[s])]
      n = int(rng.integers(4, L - 1))
      body = [int(v) for v in rng.integers(1, 60, n)]  # 1 also occurs inside code (pad id only trails)
      toks = [0] + body + [2] + [1] * (L - n - 2)
      tt = [-100] + [int(v) for v in rng.integers(0, 7, n)] + [2] + [-100] * (L - n - 2)
      if ragged == s and k == 3:
        toks, tt = toks[:-1], tt[:-1]
      inputs.append(toks)
      types.append(tt)
      names.append(f"{repo}/src/mod_{k}.py")
    with open(os.path.join(root, "processed", f"{s}_input.json"), "w") as f:
      json.dump(inputs, f)
    with open(os.path.join(root, "processed", f"{s}_input_tok_type.json"), "w") as f:
      json.dump(types, f)
    with open(os.path.join(meta, f"{s}.txt"), "w") as f:
      f.write("\n".join(names) + "\n")
    truth[s] = (inputs, types, [repo_ids[n.split("/")[0] + "/" + n.split("/")[1]] for n in names])
  return truth


def py150_config_for(root):
  c = py150_config.get_config()
  c.data.root = str(root)
  return c


def test_py150_official_split_examples_and_domains(tmp_path):
  truth = write_py150(tmp_path / "py150_v1.0")
  fold = wilds.load_fold(py150_config_for(tmp_path / "py150_v1.0").data)
  all_repos = sorted({r for s in SPLIT_NAMES for r in truth[s][2]})
  assert fold.domain_names == tuple(f"repo_{r}" for r in all_repos)
  for field, s in (("train", "train"), ("in_val", "IDval"), ("in_test", "IDtest"), ("heldout_val", "OODval"),
                   ("test", "OODtest")):
    split = getattr(fold, field)
    inputs, types, repos = truth[s]
    assert split.x.shape == (6, L - 1) and split.y.shape == (6, L - 1)
    for k in range(6):
      toks, tt = inputs[k], types[k]
      last_real = max(i for i in range(L - 1) if toks[i] != 1)  # trailing <pad> run of the input
      for i in range(L - 1):
        assert split.x[k, i] == (toks[i] if i <= last_real else -1)
        assert split.y[k, i] == (-100 if tt[i + 1] == -100 else toks[i + 1])
        assert split.meta[k, i] == tt[i + 1]
      assert fold.domain_names[split.domain[k]] == f"repo_{repos[k]}"
  assert fold.metrics is py150.wilds_metrics
  assert fold.num_classes == 1 + max(max(t) for s in SPLIT_NAMES for t in truth[s][0])


def test_py150_metric_equals_wilds_loops():
  rng = np.random.default_rng(0)
  y = rng.integers(0, 9, (20, 7))
  tt = rng.choice([-100, 0, 1, 2, 3, 6], (20, 7))
  y[tt == -100] = -100
  pred = np.where(rng.random((20, 7)) < 0.6, y, rng.integers(0, 9, (20, 7)))
  out = py150.wilds_metrics(pred, Split(np.zeros((20, 7)), y, np.zeros(20, np.int32), tt))
  flat = lambda keep: [pred[i, j] == y[i, j] for i in range(20) for j in range(7) if keep(i, j)]
  assert out["accuracy"] == pytest.approx(np.mean(flat(lambda i, j: tt[i, j] in (0, 1))))
  assert out["overall_accuracy"] == pytest.approx(np.mean(flat(lambda i, j: y[i, j] != -100)))
  assert out["class_accuracy"] == pytest.approx(np.mean(flat(lambda i, j: tt[i, j] == 0)))
  assert out["method_accuracy"] == pytest.approx(np.mean(flat(lambda i, j: tt[i, j] == 1)))


def test_py150_errors_name_the_file(tmp_path):
  root = tmp_path / "py150_v1.0"
  write_py150(root, ragged="OODval")
  with pytest.raises(ValueError, match=rf"{root / 'processed' / 'OODval_input.json'}: example 3 has 11 tokens, "
                                       "example 0 has 12"):
    wilds.load_fold(py150_config_for(root).data)
  write_py150(root, unknown_repo=True)
  with pytest.raises(ValueError, match=r"OODtest.txt line 2: repository 'frank/db' is not in repo_ids.csv"):
    wilds.load_fold(py150_config_for(root).data)
  write_py150(root)
  with open(root / "processed" / "IDtest_input.json", "w") as f:
    json.dump([], f)
  with pytest.raises(ValueError, match=r"IDtest_input.json: the split is empty"):
    wilds.load_fold(py150_config_for(root).data)
  write_py150(root)
  os.remove(root / "processed" / "IDval_input_tok_type.json")
  with pytest.raises(FileNotFoundError, match=r"IDval_input_tok_type.json: not found"):
    wilds.load_fold(py150_config_for(root).data)
  write_py150(root)
  with open(root / "metadata" / "repo_file_names" / "train.txt", "a") as f:
    f.write("alice/web/extra.py\n")
  with pytest.raises(ValueError, match=r"train.txt: 7 file names for the 6 examples"):
    wilds.load_fold(py150_config_for(root).data)
  (root / "metadata" / "repo_file_names" / "repo_ids.csv").write_text("id,name\n1,a/b\n")
  with pytest.raises(ValueError, match=r"repo_ids.csv: no column 'repo_name'"):
    wilds.load_fold(py150_config_for(root).data)


def test_py150_gpt2_loss_on_the_fixture(tmp_path):
  """The fold feeds the tiny GPT-2: token loss finite and equal to the mean over labelled
  tokens of per-token log-softmax (computed from the model's own logits, label by label)."""
  write_py150(tmp_path / "py150_v1.0")
  fold = wilds.load_fold(py150_config_for(tmp_path / "py150_v1.0").data)
  c = py150_config.get_config()
  c.model.hf_config = tiny_hf_config(tmp_path, "gpt2", 64, 16)
  model = build_model(c.model, fold.train.x.shape[1:], fold.num_classes)
  params = model.init(jax.random.PRNGKey(0))
  logits = np.asarray(jax.jit(model.apply)(params, fold.train.x), np.float64)  # one program, not one per primitive
  loss = float(jax.jit(text_models.token_cross_entropy)(jnp.asarray(logits, jnp.float32), jnp.asarray(fold.train.y)))
  lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
  nll = [-lp[i, t, fold.train.y[i, t]] for i in range(6) for t in range(L - 1) if fold.train.y[i, t] != -100]
  assert loss == pytest.approx(np.mean(nll), rel=1e-5)


def test_per_token_labels_pack_into_client_stores(tmp_path):
  """Py150's [N, T] labels pack as [C, N_max, T]; padding rows hold only IGNORE; the host
  store's labels equal the packed store's."""
  from fedjax_dg.data.host_store import pack_clients_host
  from fedjax_dg.data.store import pack_clients
  write_py150(tmp_path / "py150_v1.0")
  tr = wilds.load_fold(py150_config_for(tmp_path / "py150_v1.0").data).train
  parts = [np.array([0, 2, 5]), np.array([1])]
  packed, host = pack_clients(tr, parts), pack_clients_host(tr, parts)
  assert packed.y.shape == (2, 3, L - 1)
  np.testing.assert_array_equal(packed.y[0], tr.y[[0, 2, 5]])
  np.testing.assert_array_equal(packed.y[1, 0], tr.y[1])
  assert np.all(packed.y[1, 1:] == -100)
  np.testing.assert_array_equal(host.y, packed.y)


def _py150_methods():
  """Every method (and reported composition) that applies to Py150 with GPT-2."""
  from fedjax_dg import algorithms
  skip = {n for n, s in algorithms.METHODS.items() if s.not_for_text is not None or s.not_for_model("gpt2")}
  return [m for m in algorithms.ALGORITHMS if m.partition("+")[0] not in skip]


def test_py150_method_list_is_what_validate_accepts(tmp_path):
  """The parametrisation below covers exactly the methods `validate` accepts on Py150."""
  from fedjax_dg import algorithms, config as config_lib
  accepted = []
  for m in algorithms.ALGORITHMS:
    c = py150_config.get_config()
    c.algorithm.name, c.workdir = m, str(tmp_path / "w")
    if m == "scaffold":
      c.client.optimizer, c.client.momentum = "sgd", 0.0
    try:
      config_lib.validate(c)
      accepted.append(m)
    except config_lib.ConfigError as e:
      assert "does not apply to" in str(e), (m, str(e))
  assert accepted == _py150_methods()
  assert {"feddg", "fedadg", "mixup", "feddim", "fedloe", "fedsr"}.isdisjoint(accepted)


@pytest.mark.parametrize("method", [m if m == "fedavg" else pytest.param(m, marks=pytest.mark.slow)
                                    for m in _py150_methods()])
def test_py150_trains_from_its_config(tmp_path, method):
  """Two rounds from configs/py150.py on the fixture; the summary reports WILDS's Py150
  metrics (class/method and overall token accuracy) and selects on `data.select_metric`."""
  write_py150(tmp_path / "py150_v1.0")
  c = py150_config_for(tmp_path / "py150_v1.0")
  c.model.hf_config = tiny_hf_config(tmp_path, "gpt2", 64, 16)
  c.algorithm.name = method
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every, c.quiet = 2, 2, 1, 0, True
  c.partition.lam = 1.0  # each client holds all three training repositories: the DG penalties are on
  c.client.lr = 1e-3
  if method == "scaffold":  # SCAFFOLD's option II needs plain SGD
    c.client.optimizer, c.client.momentum = "sgd", 0.0
  summary = experiment.train_and_evaluate(c, str(tmp_path / "run"))
  assert summary["config"]["engine"]["host_store"] is True
  fold = wilds.load_fold(c.data)
  sel = summary["selection"]["heldout_domain"]
  assert sel is not None and sel["test"]["n_tokens"] == int(np.sum(fold.test.y != text_models.IGNORE))
  assert sel["test"]["n_class_method_tokens"] == int(np.isin(fold.test.meta, (0, 1)).sum())
  assert np.isfinite(summary["final"]["train_loss"])
  assert_selected_on(tmp_path / "run", summary, "accuracy")


def test_evaluator_scores_with_the_folds_wilds_metric(tmp_path):
  """`Evaluator(..., metrics=fold.metrics)` on Py150 (per-token predictions, batches of 4
  over 6 examples) equals WILDS's metric counted in a loop over per-example argmaxes."""
  from fedjax_dg.eval.evaluate import Evaluator
  write_py150(tmp_path / "py150_v1.0")
  fold = wilds.load_fold(py150_config_for(tmp_path / "py150_v1.0").data)
  c = py150_config.get_config()
  c.model.hf_config = tiny_hf_config(tmp_path, "gpt2", 64, 16)
  model = build_model(c.model, fold.train.x.shape[1:], fold.num_classes)
  params = model.init(jax.random.PRNGKey(3))
  out = Evaluator(model, fold.eval_splits(), fold.num_classes, batch_size=4, metrics=fold.metrics)(params)
  assert set(out) == {"in_val", "in_test", "heldout_val", "test"}
  for name, split in fold.eval_splits().items():
    pred = np.stack([np.argmax(np.asarray(model.apply(params, split.x[i:i + 1]))[0], -1) for i in range(len(split))])
    hits = {"cm": [], "all": []}
    for i in range(len(split)):
      for t in range(split.y.shape[1]):
        if split.y[i, t] != text_models.IGNORE:
          hits["all"].append(pred[i, t] == split.y[i, t])
          if split.meta[i, t] in (0, 1):
            hits["cm"].append(pred[i, t] == split.y[i, t])
    assert out[name]["overall_accuracy"] == pytest.approx(np.mean(hits["all"]))
    assert out[name]["accuracy"] == pytest.approx(np.mean(hits["cm"]) if hits["cm"] else 0.0)
    assert out[name]["n_tokens"] == len(hits["all"])
