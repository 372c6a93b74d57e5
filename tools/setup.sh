#!/usr/bin/env bash
# Installs every Debian package tessel's build, tests and benchmarks need.
# Idempotent: it only calls apt-get when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache git pkg-config
  libgloo-dev libprotobuf-dev protobuf-compiler
  libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev
  libdnnl-dev libopenblas-dev
  libssl-dev                           # HMAC-SHA256 for the rendezvous store's authentication
  libisal-dev                          # Intel ISA-L: CRC-32C of TensorBoard records and checkpoint chunks
  nlohmann-json3-dev                   # JSON headers of safetensors files
  clang libclang-rt-14-dev             # libFuzzer and sanitizers (tools/fuzz.sh)
  iproute2 procps                      # ss and pgrep, used by the reliability tests
  python3 python3-torch python3-numpy  # PyTorch 1.13 (CPU): numerical reference and benchmark peer
  python3-matplotlib                   # tools/pipeline_timeline.py and plot_metrics.py draw PNGs
  python3-pip                          # the data tests install Hugging Face tokenizers into a temp dir
  clang-format
  doxygen                              # the C++ API reference (docs/Doxyfile; test api_reference)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA 13 toolkit is expected under /usr/local/cuda (it is not a Debian
# package); without it tessel builds CPU-only.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found: $(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1)"
else
  echo "setup: no CUDA toolkit under /usr/local/cuda; the build will be CPU-only"
fi
