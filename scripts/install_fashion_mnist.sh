#!/usr/bin/env bash
# Installs Fashion-MNIST from Debian / Ubuntu's `dataset-fashion-mnist` package: four gzipped
# IDX files in /usr/share/datasets/fashion-mnist, where configs/rotated_fashion_mnist.py
# looks for them when data.path holds no files. Exits non-zero, saying why, when it cannot.
set -euo pipefail

PACKAGE=dataset-fashion-mnist
TARGET=/usr/share/datasets/fashion-mnist
FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

have_files() {
  for f in "${FILES[@]}"; do [[ -f "$TARGET/$f" ]] || return 1; done
}

if have_files; then
  echo "Fashion-MNIST is already installed in $TARGET"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: apt-get not found; this script needs Debian or Ubuntu. Elsewhere, download the four" \
       "IDX files from https://github.com/zalandoresearch/fashion-mnist into a directory and pass" \
       "--config.data.path=DIR" >&2
  exit 1
fi

if [[ $(id -u) -eq 0 ]]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
elif command -v sudo >/dev/null 2>&1 && [[ -t 0 ]]; then
  SUDO=(sudo)  # will prompt for a password
else
  echo "error: installing $PACKAGE needs root and sudo is unavailable here. Either ask an administrator" \
       "to run 'apt-get install $PACKAGE', or unpack it without root:" \
       "'apt-get download $PACKAGE && dpkg-deb -x ${PACKAGE}_*.deb DIR' and pass" \
       "--config.data.path=DIR$TARGET" >&2
  exit 1
fi

if ! apt-cache show "$PACKAGE" >/dev/null 2>&1; then
  "${SUDO[@]}" apt-get update -q || true
fi
if ! apt-cache show "$PACKAGE" >/dev/null 2>&1; then
  echo "error: apt knows no package $PACKAGE (Debian bookworm ships it in main; older releases may not)" >&2
  exit 1
fi
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$PACKAGE"

if ! have_files; then
  echo "error: $PACKAGE installed but the IDX files are not in $TARGET; see 'dpkg -L $PACKAGE'" >&2
  exit 1
fi
echo "Fashion-MNIST installed in $TARGET"
