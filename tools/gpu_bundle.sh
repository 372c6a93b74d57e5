#!/usr/bin/env bash
# Packs what tools/gpu_check.sh runs on a GPU machine that has a CUDA 13
# runtime and PyTorch but none of Debian's -dev libraries: tessel-train,
# tessel-launch, the GPU test binaries and the shared libraries they load
# that are neither glibc's, GCC's nor CUDA's (glog, gflags, protobuf, Gloo,
# oneDNN, ISA-L, ...). Writes build/gpu_bundle/tessel_gpu.tar.xz (about
# 30 MB), small enough to travel with a checkout. Run after tools/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TESSEL_BUILD_DIR:-build}
out=$build_dir/gpu_bundle
binaries=(tools/tessel-train tools/tessel-launch tests/core/cuda_unit_tests tests/ops/ops_unit_tests
  tests/ops/cuda_ops_unit_tests tests/dist/nccl_test)
# Everywhere already, and newer there: taking Debian's would shadow them for
# every process under LD_LIBRARY_PATH (PyTorch's too).
system='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux.*|libstdc\+\+|libgcc_s|libz|liblzma|libcrypto|libssl)\.so'

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "${binaries[@]}"; do
  [ -x "$build_dir/$b" ] || {
    echo "gpu_bundle: $build_dir/$b is missing; build with the CUDA toolkit first (tools/build.sh)" >&2
    exit 1
  }
  strip --strip-unneeded -o "$stage/bin/$(basename "$b")" "$build_dir/$b"
  ldd "$build_dir/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    name=$(basename "$lib")
    case "$lib" in /usr/local/cuda*) continue ;; esac
    [[ $name =~ $system ]] && continue
    [ -e "$stage/lib/$name" ] || cp -L "$lib" "$stage/lib/$name"
  done
done
mkdir -p "$out"
tar -C "$stage" -cf - bin lib | xz -T0 -6 > "$out/tessel_gpu.tar.xz"
echo "gpu_bundle: $out/tessel_gpu.tar.xz ($(du -h "$out/tessel_gpu.tar.xz" | cut -f1)):" \
  "$(ls "$stage/bin" | tr '\n' ' ')+ $(ls "$stage/lib" | wc -l) libraries"
