"""TFDS data sources without TensorFlow: `tfds.testing.mock_data`, and a tiny dataset
built on disk in the array_record format and read back with `tfds.data_source`."""
import io

import ml_collections
import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
Image = pytest.importorskip("PIL.Image")

from fedjax_dg import config as config_lib  # noqa: E402
from fedjax_dg import experiment  # noqa: E402
from fedjax_dg.data import datasets, tfds_source  # noqa: E402

SITES = ("north", "east", "south", "west")


def _png(a: np.ndarray) -> bytes:
  buf = io.BytesIO()
  Image.fromarray(a).save(buf, format="PNG")
  return buf.getvalue()


def tiny_image(i: int) -> np.ndarray:
  return np.random.default_rng(i).integers(0, 256, (6, 6, 3), dtype=np.uint8)


class TinySites(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """12 examples per split: 6x6 RGB images, 3 classes, a string `site` feature.

  Images are PNG bytes so that building needs no TensorFlow (TFDS encodes NumPy images
  with TF). `skip_registration`: `tfds.data_source` finds it from its files on disk.
  """
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(6, 6, 3)),
        "label": tfds.features.ClassLabel(num_classes=3),
        "site": tfds.features.Text(),
    }))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(0), "test": self._generate_examples(12)}

  def _generate_examples(self, start):
    for i in range(start, start + 12):
      yield i, {"image": _png(tiny_image(i)), "label": i % 3, "site": SITES[i % 4]}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  TinySites(data_dir=data_dir, file_format="array_record").download_and_prepare()
  return data_dir


def tfds_config(**kw):
  return ml_collections.ConfigDict({"tfds_name": "tiny_sites", "tfds_data_dir": "", "image_size": 0,
                                    "max_per_domain": 0, "seed": 0, **kw})


def test_mock_mnist_one_domain_per_split():
  with tfds.testing.mock_data(num_examples=7):
    ds = tfds_source.load(tfds_config(tfds_name="mnist", image_size=8, tfds_domain_splits=("train", "test")))
  assert ds.names == ("train", "test") and ds.num_classes == 10
  for x, y in zip(ds.xs, ds.ys):
    assert x.shape == (7, 8, 8, 1) and x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0
    assert y.dtype == np.int32 and np.all((0 <= y) & (y < 10))


def test_domains_from_a_string_feature(tiny_dir):
  ds = tfds_source.load(tfds_config(tfds_data_dir=tiny_dir, tfds_domain_key="site", tfds_split="train+test"))
  assert ds.names == tuple(sorted(SITES)) and ds.num_classes == 3
  for name, x, y in zip(ds.names, ds.xs, ds.ys):
    ids = [i for i in range(24) if SITES[i % 4] == name]
    assert x.shape == (6, 6, 6, 3) and sorted(y.tolist()) == sorted(i % 3 for i in ids)
    # Every stored image comes back exactly (PNG is lossless), scaled to [0, 1].
    want = {tiny_image(i).tobytes() for i in ids}
    assert {np.round(im * 255).astype(np.uint8).tobytes() for im in x} == want


def test_domains_from_splits_resized_and_subsampled(tiny_dir):
  splits = ("train[:50%]", "train[50%:]", "test")
  ds = tfds_source.load(tfds_config(tfds_data_dir=tiny_dir, tfds_domain_splits=splits, image_size=4, max_per_domain=5))
  assert ds.names == splits
  assert [x.shape for x in ds.xs] == [(5, 4, 4, 3)] * 3


def test_missing_dataset_is_one_line(tiny_dir):
  with pytest.raises(ValueError) as e:
    tfds_source.load(tfds_config(tfds_name="no_such_dataset", tfds_data_dir=tiny_dir))
  msg = str(e.value)
  assert "no_such_dataset" in msg and "tfds build" in msg and "\n" not in msg


def test_tfds_trains_end_to_end(tiny_config, tiny_dir, tmp_path, monkeypatch):
  monkeypatch.setattr(config_lib, "DATASETS", tuple(datasets.DATASETS), raising=False)
  c = tiny_config
  c.data.name = "tfds"
  c.data.update(dict(tfds_name="tiny_sites", tfds_data_dir=tiny_dir, tfds_domain_key="site",
                     tfds_split="train+test", image_size=6, max_per_domain=0))
  c.data.test_domains, c.data.val_domains = (3,), (2,)
  c.num_clients, c.model.hidden, c.num_rounds, c.eval_every = 4, (8,), 1, 1
  c.client.batch_size = 4
  out = experiment.train_and_evaluate(c, str(tmp_path / "w"))
  assert out["domains"]["names"] == sorted(SITES)
  assert 0.0 <= out["final"]["splits"]["test"]["accuracy"] <= 1.0
