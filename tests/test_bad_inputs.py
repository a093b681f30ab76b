"""Bad inputs and faults and the one line each gets, as a generated table.

`CASES` lists them. Each case runs in a fresh temporary folder and returns the line the user
sees; it passes when that line is one line and contains the case's `expect` fragment (a
case that raises nothing, or the wrong kind of error, fails). The table of every case and
its line, `docs/bad_inputs.md`, is generated from the results and compared here, so it
cannot go stale; after changing a case or a message, regenerate it with

    REGENERATE_BAD_INPUTS=1 python -m pytest -q -p no:xdist tests/test_bad_inputs.py

Adding a case: decorate a function of a `pathlib.Path` (its temporary folder) with
`@case(item, name, trigger, expect)` anywhere below `case`; the table orders cases by group
item, then by their place in this file. A case given a `section` (the run directory,
untrusted files, config fields, config files, sweeps, data files) shows it in place of
the item. Helpers for the function body:

- `cli(tmp, *overrides, config=...)`: runs `python -m fedjax_dg` with the table's `P`
  (`configs/default.py`, MLP, 4 clients, 4 rounds, no checkpoints, workdir `tmp/W`) plus
  `overrides`; checks exit status 2 and exactly one line on stderr, and returns it. It runs
  in a child forked from one Python that has imported the package already (`forkserver`:
  its own process, exit status and stderr, without the seconds of imports); `fresh=True`
  starts a fresh interpreter instead, as a shell does (a few cases keep that path checked).
- `script(tmp, path, *args)`: the same for any script of the repository.
- `error_of(fn)`: the message of the error `fn()` raises, which must be one the CLI prints
  as its one line (a ValueError, `config.ConfigError` included, an OSError or a
  FloatingPointError).
- `warning_of(fn)`: the one warning `fn()` emits (it must run to the end).

Paths under the case's folder read `<tmp>` in the table, hex digests `<digest>`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import re
import subprocess
import sys
import warnings
from typing import Callable

import ml_collections
import numpy as np
import pytest

import forkserver
import helpers

# One xdist worker runs this module (`make test` passes `--dist loadgroup`), so each case runs
# once: the per-case tests and the table test share `_RESULTS`.
pytestmark = pytest.mark.xdist_group("bad_inputs")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "bad_inputs.md")
REGENERATE = "REGENERATE_BAD_INPUTS=1 python -m pytest -q -p no:xdist tests/test_bad_inputs.py"
# The table's `P`, without the workdir (each case gets its own).
P = ("--config.model.name=mlp", "--config.num_clients=4", "--config.num_rounds=4", "--config.checkpoint_every=0")


@dataclasses.dataclass(frozen=True)
class Case:
  item: int                          # the case's item number in the table
  name: str                          # what is wrong
  trigger: str                       # how the case provokes it (markdown)
  expect: str                        # a fragment the line must contain
  run: Callable[..., str]            # tmp folder -> the line the user sees
  outcome: str = "error"             # "error": refused; "warning": goes on after one line; "works": no message
  group: int = 13                    # the table the case belongs to (11: text datasets)
  section: str = ""                  # shown instead of the item: the run directory, untrusted files, ...


CASES: list[Case] = []


def case(item: int, name: str, trigger: str, expect: str, outcome: str = "error", group: int = 13,
         section: str = ""):
  """Registers the decorated function as a case (see the module docstring)."""
  def register(fn):
    if any(c.name == name for c in CASES):
      raise ValueError(f"two bad-input cases named {name!r}")
    CASES.append(Case(item, name, trigger, expect, fn, outcome, 26 if section else group, section))
    return fn
  return register


# ----------------------------------------------------------------------------- helpers

def _one_line(text: str, what: str) -> str:
  assert text and "\n" not in text.strip("\n"), f"{what} is not one line: {text!r}"
  return text.strip("\n")


# Most command lines run in children forked from one Python that has imported the package
# (`forkserver`: each its own process, exit status and stderr, without the seconds of
# imports); the cases given `fresh=True` start a fresh interpreter, as a user's shell does.
# What the children find imported: the libraries and the package's modules that define no
# command-line flag (each command line's flags are those a fresh interpreter has).
_PREIMPORTS = ("numpy", "jax", "jax.numpy", "flax.linen", "optax", "ml_collections.config_flags", "absl.app",
               "fedjax_dg.config", "fedjax_dg.algorithms", "fedjax_dg.data.datasets", "fedjax_dg.models")
_SERVER: list = []  # the module's fork server, started on first use, closed by `_fork_server`
_CAPPED: list = []  # the same under test_bounded_readers.MEMORY_CAP, for `bench report` (`_report_results`)


def _env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=helpers.pythonpath(ROOT),  # this checkout's package
              FEDJAX_DG_COMPILATION_CACHE="off")  # a case's limits (ulimit -f) reach only its own files


@pytest.fixture(scope="module", autouse=True)
def _fork_server():
  yield
  for servers in (_SERVER, _CAPPED):
    while servers:
      servers.pop().close()


def _run(tmp, argv, fresh=False, timeout=300) -> str:
  """`argv` (`python -m MODULE ...` or `python SCRIPT ...`): checks exit status 2 and one
  stderr line, and returns it."""
  if fresh:
    out = subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    code, err = out.returncode, out.stderr
  else:
    assert argv[0] == sys.executable, argv
    module = argv[1] == "-m"
    target, args = (argv[2], argv[3:]) if module else (argv[1], argv[2:])
    if not _SERVER:
      _SERVER.append(forkserver.ForkServer(_env(), ROOT, _PREIMPORTS))
    code, _, err = _SERVER[0].run(target, args, module, timeout)
  assert code == 2, f"exit status {code}, expected 2; stderr: {err[-2000:]}"
  return _one_line(err, "stderr")


def cli(tmp, *overrides, config="configs/default.py", fresh=False) -> str:
  """`python -m fedjax_dg --config CONFIG P... --config.workdir=tmp/W OVERRIDES...`: its one stderr line."""
  return _run(tmp, [sys.executable, "-m", "fedjax_dg", "--config", config, *P,
                    f"--config.workdir={tmp}/W", *overrides], fresh)


def script(tmp, path, *args, fresh=False) -> str:
  """`python PATH ARGS...` (relative to the repository): its one stderr line."""
  return _run(tmp, [sys.executable, os.path.join(ROOT, path), *args], fresh)


# What `fedjax_dg.main` prints as its one line (`config.ConfigError` is a ValueError).
CLI_ERRORS = (ValueError, OSError, FloatingPointError)


def error_of(fn) -> str:
  try:
    fn()
  except CLI_ERRORS as e:
    return _one_line(str(e), f"{type(e).__name__} message")
  raise AssertionError("no error was raised")


def warning_of(fn) -> str:
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    fn()
  mine = [w for w in record if issubclass(w.category, UserWarning)]
  assert len(mine) == 1, f"expected one warning, got {[str(w.message) for w in mine]}"
  return _one_line(str(mine[0].message), "warning")


def _normalise(line: str, tmp) -> str:
  line = line.replace(str(tmp), "<tmp>").replace(ROOT, "<repo>")
  return re.sub(r"\b[0-9a-f]{16,40}\b", "<digest>", line)


# ----------------------------------------------------------------------------- fixtures on disk

def _idx_dir(root, labels):
  """MNIST-format files: 9 train and 3 t10k random images with `labels`."""
  import struct
  os.makedirs(root, exist_ok=True)
  images = np.random.default_rng(0).integers(0, 256, (len(labels), 28, 28), dtype=np.uint8)
  labels = np.asarray(labels, np.uint8)

  def write(name, a):
    with open(os.path.join(root, name), "wb") as f:
      f.write(bytes([0, 0, 8, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes())
  write("train-images-idx3-ubyte", images[:9])
  write("train-labels-idx1-ubyte", labels[:9])
  write("t10k-images-idx3-ubyte", images[9:])
  write("t10k-labels-idx1-ubyte", labels[9:])
  return str(root)


def _image_folder(root):
  from PIL import Image
  for d in ("art", "photo"):
    for c, colour in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
      os.makedirs(root / d / c, exist_ok=True)
      Image.new("RGB", (9, 7), colour).save(root / d / c / "img0.png")
  return root


def _folder_config(root):
  return ml_collections.ConfigDict({"name": "image_folder", "root": str(root), "image_size": 8, "seed": 0,
                                    "num_workers": 1})


def _wilds_config(root, dataset):
  return ml_collections.ConfigDict({"name": "wilds", "dataset": dataset, "root": str(root), "image_size": 8,
                                    "seed": 0, "num_workers": 1})


# ----------------------------------------------------------------------------- item 8: labels

@case(8, "IDX label outside the classes", "`P --config configs/rotated_mnist.py --config.data.path=D` where "
      "`D/train-labels-idx1-ubyte` holds a 255", "train-labels-idx1-ubyte: label 255 at index 4 lies outside [0, 10)")
def _(tmp):
  labels = [3, 1, 4, 1, 255, 9, 2, 6, 5, 3, 5, 8]
  return cli(tmp, f"--config.data.path={_idx_dir(tmp / 'mnist', labels)}", config="configs/rotated_mnist.py")


@case(8, "WILDS label -1", "`wilds.load_fold` of an IWildCam `metadata.csv` whose row 3 has `y=-1`",
      "metadata.csv row 3: column 'y' holds -1, outside [0, 182)")
def _(tmp):
  from fedjax_dg.data import wilds
  from PIL import Image
  root = tmp / "iwildcam_v2.0"
  os.makedirs(root / "train")
  rows = [("train", 0, 0), ("train", -1, 1), ("val", 1, 2), ("test", 2, 3)]
  with open(root / "metadata.csv", "w") as f:
    f.write("split,location_remapped,y,filename\n")
    for k, (split, y, loc) in enumerate(rows):
      Image.new("RGB", (5, 5)).save(root / "train" / f"{k}.jpg")
      f.write(f"{split},{loc},{y},{k}.jpg\n")
  return error_of(lambda: wilds.load_fold(_wilds_config(root, "iwildcam")))


@case(8, "label outside the classes (any loader)", "a loader returns a `DomainDataset` with 3 classes and a label 3",
      "toy: domain 'b': label 3 at index 1 lies outside [0, 3)")
def _(tmp):
  from fedjax_dg.data.datasets import DomainDataset
  x = np.zeros((2, 4), np.float32)
  return error_of(lambda: DomainDataset("toy", ("a", "b"), (x, x), (np.array([0, 2]), np.array([1, 3])), 3))


@case(8, "`data.correlations` outside [0, 1]", "`P --config.data.name=spurious --config.data.correlations=(0.9,1.5)`",
      "data.correlations must lie in [0, 1] (one per domain), got 1.5")
def _(tmp):
  return cli(tmp, "--config.data.name=spurious", "--config.data.correlations=(0.9,1.5)")


# ----------------------------------------------------------------------------- item 9: files

def _corrupt_cache(tmp, suffix, corrupt):
  from fedjax_dg.data import folders
  root = _image_folder(tmp / "PACS")
  folders.load(_folder_config(root))
  entry = next((root / ".fedjax_dg_cache" / "8").glob(f"art-*{suffix}"))
  corrupt(entry)
  return warning_of(lambda: folders.load(_folder_config(root)))


@case(9, "corrupt decode cache `.npy`", "an image folder's cached `.npy` cut to 100 bytes, then loaded again",
      "npy: corrupt image cache (", outcome="warning")
def _(tmp):
  return _corrupt_cache(tmp, ".npy", lambda p: p.write_bytes(p.read_bytes()[:100]))


@case(9, "corrupt decode cache manifest", "an image folder's cache manifest (`.json`) cut short, then loaded again",
      "json: corrupt image cache manifest (", outcome="warning")
def _(tmp):
  return _corrupt_cache(tmp, ".json", lambda p: p.write_text(p.read_text()[:20]))


@case(9, "CSV with a byte-order mark", "CelebA's two tables saved as UTF-8 with BOM (Excel's \"CSV UTF-8\")",
      "read as without the mark", outcome="works")
def _(tmp):
  from fedjax_dg.data import wilds
  root = tmp / "celeba"
  os.makedirs(root / "img_align_celeba")
  names = [f"{k:06d}.jpg" for k in range(1, 5)]
  with open(root / "list_attr_celeba.csv", "w", encoding="utf-8-sig") as f:
    f.write("image_id,Blond_Hair,Male\n" + "".join(f"{n},{(-1, 1)[k % 2]},{(-1, 1)[k // 2]}\n"
                                                   for k, n in enumerate(names)))
  with open(root / "list_eval_partition.csv", "w", encoding="utf-8-sig") as f:
    f.write("image_id,partition\n" + "".join(f"{n},{k % 3}\n" for k, n in enumerate(names)))
  table = wilds.read_table(_wilds_config(root, "celeba"))
  assert list(table.y) == [0, 1, 0, 1] and list(table.domain) == [0, 0, 1, 1]
  return f"{len(table.y)} rows, labels and domains read as without the mark"


@case(9, "torchvision converter on a bad file", "`python scripts/convert_torchvision_weights.py bad.pth out.npz` "
      "with `bad.pth` holding `hello`", "bad.pth: cannot read weights (")
def _(tmp):
  (tmp / "bad.pth").write_bytes(b"hello")
  return script(tmp, "scripts/convert_torchvision_weights.py", str(tmp / "bad.pth"), str(tmp / "out.npz"), fresh=True)


# ----------------------------------------------------------------------------- items 10-12

@case(10, "image folder with a symlink loop", "`ln -s D/art/dog D/art/dog/loop`, then load `D`",
      "loop: not following the directory link to <tmp>/PACS/art/dog: it leads back into <tmp>/PACS",
      outcome="warning")
def _(tmp):
  from fedjax_dg.data import folders
  root = _image_folder(tmp / "PACS")
  os.symlink(root / "art" / "dog", root / "art" / "dog" / "loop")
  loaded = []
  line = warning_of(lambda: loaded.append(folders.load(_folder_config(root))))
  assert [len(y) for y in loaded[0].ys] == [2, 2]  # each image once (the loop made it 1 + 40)
  return line


def _evil_pth(path, size, stride, storage):
  from test_resnet import write_torch_zip  # a torch.save writer without torch
  write_torch_zip(str(path), {"0": np.ones(storage, np.float32)}, {"conv1.weight": ("0", 0, size, stride)})
  return str(path)


@case(11, "`.pth` with stride 0", "a `.pth` of under 1 KB whose `conv1.weight` is `(2**26,)` elements with stride 0 "
      "(it allocated 256 MiB; `(2**28,)`: 1 GiB)", "stride 0 in dimension 0 (size 67108864); strides must be positive")
def _(tmp):
  from fedjax_dg.models import convert
  path = _evil_pth(tmp / "evil.pth", (2 ** 26,), (0,), 1)
  assert os.path.getsize(path) < 1000
  return error_of(lambda: convert.read_state_dict(path))


@case(11, "`.pth` view larger than its storage", "a `.pth` whose `conv1.weight` is a `(100, 100)` view, strides "
      "`(1, 1)`, of 100 elements", "a view of 10000 elements (size (100, 100)) on a storage of 100 elements")
def _(tmp):
  from fedjax_dg.models import convert
  path = _evil_pth(tmp / "overlap.pth", (100, 100), (1, 1), 100)
  return error_of(lambda: convert.read_state_dict(path))


@case(12, "FedDG with `engine.host_store=True`", "`feddg.amplitude_bank` of a host store (`store.x[c, rows]`); "
      "test_host_store_methods.py runs FedDG end to end", "equals the packed store's", outcome="works")
def _(tmp):
  from fedjax_dg.algorithms.feddg import amplitude_bank
  from fedjax_dg.data.host_store import pack_clients_host
  from fedjax_dg.data.splits import Split
  from fedjax_dg.data.store import pack_clients
  rng = np.random.default_rng(0)
  split = Split(rng.random((20, 6, 6, 1)).astype(np.float32), np.zeros(20, np.int32), np.zeros(20, np.int32))
  parts = [np.arange(0, 12), np.arange(12, 20)]
  got, want = amplitude_bank(pack_clients_host(split, parts), 3), amplitude_bank(pack_clients(split, parts), 3)
  assert got.shape == want.shape == (2, 3, 6, 6, 1)
  return "the amplitude bank equals the packed store's" if np.array_equal(got, want) else "the banks differ"


# ----------------------------------------------------------------------------- items 1-6: resume and checkpoints

def _p_config(tmp, **fields):
  """The table's `P` as a config object (workdir `tmp/W`), with `fields` set."""
  from fedjax_dg.bench.sweep import load_config_file, set_path
  c = load_config_file(os.path.join(ROOT, "configs", "default.py"))
  for path, v in {"model.name": "mlp", "num_clients": 4, "num_rounds": 4, "checkpoint_every": 0,
                  "workdir": f"{tmp}/W", **fields}.items():
    set_path(c, path, v)
  return c


@case(1, "resume with no checkpoint", "`P --config.num_rounds=6 --config.eval_every=2`, then the same with "
      "`--config.resume=True --config.client.lr=1e6` (metrics.jsonl was emptied); metrics.jsonl is unchanged",
      "client.lr: 0.1 in the run, 1000000.0 now")
def _(tmp):
  from fedjax_dg import experiment
  experiment.train_and_evaluate(_p_config(tmp, num_rounds=6, eval_every=2, quiet=True))  # the run resumed below
  before = (tmp / "W" / "metrics.jsonl").read_bytes()
  assert len(before.splitlines()) == 3
  line = cli(tmp, "--config.num_rounds=6", "--config.eval_every=2", "--config.resume=True", "--config.client.lr=1e6")
  assert (tmp / "W" / "metrics.jsonl").read_bytes() == before
  return line


@case(2, "resume with another config", "a run of `P` with `num_clients=8` stopped after its first evaluation, "
      "resumed as `P --config.resume=True` (4 clients)", "num_clients: 8 in the run, 4 now")
def _(tmp):
  from fedjax_dg import rundir
  os.makedirs(tmp / "W")
  rundir.write_run_config(_p_config(tmp, num_clients=8), str(tmp / "W"))
  (tmp / "W" / "metrics.jsonl").write_text('{"round": 1, "train_loss": 1.0, "splits": {}}\n')
  return cli(tmp, "--config.resume=True")


@case(3, "fresh run over stale checkpoints", "`P` on a workdir holding `checkpoints/2` and no metrics.jsonl",
      "already holds checkpoints (checkpoints/); pass --config.resume=True")
def _(tmp):
  from fedjax_dg import checkpoint
  ck = checkpoint.Checkpoints(str(tmp / "W"))
  ck.save(2, {"a": np.zeros(3, np.float32)})
  ck.close()
  return cli(tmp)


@case(4, "error right after a checkpoint", "`P --config.num_rounds=10 --config.eval_every=1 "
      "--config.checkpoint_every=1 --config.server.lr=1e30` (and `quiet`); no `N.orbax-checkpoint-tmp` is left",
      "at round 2; lower client.lr (now 0.1) or server.lr (now 1e+30)")
def _(tmp):
  line = cli(tmp, "--config.num_rounds=10", "--config.eval_every=1", "--config.checkpoint_every=1",
             "--config.server.lr=1e30", "--config.quiet=True")
  left = sorted(os.listdir(tmp / "W" / "checkpoints"))
  assert left == ["1"], f"checkpoints/ holds {left}"
  return line


def _corrupt_checkpoint(tmp, corrupt, steps=("4",)):
  """Checkpoints 2 and 4 of a small state, `corrupt(step_dir)` applied to `steps`, then restored."""
  from fedjax_dg import checkpoint
  import jax
  state = {"w": np.arange(3000, dtype=np.float32), "b": np.ones((40, 3), np.float32)}
  ck = checkpoint.Checkpoints(str(tmp / "W"))
  ck.save(2, state)
  ck.save(4, {k: 2 * v for k, v in state.items()})
  ck.close()
  for s in steps:
    corrupt(tmp / "W" / "checkpoints" / s)
  ck = checkpoint.Checkpoints(str(tmp / "W"))
  try:
    step, restored = ck.restore_latest(lambda step: jax.eval_shape(lambda: state))
  finally:
    ck.close()
  assert step == 2 and np.array_equal(restored["w"], state["w"])
  return step


def _data_file(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs if os.path.basename(r) == "d"]
  return max(files, key=os.path.getsize)


def _truncate_data(d):
  f = _data_file(d)
  os.truncate(f, os.path.getsize(f) // 2)


def _flip_bytes(d):
  f = _data_file(d)
  with open(f, "r+b") as h:
    data = bytearray(h.read())
    data[len(data) // 2] ^= 0xFF
    h.seek(0)
    h.write(bytes(data))


def _empty_step(d):
  import shutil
  shutil.rmtree(d)
  os.makedirs(d)


_CORRUPTIONS = [
    ("truncated data file", "its largest data file cut to half", _truncate_data, "checkpoint 4: ValueError"),
    ("deleted metadata", "`default/_METADATA` deleted", lambda d: os.remove(d / "default" / "_METADATA"),
     "Metadata file (named _METADATA) does not exist"),
    ("empty step folder", "the step folder emptied", _empty_step, "checkpoint 4: FileNotFoundError"),
    ("flipped bytes", "one byte of its largest data file flipped (orbax restores other values, no error)",
     _flip_bytes, "SHA-256 mismatch"),
]


def _sizes(line: str) -> str:
  """Byte counts in orbax's messages, which vary with the length of the folder's path, as <n>."""
  return re.sub(r"(byte range \[0, |value of size )\d+", r"\1<n>", line)


for _name, _how, _fn, _expect in _CORRUPTIONS:
  case(5, f"corrupt latest checkpoint: {_name}", f"checkpoints 2 and 4, checkpoint 4 with {_how}, then "
       "resumed", _expect, outcome="warning")(
           lambda tmp, fn=_fn: _sizes(warning_of(lambda: _corrupt_checkpoint(tmp, fn))))


@case(5, "every checkpoint corrupt", "checkpoints 2 and 4, both with a truncated data file, then resumed "
      "(nothing is moved)", "no checkpoint restores intact (checkpoint 4: ValueError")
def _(tmp):
  line = error_of(lambda: _corrupt_checkpoint(tmp, _truncate_data, steps=("2", "4")))
  assert sorted(os.listdir(tmp / "W" / "checkpoints")) == ["2", "4"]
  return _sizes(line)


@case(6, "NaN or inf in the evaluation data", "a fold of the default data set whose `test` split holds an inf",
      "data: the 'test' split's inputs hold NaN or inf (1 values)")
def _(tmp):
  from fedjax_dg import plan
  from fedjax_dg.data import datasets, splits
  c = _p_config(tmp)
  fold = splits.fold_from_config(datasets.load_dataset(c.data), c.data)
  fold.test.x[(0,) * fold.test.x.ndim] = np.inf
  return error_of(lambda: plan.check_finite(fold))


# ----------------------------------------------------------------------------- item 9: command line, metrics

@case(9, "typo in a field name", "`P --config.num_cleints=4`", "--config.num_cleints: unknown config field; did you "
      "mean --config.num_clients?")
def _(tmp):
  return cli(tmp, "--config.num_cleints=4", fresh=True)


@case(9, "missing config file", "`fedjax-dg --config configs/nope.py`", "--config configs/nope.py: no such config file")
def _(tmp):
  return cli(tmp, config="configs/nope.py")


@case(9, "torn last line of metrics.jsonl", "a metrics.jsonl whose last line was cut mid-write, read by a resume",
      "line 2 is torn (a write cut short); ignoring it", outcome="warning")
def _(tmp):
  from fedjax_dg import rundir
  path = tmp / "metrics.jsonl"
  path.write_text('{"round": 2, "train_loss": 0.5, "splits": {}}\n{"round": 4, "train_lo')
  recs = []
  line = warning_of(lambda: recs.extend(rundir.read_metrics(str(tmp))))
  assert [r["round"] for r in recs] == [2]
  return line
# ----------------------------------------------------------------------------- config fields (items 7-9)

def _default_field(tmp, **overrides):
  """`config.validate` of configs/default.py with `overrides` (dotted fields): the check every
  run does before anything is packed or compiled."""
  from fedjax_dg import config as config_lib
  c = _text_config("default", **{"workdir": str(tmp / "W"), **overrides})
  return error_of(lambda: config_lib.validate(c))


for _item, _name, _field, _value, _expect in (
    (7, "unknown selection metric", "data.select_metric", "foo", "data.select_metric: unknown 'foo'"),
    (8, "client momentum >= 1", "client.momentum", 1.0, "client.momentum must lie in [0, 1)"),
    (8, "negative client momentum", "client.momentum", -0.1, "client.momentum must lie in [0, 1)"),
    (8, "negative weight decay", "client.weight_decay", -1e-4, "client.weight_decay must be >= 0"),
    (8, "server momentum >= 1", "server.momentum", 1.0, "server.momentum must lie in [0, 1)"),
    (8, "duplicate validation domains", "data.val_domains", (0, 0), "data.val_domains lists a domain twice"),
    (8, "empty test domains", "data.test_domains", (), "data.test_domains must name at least one domain"),
    (9, "eval_batch_size 0", "eval_batch_size", 0, "eval_batch_size must be >= 1"),
    (9, "a hidden width of 0", "model.hidden", (128, 0), "model.hidden: every width must be >= 1"),
    (9, "negative seed", "seed", -1, "seed must be an integer >= 0"),
    (9, "empty workdir", "workdir", "", "workdir must be a directory path"),
):
  case(_item, _name, f"`configs/default.py` with `{_field}={_value!r}`, validated before anything compiles",
       _expect)(lambda tmp, f=_field, v=_value: _default_field(tmp, **{f: v}))


@case(9, "workdir that is a file", "`configs/default.py` with `workdir` naming an existing file",
      "is a file, not a directory")
def _(tmp):
  (tmp / "f").write_text("")
  from fedjax_dg import config as config_lib
  c = _text_config("default", workdir=str(tmp / "f"))
  return error_of(lambda: config_lib.validate(c))


# ----------------------------------------------------------------------------- text datasets

def _text_config(dataset, **overrides):
  """configs/<dataset>.py with `overrides` (dotted fields), for `config.validate`."""
  import importlib
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  c = importlib.import_module(dataset).get_config()
  for k, v in overrides.items():
    node = c
    *path, last = k.split(".")
    for part in path:
      node = node[part]
    node[last] = v
  return c


def _validate(tmp, dataset, **overrides):
  from fedjax_dg import config as config_lib
  c = _text_config(dataset, workdir=str(tmp / "W"), **overrides)
  return error_of(lambda: config_lib.validate(c))


@case(0, "FedDG on text", "`fedjax-dg --config configs/civilcomments.py P --config.model.name=distilbert "
      "--config.algorithm.name=feddg` (no data is read)",
      "error: algorithm.name: 'feddg' does not apply to text: FedDG interpolates the amplitude spectra", group=11)
def _(tmp):
  return cli(tmp, "--config.model.name=distilbert", "--config.algorithm.name=feddg", config="configs/civilcomments.py")


@case(0, "FedADG on text", "`configs/py150.py` with `algorithm.name=fedadg`",
      "algorithm.name: 'fedadg' does not apply to text: FedADG is designed for images", group=11)
def _(tmp):
  return _validate(tmp, "py150", **{"algorithm.name": "fedadg"})


@case(0, "Mixup on token ids", "`configs/civilcomments.py` with `algorithm.name=mixup`",
      "algorithm.name: 'mixup' does not apply to text: Mixup interpolates inputs", group=11)
def _(tmp):
  return _validate(tmp, "civilcomments", **{"algorithm.name": "mixup"})


@case(0, "FedDIM with GPT-2's tied vocabulary head", "`configs/py150.py` with `algorithm.name=feddim`",
      "algorithm.name: 'feddim' does not apply to model.name='gpt2': FedDIM's insight matrices are [V, d, V]",
      group=11)
def _(tmp):
  return _validate(tmp, "py150", **{"algorithm.name": "feddim"})


@case(0, "FedLOE with GPT-2's tied head", "`configs/py150.py` with `algorithm.name=fedloe`",
      "algorithm.name: 'fedloe' does not apply to model.name='gpt2'", group=11)
def _(tmp):
  return _validate(tmp, "py150", **{"algorithm.name": "fedloe"})


@case(0, "FedSR+OMG with GPT-2", "`configs/py150.py` with `algorithm.name=fedsr+omg`",
      "algorithm.name: 'fedsr' does not apply to model.name='gpt2'", group=11)
def _(tmp):
  return _validate(tmp, "py150", **{"algorithm.name": "fedsr+omg"})


@case(0, "image model on text", "`configs/civilcomments.py` with `model.name=resnet18`",
      "model.name: 'resnet18' reads images; data.dataset='civilcomments' is text (use distilbert)", group=11)
def _(tmp):
  return _validate(tmp, "civilcomments", **{"model.name": "resnet18"})


@case(0, "classifier on Py150's per-token labels", "`configs/py150.py` with `model.name=distilbert`",
      "model.name: Py150 is next-token prediction with a label per token; use 'gpt2'", group=11)
def _(tmp):
  return _validate(tmp, "py150", **{"model.name": "distilbert"})


@case(0, "text model on images", "`configs/pacs.py` with `model.name=distilbert`",
      "model.name: 'distilbert' reads token ids", group=11)
def _(tmp):
  return _validate(tmp, "pacs", **{"model.name": "distilbert"})


@case(0, "selection metric the dataset does not report", "`configs/civilcomments.py` with "
      "`data.select_metric=overall_accuracy` (a Py150 metric)",
      "data.select_metric: unknown 'overall_accuracy' for civilcomments; choose one of", group=11)
def _(tmp):
  return _validate(tmp, "civilcomments", **{"data.select_metric": "overall_accuracy"})


# ----------------------------------------------------------------------------- the run directory

def _pid_host_time(line: str) -> str:
  """A live owner's PID, host and start time, which differ per run, as <pid>, <host>, <time>."""
  import socket
  line = re.sub(r"process \d+", "process <pid>", line).replace(socket.gethostname(), "<host>")
  return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", line)


def _schedule(rounds, every):
  """The evaluation schedule of a one-stage run of `rounds` rounds, evaluated every `every`."""
  from fedjax_dg.plan import StagePlan
  return lambda t: t % every == 0 or t == StagePlan("stage 1", 0, rounds).last


def _resume_files(tmp, rounds, run_of=None, torn=False):
  """`P`'s config stored in `tmp/W` (its identity returned) and metrics records of `rounds`."""
  from fedjax_dg import rundir
  w = str(tmp / "W")
  os.makedirs(w, exist_ok=True)
  run = rundir.write_run_config(_p_config(tmp, eval_every=2), w)
  recs = [{"round": r, "run": (run_of or {}).get(r, run), "train_loss": 1.0, "splits": {}} for r in rounds]
  text = "".join(json.dumps(r) + "\n" for r in recs)
  (tmp / "W" / "metrics.jsonl").write_text(text[:-12] if torn else text)
  return w, run


@case(1, "a second process on the same workdir", "a process holds `W` (`rundir.owned`), then a run on `W` starts",
      "is in use by process <pid> on <host>", section="run directory")
def _(tmp):
  from fedjax_dg import rundir
  holder = ("import sys, time; from fedjax_dg import rundir\n"
            "with rundir.owned(sys.argv[1]):\n  print('held', flush=True); time.sleep(60)\n")
  env = dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT))
  p = subprocess.Popen([sys.executable, "-c", holder, str(tmp / "W")], env=env, stdout=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline().strip() == "held"

    def enter():
      with rundir.owned(str(tmp / "W")):
        pass
    return _pid_host_time(error_of(enter))
  finally:
    p.kill()
    p.wait()


@case(2, "resume after config.json was deleted", "`W` holds metrics.jsonl and checkpoints/4 but no config.json; "
      "`P --config.resume=True --config.client.lr=0.05`", "but no config.json, so no resume can tell which config",
      section="run directory")
def _(tmp):
  from fedjax_dg import rundir
  os.makedirs(tmp / "W" / "checkpoints" / "4")
  (tmp / "W" / "metrics.jsonl").write_text('{"round": 2, "splits": {}}\n')
  c = _p_config(tmp, resume=True, **{"client.lr": 0.05})
  return error_of(lambda: rundir.prepare(c, str(tmp / "W"), multi_stage=False))


@case(2, "metrics records of another run", "`W/metrics.jsonl`'s second record carries another run's identity; "
      "resumed from checkpoint 4", "record 2 (round 4) carries run <digest>, this config is run <digest>",
      section="run directory")
def _(tmp):
  from fedjax_dg import runbook
  w, run = _resume_files(tmp, (2, 4), run_of={4: "0" * 16})
  return error_of(lambda: runbook.resumed_records(w, run, 4, _schedule(6, 2)))  # pylint: disable=protected-access


@case(2, "metrics.jsonl deleted, checkpoints kept", "`W` of `P --config.eval_every=2` with checkpoint 4 and no "
      "metrics.jsonl, resumed", "metrics.jsonl lacks the evaluation(s) of round(s) [2, 4], which checkpoint 4 follows",
      section="run directory")
def _(tmp):
  from fedjax_dg import runbook
  w, run = _resume_files(tmp, ())
  os.remove(tmp / "W" / "metrics.jsonl")
  return error_of(lambda: runbook.resumed_records(w, run, 4, _schedule(6, 2)))  # pylint: disable=protected-access


@case(2, "torn last evaluation at the checkpoint's round", "`W/metrics.jsonl` with round 4's line cut mid-write and "
      "checkpoint 4: the resume evaluates round 4 again from the checkpoint", "line 2 is torn", outcome="warning",
      section="run directory")
def _(tmp):
  from fedjax_dg import runbook
  w, run = _resume_files(tmp, (2, 4), torn=True)
  out = []
  line = warning_of(lambda: out.append(runbook.resumed_records(  # pylint: disable=protected-access
      w, run, 4, _schedule(6, 2))))  # pylint: disable=protected-access
  before, _, again = out[0]
  assert [r["round"] for r in before] == [2] and again
  return line


@case(2, "a run extended with more rounds", "`P --config.num_rounds=3 --config.eval_every=2` (evaluated at 2 and 3), "
      "resumed with `--config.num_rounds=6`: evaluated at 2, 4, 6", "dropping the evaluation(s) of round(s) [3], off "
      "this run's schedule", outcome="warning", section="run directory")
def _(tmp):
  from fedjax_dg import runbook
  w, run = _resume_files(tmp, (2, 3))
  out = []
  line = warning_of(lambda: out.append(runbook.resumed_records(  # pylint: disable=protected-access
      w, run, 3, _schedule(6, 2))))  # pylint: disable=protected-access
  assert [r["round"] for r in out[0][0]] == [2] and not out[0][2]
  return line


def _two_checkpoints(tmp, run="00112233aabbccdd"):
  from fedjax_dg import checkpoint
  ck = checkpoint.Checkpoints(str(tmp / "W"), run=run)
  for step in (2, 4):
    ck.save(step, {"w": np.full(3, float(step), np.float32)})
  ck.close()


def _restore_two(tmp, run="00112233aabbccdd"):
  from fedjax_dg import checkpoint
  ck = checkpoint.Checkpoints(str(tmp / "W"), run=run)
  try:
    step, _ = ck.restore_latest(lambda s: {"w": np.zeros(3, np.float32)})
  finally:
    ck.close()
  assert step == 2


@case(2, "older checkpoint under a newer step", "checkpoint 2's folder and checksum file copied over checkpoint 4's, "
      "then resumed", "checkpoint 4: ValueError: it holds round 2's state, not round 4's", outcome="warning",
      section="run directory")
def _(tmp):
  import shutil
  _two_checkpoints(tmp)
  d = tmp / "W" / "checkpoints"
  shutil.rmtree(d / "4")
  shutil.copytree(d / "2", d / "4")
  s = json.loads((tmp / "W" / "checkpoint_sums" / "2.json").read_text())
  (tmp / "W" / "checkpoint_sums" / "4.json").write_text(json.dumps({**s, "step": 4}))
  return warning_of(lambda: _restore_two(tmp))


@case(2, "checkpoint without its checksum", "`checkpoint_sums/4.json` deleted (a flipped byte would then pass), "
      "then resumed", "checkpoint 4: ValueError: it has no checksum file (checkpoint_sums/4.json)", outcome="warning",
      section="run directory")
def _(tmp):
  _two_checkpoints(tmp)
  os.remove(tmp / "W" / "checkpoint_sums" / "4.json")
  return warning_of(lambda: _restore_two(tmp))


@case(2, "checkpoints of another run", "`W`'s checkpoints saved by another run, resumed by this one",
      "checkpoint 4: ValueError: its checksum file is run <digest>'s, this is run <digest>",
      section="run directory")
def _(tmp):
  _two_checkpoints(tmp)
  return error_of(lambda: _restore_two(tmp, run="ffffffffffffffff"))


@case(2, "fresh run over another run's summary and selected parameters", "`P` on a workdir holding `summary.json` "
      "and `selected/` (no metrics.jsonl)", "already holds results (summary.json, selected/)", section="run directory")
def _(tmp):
  from fedjax_dg import rundir
  os.makedirs(tmp / "W" / "selected")
  (tmp / "W" / "summary.json").write_text("{}")
  return error_of(lambda: rundir.prepare(_p_config(tmp), str(tmp / "W"), multi_stage=False))


@case(2, "a tuple field overridden twice", "`P --config.model.hidden=(64,) --config.model.hidden=(32,)` "
      "(ml_collections alone concatenates them into a 64-32 MLP)", "--config.model.hidden=(32,)", outcome="works",
      section="run directory")
def _(tmp):
  from fedjax_dg import main
  argv = ["fedjax-dg", "--config", "configs/default.py", "--config.model.hidden=(64,)", "--config.model.hidden=(32,)"]
  kept = [a for a in main.last_overrides(argv) if a.startswith("--config.")]
  assert kept == ["--config.model.hidden=(32,)"]
  return f"the last one is kept: {kept[0]}"


@case(2, "garbage selected/ record", "`python -m fedjax_dg.evaluate` on a run whose `selected/heldout_domain.json` "
      "holds `garbage`", "selected/heldout_domain.json: cannot read a selection record", section="run directory")
def _(tmp):
  from fedjax_dg import rundir
  os.makedirs(tmp / "W" / "selected")
  (tmp / "W" / "selected" / "heldout_domain.json").write_text("garbage")
  (tmp / "W" / "selected" / "heldout_domain.msgpack").write_bytes(b"\x80")
  return error_of(lambda: rundir.load_selected(str(tmp / "W"), "heldout_domain", {}))


# ----------------------------------------------------------------------------- untrusted files

@case(3, "pickle whose dicts share children", "a `.pth` of under 2 KB: 60 nested dicts, each holding the next twice "
      "(2**60 paths as a tree), given to the converter or `model.pretrained_path`",
      "expected a state_dict (a dict of tensors), got dict", section="untrusted files")
def _(tmp):
  from test_untrusted_files import _pth_of
  from fedjax_dg.models import convert

  def dag(tensor):
    node = {"w": tensor("0", 4)}
    for _ in range(60):
      node = {"a": node, "b": node}
    return node
  path = _pth_of(tmp / "dag.pth", dag, {"0": np.ones(4, np.float32)})
  return error_of(lambda: convert.read_state_dict(path))


@case(3, "`.pth` storage declaring 4 GiB", "a `.pth` whose pickle declares a storage of 2**30 floats, its record 16 "
      "bytes", "storage '0' (1073741824 elements) brings the tensors to more than 2147483648 bytes in all",
      section="untrusted files")
def _(tmp):
  from test_untrusted_files import write_oversized_storage_pth
  from fedjax_dg.models import convert
  path = str(tmp / "big.pth")
  write_oversized_storage_pth(path)
  return error_of(lambda: convert.read_state_dict(path))


@case(3, "`.pth` record larger than its storage", "a `.pth` whose storage record is deflated and declares 4000 bytes "
      "for a storage of 4 floats", "record 'archive/data/0' declares 4000 bytes, its storage 16",
      section="untrusted files")
def _(tmp):
  import zipfile
  from test_resnet import write_torch_zip
  from fedjax_dg.models import convert
  path = str(tmp / "mismatch.pth")
  write_torch_zip(path, {"0": np.ones(4, np.float32)}, {"conv1.weight": ("0", 0, (4,), (1,))})
  with zipfile.ZipFile(path) as zf:
    members = {n: zf.read(n) for n in zf.namelist()}
  members["archive/data/0"] = bytes(4000)
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    for n, b in members.items():
      zf.writestr(n, b)
  return script(tmp, "scripts/convert_torchvision_weights.py", path, str(tmp / "out.npz"))


@case(3, "`.npz` member declaring 8 GiB", "a converted `.npz` whose `conv1/kernel.npy` header says `(2**31,)` "
      "float32 over 64 bytes of data", "member 'conv1/kernel.npy' declares 192 bytes, its array header [2147483648] "
      "float32 needs", section="untrusted files")
def _(tmp):
  import io
  import zipfile
  from fedjax_dg.models import convert
  header = io.BytesIO()
  np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2 ** 31,)})
  path = str(tmp / "w.npz")
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    zf.writestr("conv1/kernel.npy", header.getvalue() + bytes(64))
  return error_of(lambda: convert.load_converted(path))


@case(3, "gzipped IDX declaring 60 GB", "`train-images-idx3-ubyte.gz` whose header says `(60000, 1000, 1000)`",
      "its IDX header declares shape (60000, 1000, 1000) (60000000016 bytes), more than the 2147483648 allowed",
      section="untrusted files")
def _(tmp):
  from test_untrusted_files import _gz_idx
  from fedjax_dg.data import idx
  path = _gz_idx(tmp / "train-images-idx3-ubyte.gz", (60000, 1000, 1000), bytes(1000))
  return error_of(lambda: idx.read_idx(path))


@case(3, "gzipped IDX inflating past its header", "a `.gz` whose header says `(10, 28, 28)` and whose data inflates "
      "to 50 MiB: read to 7841 bytes only", "IDX data size 7841 bytes does not match its header shape (10, 28, 28)",
      section="untrusted files")
def _(tmp):
  from test_untrusted_files import _gz_idx
  from fedjax_dg.data import idx
  path = _gz_idx(tmp / "x.gz", (10, 28, 28), bytes(50 * 2 ** 20))
  return error_of(lambda: idx.read_idx(path))


@case(3, "corrupt gzipped IDX", "`train-images-idx3-ubyte.gz` with its last 100 bytes cut",
      "corrupt gzip data (Compressed file ended before the end-of-stream marker was reached)",
      section="untrusted files")
def _(tmp):
  from test_untrusted_files import _gz_idx
  from fedjax_dg.data import idx
  path = _gz_idx(tmp / "train-images-idx3-ubyte.gz", (10, 28, 28), np.random.default_rng(0).bytes(7840))
  os.truncate(path, os.path.getsize(path) - 100)
  return error_of(lambda: idx.read_idx(path))


# ----------------------------------------------------------------------------- untrusted files: archives and verify
# The command-line cases below run under a 1 GiB address-space cap (RLIMIT_AS, `MEMORY_CAP` of
# tests/test_bounded_readers.py): a reader that held a 3 GiB member or inflated a file whole
# would die in it instead of answering in one line.

def _prepare_line(*args) -> str:
  """`python -m fedjax_dg.data.prepare ARGS` under the memory cap: its one line (stderr on an
  error, exit status 2; stdout for a verify that fails, exit status 1)."""
  from test_bounded_readers import prepare_cli
  code, out, err = prepare_cli(*args)
  assert code in (1, 2), f"exit status {code}; stderr: {err[-2000:]}"
  return _one_line(err if code == 2 else out, "stderr" if code == 2 else "stdout")


@case(3, "zip declaring a 3 GiB member", "`python -m fedjax_dg.data.prepare pacs --root D` where `D/PACS.zip` "
      "(under 2 KB) declares a 3 GiB member, under a 1 GiB memory cap; nothing is extracted",
      "member 'kfold/art_painting/dog/0.png' declares 3221225472 bytes from", section="untrusted files")
def _(tmp):
  from test_bounded_readers import zip_declaring
  zip_declaring(tmp / "PACS.zip", "kfold/art_painting/dog/0.png", 3 << 30)
  return _prepare_line("pacs", "--root", str(tmp))


@case(3, "tar.gz declaring a 3 GiB member", "`prepare vlcs --root D` where `D/VLCS.tar.gz` (under 2 KB) holds a "
      "tar header declaring 3 GiB, under a 1 GiB memory cap: refused at the header",
      "its members declare 3221225472 bytes in all, more than the", section="untrusted files")
def _(tmp):
  from test_bounded_readers import tar_gz_declaring
  tar_gz_declaring(tmp / "VLCS.tar.gz", "VLCS/big.bin", 3 << 30)
  return _prepare_line("vlcs", "--root", str(tmp))


@case(3, "zip bomb", "`prepare.unpack_archive` of a genuine zip of 64 MiB of zeros (about 65 KB)",
      "declares 67108864 bytes from", section="untrusted files")
def _(tmp):
  from test_bounded_readers import zeros_zip
  from fedjax_dg.data import prepare
  path = zeros_zip(tmp / "b.zip", "VLCS/x.bin", 64 << 20)
  return error_of(lambda: prepare.unpack_archive(path, str(tmp / "out")))


@case(3, "FIFO member in a tar", "`prepare vlcs --root D` where `D/VLCS.tar.gz` holds a FIFO `VLCS/labels.json`",
      "member 'VLCS/labels.json' is a FIFO; refusing the archive", section="untrusted files")
def _(tmp):
  import tarfile
  from test_bounded_readers import regular, special, tar_gz_of
  tar_gz_of(tmp / "VLCS.tar.gz", [regular("VLCS/a.txt", b"a"), (special("VLCS/labels.json", tarfile.FIFOTYPE), None)])
  return _prepare_line("vlcs", "--root", str(tmp))


@case(3, "device member in a tar", "`prepare vlcs --root D` where `D/VLCS.tar.gz` holds a character device "
      "(1, 5: /dev/zero's numbers)", "member 'VLCS/labels.json' is a device; refusing the archive",
      section="untrusted files")
def _(tmp):
  import tarfile
  from test_bounded_readers import regular, special, tar_gz_of
  tar_gz_of(tmp / "VLCS.tar.gz", [regular("VLCS/a.txt", b"a"), (special("VLCS/labels.json", tarfile.CHRTYPE), None)])
  return _prepare_line("vlcs", "--root", str(tmp))


@case(3, "truncated tar.gz", "`prepare vlcs --root D` where `D/VLCS.tar.gz` has its last 1000 bytes cut",
      "VLCS.tar.gz: corrupt compressed data (Compressed file ended before the end-of-stream marker was reached)",
      section="untrusted files")
def _(tmp):
  from test_bounded_readers import regular, tar_gz_of
  path = tar_gz_of(tmp / "VLCS.tar.gz", [regular("VLCS/a.bin", np.random.default_rng(0).bytes(50_000))])
  os.truncate(path, os.path.getsize(path) - 1000)
  return _prepare_line("vlcs", "--root", str(tmp))


@case(3, "zip with a bad CRC", "`prepare pacs --root D` where one stored member of `D/PACS.zip` has a byte changed",
      "PACS.zip: corrupt archive data (BadZipFile: Bad CRC-32 for file 'kfold/photo/dog/0.png')",
      section="untrusted files")
def _(tmp):
  import zipfile
  with zipfile.ZipFile(tmp / "PACS.zip", "w", zipfile.ZIP_STORED) as z:
    z.writestr("kfold/photo/dog/0.png", b"hello world, a member whose bytes change")
  raw = bytearray((tmp / "PACS.zip").read_bytes())
  raw[raw.index(b"hello")] = ord("j")
  (tmp / "PACS.zip").write_bytes(bytes(raw))
  return _prepare_line("pacs", "--root", str(tmp))


def _civil_release(tmp):
  from test_bounded_readers import regular, tar_gz_of
  from fedjax_dg.data import prepare
  csv = b"id,comment_text,split,toxicity\n0,hi,train,0.1\n1,yo,test,0.9\n"
  path = tar_gz_of(tmp / "civil.tar.gz", [regular("civilcomments_v1.0/all_data_with_identities.csv", csv)])
  prepare.prepare("civilcomments", str(tmp), [path])
  return tmp / "civilcomments_v1.0"


@case(3, "verify: a link to /dev/zero", "`prepare verify civilcomments --root D` where `labels.json` in the "
      "dataset folder is a link to `/dev/zero`, under a 1 GiB memory cap (it read 2.9 GB)",
      "labels.json: a link out of the dataset folder (to /dev/zero); not following it", section="untrusted files")
def _(tmp):
  folder = _civil_release(tmp)
  os.symlink("/dev/zero", folder / "labels.json")
  return _prepare_line("verify", "civilcomments", "--root", str(tmp))


@case(3, "verify: a gzipped IDX inflating to 1 GiB", "`prepare verify mnist --root D --fast` where "
      "`train-images-idx3-ubyte.gz` (about 1 MB) declares `(10, 28, 28)` and inflates to 1 GiB, under a 1 GiB memory "
      "cap: read to 7841 bytes only", "IDX data size 7841 bytes does not match its header shape (10, 28, 28)",
      section="untrusted files")
def _(tmp):
  from test_bounded_readers import gzip_of_zeros
  (tmp / "mnist").mkdir()
  header = bytes([0, 0, 8, 3]) + np.array((10, 28, 28), ">u4").tobytes()
  gzip_of_zeros(tmp / "mnist" / "train-images-idx3-ubyte.gz", header, 1024)
  return _prepare_line("verify", "mnist", "--root", str(tmp), "--fast")


@case(3, "verify: a garbage manifest", "`prepare verify civilcomments --root D` whose `.fedjax_dg_manifest.json` "
      "holds `garbage`", "not a manifest written by prepare (JSONDecodeError", section="untrusted files")
def _(tmp):
  from fedjax_dg.data import prepare
  (_civil_release(tmp) / prepare.MANIFEST).write_text("garbage")
  return _prepare_line("verify", "civilcomments", "--root", str(tmp))


@case(3, "verify: a wrongly typed manifest", "the manifest's entry for a file is `\"x\"`, not `[size, SHA-256]`",
      "is \"x\", not [size, SHA-256]", section="untrusted files")
def _(tmp):
  from fedjax_dg.data import prepare
  (_civil_release(tmp) / prepare.MANIFEST).write_text('{"all_data_with_identities.csv": "x"}')
  return _prepare_line("verify", "civilcomments", "--root", str(tmp))


@case(3, "verify without Pillow", "`prepare.verify` of a PACS folder holding a valid PNG, with Pillow not installed",
      'checking images needs Pillow: pip install "fedjax-dg[data]"', section="untrusted files")
def _(tmp):
  from PIL import Image
  from fedjax_dg.data import prepare
  (tmp / "PACS" / "photo" / "dog").mkdir(parents=True)
  Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp / "PACS" / "photo" / "dog" / "0.png")
  saved = sys.modules.get("PIL")
  sys.modules["PIL"] = None
  try:
    return error_of(lambda: prepare.verify("pacs", str(tmp)))
  finally:
    sys.modules["PIL"] = saved


@case(4, "an empty config file", "`fedjax-dg --config F P` where F is empty",
      "the config file is empty; it must define get_config()", section="config files")
def _(tmp):
  return cli(tmp, config=_config_file(tmp, ""))


@case(4, "a config file without get_config", "`fedjax-dg --config F P` where F holds `x = 1`",
      "the config file defines no get_config(); it must define get_config()", section="config files")
def _(tmp):
  return cli(tmp, config=_config_file(tmp, "x = 1\n"))


@case(4, "no --config at all", "`fedjax-dg --config.num_clients=4`",
      "--config: no config file given; pass one, e.g. --config configs/default.py", section="config files")
def _(tmp):
  return _run(tmp, [sys.executable, "-m", "fedjax_dg", "--config.num_clients=4"])


# ----------------------------------------------------------------------------- sweeps: a results file handed over

_RESULTS_FILE: list = []  # the fixture sweep's results file, built once


def _results_file(tmp) -> str:
  if not _RESULTS_FILE:
    from test_results_file import make_results_file
    _RESULTS_FILE.append(make_results_file(tmp))
  return _RESULTS_FILE[0]


def _report_results(tmp, path, outcome="error") -> str:
  """`bench report --results PATH` under the memory cap (`test_results_file.report_cli`'s
  command, forked from a Python started under the cap that has imported what the command
  imports before it reads the file): its one error line, or its one note."""
  from test_bounded_readers import capped
  if not _CAPPED:
    env = dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT), JAX_PLATFORMS="cpu", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    imports = ("absl.app", "ml_collections.config_flags", "fedjax_dg.bench.collect", "fedjax_dg.bench.figures",
               "fedjax_dg.bench.report", "fedjax_dg.bench.results")
    _CAPPED.append(forkserver.ForkServer(env, ROOT, imports, prefix=capped([])))
  code, out, err = _CAPPED[0].run("fedjax_dg.bench", ["report", f"--results={path}", f"--out={tmp / 'out'}"], True)
  if outcome == "error":
    assert code == 2, f"exit status {code}; stdout {out[-1000:]} stderr {err[-2000:]}"
    return _one_line(err, "stderr")
  assert code == 0, err[-2000:]
  return _one_line("\n".join(l for l in out.splitlines() if l.startswith("note: ")), "notes")


for _name, _field, _value, _show, _expect in (
    ("header a list", None, [1, 2], "line 1 is `[1, 2]`", "not a results file of format 1"),
    ("a job without `config`", "config", KeyError, "a job has no `config`", "config: absent; it must be dict"),
    ("an accuracy given as a string", "summary.selection.heldout_domain.test.accuracy", "0.9",
     "a job's held-out-selected test accuracy is `\"0.9\"`", 'accuracy: "0.9" (str), not int or float'),
    ("`entries` an integer", "entries", 5, "a job's `entries` is `5`", "entries: 5 (int), not list"),
    ("`sweep` a list", "header.sweep", [1], "the header's `sweep` is `[1]`", "sweep: [1] (list), not dict"),
    ("an accuracy of 1e308", "summary.selection.heldout_domain.test.accuracy", 1e308,
     "a job's held-out-selected test accuracy is `1e308`", "accuracy: 1e+308 lies outside [0, 1]"),
    ('`"stale": "no"`', "stale", "no", "a job's `stale` is the string `\"no\"`", 'stale: "no" (str), not bool'),
):
  def _mutated_case(tmp, _field=_field, _value=_value):
    from test_results_file import lines_of, mutated, write_lines
    src = _results_file(tmp)
    if _field is None:
      path = write_lines(tmp / "r.jsonl.gz", [[1, 2]] + lines_of(src)[1:])
    else:
      path = mutated(src, tmp / "r.jsonl.gz", _field, _value)
    return _report_results(tmp, path)
  case(5, f"results file: {_name}", f"`python -m fedjax_dg.bench report --results F` where {_show}, under a 1 GiB "
       "memory cap", _expect, section="sweeps")(_mutated_case)


@case(5, "results file: a 5000-digit number", "`bench report --results F` where a job's line holds a number of 5000 "
      "digits, under a 1 GiB memory cap", "the line: a number of 5000 characters (at most 40)", section="sweeps")
def _(tmp):
  from test_results_file import job_line, lines_of, write_lines
  docs = lines_of(_results_file(tmp))
  k = job_line(docs)
  body = json.dumps(docs[k]).replace('"stale": false', '"stale": false, "x": ' + "9" * 5000)
  return _report_results(tmp, write_lines(tmp / "r.jsonl.gz", docs, {k: body}))


@case(5, "results file: a line nested 100,000 deep", "`bench report --results F` where a job's line is 100,000 "
      "nested lists, under a 1 GiB memory cap", "the line: nested 100000 deep, more than the 32", section="sweeps")
def _(tmp):
  from test_results_file import job_line, lines_of, write_lines
  docs = lines_of(_results_file(tmp))
  return _report_results(tmp, write_lines(tmp / "r.jsonl.gz", docs, {job_line(docs): "[" * 100_000 + "]" * 100_000}))


@case(5, "results file: a line inflating to 64 MiB", "`bench report --results F` where line 2 of F (about 70 KB) "
      "inflates to 64 MiB, under a 1 GiB memory cap (a 1.5 GiB line took 3.2 GB)",
      "line 2 is longer than 16777216 bytes, the cap on one line", section="sweeps")
def _(tmp):
  import gzip
  from test_results_file import lines_of
  head = lines_of(_results_file(tmp))[0]
  with gzip.open(tmp / "big.jsonl.gz", "wb", compresslevel=1) as g:
    g.write(json.dumps(head).encode() + b"\n")
    for _ in range(64):
      g.write(b" " * (1 << 20))
    g.write(b"\n")
  return _report_results(tmp, tmp / "big.jsonl.gz")


@case(5, "results file: NaN metrics in a finished job", "`bench report --results F` where a done job's "
      "held-out-selected test accuracy is NaN: the report is written and says which job its cells leave out",
      "finished with NaN in summary.selection.heldout_domain.test.accuracy; cells that read it leave the job out",
      outcome="warning", section="sweeps")
def _(tmp):
  from test_results_file import mutated
  path = mutated(_results_file(tmp), tmp / "r.jsonl.gz", "summary.selection.heldout_domain.test.accuracy",
                 float("nan"))
  return _report_results(tmp, path, outcome="warning")


@case(5, "results file: done without a summary", "`bench report --results F` where a job marked done has no "
      "`summary` and no `records`: the report is written and names the job",
      "is marked done but holds no summary; left out of every cell", outcome="warning", section="sweeps")
def _(tmp):
  from test_results_file import job_line, lines_of, write_lines
  docs = lines_of(_results_file(tmp))
  k = job_line(docs)
  del docs[k]["summary"], docs[k]["records"]
  return _report_results(tmp, write_lines(tmp / "r.jsonl.gz", docs), outcome="warning")


# ----------------------------------------------------------------------------- data files: paths and values

@case(5, "WILDS image path out of the release", "`wilds.load_fold` of an IWildCam `metadata.csv` whose row 3 names "
      "`../../../../../../etc/passwd`", "metadata.csv row 3: column 'filename' names '../../../../../../etc/passwd', "
      "a path outside", section="data files")
def _(tmp):
  from fedjax_dg.data import wilds
  root = _iwildcam(tmp, [("train", 0, 1), ("train", 0, 1), ("val", 1, 2)])
  text = (root / "metadata.csv").read_text().replace(",1.jpg\n", ",../../../../../../etc/passwd\n")
  (root / "metadata.csv").write_text(text)
  return error_of(lambda: wilds.load_fold(_wilds_config(root, "iwildcam")))


@case(5, "FEMNIST NaN pixel", "a LEAF `train/*.json` whose writer's third image has `NaN` at pixel 300",
      "image 2 pixel 300 is nan, outside [0, 1] (1 of the writer's 2352 pixels are)", section="data files")
def _(tmp):
  from fedjax_dg.data import femnist
  x = np.full((3, 784), 0.5)
  x[2, 300] = np.nan
  obj = {"users": ["w"], "num_samples": [3], "user_data": {"w": {"x": x.tolist(), "y": [1, 2, 3]}}}
  (tmp / "f.json").write_text(json.dumps(obj))
  return error_of(lambda: femnist.read_leaf_file(str(tmp / "f.json")))


# ----------------------------------------------------------------------------- config fields: types and ranges

def _typed(tmp, **fields):
  """`configs/default.py` rebuilt from its dict with `fields` set (as a config file building its
  own ConfigDict may hold any type), then `config.validate`."""
  from fedjax_dg import config as config_lib
  d = _text_config("default", workdir=str(tmp / "W")).to_dict()
  for path, v in fields.items():
    node = d
    *head, last = path.split(".")
    for part in head:
      node = node[part]
    if v is _DELETE:
      del node[last]
    else:
      node[last] = v
  return error_of(lambda: config_lib.validate(ml_collections.ConfigDict(d)))


_DELETE = object()

for _field, _value, _expect in (
    ("seed", 2 ** 64, "seed must be an integer >= 0 and < 2**32, got"),
    ("seed", True, "seed must be an integer, got True (bool)"),
    ("model.hidden", "abc", "model.hidden must be a tuple, got 'abc' (str)"),
    ("num_clients", None, "num_clients must be an integer, got None"),
    ("algorithm.name", None, "algorithm.name must be a string, got None"),
    ("data.angles", (0.0, float("nan")), "data.angles: every entry must be a finite number, got nan"),
    ("data.angles", (0.0, float("inf")), "data.angles: every entry must be a finite number, got inf"),
    ("engine", _DELETE, "the config lacks the 'engine' block"),
    ("server.b1", 2.0, "server.b1 must be in [0, 1), got 2.0"),
    ("server.eps", -1e-3, "server.eps must be > 0, got -0.001"),
    ("server.b2", float("nan"), "server.b2 must be a finite number, got nan"),
    ("client.weight_decay", float("inf"), "client.weight_decay must be a finite number, got inf"),
    ("algorithm.name", "irm+", "algorithm.name: 'irm+' names no method in one of its parts"),
    ("data.test_domains", 5, "data.test_domains must be a tuple, got 5 (int), e.g. (5,)"),
    ("data.test_domains", (5.0,), "data.test_domains: every entry must be an integer, got 5.0 (float)"),
    ("engine.unroll", -5, "engine.unroll must be >= 1, or -1 (the measured default), got -5"),
    ("engine.run_axis", "loop", "engine.run_axis must be one of map, vmap, auto, got 'loop'"),
    ("data.num_workers", -1, "data.num_workers must be in [0, 1024] (0: no worker threads), got -1"),
    ("data.max_per_domain", -3, "data.max_per_domain must be >= 0 (0: all), got -3"),
    ("data.color_flips", (0.1, 1.5), "data.color_flips: every entry must lie in [0, 1], got 1.5"),
    ("data.label_noise", -0.1, "data.label_noise must be in [0, 1], got -0.1"),
    ("data.image_size", 100000, "data.image_size must be in [1, 4096], got 100000"),
    ("num_rounds", 2.0, "num_rounds must be an integer, got 2.0 (float)"),
):
  _shown = "deleted" if _value is _DELETE else repr(_value)
  case(4, f"`{_field}` = {_shown}", f"a config file (a ConfigDict built from a dict) with `{_field}` {_shown}, "
       "validated before anything is read", _expect, section="config fields")(
           lambda tmp, f=_field, v=_value: _typed(tmp, **{f: v}))


@case(4, "a round that cannot fit in memory", "`P --config.client.batch_size=100000000` on a device of 8 GiB "
      "(the estimate runs once the data's shape is known, before compiling)",
      "client.batch_size, data.image_size: the round needs about", section="config fields")
def _(tmp):
  from fedjax_dg import checks
  from fedjax_dg.models import build_model
  c = _p_config(tmp, **{"client.batch_size": 10 ** 8})
  model = build_model(c.model, (16, 16, 1), 6)
  return error_of(lambda: checks.check_memory(c, model, (16, 16, 1), 4, "vmap", 1, available=8 << 30))


@case(4, "absurd local steps", "`P --config.client.local_steps=1000000000` on a device of 8 GiB",
      "client.local_steps, client.batch_size: the round needs about", section="config fields")
def _(tmp):
  from fedjax_dg import checks
  from fedjax_dg.models import build_model
  c = _p_config(tmp, **{"client.local_steps": 10 ** 9})
  model = build_model(c.model, (16, 16, 1), 6)
  return error_of(lambda: checks.check_memory(c, model, (16, 16, 1), 4, "vmap", 10 ** 9, available=8 << 30))


@case(4, "absurd embedded image size", "`P --config.data.image_size=4000` on a machine of 8 GiB (before the images "
      "are generated)", "data.image_size: 400 x 6 images of 4000^2 pixels need", section="config fields")
def _(tmp):
  from fedjax_dg import checks
  c = _p_config(tmp, **{"data.image_size": 4000})
  return error_of(lambda: checks._check_data_size(c, available=8 << 30))  # pylint: disable=protected-access


# ----------------------------------------------------------------------------- config files

def _config_file(tmp, body: str) -> str:
  path = tmp / "cfg.py"
  path.write_text(body)
  return str(path)


@case(4, "a config file's own error", "`fedjax-dg --config configs/pacs.py:bogus`",
      "cannot load the config file (ValueError: configs/pacs.py: unknown setting 'bogus'", section="config files")
def _(tmp):
  return cli(tmp, config="configs/pacs.py:bogus")


@case(4, "a config file that exits", "`fedjax-dg --config F` where `get_config` calls `sys.exit(3)`",
      "the config file exited (status 3) instead of returning a config", section="config files")
def _(tmp):
  return cli(tmp, config=_config_file(tmp, "import sys\ndef get_config():\n  sys.exit(3)\n"), fresh=True)


@case(4, "a config file returning None", "`fedjax-dg --config F P` where `get_config` returns None",
      "get_config() returned NoneType, not an ml_collections.ConfigDict", section="config files")
def _(tmp):
  return cli(tmp, config=_config_file(tmp, "def get_config():\n  return None\n"))


@case(4, "a config file returning a dict", "`fedjax-dg --config F P` where `get_config` returns `{'a': 1}`",
      "get_config() returned dict, not an ml_collections.ConfigDict", section="config files")
def _(tmp):
  return cli(tmp, config=_config_file(tmp, "def get_config():\n  return {'a': 1}\n"))


# ----------------------------------------------------------------------------- sweeps

def _tiny_sweep(tmp):
  from fedjax_dg.bench import launch, sweep as sweep_lib
  s = sweep_lib.load_config_file(os.path.join(ROOT, "configs", "sweeps", "tiny.py"))
  s.root = str(tmp / "sweep")
  exp = sweep_lib.expand(s)
  launch.prepare(exp)
  return s, exp, list(exp.jobs.values())[0].workdir


def _status_of(exp, workdir):
  from fedjax_dg.bench import launch
  row = next(r for r in launch.status(exp) if r["workdir"] == workdir)
  return f"{row['state']}: {row['error']}" if row["error"] else row["state"]


@case(5, "torn summary.json in a sweep job", "a finished job's `summary.json` cut mid-write; `bench status`",
      "broken: <tmp>/sweep/<digest>/summary.json: cannot read the run's summary", section="sweeps")
def _(tmp):
  _, exp, w = _tiny_sweep(tmp)
  with open(os.path.join(w, "summary.json"), "w") as f:
    f.write('{"selection": {"heldout')
  return _status_of(exp, w)


@case(5, "garbage line inside a job's metrics.jsonl", "a finished job whose `metrics.jsonl` line 2 is `garbage`; "
      "`bench status` (and `collect` leaves it out)", "broken: <tmp>/sweep/<digest>/metrics.jsonl: line 2 is not an "
      "evaluation record", section="sweeps")
def _(tmp):
  from fedjax_dg.bench import collect
  s, exp, w = _tiny_sweep(tmp)
  with open(os.path.join(w, "summary.json"), "w") as f:
    f.write('{"selection": {}}')
  with open(os.path.join(w, "metrics.jsonl"), "w") as f:
    f.write('{"round": 1, "splits": {}}\ngarbage\n')
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    assert collect.load_results(exp) == {}
  return _status_of(exp, w)


@case(5, "malformed RUNNING lock", "a job's `RUNNING` lock holding `{\"pid\": 1` (cut short); `bench status`",
      "pending", outcome="works", section="sweeps")
def _(tmp):
  _, exp, w = _tiny_sweep(tmp)
  with open(os.path.join(w, "RUNNING"), "w") as f:
    f.write('{"pid": 1')
  return _status_of(exp, w)


@case(5, "job folder replaced by a file", "a job's folder replaced by a file; `bench run`",
      "the job's folder is not a folder; move it away so the job can run", section="sweeps")
def _(tmp):
  import shutil
  from fedjax_dg.bench import launch
  _, exp, w = _tiny_sweep(tmp)
  shutil.rmtree(w)
  with open(w, "w") as f:
    f.write("x")
  assert _status_of(exp, w).startswith("broken: ")
  return error_of(lambda: launch.run_local(exp, workers=1, quiet=True))


@case(5, "typo in a sweep override", "`python -m fedjax_dg.bench status --sweep configs/sweeps/tiny.py "
      "--sweep.bse.num_rounds=3`", "--sweep.bse.num_rounds: no config field 'bse'; did you mean --sweep.base.num_rounds?",
      section="sweeps")
def _(tmp):
  return _run(tmp, [sys.executable, "-m", "fedjax_dg.bench", "status", "--sweep", "configs/sweeps/tiny.py",
                    "--sweep.bse.num_rounds=3"])


@case(5, "missing sweep file", "`python -m fedjax_dg.bench status --sweep configs/sweeps/nope.py`",
      "--sweep configs/sweeps/nope.py: no such config file", section="sweeps")
def _(tmp):
  return _run(tmp, [sys.executable, "-m", "fedjax_dg.bench", "status", "--sweep", "configs/sweeps/nope.py"])


@case(5, "`log_uniform` with a bound <= 0", "`sweep.search.distributions.client.lr = ('log_uniform', 0.0, 1.0)`, "
      "a trial drawn", "log_uniform draws exp(uniform(log lo, log hi)), so both bounds must be > 0; got lo = 0.0",
      section="sweeps")
def _(tmp):
  from fedjax_dg.bench import sweep as sweep_lib
  s = sweep_lib.load_config_file(os.path.join(ROOT, "configs", "sweeps", "tiny.py"))
  s.search = ml_collections.ConfigDict({"distributions": {"client": {"lr": ("log_uniform", 0.0, 1.0)}}})
  return error_of(lambda: sweep_lib.trial_overrides(s, "fedavg", 1))


@case(5, "`bench run --workers=0`", "`python -m fedjax_dg.bench run --sweep configs/sweeps/tiny.py --workers=0`",
      "workers must be >= 1, got 0", section="sweeps")
def _(tmp):
  from fedjax_dg.bench import launch
  _, exp, _ = _tiny_sweep(tmp)
  return error_of(lambda: launch.run_local(exp, workers=0, quiet=True))


@case(5, "stale jobs in `bench collect`", "a finished job whose summary records another source fingerprint "
      "(the code changed since it ran); `bench collect`", "finished job(s) ran under other code than the current "
      "fedjax_dg", section="sweeps")
def _(tmp):
  import json as json_lib
  from fedjax_dg.bench import collect
  s, exp, w = _tiny_sweep(tmp)
  with open(os.path.join(w, "metrics.jsonl"), "w") as f:
    f.write('{"round": 1, "splits": {}}\n')
  with open(os.path.join(w, "summary.json"), "w") as f:
    json_lib.dump({"selection": {}, "provenance": {"source": {"sha256": "0" * 64}}}, f)
  return error_of(lambda: collect.collect(s, str(tmp / "out"), exp))


@case(5, "`bench report --results` on a file that is not one", "`python -m fedjax_dg.bench report --results "
      "x.jsonl.gz` where x.jsonl.gz is not gzip", "x.jsonl.gz: not a results file (gzip JSON lines)", section="sweeps")
def _(tmp):
  (tmp / "x.jsonl.gz").write_bytes(b"plain text")
  return _run(tmp, [sys.executable, "-m", "fedjax_dg.bench", "report", "--results", str(tmp / "x.jsonl.gz")])


@case(5, "`select_from` naming no search grid", "`sweep.grids.seeds.select_from = 'nope'`",
      "sweep.grids.seeds.select_from: 'nope' is not a search grid of this sweep", section="sweeps")
def _(tmp):
  from fedjax_dg.bench import sweep as sweep_lib
  s, _, _ = _tiny_sweep(tmp)
  s.grids.seeds = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (0,), "select_from": "nope"}
  return error_of(lambda: sweep_lib.expand(s))


@case(5, "`select_seeds` naming a seed its search did not run", "`sweep.grids.seeds.select_seeds = (7,)` where "
      "grid `table` runs seeds 0, 1", "sweep.grids.seeds.select_seeds: [7] not among the seeds of its search grid "
      "'table' ([0, 1])", section="sweeps")
def _(tmp):
  from fedjax_dg.bench import sweep as sweep_lib
  s, _, _ = _tiny_sweep(tmp)
  s.grids.seeds = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (2,),
                   "select_from": "table", "select_seeds": (7,)}
  return error_of(lambda: sweep_lib.expand(s))


for _flag, _value, _expect in (
    ("--batch-memory", "abc", "--batch-memory: cannot read 'abc' as a size; give bytes with an optional unit"),
    ("--batch-memory", "-1G", "--batch-memory must be > 0, got '-1G'"),
    ("--batch-memory", "150%", "--batch-memory: a share of the device's memory must lie in (0%, 100%], got '150%'"),
    ("--max-batch", "0", "--max-batch (runs per batch) must be an integer >= 1, got 0")):
  case(5, f"`bench run {_flag}={_value}`", f"`python -m fedjax_dg.bench run --sweep configs/sweeps/tiny.py "
       f"{_flag}={_value}`", _expect, section="sweeps")(
           lambda tmp, f=_flag, v=_value: _run(tmp, [sys.executable, "-m", "fedjax_dg.bench", "run", "--sweep",
                                                     "configs/sweeps/tiny.py", f"--sweep.root={tmp}/sweep", f"{f}={v}"]))


for _value, _launcher, _expect in (
    ("0", "local", "--tasks_per_job (processes per job) must be an integer >= 1, got 0"),
    ("2", "local", "--tasks_per_job=2 runs a job as several submitit tasks: use --launcher=submitit")):
  case(5, f"`bench run --launcher={_launcher} --tasks_per_job={_value}`", f"`python -m fedjax_dg.bench run --sweep "
       f"configs/sweeps/tiny.py --launcher={_launcher} --tasks_per_job={_value}`", _expect, section="sweeps")(
           lambda tmp, v=_value, la=_launcher: _run(tmp, [
               sys.executable, "-m", "fedjax_dg.bench", "run", "--sweep", "configs/sweeps/tiny.py",
               f"--sweep.root={tmp}/sweep", f"--launcher={la}", f"--tasks_per_job={v}"]))


@case(5, "submitit nodes not dividing the tasks of a job", "`sweep.launch.submitit.nodes = 3` with "
      "`--tasks_per_job=4`", "sweep.launch.submitit.nodes=3 must be >= 1 and divide tasks_per_job=4",
      section="sweeps")
def _(tmp):
  pytest.importorskip("submitit")
  from fedjax_dg.bench import launch
  _, exp, _ = _tiny_sweep(tmp)
  return error_of(lambda: launch.run_submitit(exp, str(tmp / "submitit"), cluster="local", parameters={"nodes": 3},
                                              tasks=4))


# ----------------------------------------------------------------------------- data files

def _iwildcam(tmp, rows, raw: bytes | None = None):
  """An IWildCam release of `rows` (split, y, location) with 5x5 images; `raw` replaces its table."""
  from PIL import Image
  root = tmp / "iwildcam_v2.0"
  os.makedirs(root / "train")
  text = "split,location_remapped,y,filename\n"
  for k, (split, y, loc) in enumerate(rows):
    Image.new("RGB", (5, 5)).save(root / "train" / f"{k}.jpg")
    text += f"{split},{loc},{y},{k}.jpg\n"
  (root / "metadata.csv").write_bytes(raw if raw is not None else text.encode())
  return root


for _label in ("nan", "inf", "1e400", "3.7"):
  case(5, f"WILDS label {_label}", f"`wilds.load_fold` of an IWildCam `metadata.csv` whose row 3 has `y={_label}`",
       f"metadata.csv row 3: column 'y' holds '{_label}', not an integer", section="data files")(
           lambda tmp, v=_label: error_of(lambda: __import__("fedjax_dg.data.wilds", fromlist=["w"]).load_fold(
               _wilds_config(_iwildcam(tmp, [("train", 0, 0), ("train", v, 1), ("val", 1, 2), ("test", 2, 3)]),
                             "iwildcam"))))


@case(5, "WILDS table that is not UTF-8", "an IWildCam `metadata.csv` holding the byte 0xff",
      "metadata.csv: not UTF-8 text (byte b'\\xff' at offset", section="data files")
def _(tmp):
  from fedjax_dg.data import wilds
  root = _iwildcam(tmp, [("train", 0, 0)], raw=b"split,location_remapped,y,filename\ntrain,0,\xff,0.jpg\n")
  return error_of(lambda: wilds.load_fold(_wilds_config(root, "iwildcam")))


@case(5, "WILDS release without its val split", "an IWildCam `metadata.csv` with train and test rows only",
      "no rows in the official 'val' split (held-out-domain selection needs it)", section="data files")
def _(tmp):
  from fedjax_dg.data import wilds
  root = _iwildcam(tmp, [("train", 0, 0), ("train", 1, 1), ("test", 2, 3)])
  return error_of(lambda: wilds.load_fold(_wilds_config(root, "iwildcam")))


@case(5, "CivilComments toxicity NaN", "`all_data_with_identities.csv` whose first comment's toxicity is `nan`",
      "column 'toxicity' holds 'nan', outside [0, 1]", section="data files")
def _(tmp):
  import csv
  from test_text import write_civilcomments
  from fedjax_dg.data import civilcomments
  write_civilcomments(tmp / "cc", n=10)
  path = tmp / "cc" / civilcomments.FILE
  rows = list(csv.reader(open(path, newline="")))
  rows[1][rows[0].index("toxicity")] = "nan"
  with open(path, "w", newline="") as f:
    csv.writer(f).writerows(rows)
  table = civilcomments.read_table(str(tmp / "cc"))
  return error_of(lambda: civilcomments.labels_and_identities(table, str(path)))


@case(5, "Py150 negative token id", "`processed/train_input.json` whose first chunk's second token is -5",
      "train_input.json: example 0 token 1 is -5, outside the token ids [0, 16777216)", section="data files")
def _(tmp):
  from test_text import write_py150
  from fedjax_dg.data import py150
  write_py150(str(tmp / "py150_v1.0"))
  path = tmp / "py150_v1.0" / "processed" / "train_input.json"
  rows = json.loads(path.read_text())
  rows[0][1] = -5
  path.write_text(json.dumps(rows))
  return error_of(lambda: py150.read_split(str(tmp / "py150_v1.0"), "train", py150.repo_table(
      str(tmp / "py150_v1.0"))))


@case(5, "FEMNIST JSON nested very deep", "a LEAF `train/*.json` of 100000 nested lists",
      "JSON nested too deeply (LEAF's files nest three levels)", section="data files")
def _(tmp):
  from fedjax_dg.data import femnist
  (tmp / "deep.json").write_text("[" * 100000 + "]" * 100000)
  return error_of(lambda: femnist.read_leaf_file(str(tmp / "deep.json")))


@case(5, "FEMNIST JSON of the wrong shape", "a LEAF file whose `users` is `5`",
      "not LEAF's layout of users / num_samples / user_data (TypeError:", section="data files")
def _(tmp):
  from fedjax_dg.data import femnist
  (tmp / "f.json").write_text('{"users": 5, "num_samples": [1], "user_data": {}}')
  return error_of(lambda: femnist.read_leaf_file(str(tmp / "f.json")))


@case(5, "IDX images stored as floats", "`train-images-idx3-ubyte` of float32 pixels up to 1e6 (IDX type 0x0D)",
      "images must be unsigned bytes (IDX type 0x08, pixels 0..255), got float32", section="data files")
def _(tmp):
  import struct
  from fedjax_dg.data import idx
  root = _idx_dir(tmp / "mnist", [1] * 12)
  a = np.full((9, 28, 28), 1e6, ">f4")
  with open(os.path.join(root, "train-images-idx3-ubyte"), "wb") as f:
    f.write(bytes([0, 0, 0x0D, 3]) + struct.pack(">3I", *a.shape) + a.tobytes())
  return error_of(lambda: idx.load_mnist_dir(root, num_classes=10))


@case(5, "`hf_config` with zero heads", "`model.hf_config` naming a GPT-2 `config.json` with `n_head: 0`",
      "n_head must be a positive integer, got 0", section="data files")
def _(tmp):
  from fedjax_dg.models import text
  (tmp / "config.json").write_text('{"n_head": 0}')
  return error_of(lambda: text.read_hf_config("gpt2", str(tmp / "config.json")))


@case(5, "`hf_config` with an absurd vocabulary", "a GPT-2 `config.json` with `vocab_size: 10**12`",
      "vocab_size = 1000000000000 exceeds 4194304 (not a gpt2 size)", section="data files")
def _(tmp):
  from fedjax_dg.models import text
  (tmp / "config.json").write_text('{"vocab_size": 1000000000000}')
  return error_of(lambda: text.read_hf_config("gpt2", str(tmp / "config.json")))


@case(5, "truncated token cache", "a token cache `.npy` cut to 100 bytes, then the texts encoded again",
      "unreadable token cache (ValueError:", outcome="warning", section="data files")
def _(tmp):
  from fedjax_dg.data import text
  np.save(tmp / "c.npy", np.zeros((4, 12), np.int32))
  os.truncate(tmp / "c.npy", 100)
  got = []
  line = warning_of(lambda: got.append(text._read_cache(str(tmp / "c.npy"), 4, 12)))  # pylint: disable=protected-access
  assert got == [None]
  return line


@case(5, "workdir below a file", "`P --config.workdir=F/W` where `F` is a file",
      "cannot write there (NotADirectoryError:", section="data files")
def _(tmp):
  from fedjax_dg import rundir
  (tmp / "F").write_text("")

  def enter():
    with rundir.owned(str(tmp / "F" / "W")):
      pass
  return error_of(enter)


@case(5, "workdir /dev/null", "`P --config.workdir=/dev/null`", "workdir '/dev/null': cannot write there",
      section="data files")
def _(tmp):
  from fedjax_dg import rundir

  def enter():
    with rundir.owned("/dev/null"):
      pass
  return error_of(enter)


# ----------------------------------------------------------------------------- failed writes

def _full_disk(tmp, write):
  """`write(folder)` on a full file system: a filled one-page tmpfs where mounting is allowed
  (root), else with the file write failing as on a full disk (ENOSPC, injected)."""
  import errno
  import unittest.mock
  from fedjax_dg import rundir
  where = tmp / "fs"
  os.makedirs(where)
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(where)], capture_output=True).returncode:
    def enospc(path, data):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with unittest.mock.patch.object(rundir, "_write_file", enospc):
      return error_of(lambda: write(where))
  try:
    with contextlib.suppress(OSError), open(where / "filler", "wb", buffering=0) as f:
      while True:
        f.write(b"\0" * 512)
    return error_of(lambda: write(where)).replace(str(where), f"{tmp}/W")
  finally:
    subprocess.run(["umount", "-l", str(where)], check=False)


@case(2, "a full disk while writing metrics.jsonl", "the run's file system full when an evaluation is written",
      "<tmp>/W/metrics.jsonl: cannot write it (no space left on the device); nothing half-written is kept",
      section="run directory")
def _(tmp):
  from fedjax_dg import rundir
  return _full_disk(tmp, lambda w: rundir.write_metrics(str(w), [{"round": 2}])).replace(str(tmp / "fs"), f"{tmp}/W")


@case(2, "a full disk while writing selected/", "the run's file system full when a selection rule's parameters "
      "are saved", "<tmp>/W/selected/heldout_domain.msgpack: cannot write it (no space left on the device)",
      section="run directory")
def _(tmp):
  from fedjax_dg import rundir
  return _full_disk(tmp, lambda w: rundir.save_selected(str(w), "heldout_domain", 2, {"w": np.ones(4)}, {})
                    ).replace(str(tmp / "fs"), f"{tmp}/W")


@case(2, "a file-size limit below a checkpoint", "`P --config.checkpoint_every=2 --config.algorithm.name=scaffold --config.client.momentum=0` "
      "--config.model.hidden=(32,) --config.data.image_size=8` under `ulimit -f 16` (RLIMIT_FSIZE 16 kB: the selected "
      "parameters fit, 10 kB, the checkpoint's 4 client controls do not)",
      "<tmp>/W/checkpoints/2: cannot write it (larger than the file-size limit (ulimit -f, RLIMIT_FSIZE))",
      section="run directory")
def _(tmp):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=helpers.pythonpath(ROOT))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's cache: JAX warns when an entry is over the limit
  env["FEDJAX_DG_COMPILATION_CACHE"] = "off"  # nor the user's: an entry cut at the limit would stay behind
  # the limit set by the shell, not a preexec_fn: no Python runs in a forked child of this multithreaded process
  out = subprocess.run(["bash", "-c", 'ulimit -f 16 && exec "$@"', "bash", sys.executable, "-m", "fedjax_dg", "--config", "configs/default.py", *P,
                        f"--config.workdir={tmp}/W", "--config.checkpoint_every=2", "--config.quiet=True", "--config.algorithm.name=scaffold",
                        "--config.data.image_size=8", "--config.num_rounds=2", "--config.client.momentum=0.0",
                        "--config.model.hidden=(32,)"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, f"exit status {out.returncode}, expected 2; stderr: {out.stderr[-2000:]}"
  assert not os.listdir(tmp / "W" / "checkpoint_sums"), "a checksum names the partial checkpoint"
  return _one_line(out.stderr, "stderr")


@case(2, "checkpoints/ read-only while a save runs", "`W/checkpoints` becomes a read-only mount as checkpoint 2's "
      "save starts (where mounting is not allowed: the save fails with EROFS, injected)",
      "<tmp>/W/checkpoints/2: cannot write it (read-only file system)", section="run directory")
def _(tmp):
  import errno
  from fedjax_dg import checkpoint
  w = tmp / "W"
  ck = checkpoint.Checkpoints(str(w))
  ckdir = str(w / "checkpoints")
  mounted = (subprocess.run(["mount", "--bind", ckdir, ckdir], capture_output=True).returncode == 0
             and subprocess.run(["mount", "-o", "remount,bind,ro", ckdir], capture_output=True).returncode == 0)
  if not mounted:
    subprocess.run(["umount", ckdir], capture_output=True)

    def erofs(*a, **k):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    ck.mngr.save = erofs
  try:
    def save():
      ck.save(2, {"w": np.ones(4, np.float32)})
      ck.close()
    line = error_of(save)
  finally:
    ck.close(quietly=True)
    if mounted:
      subprocess.run(["umount", ckdir], check=True)
  assert os.listdir(w / "checkpoint_sums") == [], "a checksum names the failed checkpoint"
  return line


@case(9, "learned aggregation through 0 rounds", "`P --config.algorithm.name=learned_agg "
      "--config.algorithm.learned.unroll=0`", "algorithm.learned.unroll must be >= 1", group=22)
def _(tmp):
  return cli(tmp, "--config.algorithm.name=learned_agg", "--config.algorithm.learned.unroll=0")


@case(9, "learned aggregation through more rounds than the run", "`P --config.algorithm.name=learned_agg "
      "--config.algorithm.learned.unroll=5` (4 rounds)", "algorithm.learned.unroll: K=5 is larger than the run "
      "(num_rounds=4)", group=22)
def _(tmp):
  return cli(tmp, "--config.algorithm.name=learned_agg", "--config.algorithm.learned.unroll=5")


# ----------------------------------------------------------------------------- run lists (batched runs)

@case(1, "a run list with an unknown field", "`P --config.runs=\"('seed=1', 'sed=2')\"`",
      "runs[1]: unknown field 'sed'; did you mean 'seed'?", section="config fields")
def _run_list_unknown_field(tmp):
  return cli(tmp, "--config.runs=('seed=1', 'sed=2')")


@case(1, "a run list whose runs differ in a static field", "`experiment.train_and_evaluate` of `P` with "
      "`runs = ('seed=1', 'model.hidden=(8,)')`: the runs cannot share one program",
      "run 1 (<tmp>/W/run_1): model.hidden is [8], run 0's is [200, 200]; the runs of one batch may differ only in "
      "seeds and continuous hyperparameters", section="config fields")
def _run_list_static_field(tmp):
  from fedjax_dg import experiment
  c = _p_config(tmp, runs=("seed=1", "model.hidden=(8,)"))
  return error_of(lambda: experiment.train_and_evaluate(c))


@case(1, "a run list with a value out of its range", "`experiment.train_and_evaluate` of `P` with "
      "`algorithm.name = 'fedprox'` and `runs = ('seed=1', 'algorithm.fedprox.mu=-1.0')`",
      "run 1 (<tmp>/W/run_1): algorithm.fedprox.mu must be >= 0", section="config fields")
def _run_list_out_of_range(tmp):
  from fedjax_dg import experiment
  c = _p_config(tmp, **{"algorithm.name": "fedprox", "runs": ("seed=1", "algorithm.fedprox.mu=-1.0")})
  return error_of(lambda: experiment.train_and_evaluate(c))


# ----------------------------------------------------------------------------- several processes
# Cases that need two processes (configs that differ across processes, host_loop across
# processes, a fault in one process) are in tests/test_distributed_runner.py.

@case(5, "unknown start-up mode", "`P --config.distributed.initialize=mpi`",
      "distributed.initialize: unknown 'mpi'", section="several processes")
def _distributed_unknown_mode(tmp):
  return cli(tmp, "--config.distributed.initialize=mpi")


@case(5, "no coordinator address", "`P --config.distributed.initialize=local` (no address)",
      "distributed.coordinator_address: distributed.initialize='local' needs the coordinator as HOST:PORT",
      section="several processes")
def _distributed_no_address(tmp):
  return cli(tmp, "--config.distributed.initialize=local")


@case(5, "process id out of range", "`--config.distributed.num_processes=2 --config.distributed.process_id=2`",
      "distributed.process_id must lie in [0, 1]", section="several processes")
def _distributed_bad_id(tmp):
  return cli(tmp, "--config.distributed.initialize=local", "--config.distributed.coordinator_address=localhost:1",
             "--config.distributed.num_processes=2", "--config.distributed.process_id=2")


@case(5, "unreachable coordinator", "process 1 of 2 with no process 0 at `localhost:1`, "
      "`--config.distributed.timeout_s=3`",
      "distributed.coordinator_address: no coordinator answered at localhost:1 within 3 s",
      section="several processes")
def _distributed_no_coordinator(tmp):
  return cli(tmp, "--config.distributed.initialize=local", "--config.distributed.coordinator_address=localhost:1",
             "--config.distributed.num_processes=2", "--config.distributed.process_id=1",
             "--config.distributed.timeout_s=3")


@case(5, "two processes given the same process id", "process 1 of a 2-process job holds its id on this machine "
      "(coordinator `localhost:PORT`), then another process starts as process 1 of the same job",
      "distributed.process_id: 1 is already used by process <pid> on this machine", section="several processes")
def _distributed_same_id(tmp):
  from test_process_ids import free_address, holder, second_process
  address = free_address()
  p = holder(address)
  try:
    out, _ = second_process(tmp, address, timeout_s=60)
  finally:
    p.kill()
    p.wait()
  assert out.returncode == 2, out.stderr[-2000:]
  line = _one_line(out.stderr, "stderr").replace(f"process {p.pid} ", "process <pid> ")
  return line.replace(address, "localhost:<port>")


@case(5, "resume with another process count", "a checkpoint whose checksum file says 2 processes saved it "
      "(`\"topology\": [2, D]`), restored by one process; tests/test_resume_process_count.py resumes real 2-process "
      "runs as one (and one as two), equal to the uninterrupted run", "round 2 restored", outcome="works",
      section="several processes")
def _distributed_other_topology(tmp):
  import jax.numpy as jnp
  from fedjax_dg import checkpoint
  state = {"w": jnp.arange(4.0)}
  ckpt = checkpoint.Checkpoints(str(tmp / "W"), run="00112233aabbccdd")
  ckpt.save(2, state)
  ckpt.close()
  path = tmp / "W" / "checkpoint_sums" / "2.json"
  record = json.loads(path.read_text())
  record["topology"] = [2, 2 * record["topology"][1]]
  path.write_text(json.dumps(record))
  ckpt = checkpoint.Checkpoints(str(tmp / "W"), run="00112233aabbccdd")
  step, got = ckpt.restore_latest(lambda step: checkpoint.shape_of(state))
  ckpt.close()
  import jax
  assert step == 2 and np.array_equal(np.asarray(got["w"]), np.arange(4.0))
  assert got["w"].sharding.is_fully_replicated and len(got["w"].sharding.device_set) == jax.device_count()
  return "round 2 restored, every array replicated over this process's devices"


@case(5, "host-held states for a staged method", "`P --config.algorithm.name=fedloe "
      "--config.engine.host_client_states=True`", "engine.host_client_states: 'fedloe' runs in stages",
      section="config fields")
def _host_states_staged(tmp):
  return cli(tmp, "--config.algorithm.name=fedloe", "--config.engine.host_client_states=True")


# ----------------------------------------------------------------------------- the runner, fourth pass

@case(1, "a field set twice in one run-list entry", "`P --config.runs=\"('seed=1,seed=2',)\"`",
      "runs[0]: seed is set twice in one entry ('seed=1,seed=2'); give each field once",
      section="config fields")
def _run_list_field_twice(tmp):
  return cli(tmp, "--config.runs=('seed=1,seed=2',)")


@case(1, "a run list mixing methods", "`experiment.train_and_evaluate` of `P` with "
      "`runs = ('seed=1', 'algorithm.name=irm')`: the method is named, not a field of one method",
      "run 1 (<tmp>/W/run_1): algorithm.name is 'irm', run 0's is 'fedavg'", section="config fields")
def _run_list_mixed_methods(tmp):
  from fedjax_dg import experiment
  c = _p_config(tmp, runs=("seed=1", "algorithm.name=irm"))
  return error_of(lambda: experiment.train_and_evaluate(c))


@case(1, "a run list in a single run's folder", "`P` run to the end in `W`, then `P --config.runs=\"('seed=1',)\"` "
      "in the same `W`", "holds a single run's files (metrics.jsonl, summary.json, selected/); a run list writes "
      "run_<i>/ and runs.json", section="run directory")
def _run_list_over_single(tmp):
  from fedjax_dg import experiment
  experiment.train_and_evaluate(_p_config(tmp, num_rounds=2, quiet=True))
  return error_of(lambda: experiment.train_and_evaluate(_p_config(tmp, num_rounds=2, quiet=True, runs=("seed=1",))))


@case(1, "a single run in a run list's folder", "`P --config.runs=\"('seed=1',)\"` run in `W`, then `P` in the same `W`",
      "holds a run list (runs.json, run_<i>/); a single run does not share a folder with a batch",
      section="run directory")
def _single_over_run_list(tmp):
  from fedjax_dg import experiment
  experiment.train_and_evaluate(_p_config(tmp, num_rounds=2, quiet=True, runs=("seed=1",)))
  return error_of(lambda: experiment.train_and_evaluate(_p_config(tmp, num_rounds=2, quiet=True)))


@case(1, "the learned rule diverging on its own step", "`P --config.algorithm.name=learned_agg "
      "--config.algorithm.learned.outer_lr=1e30` (and `quiet`)", "or algorithm.learned.outer_lr (now 1e+30)",
      section="config fields")
def _learned_outer_lr(tmp):
  return cli(tmp, "--config.algorithm.name=learned_agg", "--config.algorithm.learned.outer_lr=1e30",
             "--config.eval_every=1", "--config.quiet=True")


@case(1, "the memory check under a process limit", "`checks.check_memory` of the CNN with 3 x 10^7 local steps "
      "(4.5 GiB of index arrays) while "
      "`ulimit -v` is 4 GiB on a machine with more memory",
      "more than the process's address-space limit (ulimit -v), 4.0 GiB", section="config fields")
def _memory_under_ulimit(tmp):
  import resource
  from fedjax_dg import checks
  from fedjax_dg.models import build_model
  c = _p_config(tmp, **{"model.name": "cnn"})
  model = build_model(c.model, (16, 16, 1), 10)
  soft, hard = resource.getrlimit(resource.RLIMIT_AS)
  resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))
  try:
    return error_of(lambda: checks.check_memory(c, model, (16, 16, 1), 1, "sequential", 3 * 10 ** 7))
  finally:
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@case(1, "an evaluation lost after its checkpoint", "`P --config.num_rounds=4 --config.eval_every=2 "
      "--config.checkpoint_every=2` stopped after round 4's checkpoint with metrics.jsonl's last line torn, resumed",
      "read from checkpoint_losses.json, as the uninterrupted run recorded it", outcome="works",
      section="run directory")
def _torn_line_keeps_the_loss(tmp):
  import json as json_lib
  from fedjax_dg import experiment
  c = _p_config(tmp, num_rounds=4, eval_every=2, checkpoint_every=2, quiet=True)
  experiment.train_and_evaluate(c)
  path = os.path.join(f"{tmp}/W", "metrics.jsonl")
  lines = open(path).read().splitlines()
  want = json_lib.loads(lines[-1])["train_loss"]
  with open(path, "w") as f:
    f.write("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
  os.remove(os.path.join(f"{tmp}/W", "summary.json"))
  c.resume = True
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    experiment.train_and_evaluate(c)
  got = [json_lib.loads(l) for l in open(path)][-1]["train_loss"]
  assert got == want, (got, want)
  return f"round 4 evaluated again on resume, its training loss {got:.6f} read from checkpoint_losses.json, as the " \
         "uninterrupted run recorded it"


@case(9, "meta: a NaN outer variable", "`meta.hypergradient` with `meta.hparams = {'client.lr': nan}`",
      "meta.hparams['client.lr']: must be finite, got nan", section="hypergradients")
def _meta_nan(tmp):
  from fedjax_dg import meta
  p, state, key = meta.from_config(_p_config(tmp, num_rounds=2))
  m = meta.init_meta(p, ("client.lr",), weights=False)
  m = m._replace(hparams={"client.lr": float("nan")})
  fn = meta.hypergradient(p, meta.validation_loss(p.model), 2)
  return error_of(lambda: fn(m, state, key))


@case(9, "meta: truncate=True", "`meta.check_rounds(3, True)`", "truncate: K=True must lie in [1, rounds=3]",
      section="hypergradients")
def _meta_truncate_bool(tmp):
  from fedjax_dg import meta
  return error_of(lambda: meta.check_rounds(3, True))


@case(9, "meta: a fractional round count", "`meta.check_rounds(2.0, None)`", "rounds: must be a positive integer, "
      "got 2.0", section="hypergradients")
def _meta_rounds_float(tmp):
  from fedjax_dg import meta
  return error_of(lambda: meta.check_rounds(2.0, None))


# ----------------------------------------------------------------------------- running and the table

_RESULTS: dict[str, tuple[str | None, str | None]] = {}  # name -> (line, failure)


def _result(c: Case, tmp_path_factory) -> tuple[str | None, str | None]:
  if c.name not in _RESULTS:
    tmp = tmp_path_factory.mktemp(re.sub(r"[^a-z0-9]+", "_", c.name.lower())[:40])
    try:
      line, failure = _normalise(c.run(tmp), tmp), None
      if c.expect not in line:
        failure = f"expected {c.expect!r} in {line!r}"
    except Exception as e:  # pylint: disable=broad-except  # reported per case
      line, failure = None, f"{type(e).__name__}: {e}"
    _RESULTS[c.name] = (line, failure)
  return _RESULTS[c.name]


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
def test_bad_input_gets_its_line(c, tmp_path_factory):
  _, failure = _result(c, tmp_path_factory)
  assert failure is None, f"{c.name}: {failure}"


def _cell(text: str) -> str:
  text = text.replace("|", "\\|")
  return f"`` {text} ``" if "`" in text else f"`{text}`"


def render(results: dict[str, str]) -> str:
  lines = [
      "# Bad inputs and what they get",
      "",
      "Every bad input and fault that is handled, and the line the user sees; then the refusals",
      "of what does not apply to the text datasets (checked before any data is read); then the run",
      "directory (one owner, one identity, nothing mixed or lost on resume), untrusted files",
      "(declared sizes checked before anything is inflated), config fields (types, ranges and a",
      "memory estimate before compiling), config files, sweeps, and data files.",
      "Generated by `tests/test_bad_inputs.py`, which runs each case and fails when this file",
      f"differs from what the cases print; regenerate with `{REGENERATE}`.",
      "`P` is the base command, `fedjax-dg --config configs/default.py --config.model.name=mlp",
      "--config.num_clients=4 --config.num_rounds=4 --config.checkpoint_every=0 --config.workdir=W`;",
      "on the command line an error is printed as `error: <message>` with exit status 2. Outcomes:",
      "*error*, refused with the message; *warning*, goes on after the one line; *works*, handled",
      "without a message.",
      "",
      "| item | bad input | how | outcome | line |",
      "| --- | --- | --- | --- | --- |",
  ]
  order = sorted(range(len(CASES)), key=lambda k: (CASES[k].group != 13, CASES[k].group, CASES[k].item, k))
  for k in order:
    c = CASES[k]
    item = c.section or (c.item if c.group == 13 else "text")
    lines.append(f"| {item} | {c.name} | {c.trigger} | {c.outcome} | {_cell(results[c.name])} |")
  return "\n".join(lines) + "\n"


def test_docs_table_is_up_to_date(tmp_path_factory):
  results = {c.name: _result(c, tmp_path_factory) for c in CASES}
  failed = {n: f for n, (_, f) in results.items() if f}
  assert not failed, f"cases failing, table not checked: {failed}"
  text = render({n: line for n, (line, _) in results.items()})
  if os.environ.get("REGENERATE_BAD_INPUTS"):
    os.makedirs(os.path.dirname(DOC), exist_ok=True)
    with open(DOC, "w") as f:
      f.write(text)
  old = open(DOC).read() if os.path.exists(DOC) else ""
  diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "docs/bad_inputs.md", "generated"))
  assert old == text, f"docs/bad_inputs.md is stale; regenerate with: {REGENERATE}\n{diff[:4000]}"

