"""The PyTorch peer of `round_speed.py`: one FedAvg round, clients trained one after another.

This is how the reference codebases (DomainBed's and the FL papers' PyTorch code) run a
round: one model object, for each sampled client load the global weights, run `K` local
SGD steps on minibatches of `B` drawn from a fresh permutation of the client's examples,
and add the client's weights, weighted by its example count, into a running sum; the new
global model is that weighted mean (FedAvg with server step 1, `theta + mean Delta`).

Models match fedjax_dg.models exactly:
  cnn: DomainBed's `MNIST_CNN`: Conv 3x3 (1->64, pad 1), ReLU, GroupNorm(8, 64); Conv 3x3
       stride 2 (64->128); Conv 3x3 (128->128) twice, each ReLU + GroupNorm(8, 128); global
       average pooling; Linear(128, num_classes). GroupNorm eps 1e-6 as Flax's.
  mlp: Linear(784, 200), ReLU, Linear(200, 200), ReLU, Linear(200, 10).
  femnist_cnn: LEAF's FEMNIST CNN (models.LeafCNNFeaturizer): Conv 5x5 (1->16, pad 2), ReLU,
       MaxPool 2; Conv 5x5 (16->64, pad 2), ReLU, MaxPool 2; Linear(3136, 2048);
       Linear(2048, 62). For 28x28x1 inputs.
  resnet18, resnet50: torchvision's, `fc` sized to the classes, batch norm in eval mode
       (frozen statistics, trainable affine: DomainBed's `freeze_bn`, our default), or in
       training mode with `--bn train` (our `model.freeze_bn = False`).
Inputs are NCHW (PyTorch's layout; the JAX side stores NHWC); random data of the right
shapes, each client holding exactly `K * B` examples, as round_speed.py's. `--device cuda`
keeps the data and model on the GPU and synchronises before reading the clock; PyTorch's
defaults stay (float32; cuDNN convolutions may use TF32, its default).

Not a project dependency: run it with a Python that has torch, e.g.

    /tmp/torchvenv/bin/python benchmarks/torch_peer.py --workload cnn --clients 10 --threads 2

It prints one JSON line: {"workload", "median_s", "times", "threads", "torch", ...}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


SHAPES = {"cnn": (1, 28, 28), "mlp": (1, 28, 28), "femnist_cnn": (1, 28, 28), "resnet18": (3, 32, 32),
          "resnet50": (3, 224, 224)}  # default input shapes (C, H, W); --size overrides H = W


def build(workload: str, num_classes: int = 10):
  import torch.nn as nn
  if workload == "femnist_cnn":
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 64, 5, padding=2),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 7 * 7, 2048),
                         nn.Linear(2048, num_classes))
  if workload in ("resnet18", "resnet50"):
    import torchvision
    return getattr(torchvision.models, workload)(num_classes=num_classes)
  if workload == "cnn":
    layers, cin = [], 1
    for width, stride in ((64, 1), (128, 2), (128, 1), (128, 1)):
      layers += [nn.Conv2d(cin, width, 3, stride=stride, padding=1), nn.ReLU(), nn.GroupNorm(8, width, eps=1e-6)]
      cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, num_classes))
  if workload == "mlp":
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(),
                         nn.Linear(200, num_classes))
  raise ValueError(f"unknown workload {workload!r}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workload", choices=tuple(SHAPES), required=True)
  p.add_argument("--classes", type=int, default=10)
  p.add_argument("--size", type=int, default=0, help="image height = width (default: the workload's)")
  p.add_argument("--device", default="cpu", help="cpu | cuda")
  p.add_argument("--clients", type=int, required=True)
  p.add_argument("--steps", type=int, required=True)
  p.add_argument("--batch", type=int, required=True)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--bn", choices=("frozen", "train"), default="frozen",
                 help="the ResNets' batch norm: frozen statistics (DomainBed's) or each batch's own")
  p.add_argument("--serve", action="store_true",
                 help="after the warm-up round print {\"ready\": ...}, then run one round per 'round' line read "
                      "from stdin and print {\"s\": seconds}; 'quit' ends (round_speed.py --peer interleaves this "
                      "way, so both sides see the same machine load)")
  p.add_argument("--channels-last", action="store_true", help="NHWC memory format for the CNN (not the references' way)")
  args = p.parse_args(argv)

  import numpy as np
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  C, K, B = args.clients, args.steps, args.batch
  n = K * B
  rng = np.random.default_rng(0)
  chw = SHAPES[args.workload]
  if args.size:
    chw = (chw[0], args.size, args.size)
  dev = torch.device(args.device)
  xs = torch.from_numpy(rng.random((C, n) + chw, dtype=np.float32)).to(dev)
  ys = torch.from_numpy(rng.integers(0, args.classes, (C, n)).astype(np.int64)).to(dev)
  counts = [n] * C
  model = build(args.workload, args.classes).to(dev)
  sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
  fmt = torch.channels_last if args.channels_last else torch.contiguous_format
  if args.channels_last:
    model = model.to(memory_format=fmt)
    xs = xs.reshape((C * n,) + chw).contiguous(memory_format=fmt).reshape((C, n) + chw)
  global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

  floats = [k for k, v in global_state.items() if v.is_floating_point()]  # not BN's num_batches_tracked

  def one_round():
    total = {k: torch.zeros_like(global_state[k]) for k in floats}
    weight = 0.0
    for c in range(C):
      model.load_state_dict(global_state)
      opt = torch.optim.SGD(model.parameters(), lr=args.lr)
      model.train()
      for m in model.modules():  # frozen batch-norm statistics, as our ResNets (DomainBed's freeze_bn)
        if isinstance(m, torch.nn.BatchNorm2d) and args.bn == "frozen":
          m.eval()
      perm = torch.randperm(counts[c], device=dev)
      for k in range(K):
        idx = perm[k * B:(k + 1) * B]
        x, y = xs[c, idx], ys[c, idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
      with torch.no_grad():
        state = model.state_dict()
        for k in floats:
          total[k].add_(state[k], alpha=float(counts[c]))
      weight += counts[c]
    with torch.no_grad():
      for k in floats:  # FedAvg, server step 1: theta + sum p_c (theta_c - theta) = sum p_c theta_c
        global_state[k] = total[k] / weight

  def timed_round():
    sync()
    t = time.perf_counter()
    one_round()
    sync()
    return time.perf_counter() - t

  first = timed_round()  # warm-up, as the JAX side's compiling round
  info = {"workload": args.workload, "clients": C, "steps": K, "batch": B, "first_round_s": first,
          "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
          "torch": torch.__version__, "channels_last": args.channels_last,
          "mkldnn": torch.backends.mkldnn.is_available(), "device": args.device, "input_chw": chw,
          "classes": args.classes, "bn": args.bn}
  if dev.type == "cuda":
    info.update(gpu=torch.cuda.get_device_name(), cudnn=torch.backends.cudnn.version(),
                cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
                matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32)
  if args.serve:
    print(json.dumps({"ready": info}), flush=True)
    for line in sys.stdin:
      if line.strip() != "round":
        break
      print(json.dumps({"s": timed_round()}), flush=True)
    return
  times = []
  for _ in range(args.repeats):
    times.append(timed_round())
  finite = all(bool(torch.isfinite(global_state[k]).all()) for k in floats)
  print(json.dumps(dict(info, median_s=float(np.median(times)), times=times, state_finite=finite)), flush=True)


if __name__ == "__main__":
  main()
