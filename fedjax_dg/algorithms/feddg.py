"""FedDG / ELCFS (Liu et al. 2021): amplitude-spectrum exchange and continuous frequency-space
interpolation, as a client-side augmentation.

Before training every client uploads the amplitude spectra `A = |FFT2(x)|` of (up to
`bank_size` of) its images; the server keeps them in a bank that every client downloads.
This shares information about the clients' data beyond model parameters: a privacy leak
that the method needs and that the documentation declares. In local training, for each image with
spectrum `A e^{iP}` (FFT over height and width, per channel) the client draws an amplitude
`A'` of another client's image from the bank and `lam ~ U(0, 1)`, and replaces the
low-frequency square of half-width `b = floor(r min(H, W) / 2)` around the (shifted) zero
frequency by `(1 - lam) A + lam A'` (eq. 2 of the paper); the augmented image is
`Re(IFFT2(A_new e^{iP}))`. The client trains on original and augmented images (the
cross-entropy over both, as one batch of `2B`). We keep the paper's augmentation and leave
out its episodic meta-learning boundary losses (docs/ALGORITHMS.md). Images are not clipped
after the inverse FFT (the authors clip to [0, 1] because their inputs live there).
Server: FedAvg's rule.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dg.algorithms.base import LocalSchedule, local_train, masked_cross_entropy
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, Uniform, hparam, send
from fedjax_dg.data.augment import to_float


def low_freq_window(h: int, w: int, ratio: float):
  """`[H, W]` 0/1 mask of the centred square of half-width `floor(ratio min(H, W) / 2)`,
  in the unshifted FFT layout (zero frequency at index 0)."""
  b = int(math.floor(ratio * min(h, w) / 2))
  ch, cw = h // 2, w // 2
  m = np.zeros((h, w), np.float32)
  m[ch - b:ch + b + 1, cw - b:cw + b + 1] = 1.0
  return jnp.asarray(np.fft.ifftshift(m))


def amplitude_mix(x, amp_other, lam, window):
  """The frequency-space interpolation of `x` `[..., H, W, C]` towards `amp_other` (same
  shape) by `lam` (broadcast against `x`) inside `window` `[H, W]`."""
  spec = jnp.fft.fft2(x, axes=(-3, -2))
  amp, phase = jnp.abs(spec), jnp.angle(spec)
  win = window[..., None]
  amp_new = amp * (1 - win) + ((1 - lam) * amp + lam * amp_other) * win
  return jnp.real(jnp.fft.ifft2(amp_new * jnp.exp(1j * phase), axes=(-3, -2))).astype(x.dtype)


def other_clients(rng, client_id, num_clients: int, n: int):
  """`n` client ids drawn uniformly from the clients other than `client_id` (itself only in
  a one-client federation)."""
  return (client_id + 1 + jax.random.randint(rng, (n,), 0, max(num_clients - 1, 1))) % num_clients


def amplitude_bank(store, bank_size: int, seed: int = 0) -> np.ndarray:
  """The server's bank `[C, M, H, W, C_img]`: the amplitude spectra of `M = bank_size`
  random images of each client (drawn with replacement when a client has fewer)."""
  rng = np.random.default_rng(seed)
  picks = [rng.choice(int(n), bank_size, replace=int(n) < bank_size) for n in store.counts]
  with jax.ensure_compile_time_eval():  # a constant of the program, also when built inside a traced round
    imgs = to_float(np.stack([store.x[c, p] for c, p in enumerate(picks)]))  # the scale the local loop sees
    return np.asarray(jnp.abs(jnp.fft.fft2(imgs, axes=(-3, -2))))


def feddg_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, bank: np.ndarray,
                 window_ratio: float) -> ClientSide:
  """FedDG clients; `bank` from `amplitude_bank` over the training clients."""
  bank = jnp.asarray(bank)
  num_clients, bank_size = bank.shape[:2]
  window = low_freq_window(bank.shape[2], bank.shape[3], window_ratio)

  def make_objective(client_id):
    def objective(params, batch, rng):
      k_c, k_m, k_l = jax.random.split(rng, 3)
      b = batch.x.shape[0]
      other = other_clients(k_c, client_id, num_clients, b)
      amp_other = bank[other, jax.random.randint(k_m, (b,), 0, bank_size)]
      lam = jax.random.uniform(k_l, (b,) + (1,) * (batch.x.ndim - 1))
      x_aug = amplitude_mix(batch.x, amp_other, lam, window)
      logits = model.apply(params, jnp.concatenate([batch.x, x_aug]))
      y, m = jnp.concatenate([batch.y, batch.y]), jnp.concatenate([batch.mask, batch.mask])
      return masked_cross_entropy(logits, y, m), {}
    return objective

  def update(global_params, extra, client_state, data, rng):
    params, loss = local_train(global_params, make_objective(data.client_id), client_opt, data, rng, sched)
    return send(params, global_params, client_state, {"train_loss": loss})
  return ClientSide(update)


@dataclasses.dataclass(frozen=True)
class HParams:
  window: float = hparam(0.25, "low-frequency window ratio r: half-width floor(r min(H, W) / 2) (ours)", ge=0, le=1,
                         search=Uniform(0.0, 0.5), static=True)  # the window's size in pixels
  bank_size: int = hparam(16, "amplitude spectra per client in the server's bank (ours)", ge=1, integer=True)


def _bank(ctx, hp):
  if ctx.store is None:
    raise ValueError("algorithm.name='feddg' needs the training client store for its amplitude bank")
  if ctx.store.x.ndim != 5:
    raise ValueError(f"algorithm.name='feddg' needs image inputs [H, W, C]; got inputs of shape {ctx.store.x.shape[2:]}")
  return amplitude_bank(ctx.store, hp.bank_size, ctx.config.seed)


SPEC = MethodSpec(
    "feddg", "Liu et al. 2021 (ELCFS)",
    lambda ctx, hp: feddg_client(ctx.model, ctx.sched, ctx.client_opt, ctx.prepared, hp.window), HParams,
    prepare=_bank,  # the amplitude bank: once per run, from the run's own store and seed
    sends=("amplitude spectra of its images (once)",), receives=("other clients' amplitude spectra (once)",),
    leaks_data=True, group="FDG",
    not_for_text="FedDG interpolates the amplitude spectra of images (2-D Fourier transforms of pixels)",
    # every client uploads its part of the bank and downloads the whole bank (float32 spectra)
    setup_bytes=lambda ctx, hp: (1 + ctx.num_clients) * ctx.num_clients * hp.bank_size
    * int(np.prod(ctx.store.x.shape[2:])) * 4)
