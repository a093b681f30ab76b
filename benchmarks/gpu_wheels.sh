#!/usr/bin/env bash
# Downloads the wheels that the GPU machine's image lacks into .whl/ (ignored by git), to be
# copied there with the working tree: run it where PyPI is reachable, before the GPU run. The image (Python 3.12; jax 0.11.2 with CUDA 13, flax, optax,
# orbax-checkpoint, chex, numpy, scipy, scikit-learn, tqdm, torch, torchvision, absl-py,
# pyyaml, ...) holds every dependency in pyproject.toml but ml-collections; this script checks
# that again against the image's package list below and checks each downloaded wheel's own
# requirements against it too, then that the folder is under the tool's 64 MiB.
#
#   bash benchmarks/gpu_wheels.sh            # -> .whl/ml_collections-1.1.0-py3-none-any.whl
#
# Then one command on the GPU machine, with .whl/ beside the working tree and a 540-second
# limit (PYTHONUNBUFFERED: each line as it is printed; `timeout 470`: inside 8 minutes):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || echo "editable install failed: fedjax_dg is imported from the tree"; PYTHONUNBUFFERED=1 timeout 470 python3 benchmarks/gpu_session.py --out $OUT 2>&1 | tee $OUT/gpu_session.log
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.whl}"
PY="${PYTHON:-python3}"
WHEELS=("ml-collections==1.1.0")  # pinned: the version the project is tested with here

# The GPU image's Python packages, as listed on that machine.
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"

rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${WHEELS[@]}"

IMAGE="$IMAGE" DEST="$DEST" "$PY" - <<'EOF'
import glob, os, re, sys, tomllib, zipfile

def norm(name):
  return re.sub(r"[-_.]+", "-", name).lower()

def names(reqs):
  return [norm(re.match(r"\s*([A-Za-z0-9_.\-]+)", r).group(1)) for r in reqs]

image = set(os.environ["IMAGE"].split())
wheels = sorted(glob.glob(os.path.join(os.environ["DEST"], "*.whl")))
carried = {norm(os.path.basename(w).split("-")[0]) for w in wheels}
with open("pyproject.toml", "rb") as f:
  deps = names(tomllib.load(f)["project"]["dependencies"])
missing = [d for d in deps if d not in image and d not in carried]
for w in wheels:  # each carried wheel's own requirements (without extras and markers for other Pythons)
  with zipfile.ZipFile(w) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
  reqs = [l.split(":", 1)[1] for l in meta.splitlines() if l.startswith("Requires-Dist:") and "extra ==" not in l]
  missing += [f"{d} (needed by {os.path.basename(w)})" for d in names(reqs) if d not in image and d not in carried]
if missing:
  sys.exit(f"gpu_wheels.sh: not in the GPU image and not carried: {', '.join(missing)}; add them to WHEELS")
size = sum(os.path.getsize(w) for w in wheels)
if size > 32 * 2**20:  # the working tree and the carried paths travel within 64 MiB together
  sys.exit(f"gpu_wheels.sh: the wheels take {size / 2**20:.1f} MiB; the working tree and the wheels travel within 64 MiB")
print(f"{len(wheels)} wheel(s), {size / 1024:.0f} KiB in {os.environ['DEST']}: " + ", ".join(map(os.path.basename, wheels)))
print("pyproject.toml's dependencies, each in the image or carried: " + ", ".join(deps))
EOF
