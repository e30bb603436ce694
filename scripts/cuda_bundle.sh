#!/usr/bin/env bash
# Packs the CUDA build (cmake --preset cuda) for a lent GPU machine (issue 20), whose CUDA
# image lacks loom's Debian libraries: .device/bundle.tar.xz holds the loom binary, the
# CUDA test, the GEMM benchmark (bench/cuda_gemm.cc), every shared library they load except
# glibc, libstdc++ and CUDA's own, the default corpus and a larger one (pysrc) (NCCL is not linked: loom opens the machine's libnccl.so.2 for dp > 1).
# bench/cuda_device.sh unpacks it there. .device/ is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=$(mktemp -d)
mkdir -p "$stage/lib" .device
cp build/cuda/loom build/cuda/tests/cuda_test build/cuda/cuda_gemm "$stage/"
for so in $(ldd build/cuda/loom build/cuda/tests/cuda_test build/cuda/cuda_gemm | awk '/=> \//{print $3}' | sort -u); do
  case $(basename "$so") in
    libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*|libcuda.so*|libcublas*|libcudart*) ;;
    *) cp -L "$so" "$stage/lib/" ;;
  esac
done
cp -r /usr/share/games/fortunes "$stage/fortunes"
# A corpus a 1B model does not memorise in 1,000 steps of 4,096 tokens (bench/cuda_device.sh
# fp8loss): Debian's Python standard library without its tests and packages, about 11 MB.
stdlib=$(ls -d /usr/lib/python3.[0-9]* | head -1)
mkdir -p "$stage/pysrc"
find "$stdlib" -name '*.py' -not -path '*/test/*' -not -path '*/tests/*' -not -path '*/idle_test/*' \
  -not -path '*-packages/*' | sort | xargs cat > "$stage/pysrc/stdlib.py"
tar -C "$stage" -cJf .device/bundle.tar.xz .
rm -rf "$stage"
mkdir -p .git/info; grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
ls -la .device/bundle.tar.xz
