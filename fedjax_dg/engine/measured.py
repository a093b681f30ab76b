"""The engine's measured defaults: which strategy and local-loop unrolling a backend and a
model family run fastest (`ENGINE_DEFAULTS`, with where each figure comes from)."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class EngineDefaults(NamedTuple):
  strategy: str
  unroll_upto: int  # local loops of at most this many steps are unrolled in full (0: never)
  measured: str     # where the choice comes from


# Measured on the 2-core CPU machine (benchmarks/results/round_speed_cpu.json, DomainBed's
# MNIST CNN and the 784-200-200-10 MLP): with convolutions the host loop is 35x faster
# than the `lax.scan` over clients ("sequential"), since XLA:CPU runs a convolution's weight
# gradient inside any while loop tens of times slower (JAX issue 12868), which is also why
# the local loop is unrolled there; for dense models the scan over clients is fastest (host
# loop 1.46x, vmap 4.5x slower), and the local loop runs as a scan too: unrolled in full it
# compiles 1.5-10x slower and runs 1.5-14x slower per round from 8 local steps on
# (benchmarks/results/unroll_speed_cpu.json, the report grid's MLP at C = 1 and 20), and is
# within -22%/+17% of the scan at 2 to 4 steps.
ENGINE_DEFAULTS = {
    ("cpu", "conv"): EngineDefaults("host_loop", 64, "round_speed_cpu.json: cnn, host_loop 0.028x sequential"),
    ("cpu", "dense"): EngineDefaults("sequential", 2, "round_speed_cpu.json: mlp, sequential fastest; "
                                                      "unroll_speed_cpu.json: scan from 3 local steps"),
    # Measured on an H100 (round_speed_gpu.json): the CNN's cohort of 100 runs
    # 0.235 s per round client by client in one scan, 0.284 s in the host loop and 0.465 s
    # under vmap (a vmapped convolution with per-client weights lowers to a grouped one);
    # the 1000-client MLP runs 22x faster under vmap than client by client.
    # Its local loop of 5 steps unrolled in full ran 1.21x faster than the scan (H200,
    # results/gpu_h200/cnn_unroll.json: 0.194 s against 0.234 s a round, compiling in 6.0 s
    # against 5.0 s; under `sequential`, the strategy "auto" runs for this family, and the
    # table's unrolling holds for the family under any strategy); longer loops were not
    # measured, so they stay a scan.
    ("accelerator", "conv"): EngineDefaults("sequential", 5, "round_speed_gpu.json (H100): cnn, sequential 0.51x vmap; "
                                                             "gpu_h200/cnn_unroll.json: 5 steps unrolled 0.83x scan"),
    ("accelerator", "dense"): EngineDefaults("vmap", 0, "round_speed_gpu.json (H100): mlp, vmap 0.05x sequential"),
    # Convolutions as batched matrix products (`model.conv_impl = "gemm"`, models/conv.py):
    # on the CPU one client's local work of the MNIST CNN took 1.1-1.9x the XLA
    # convolution's time with the package's XLA:CPU default (fedjax_dg/xla_cpu.py), 0.96-1.24x
    # under jaxlib's YNNPACK convolutions (benchmarks/results/cnn_client_cpu.json), so the XLA convolution
    # stays the models' default and the gemm family runs as the conv family does.
    ("cpu", "gemm_conv"): EngineDefaults("host_loop", 64, "cnn_client_cpu.json: gemm 1.1-1.9x xla per client; "
                                                          "the conv family's choice"),
    # On a GPU the GEMM convolution under vmap is the fastest round of every convolutional
    # workload measured (benchmarks/gpu_session.py; results/gpu_h100/ and results/gpu_h200/,
    # seconds per round, median of 3 after compiling). The MNIST CNN at C = 100, bfloat16:
    # vmap 0.0633 s (H100) and 0.0540 s (H200) against the same convolution client by client
    # 0.167 s and 0.176 s, and chunks of 10 clients 0.0676 s (H200); FLUTE's FEMNIST CNN,
    # float32: vmap 0.0125 s / 0.0109 s against sequential XLA 0.0244 s / 0.0234 s;
    # ResNet-18 on CIFAR-10 shapes at C = 50, bfloat16 (H200): vmap 0.0287 s against
    # sequential XLA 0.478 s. Where the cohort under vmap exceeds the device's memory
    # (ResNet-50 at 224x224 and C = 100: 28.5 GB of temporaries per 10 clients), "auto" runs
    # `chunked` (H200: chunks of 10 2.06 s, of 4 2.28 s, sequential XLA 2.68 s a round), and
    # `sequential` where a chunk does not fit either (`plan.resolve_strategy`). Its local loop
    # stays a scan: unrolled in full, the CNN's 5 steps under vmap took 0.0564 s against
    # 0.0539 s, FEMNIST's 12 steps 0.0160 s against 0.0110 s (H200, results/gpu_h200/*_unroll.json).
    ("accelerator", "gemm_conv"): EngineDefaults("vmap", 0, "gpu_h100/, gpu_h200/ (gpu_session.py): "
                                                            "cnn C=100 bf16, vmap 0.38x sequential"),
}


def model_family(model, input_shape) -> str:
  """"conv" if the model's forward pass holds a convolution (traced on shapes only,
  nothing runs), "gemm_conv" for an image model whose convolutions are matrix products
  (`model.conv_impl = "gemm"`), else "dense"."""
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  x = jax.ShapeDtypeStruct((1,) + tuple(input_shape), jnp.float32)
  jaxpr = jax.make_jaxpr(model.apply)(params, x)

  def has_conv(jx) -> bool:
    for eqn in jx.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        return True
      for v in eqn.params.values():  # nested jaxprs: pjit, remat, scan, cond branches, ...
        for inner in (v if isinstance(v, (list, tuple)) else (v,)):
          inner = getattr(inner, "jaxpr", inner)
          if hasattr(inner, "eqns") and has_conv(inner):
            return True
    return False
  if has_conv(jaxpr.jaxpr):
    return "conv"
  return "gemm_conv" if getattr(model, "conv_impl", "xla") == "gemm" and model.modality == "image" else "dense"


def engine_defaults(family: str, backend: str | None = None) -> EngineDefaults:
  """The strategy and unrolling for a model family ("conv" or "dense") on `backend`."""
  backend = backend or jax.default_backend()
  return ENGINE_DEFAULTS[("cpu" if backend == "cpu" else "accelerator", family)]


def default_unroll(family: str, num_steps: int, backend: str | None = None) -> int | bool:
  """`True` (unroll the local loop in full) or 1, from `engine_defaults`."""
  return True if num_steps <= engine_defaults(family, backend).unroll_upto else 1


def default_strategy(model_or_name, backend: str | None = None, input_shape=None) -> str:
  """The measured default strategy (`ENGINE_DEFAULTS`) for a model, from its operations:
  what `engine.strategy = "auto"` picks.

  Args:
    model_or_name: the model (a `fedjax_dg.models.Model`), or a model name ("cnn" means
      convolutional, any other name dense; prefer the model).
    backend: "cpu", "gpu" or "tpu"; None: JAX's default backend.
    input_shape: one example's shape, needed with a model.

  Returns:
    The strategy's name ("host_loop", "sequential", "vmap", ...).
  """
  if isinstance(model_or_name, str):
    family = "conv" if model_or_name == "cnn" else "dense"
  else:
    family = model_family(model_or_name, input_shape)
  return engine_defaults(family, backend).strategy
