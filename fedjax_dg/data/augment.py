"""DomainBed's training augmentation and ImageNet normalisation in JAX, per example.

DomainBed (`datasets.py`, `MultipleEnvironmentImageFolder`) trains on
`RandomResizedCrop(224, scale=(0.7, 1.0))` (ratio (3/4, 4/3)), `RandomHorizontalFlip()`
(p 0.5), `ColorJitter(0.3, 0.3, 0.3, 0.3)`, `RandomGrayscale()` (p 0.1), then
`Normalize(ImageNet mean, std)`; evaluation only resizes and normalises. Here every
function is pure and jittable on float images in [0, 1], `[H, W, 3]` for one example or
`[B, H, W, 3]` for `augment` (one key per example, split from `rng`).

Where we deviate from torchvision (which DomainBed applies to PIL images):
- the crop is taken from the already resized image (the loaders store `S x S` uint8) and
  resized back with a bilinear kernel (`interp_matrix`), not from the original file (the
  Bai et al. benchmark code also resizes first);
- the colour operations follow torchvision's tensor formulas on floats (brightness
  `f x`, contrast blends with the mean grey level, saturation with the grey image, hue
  rotates in HSV), with grey = ITU-R 601-2 luma `0.299 R + 0.587 G + 0.114 B` as PIL's
  `convert("L")`; PIL itself rounds to uint8 after every step;
- the crop draws its 10 candidate boxes at once and takes the first that fits
  (torchvision's loop), falling back to the central crop as torchvision does.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2, PIL's convert("L")


@dataclasses.dataclass(frozen=True)
class AugmentParams:
  """DomainBed's settings by default. Zero jitter strengths skip that operation."""
  scale: tuple[float, float] = (0.7, 1.0)        # crop area fraction
  ratio: tuple[float, float] = (3 / 4, 4 / 3)    # crop aspect ratio w / h
  flip_prob: float = 0.5
  brightness: float = 0.3
  contrast: float = 0.3
  saturation: float = 0.3
  hue: float = 0.3
  grayscale_prob: float = 0.1
  crop_attempts: int = 10


DOMAINBED = AugmentParams()
# `data.augment_preset` -> params. The Bai et al. benchmark code (Bai et al. 2024;
# FedDG_Benchmark `src/dataset_bundle.py`) uses DomainBed's pipeline for PACS, OfficeHome and
# IWildCam, but for CelebA only a crop (ratio (1, 4/3)) and a flip, and for Camelyon17 no
# crop (flip, colour jitter, grey).
PRESETS = {
    "domainbed": DOMAINBED,
    "celeba": AugmentParams(ratio=(1.0, 4 / 3), brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0,
                            grayscale_prob=0.0),
    "camelyon17": AugmentParams(scale=(1.0, 1.0), ratio=(1.0, 1.0)),
}


def params_for(data_config) -> AugmentParams | None:
  """The training augmentation `config.data` asks for: None when `data.augment` is false,
  else `PRESETS[data.augment_preset]` (default "domainbed")."""
  if not data_config.get("augment", False):
    return None
  name = data_config.get("augment_preset", "domainbed")
  if name not in PRESETS:
    raise ValueError(f"data.augment_preset: unknown {name!r}; choose one of {sorted(PRESETS)}")
  return PRESETS[name]


def to_float(x):
  """uint8 in [0, 255] -> float32 in [0, 1]; floating inputs are returned as float32."""
  x = jnp.asarray(x)
  return x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)


def normalize(images, mean=IMAGENET_MEAN, std=IMAGENET_STD):
  """`(x - mean) / std` per channel (last axis)."""
  return (images - jnp.asarray(mean, images.dtype)) / jnp.asarray(std, images.dtype)


def grayscale(image):
  """Luma `[..., 1]` with ITU-R 601-2 weights."""
  return jnp.sum(image * jnp.asarray(GRAY_WEIGHTS, image.dtype), axis=-1, keepdims=True)


def to_grayscale(image):
  """The luma repeated over the three channels (torchvision `Grayscale(3)`)."""
  return jnp.broadcast_to(grayscale(image), image.shape)


def _blend(image, other, factor):
  return jnp.clip(factor * image + (1.0 - factor) * other, 0.0, 1.0)


def adjust_brightness(image, factor):
  return _blend(image, jnp.zeros_like(image), factor)


def adjust_contrast(image, factor):
  """Blend with the image's mean grey level."""
  return _blend(image, jnp.mean(grayscale(image)), factor)


def adjust_saturation(image, factor):
  """Blend with the grey image."""
  return _blend(image, grayscale(image), factor)


def rgb_to_hsv(image):
  """torchvision's `_rgb2hsv`: h, s, v in [0, 1] on the last axis."""
  r, g, b = image[..., 0], image[..., 1], image[..., 2]
  maxc, minc = jnp.max(image, -1), jnp.min(image, -1)
  eqc = maxc == minc
  cr = maxc - minc
  s = cr / jnp.where(eqc, 1.0, maxc)
  cr_div = jnp.where(eqc, 1.0, cr)
  rc, gc, bc = (maxc - r) / cr_div, (maxc - g) / cr_div, (maxc - b) / cr_div
  hr = jnp.where(maxc == r, bc - gc, 0.0)
  hg = jnp.where((maxc == g) & (maxc != r), 2.0 + rc - bc, 0.0)
  hb = jnp.where((maxc != g) & (maxc != r), 4.0 + gc - rc, 0.0)
  h = jnp.mod((hr + hg + hb) / 6.0 + 1.0, 1.0)
  return jnp.stack([h, s, maxc], -1)


def hsv_to_rgb(hsv):
  """HSV -> RGB as `channel(n) = v - v s clip(min(k, 4 - k), 0, 1)`, `k = (n + 6 h) mod 6`
  for n = 5, 3, 1 (R, G, B): torchvision's `_hsv2rgb` sector table in closed form."""
  h, s, v = hsv[..., 0:1], hsv[..., 1:2], hsv[..., 2:3]
  k = jnp.mod(jnp.asarray((5.0, 3.0, 1.0), hsv.dtype) + 6.0 * h, 6.0)
  return v - v * s * jnp.clip(jnp.minimum(k, 4.0 - k), 0.0, 1.0)


def adjust_hue(image, delta):
  """Rotate the hue by `delta` turns (`delta` in [-0.5, 0.5])."""
  hsv = rgb_to_hsv(image)
  hsv = hsv.at[..., 0].set(jnp.mod(hsv[..., 0] + delta, 1.0))
  return hsv_to_rgb(hsv)


def color_jitter(rng, image, brightness=0.3, contrast=0.3, saturation=0.3, hue=0.3):
  """torchvision `ColorJitter`: factors `U[1 - b, 1 + b]` (hue `U[-h, h]`), the four
  operations applied in a random order. Strengths must be static; 0 skips the operation."""
  u = jax.random.uniform(rng, (8,))  # one draw for everything: few PRNG calls compile fast
  between = lambda v, lo, hi: lo + (hi - lo) * v
  ops = []
  if brightness > 0:
    ops.append(lambda x: adjust_brightness(x, between(u[0], max(0.0, 1.0 - brightness), 1.0 + brightness)))
  if contrast > 0:
    ops.append(lambda x: adjust_contrast(x, between(u[1], max(0.0, 1.0 - contrast), 1.0 + contrast)))
  if saturation > 0:
    ops.append(lambda x: adjust_saturation(x, between(u[2], max(0.0, 1.0 - saturation), 1.0 + saturation)))
  if hue > 0:
    ops.append(lambda x: adjust_hue(x, between(u[3], -hue, hue)))
  if not ops:
    return image
  order = jnp.argsort(u[4:4 + len(ops)])  # a uniformly random permutation
  # One loop body holding every operation once (not one copy per step): smaller programs.
  return jax.lax.fori_loop(0, len(ops), lambda step, x: jax.lax.switch(order[step], ops, x), image)


def crop_box(rng, height: int, width: int, scale=(0.7, 1.0), ratio=(3 / 4, 4 / 3), attempts: int = 10):
  """torchvision `RandomResizedCrop.get_params`: `(top, left, h, w)` as float32 scalars.

  Each attempt draws an area fraction `U[scale]` and a log aspect ratio `U[log ratio]`,
  rounds the box to whole pixels and keeps it if it fits; the first fitting attempt wins,
  else the central crop with the aspect ratio clamped into `ratio`.
  """
  u = jax.random.uniform(rng, (2 * attempts + 2,))
  area = height * width * (scale[0] + (scale[1] - scale[0]) * u[:attempts])
  log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
  aspect = jnp.exp(log_lo + (log_hi - log_lo) * u[attempts:2 * attempts])
  w = jnp.round(jnp.sqrt(area * aspect))
  h = jnp.round(jnp.sqrt(area / aspect))
  fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
  first = jnp.argmax(fits)
  w, h = w[first], h[first]
  top = jnp.floor(u[-2] * (height - h + 1))
  left = jnp.floor(u[-1] * (width - w + 1))
  in_ratio = width / height
  if in_ratio < min(ratio):
    fw, fh = width, round(width / min(ratio))
  elif in_ratio > max(ratio):
    fw, fh = round(height * max(ratio)), height
  else:
    fw, fh = width, height
  ok = jnp.any(fits)
  box = (jnp.where(ok, top, (height - fh) // 2), jnp.where(ok, left, (width - fw) // 2),
         jnp.where(ok, h, fh), jnp.where(ok, w, fw))
  return tuple(jnp.asarray(v, jnp.float32) for v in box)


def interp_matrix(start, length, in_size: int, out_size: int):
  """`[out_size, in_size]` weights resampling `[start, start + length)` of an axis to
  `out_size` pixels: a triangle (bilinear) kernel at the output pixel centres, widened by
  the downscale factor when shrinking, normalised per row (PIL's and
  `jax.image.scale_and_translate`'s bilinear resize; borders clamp)."""
  scale = out_size / length
  centers = start + (jnp.arange(out_size) + 0.5) / scale - 0.5
  support = jnp.maximum(1.0 / scale, 1.0)
  w = jnp.maximum(0.0, 1.0 - jnp.abs(centers[:, None] - jnp.arange(in_size)[None, :]) / support)
  return w / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-12)


def resized_crop(image, top, left, h, w, out_height: int | None = None, out_width: int | None = None):
  """The box `[top, top + h) x [left, left + w)` of `image` `[H, W, C]`, bilinearly
  resized to `out_height x out_width` (default: the input size). Two small matrix
  products, so it vectorises and runs on accelerators without gathers."""
  out_height = out_height or image.shape[0]
  out_width = out_width or image.shape[1]
  wy = interp_matrix(top, h, image.shape[0], out_height)
  wx = interp_matrix(left, w, image.shape[1], out_width)
  return jnp.einsum("oh,hwc,pw->opc", wy, image, wx, precision=jax.lax.Precision.HIGHEST)


def random_resized_crop(rng, image, scale=(0.7, 1.0), ratio=(3 / 4, 4 / 3), attempts: int = 10):
  box = crop_box(rng, image.shape[0], image.shape[1], scale, ratio, attempts)
  return resized_crop(image, *box)


def random_flip(rng, image, prob: float = 0.5):
  """Mirror left-right with probability `prob`."""
  return jnp.where(jax.random.uniform(rng) < prob, image[:, ::-1], image)


def random_grayscale(rng, image, prob: float = 0.1):
  return jnp.where(jax.random.uniform(rng) < prob, to_grayscale(image), image)


def augment_one(rng, image, params: AugmentParams = DOMAINBED):
  """One image `[H, W, 3]` in [0, 1]: crop, flip, colour jitter, grey, in DomainBed's order."""
  k_crop, k_flip, k_jit, k_gray = jax.random.split(rng, 4)
  p = params
  height, width = image.shape[:2]
  # At scale 1 every candidate box but the full image overflows, and the fallback is the
  # full image when its aspect ratio is allowed: skip the (identity) resampling.
  if not (tuple(p.scale) == (1.0, 1.0) and min(p.ratio) <= width / height <= max(p.ratio)):
    image = random_resized_crop(k_crop, image, p.scale, p.ratio, p.crop_attempts)
  if p.flip_prob > 0:
    image = random_flip(k_flip, image, p.flip_prob)
  image = color_jitter(k_jit, image, p.brightness, p.contrast, p.saturation, p.hue)
  if p.grayscale_prob > 0:
    image = random_grayscale(k_gray, image, p.grayscale_prob)
  return image


def augment(rng, images, params: AugmentParams = DOMAINBED):
  """A batch `[B, H, W, 3]` in [0, 1], each example with its own key from `rng`."""
  keys = jax.random.split(rng, images.shape[0])
  return jax.vmap(lambda k, x: augment_one(k, x, params))(keys, images)


def preprocess(x, rng=None, params: AugmentParams = DOMAINBED):
  """Model inputs from stored images: `to_float`, then `augment` when `rng` is given
  (training), then `normalize`. Evaluation passes no key."""
  x = to_float(x)
  if rng is not None:
    x = augment(rng, x, params)
  return normalize(x)
