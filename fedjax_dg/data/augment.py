"""DomainBed's training augmentation and ImageNet normalisation in JAX, per example.

DomainBed (`datasets.py`, `MultipleEnvironmentImageFolder`) trains on
`RandomResizedCrop(224, scale=(0.7, 1.0))` (ratio (3/4, 4/3)), `RandomHorizontalFlip()`
(p 0.5), `ColorJitter(0.3, 0.3, 0.3, 0.3)`, `RandomGrayscale()` (p 0.1), then
`Normalize(ImageNet mean, std)`; evaluation only resizes and normalises. Here every
function is pure and jittable on float images in [0, 1], `[H, W, 3]` for one example or
`[B, H, W, 3]` for `augment` (one key per example, split from `rng`).

Where we deviate from torchvision (which DomainBed applies to PIL images):
- the crop is taken from the already resized image (the loaders store `S x S` uint8) and
  resized back with bilinear `jax.image.scale_and_translate`, not from the original file;
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
  """torchvision's `_hsv2rgb`."""
  h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
  i = jnp.floor(h * 6.0)
  f = h * 6.0 - i
  i = i.astype(jnp.int32) % 6
  p = jnp.clip(v * (1.0 - s), 0.0, 1.0)
  q = jnp.clip(v * (1.0 - s * f), 0.0, 1.0)
  t = jnp.clip(v * (1.0 - s * (1.0 - f)), 0.0, 1.0)
  sector = lambda *vals: jnp.select([i == k for k in range(6)], vals)
  return jnp.stack([sector(v, q, p, p, t, v), sector(t, v, v, q, p, p), sector(p, p, t, v, v, q)], -1)


def adjust_hue(image, delta):
  """Rotate the hue by `delta` turns (`delta` in [-0.5, 0.5])."""
  hsv = rgb_to_hsv(image)
  hsv = hsv.at[..., 0].set(jnp.mod(hsv[..., 0] + delta, 1.0))
  return hsv_to_rgb(hsv)


def color_jitter(rng, image, brightness=0.3, contrast=0.3, saturation=0.3, hue=0.3):
  """torchvision `ColorJitter`: factors `U[1 - b, 1 + b]` (hue `U[-h, h]`), the four
  operations applied in a random order. Strengths must be static; 0 skips the operation."""
  k_perm, k_b, k_c, k_s, k_h = jax.random.split(rng, 5)
  factor = lambda k, m: jax.random.uniform(k, (), minval=max(0.0, 1.0 - m), maxval=1.0 + m)
  ops = []
  if brightness > 0:
    ops.append(lambda x: adjust_brightness(x, factor(k_b, brightness)))
  if contrast > 0:
    ops.append(lambda x: adjust_contrast(x, factor(k_c, contrast)))
  if saturation > 0:
    ops.append(lambda x: adjust_saturation(x, factor(k_s, saturation)))
  if hue > 0:
    ops.append(lambda x: adjust_hue(x, jax.random.uniform(k_h, (), minval=-hue, maxval=hue)))
  if not ops:
    return image
  order = jax.random.permutation(k_perm, len(ops))
  for step in range(len(ops)):
    image = jax.lax.switch(order[step], ops, image)
  return image


def crop_box(rng, height: int, width: int, scale=(0.7, 1.0), ratio=(3 / 4, 4 / 3), attempts: int = 10):
  """torchvision `RandomResizedCrop.get_params`: `(top, left, h, w)` as float32 scalars.

  Each attempt draws an area fraction `U[scale]` and a log aspect ratio `U[log ratio]`,
  rounds the box to whole pixels and keeps it if it fits; the first fitting attempt wins,
  else the central crop with the aspect ratio clamped into `ratio`.
  """
  k_area, k_ratio, k_top, k_left = jax.random.split(rng, 4)
  area = height * width * jax.random.uniform(k_area, (attempts,), minval=scale[0], maxval=scale[1])
  aspect = jnp.exp(jax.random.uniform(k_ratio, (attempts,), minval=math.log(ratio[0]), maxval=math.log(ratio[1])))
  w = jnp.round(jnp.sqrt(area * aspect))
  h = jnp.round(jnp.sqrt(area / aspect))
  fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
  first = jnp.argmax(fits)
  w, h = w[first], h[first]
  top = jnp.floor(jax.random.uniform(k_top, ()) * (height - h + 1))
  left = jnp.floor(jax.random.uniform(k_left, ()) * (width - w + 1))
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


def resized_crop(image, top, left, h, w, out_height: int | None = None, out_width: int | None = None):
  """The box `[top, top + h) x [left, left + w)` of `image` `[H, W, C]`, bilinearly
  resized to `out_height x out_width` (default: the input size)."""
  out_height = out_height or image.shape[0]
  out_width = out_width or image.shape[1]
  sy, sx = out_height / h, out_width / w
  return jax.image.scale_and_translate(
      image, (out_height, out_width, image.shape[2]), (0, 1), jnp.stack([sy, sx]),
      jnp.stack([-top * sy, -left * sx]), method="linear", antialias=True)


def random_resized_crop(rng, image, scale=(0.7, 1.0), ratio=(3 / 4, 4 / 3), attempts: int = 10):
  box = crop_box(rng, image.shape[0], image.shape[1], scale, ratio, attempts)
  return resized_crop(image, *box)


def random_flip(rng, image, prob: float = 0.5):
  """Mirror left-right with probability `prob`."""
  return jnp.where(jax.random.bernoulli(rng, prob), image[:, ::-1], image)


def random_grayscale(rng, image, prob: float = 0.1):
  return jnp.where(jax.random.bernoulli(rng, prob), to_grayscale(image), image)


def augment_one(rng, image, params: AugmentParams = DOMAINBED):
  """One image `[H, W, 3]` in [0, 1]: crop, flip, colour jitter, grey, in DomainBed's order."""
  k_crop, k_flip, k_jit, k_gray = jax.random.split(rng, 4)
  p = params
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
