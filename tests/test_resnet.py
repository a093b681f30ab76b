"""ResNet featurizers and torchvision weight conversion, checked without torch.

The forward pass is compared with an independent float64 NumPy ResNet written directly on
the torchvision `state_dict` (NCHW, explicit conv windows, eval-mode BN); `.pth` reading is
checked on fixtures written once by real torch (tests/fixtures/make_torch_fixtures.py) and
on files from a hand-written torch-zip writer (big-endian, views, offsets).
"""
import collections
import contextlib
import importlib.util
import io
import os
import pickle
import subprocess
import sys
import types
import zipfile

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import traverse_util
from safetensors.numpy import save_file

from fedjax_dg.models import build_model, convert, resnet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
# torchvision.models.resnet: (blocks per stage, bottleneck?)
ARCH = {"resnet18": ((2, 2, 2, 2), False), "resnet50": ((3, 4, 6, 3), True)}


def model_config(name, **kw):
  return ml_collections.ConfigDict({"name": name, "head_hidden": (), **kw})


# ---------------------------------------------------------------- torchvision-format weights

def torchvision_state_dict(arch, seed=0):
  """Random weights under torchvision's exact key names and shapes (fc included). The last
  BN of each residual branch has a small gain, as in trained ResNets, so that features stay
  O(1) through 16 blocks instead of growing with depth."""
  stages, bottleneck = ARCH[arch]
  rng = np.random.default_rng(seed)
  sd = {}

  def conv(name, out_c, in_c, k):
    sd[name + ".weight"] = (rng.normal(size=(out_c, in_c, k, k)) * np.sqrt(2 / (in_c * k * k))).astype(np.float32)

  def bn(name, c, gain=(0.5, 1.5)):
    sd[name + ".weight"] = rng.uniform(*gain, c).astype(np.float32)
    sd[name + ".bias"] = rng.normal(0, 0.1, c).astype(np.float32)
    sd[name + ".running_mean"] = rng.normal(0, 0.2, c).astype(np.float32)
    sd[name + ".running_var"] = rng.uniform(0.5, 2.0, c).astype(np.float32)
    sd[name + ".num_batches_tracked"] = np.array(7, np.int64)

  conv("conv1", 64, 3, 7)
  bn("bn1", 64)
  inplanes = 64
  for stage, blocks in enumerate(stages):
    planes = 64 * 2 ** stage
    out = 4 * planes if bottleneck else planes
    for i in range(blocks):
      p = f"layer{stage + 1}.{i}."
      stride = 2 if stage > 0 and i == 0 else 1
      if bottleneck:
        conv(p + "conv1", planes, inplanes, 1), bn(p + "bn1", planes)
        conv(p + "conv2", planes, planes, 3), bn(p + "bn2", planes)
        conv(p + "conv3", out, planes, 1), bn(p + "bn3", out, (0.1, 0.4))
      else:
        conv(p + "conv1", planes, inplanes, 3), bn(p + "bn1", planes)
        conv(p + "conv2", planes, planes, 3), bn(p + "bn2", planes, (0.1, 0.4))
      if stride != 1 or inplanes != out:
        conv(p + "downsample.0", out, inplanes, 1), bn(p + "downsample.1", out)
      inplanes = out
  sd["fc.weight"] = rng.normal(size=(1000, inplanes)).astype(np.float32)
  sd["fc.bias"] = np.zeros(1000, np.float32)
  return sd


# ---------------------------------------------------------------- NumPy float64 reference (NCHW)

def np_conv(x, w, stride, pad):
  """torch's Conv2d (cross-correlation, no bias) over explicit windows of the padded input."""
  x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  k = w.shape[-1]
  windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
  return np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64), optimize=True)


def np_bn(x, sd, name):
  """Eval-mode BatchNorm2d, eps 1e-5."""
  g, b, m, v = (sd[f"{name}.{k}"].astype(np.float64)[None, :, None, None]
                for k in ("weight", "bias", "running_mean", "running_var"))
  return (x - m) / np.sqrt(v + 1e-5) * g + b


def np_maxpool(x):
  """MaxPool2d(3, stride 2, padding 1): padding never wins the max."""
  x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
  return np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-2, -1))


def np_block(sd, p, x, stride, bottleneck):
  relu = lambda z: np.maximum(z, 0)
  if bottleneck:
    y = relu(np_bn(np_conv(x, sd[p + "conv1.weight"], 1, 0), sd, p + "bn1"))
    y = relu(np_bn(np_conv(y, sd[p + "conv2.weight"], stride, 1), sd, p + "bn2"))
    y = np_bn(np_conv(y, sd[p + "conv3.weight"], 1, 0), sd, p + "bn3")
  else:
    y = relu(np_bn(np_conv(x, sd[p + "conv1.weight"], stride, 1), sd, p + "bn1"))
    y = np_bn(np_conv(y, sd[p + "conv2.weight"], 1, 1), sd, p + "bn2")
  if p + "downsample.0.weight" in sd:
    x = np_bn(np_conv(x, sd[p + "downsample.0.weight"], stride, 0), sd, p + "downsample.1")
  return relu(y + x)


def np_resnet(sd, x_nchw, arch):
  """torchvision's ResNet.forward up to avgpool + flatten, in float64."""
  stages, bottleneck = ARCH[arch]
  x = np.maximum(np_bn(np_conv(x_nchw.astype(np.float64), sd["conv1.weight"], 2, 3), sd, "bn1"), 0)
  x = np_maxpool(x)
  for stage, blocks in enumerate(stages):
    for i in range(blocks):
      x = np_block(sd, f"layer{stage + 1}.{i}.", x, 2 if stage > 0 and i == 0 else 1, bottleneck)
  return x.mean(axis=(2, 3))


# ---------------------------------------------------------------- torch-zip writer (no torch)

@contextlib.contextmanager
def fake_torch():
  """Stand-ins for the torch globals pickled by name, in sys.modules only while writing."""
  torch_mod, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

  def _rebuild_tensor_v2(*args):
    raise AssertionError("never called: only pickled by reference")

  _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
  utils._rebuild_tensor_v2 = _rebuild_tensor_v2
  for name in ("FloatStorage", "DoubleStorage", "LongStorage", "HalfStorage"):
    setattr(torch_mod, name, type(name, (), {"__module__": "torch"}))
  torch_mod._utils = utils
  saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
  sys.modules.update({"torch": torch_mod, "torch._utils": utils})
  try:
    yield torch_mod
  finally:
    for k, v in saved.items():
      if v is None:
        sys.modules.pop(k)
      else:
        sys.modules[k] = v


STORAGE_NAMES = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
                 np.dtype(np.int64): "LongStorage", np.dtype(np.float16): "HalfStorage"}


class _StorageRef:
  def __init__(self, key, array):
    self.key, self.array = key, array


class _TensorRef:
  def __init__(self, rebuild, storage, offset, size, stride):
    self.args = (rebuild, (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict()))

  def __reduce__(self):
    return self.args


def write_torch_zip(path, storages, tensors, byteorder="little", prefix="archive", wrap=None):
  """A `torch.save` zip file: `storages` {key: 1-d array}, `tensors` {name: (key, offset,
  size, stride)} (in elements); the state_dict is an OrderedDict, or `{wrap: it}`."""
  with fake_torch() as torch_mod:
    refs = {k: _StorageRef(k, a) for k, a in storages.items()}
    state = collections.OrderedDict(
        (name, _TensorRef(torch_mod._utils._rebuild_tensor_v2, refs[key], off, size, stride))
        for name, (key, off, size, stride) in tensors.items())
    obj = {wrap: state} if wrap else state

    class Pickler(pickle.Pickler):
      def persistent_id(self, o):
        if isinstance(o, _StorageRef):
          return ("storage", getattr(torch_mod, STORAGE_NAMES[o.array.dtype]), o.key, "cpu", o.array.size)
        return None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr(f"{prefix}/data.pkl", buf.getvalue())
    zf.writestr(f"{prefix}/byteorder", byteorder)
    zf.writestr(f"{prefix}/version", "3\n")
    for key, a in storages.items():
      raw = a.astype(a.dtype.newbyteorder("<" if byteorder == "little" else ">")).tobytes()
      zf.writestr(f"{prefix}/data/{key}", raw)


def write_state_dict_pth(path, sd, **kw):
  """`sd` as a torch zip file, one contiguous storage per tensor."""
  storages = {str(i): np.ascontiguousarray(v).reshape(-1) for i, v in enumerate(sd.values())}
  strides = lambda shape: tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
  tensors = {k: (str(i), 0, v.shape, strides(v.shape)) for i, (k, v) in enumerate(sd.items())}
  write_torch_zip(path, storages, tensors, **kw)


def params_without_init(model, arch, seed=0):
  """Params for `model` without its random init (which compiles one RNG kernel per shape,
  slow on CPU): the featurizer converted from a random torchvision state_dict, a random head."""
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)
  head = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype), shapes["classifier"])
  feat = jax.tree.map(jnp.asarray, convert.torchvision_to_flax(torchvision_state_dict(arch, seed)))
  return {"featurizer": feat, "classifier": head}


# ---------------------------------------------------------------- (a) forward pass vs NumPy

@pytest.mark.parametrize("arch,size,dim", [("resnet18", 64, 512), ("resnet50", 32, 2048)])
def test_converted_forward_matches_numpy_reference(tmp_path, arch, size, dim):
  sd = torchvision_state_dict(arch)
  path = str(tmp_path / f"{arch}.safetensors")
  save_file(sd, path)
  model = build_model(model_config(arch), (size, size, 3), 5)
  params = resnet.load_pretrained(jax.eval_shape(model.init, jax.random.PRNGKey(0)), path)
  x = np.random.default_rng(1).integers(0, 256, size=(2, size, size, 3)).astype(np.uint8)  # stored pixels
  ours = np.asarray(model.features(params, jnp.asarray(x)), np.float64)
  # The model reads x / 255 normalised with ImageNet's statistics (as torchvision's transforms).
  xn = (x / 255.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
  ref = np_resnet(sd, xn.transpose(0, 3, 1, 2), arch)
  assert ours.shape == ref.shape == (2, dim)
  err, scale = np.max(np.abs(ours - ref)), np.max(np.abs(ref))
  print(f"{arch} {size}x{size}: max abs err {err:.3g}, max |ref| {scale:.3g}")
  assert err <= 1e-4 * max(scale, 1.0), (err, scale)


def test_pth_safetensors_npz_msgpack_load_the_same(tmp_path):
  sd = torchvision_state_dict("resnet18")
  save_file(sd, str(tmp_path / "w.safetensors"))
  write_state_dict_pth(str(tmp_path / "w.pth"), sd, wrap="state_dict")
  tree = convert.load_featurizer_weights(str(tmp_path / "w.safetensors"))
  for suffix in (".npz", ".msgpack"):
    convert.save_converted(tree, str(tmp_path / f"w{suffix}"))
  flat = traverse_util.flatten_dict(tree, sep="/")
  np.testing.assert_array_equal(flat["conv1/kernel"], sd["conv1.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(flat["layer2_0/downsample_bn/scale"], sd["layer2.0.downsample.1.weight"])
  for name in ("w.pth", "w.npz", "w.msgpack"):
    other = traverse_util.flatten_dict(convert.load_featurizer_weights(str(tmp_path / name)), sep="/")
    assert other.keys() == flat.keys()
    for k in flat:
      np.testing.assert_array_equal(other[k], flat[k], err_msg=f"{name}: {k}")


def test_cli_converts_and_checks(tmp_path):
  save_file(torchvision_state_dict("resnet18"), str(tmp_path / "w.safetensors"))
  out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "convert_torchvision_weights.py"),
                        str(tmp_path / "w.safetensors"), str(tmp_path / "w.npz"), "--arch", "resnet18"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr
  assert "100 of 122 tensors converted" in out.stdout and "matches resnet18" in out.stdout


@pytest.mark.parametrize("content,dst,message", [
    (b"hello", "w.npz", "{src}: cannot read weights (UnpicklingError: Memo value not found at index 101)"),
    (None, "w.npz", "pretrained weights not found: {src}"),
    ("strided", "w.npz", "{src}: tensor 'conv1.weight': stride 0 in dimension 0 (size 4096); strides must be positive"),
    ("foreign", "w.npz", "{src}: not a torchvision ResNet key: 'encoder.weight'"),
    ("ok", "w.pt", "{dst}: converted weights are written as one of ('.npz', '.msgpack')")])
def test_cli_on_a_bad_file_prints_one_line_and_exits_2(tmp_path, monkeypatch, capsys, content, dst, message):
  """The script's `main`, in this process. Its `sys.exit(main())` in a fresh interpreter is
  checked by `test_cli_converts_and_checks` (exit 0) and test_bad_inputs' "torchvision
  converter on a bad file" (exit 2, one line)."""
  src, dst = str(tmp_path / "in.pth"), str(tmp_path / dst)
  if content == "strided":
    write_torch_zip(src, {"0": np.ones(1, np.float32)}, {"conv1.weight": ("0", 0, (4096,), (0,))})
  elif content == "foreign":
    write_state_dict_pth(src, {"encoder.weight": np.ones((2, 2), np.float32)})
  elif content == "ok":
    write_state_dict_pth(src, {"conv1.weight": np.ones((4, 3, 1, 1), np.float32)})
  elif content is not None:
    with open(src, "wb") as f:
      f.write(content)
  monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository first
  path = os.path.join(ROOT, "scripts", "convert_torchvision_weights.py")
  spec = importlib.util.spec_from_file_location("convert_script", path)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  rc = script.main([src, dst])
  out, err = capsys.readouterr()
  assert (rc, out, err) == (2, "", "error: " + message.format(src=src, dst=dst) + "\n")
  assert not os.path.exists(dst)


# ---------------------------------------------------------------- (b) .pth format

@pytest.mark.parametrize("name", ["torch_tiny.pth", "torch_tiny_legacy.pth"])
def test_reads_real_torch_files(name):
  """Files written by torch 2.13 (zip and legacy): views, offsets, int64, half, bfloat16,
  bool, 0-d, empty, an nn.Parameter and a module state_dict with `_metadata`."""
  sd = convert.read_state_dict(os.path.join(FIXTURES, name))
  with np.load(os.path.join(FIXTURES, "torch_tiny_expected.npz")) as expected:
    assert list(sd) == list(expected.files)
    for k in expected.files:
      got = sd[k].astype(np.float32) if k == "bf" else sd[k]
      assert got.dtype == expected[k].dtype and got.shape == expected[k].shape, k
      np.testing.assert_array_equal(got, expected[k], err_msg=k)
  assert sd["bf"].dtype.name == "bfloat16" and sd["idx"][-1] == 2 ** 40


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_reads_strided_views_of_shared_storages(tmp_path, byteorder):
  base = np.arange(24, dtype=np.float32) * 0.5 - 3
  storages = {"0": base, "1": np.array([5, -(2 ** 40), 7], np.int64), "2": np.array([1.5, 2.5], np.float64)}
  tensors = {"base": ("0", 0, (4, 6), (6, 1)), "t": ("0", 0, (6, 4), (1, 6)), "off": ("0", 8, (2, 3), (6, 1)),
             "col": ("0", 3, (4,), (6,)), "ints": ("1", 1, (2,), (1,)), "scalar": ("2", 1, (), ()),
             "unit": ("2", 1, (1, 1), (0, 0))}  # a dimension of size 1 never moves: its stride is free
  path = str(tmp_path / "v.pt")
  write_torch_zip(path, storages, tensors, byteorder=byteorder, prefix="some_stem")
  sd = convert.read_state_dict(path)
  m = base.reshape(4, 6)
  expected = {"base": m, "t": m.T, "off": m[1:3, 2:5], "col": m[:, 3], "ints": np.array([-(2 ** 40), 7]),
              "scalar": np.float64(2.5), "unit": np.array([[2.5]])}
  for k, v in expected.items():
    assert sd[k].shape == np.shape(v) and sd[k].dtype.isnative, k
    np.testing.assert_array_equal(sd[k], v, err_msg=k)


@pytest.mark.parametrize("size,stride,offset,storage,message", [
    ((2 ** 26,), (0,), 0, 1, "stride 0 in dimension 0 (size 67108864); strides must be positive"),
    ((3, 2 ** 24), (1, 0), 0, 3, "stride 0 in dimension 1 (size 16777216); strides must be positive"),
    ((4, 2), (-2, 1), 6, 8, "stride -2 in dimension 0 (size 4); strides must be positive"),
    ((2, 3), (1, 0), 0, 2, "stride 0 in dimension 1 (size 3); strides must be positive"),  # torch's expand()
    ((100, 100), (1, 1), 0, 100,
     "a view of 10000 elements (size (100, 100)) on a storage of 100 elements from offset 0; "
     "a view may not be larger than its storage"),
    ((4,), (1,), 9, 8, "offset 9 lies outside its storage of 8 elements"),
    ((2, 3), (3,), 0, 8, "size (2, 3) and stride (3,) do not describe a tensor")])
def test_views_that_would_allocate_more_than_their_storage_are_refused(tmp_path, size, stride, offset, storage,
                                                                        message):
  """A few hundred bytes of `.pth` with stride 0 used to allocate any amount (1 GiB for
  `(2**28,)`); the file and the key are named and nothing is allocated."""
  import tracemalloc
  path = str(tmp_path / "evil.pth")
  write_torch_zip(path, {"0": np.ones(3, np.float32), "1": np.ones(storage, np.float32)},
                  {"conv1.weight": ("0", 0, (3,), (1,)), "bn1.bias": ("1", offset, size, stride)}, wrap="state_dict")
  assert os.path.getsize(path) < 2000
  tracemalloc.start()
  try:
    with pytest.raises(ValueError) as e:
      convert.read_state_dict(path)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert str(e.value) == f"{path}: tensor 'state_dict.bn1.bias': {message}"
  assert peak < 1 << 20


# ---------------------------------------------------------------- (c) frozen BN

def test_frozen_bn_stats_get_zero_gradient():
  model = build_model(model_config("resnet18"), (32, 32, 3), 3)
  params = params_without_init(model, "resnet18")
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 32, 3))
  grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x) ** 2)))(params)
  flat = traverse_util.flatten_dict(grads["featurizer"], sep="/")
  stats = [k for k in flat if k.endswith(resnet.BN_STATS)]
  assert len(stats) == 2 * 20  # 20 BN layers in ResNet-18, incl. 3 downsample BNs
  assert all(not np.any(flat[k]) for k in stats)
  assert np.any(flat["bn1/scale"]) and np.any(flat["layer4_1/bn2/bias"])
  # the optimizer, masked weight decay included, leaves the statistics where they were
  opt = optax.chain(optax.add_decayed_weights(0.1, mask=resnet.trainable_mask), optax.adam(1e-2))
  step = jax.jit(lambda p, g: optax.apply_updates(p, opt.update(g, opt.init(p), p)[0]))
  new = traverse_util.flatten_dict(step(params, grads)["featurizer"], sep="/")
  old = traverse_util.flatten_dict(params["featurizer"], sep="/")
  assert all(np.array_equal(new[k], old[k]) for k in stats)
  assert not np.array_equal(new["bn1/scale"], old["bn1/scale"])


def test_frozen_bn_uses_running_stats_batch_bn_uses_batch_stats():
  x = 3.0 + 2.0 * jax.random.normal(jax.random.PRNGKey(0), (4, 5, 5, 3))
  p = {"scale": jnp.array([1.0, 2.0, 0.5]), "bias": jnp.array([0.0, 1.0, -1.0]),
       "running_mean": jnp.array([0.5, -1.0, 2.0]), "running_var": jnp.array([4.0, 1.0, 0.25])}
  frozen = resnet.BatchNorm(freeze=True).apply({"params": p}, x)
  np.testing.assert_allclose(frozen, (x - p["running_mean"]) / jnp.sqrt(p["running_var"] + 1e-5) * p["scale"]
                             + p["bias"], rtol=1e-5, atol=1e-5)
  batch = resnet.BatchNorm(freeze=False).apply({"params": p}, x)
  np.testing.assert_allclose(batch.mean(axis=(0, 1, 2)), p["bias"], atol=1e-5)
  np.testing.assert_allclose(batch.std(axis=(0, 1, 2)), p["scale"], rtol=1e-4)


def test_batch_bn_couples_samples_and_frozen_does_not():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 32, 32, 3))
  for freeze in (True, False):
    model = build_model(model_config("resnet18", freeze_bn=freeze), (32, 32, 3), 3)
    params = params_without_init(model, "resnet18")
    features = jax.jit(model.features)  # one program per batch size, not one per primitive
    same = np.allclose(features(params, x)[:1], features(params, x[:2])[:1], atol=1e-5)
    assert same == freeze


def test_freeze_featurizer_trains_only_the_head():
  model = build_model(model_config("resnet18", freeze_featurizer=True), (32, 32, 3), 3)
  params = params_without_init(model, "resnet18")
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 32, 32, 3))
  grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x) ** 2)))(params)
  assert not any(np.any(g) for g in jax.tree.leaves(grads["featurizer"]))
  assert all(np.any(g) for g in jax.tree.leaves(grads["classifier"]))


# ---------------------------------------------------------------- (d) errors

@pytest.fixture(scope="module")
def resnet18_shapes():
  module = resnet.featurizer("resnet18", ml_collections.ConfigDict())
  return {"featurizer": jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))["params"]}


def test_shape_mismatch_names_file_and_key(tmp_path, resnet18_shapes):
  sd = torchvision_state_dict("resnet18")
  sd["layer3.1.conv2.weight"] = sd["layer3.1.conv2.weight"][:, :, :1, :1]
  path = str(tmp_path / "bad.safetensors")
  save_file(sd, path)
  with pytest.raises(ValueError, match=r"bad\.safetensors: shape mismatch at 'layer3_1/conv2/kernel'") as e:
    resnet.load_pretrained(resnet18_shapes, path)
  assert "\n" not in str(e.value)


def test_missing_and_unexpected_keys_are_named(tmp_path, resnet18_shapes):
  sd = torchvision_state_dict("resnet18")
  del sd["layer4.1.bn2.running_var"]
  save_file(sd, str(tmp_path / "short.safetensors"))
  with pytest.raises(ValueError, match=r"short\.safetensors: missing featurizer parameter 'layer4_1/bn2/running_var"):
    resnet.load_pretrained(resnet18_shapes, str(tmp_path / "short.safetensors"))
  resnet50 = torchvision_state_dict("resnet50")
  save_file(resnet50, str(tmp_path / "r50.safetensors"))
  with pytest.raises(ValueError, match=r"r50\.safetensors: .*'layer1_0/"):
    resnet.load_pretrained(resnet18_shapes, str(tmp_path / "r50.safetensors"))
  save_file({"layer1.0.conv9.weight": np.zeros((1, 1, 1, 1), np.float32)}, str(tmp_path / "odd.safetensors"))
  with pytest.raises(ValueError, match=r"not a torchvision ResNet key: 'layer1.0.conv9.weight'"):
    convert.load_featurizer_weights(str(tmp_path / "odd.safetensors"))


@pytest.mark.parametrize("name", ["nothere.pth", "nothere.npz", "nothere.safetensors"])
def test_missing_file_is_named(tmp_path, name):
  with pytest.raises(FileNotFoundError, match=f"pretrained weights not found: .*{name}"):
    convert.load_featurizer_weights(str(tmp_path / name))


@pytest.mark.parametrize("name", ["junk.pth", "junk.safetensors", "junk.npz", "junk.msgpack"])
def test_corrupt_file_is_named(tmp_path, name):
  path = tmp_path / name
  path.write_bytes(b"\x00\x01 definitely not weights " * 5)
  with pytest.raises(ValueError, match=f"{name}: cannot read weights") as e:
    convert.load_featurizer_weights(str(path))
  assert "\n" not in str(e.value)


def test_truncated_zip_and_foreign_globals_are_refused(tmp_path):
  sd = {"conv1.weight": np.ones((64, 3, 7, 7), np.float32)}
  write_state_dict_pth(str(tmp_path / "ok.pth"), sd)
  data = (tmp_path / "ok.pth").read_bytes()
  (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
  with pytest.raises(ValueError, match=r"cut\.pth: cannot read weights"):
    convert.read_state_dict(str(tmp_path / "cut.pth"))
  with zipfile.ZipFile(tmp_path / "evil.pth", "w") as zf:
    zf.writestr("archive/data.pkl", pickle.dumps(os.system, protocol=2))
  with pytest.raises(ValueError, match=r"evil\.pth: .*refusing to load global (posix|os|nt)\.system"):
    convert.read_state_dict(str(tmp_path / "evil.pth"))


# ---------------------------------------------------------------- (e) build_model

def test_build_model_resnet18_logits():
  model = build_model(model_config("resnet18"), (32, 32, 3), 4)
  params = model.init(jax.random.PRNGKey(0))
  assert set(params) == {"featurizer", "classifier"}
  kernel = params["featurizer"]["layer1_0"]["conv1"]["kernel"]  # torchvision's fan-out He init
  assert kernel.shape == (3, 3, 64, 64) and abs(float(kernel.std()) - np.sqrt(2 / (9 * 64))) < 0.01
  logits = jax.jit(model.apply)(params, jnp.ones((2, 32, 32, 3)))  # one program, not one per primitive
  assert logits.shape == (2, 4) and bool(jnp.all(jnp.isfinite(logits)))
  head_of_features = jax.jit(lambda p, x: model.head(p["classifier"], model.features(p, x)))
  assert head_of_features(params, jnp.ones((2, 32, 32, 3))).shape == (2, 4)


def test_runner_loads_pretrained_weights_into_fedsr_base(tmp_path):
  """FedSR wraps the ResNet in a probabilistic featurizer; the runner loads the weights into
  its base and leaves the projection and the head alone."""
  from fedjax_dg.algorithms import fedsr
  from fedjax_dg.algorithms.fedsr import probabilistic_model
  from fedjax_dg.runbook import load_pretrained
  sd = torchvision_state_dict("resnet18")
  path = str(tmp_path / "r18.safetensors")
  save_file(sd, path)
  plain = build_model(model_config("resnet18"), (32, 32, 3), 5)
  sr = probabilistic_model(plain, 8)
  shapes = jax.eval_shape(sr.init, jax.random.PRNGKey(0))
  zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  got = load_pretrained(zeros, path, fedsr.SPEC)  # the runner passes the method's record
  want = resnet.load_pretrained({"featurizer": zeros["featurizer"]["base"]}, path)["featurizer"]
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), got["featurizer"]["base"], want))
  np.testing.assert_array_equal(got["featurizer"]["base"]["conv1"]["kernel"], sd["conv1.weight"].transpose(2, 3, 1, 0))
  assert not np.any(got["featurizer"]["to_z"]["kernel"]) and not np.any(got["classifier"]["Dense_0"]["kernel"])
  plain_got = load_pretrained(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(plain.init, jax.random.PRNGKey(0))), path)
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), plain_got["featurizer"], want))
