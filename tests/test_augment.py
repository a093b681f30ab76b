"""DomainBed's augmentation in JAX: each piece against NumPy or an exact identity."""
import colorsys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.data import augment as A

IDENTITY = A.AugmentParams(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip_prob=0.0, brightness=0.0, contrast=0.0,
                           saturation=0.0, hue=0.0, grayscale_prob=0.0)
FLIP = A.AugmentParams(**{**IDENTITY.__dict__, "flip_prob": 1.0})
aug = jax.jit(A.augment, static_argnums=2)  # one compilation per (params, shape)


def images(b=4, h=16, w=16, seed=0):
  return np.random.default_rng(seed).uniform(size=(b, h, w, 3)).astype(np.float32)


def test_shapes_dtype_range_jit_vmap_and_determinism():
  x = images()
  key = jax.random.PRNGKey(0)
  y = aug(key, x, A.DOMAINBED)
  assert y.shape == x.shape and y.dtype == jnp.float32
  assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
  np.testing.assert_array_equal(aug(key, x, A.DOMAINBED), y)
  assert not np.allclose(aug(jax.random.PRNGKey(1), x, A.DOMAINBED), y)
  same = np.repeat(x[:1], 4, 0)  # examples get different draws
  out = aug(key, same, A.DOMAINBED)
  assert not np.allclose(out[0], out[1])
  # `augment` is `augment_one` mapped over the keys split from `rng`.
  half = A.AugmentParams(**{**IDENTITY.__dict__, "flip_prob": 0.5})
  per_example = jax.jit(jax.vmap(lambda k, i: A.augment_one(k, i, half)))(jax.random.split(key, 4), x)
  np.testing.assert_allclose(per_example, aug(key, x, half), atol=1e-6)


def test_identity_settings_and_flip_are_exact():
  x = images()
  key = jax.random.PRNGKey(3)
  np.testing.assert_allclose(aug(key, x, IDENTITY), x, atol=1e-5)
  np.testing.assert_allclose(aug(key, x, FLIP), x[:, :, ::-1], atol=1e-5)
  half = A.AugmentParams(**{**IDENTITY.__dict__, "flip_prob": 0.5})
  many = images(b=64, h=4, w=4)
  out = np.asarray(aug(key, many, half))
  flipped = [np.allclose(o, m[:, ::-1], atol=1e-5) for o, m in zip(out, many)]
  kept = [np.allclose(o, m, atol=1e-5) for o, m in zip(out, many)]
  assert all(f or k for f, k in zip(flipped, kept)) and 16 < sum(flipped) < 48


def test_crop_box_matches_torchvision_ranges_and_crop_translates_correctly():
  boxes = jax.jit(jax.vmap(lambda k: jnp.stack(A.crop_box(k, 224, 224))))(jax.random.split(jax.random.PRNGKey(0), 500))
  top, left, h, w = np.asarray(boxes).T
  assert np.all(top >= 0) and np.all(left >= 0) and np.all(top + h <= 224) and np.all(left + w <= 224)
  assert np.all(h == np.round(h)) and np.all(top == np.round(top))
  area = h * w / 224 ** 2
  assert area.min() >= 0.69 and area.max() <= 1.0
  aspect = w / h
  assert aspect.min() >= 0.74 and aspect.max() <= 1.34
  # Scale 1, ratio 1: the whole image, and the crop-resize is the identity.
  full = A.crop_box(jax.random.PRNGKey(1), 16, 16, scale=(1.0, 1.0), ratio=(1.0, 1.0))
  assert [float(v) for v in full] == [0.0, 0.0, 16.0, 16.0]
  x = images(1)[0]
  crop = jax.jit(A.resized_crop, static_argnums=(5, 6))
  np.testing.assert_allclose(crop(x, *full), x, atol=1e-5)
  # An integer box resized to its own size is the NumPy slice.
  np.testing.assert_allclose(crop(x, 2.0, 3.0, 14.0, 13.0, 14, 13), x[2:, 3:], atol=1e-5)
  # Upsampling a box by 2: output pixel centres fall between input pixels (bilinear).
  y = np.asarray(crop(x, 4.0, 4.0, 8.0, 8.0, 16, 16))
  np.testing.assert_allclose(y[1::2, 1::2][:-1, :-1], (x[4:11, 4:11] * 0.75 + x[5:12, 4:11] * 0.25) * 0.75
                             + (x[4:11, 5:12] * 0.75 + x[5:12, 5:12] * 0.25) * 0.25, atol=1e-5)


def test_grayscale_uses_itu_weights_and_equal_channels():
  x = images(1)[0]
  g = np.asarray(A.to_grayscale(x))
  want = x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114
  for c in range(3):
    np.testing.assert_allclose(g[..., c], want, atol=1e-6)
  np.testing.assert_allclose(A.random_grayscale(jax.random.PRNGKey(0), x, 1.0), g)
  np.testing.assert_array_equal(A.random_grayscale(jax.random.PRNGKey(0), x, 0.0), x)
  half = A.AugmentParams(**{**IDENTITY.__dict__, "grayscale_prob": 0.5})
  out = np.asarray(aug(jax.random.PRNGKey(5), images(b=64, h=4, w=4), half))
  grey = [np.allclose(o[..., 0], o[..., 1]) and np.allclose(o[..., 1], o[..., 2]) for o in out]
  assert 16 < sum(grey) < 48


def test_brightness_contrast_saturation_match_numpy():
  x = images(1)[0]
  np.testing.assert_allclose(A.adjust_brightness(x, 1.2), np.clip(1.2 * x, 0, 1), atol=1e-6)
  grey = x @ np.array([0.299, 0.587, 0.114], np.float32)
  np.testing.assert_allclose(A.adjust_contrast(x, 0.8), np.clip(0.8 * x + 0.2 * grey.mean(), 0, 1), atol=1e-6)
  np.testing.assert_allclose(A.adjust_saturation(x, 1.3), np.clip(1.3 * x - 0.3 * grey[..., None], 0, 1), atol=1e-6)
  # ColorJitter with brightness only: one factor in [0.7, 1.3] scales every pixel.
  only = A.AugmentParams(**{**IDENTITY.__dict__, "brightness": 0.3})
  dark = 0.5 * x  # no clipping for factors <= 1.3
  y = np.asarray(aug(jax.random.PRNGKey(2), dark[None], only)[0])
  f = y.sum() / dark.sum()
  assert 0.7 <= f <= 1.3 and abs(f - 1.0) > 1e-4
  np.testing.assert_allclose(y, np.clip(f * dark, 0, 1), atol=1e-5)


def test_hue():
  x = images(1)[0]
  np.testing.assert_allclose(A.adjust_hue(x, 0.0), x, atol=1e-5)
  hsv = np.asarray(A.rgb_to_hsv(x)).reshape(-1, 3)
  want = np.array([colorsys.rgb_to_hsv(*p) for p in x.reshape(-1, 3)])
  np.testing.assert_allclose(hsv, want, atol=1e-5)
  np.testing.assert_allclose(A.adjust_hue(jnp.array([[[1.0, 0.0, 0.0]]]), 1 / 3), [[[0.0, 1.0, 0.0]]], atol=1e-5)
  shifted = np.asarray(A.adjust_hue(x, 0.25)).reshape(-1, 3)
  want = np.array([colorsys.hsv_to_rgb((h + 0.25) % 1.0, s, v) for h, s, v in hsv])
  np.testing.assert_allclose(shifted, want, atol=1e-5)


def test_normalize_to_float_and_preprocess():
  x = images(2)
  mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
  np.testing.assert_allclose(A.normalize(x), (x - mean) / std, atol=1e-5)
  u8 = (x * 255).astype(np.uint8)
  np.testing.assert_allclose(A.to_float(u8), u8 / 255.0, atol=1e-7)
  np.testing.assert_allclose(A.preprocess(u8), (u8 / 255.0 - mean) / std, atol=1e-5)
  flipped = jax.jit(A.preprocess, static_argnums=2)(u8, jax.random.PRNGKey(0), FLIP)
  np.testing.assert_allclose(flipped, (u8[:, :, ::-1] / 255.0 - mean) / std, atol=1e-5)


@pytest.mark.parametrize("h,w", [(12, 16), (16, 12)])
def test_fallback_crop_for_out_of_range_aspect(h, w):
  # Ratio 1 on a non-square image never fits at scale 1: torchvision's central fallback.
  top, left, bh, bw = (float(v) for v in A.crop_box(jax.random.PRNGKey(0), h, w, (1.0, 1.0), (1.0, 1.0)))
  m = min(h, w)
  assert (bh, bw) == (m, m) and (top, left) == ((h - m) // 2, (w - m) // 2)


def test_presets_and_params_for():
  import ml_collections
  cfg = lambda **kw: ml_collections.ConfigDict(kw)
  assert A.params_for(cfg(augment=False)) is None and A.params_for(cfg()) is None
  assert A.params_for(cfg(augment=True)) == A.DOMAINBED
  assert A.params_for(cfg(augment=True, augment_preset="celeba")).ratio == (1.0, 4 / 3)
  with pytest.raises(ValueError, match="data.augment_preset"):
    A.params_for(cfg(augment=True, augment_preset="nope"))
  # Camelyon17's preset never crops: flip-free, jitter-free settings leave images unchanged.
  still = A.AugmentParams(**{**A.PRESETS["camelyon17"].__dict__, "flip_prob": 0.0, "brightness": 0.0,
                             "contrast": 0.0, "saturation": 0.0, "hue": 0.0, "grayscale_prob": 0.0})
  x = images()
  np.testing.assert_array_equal(aug(jax.random.PRNGKey(0), x, still), x)
