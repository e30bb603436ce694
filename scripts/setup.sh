#!/usr/bin/env bash
# Installs every Debian package loom uses. Idempotent; run as root on Debian 12.
#   scripts/setup.sh            build + test dependencies
#   scripts/setup.sh --oracle   also python3-torch (regenerates fixtures, benchmark peer)
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-openmp-dev            # GEMM (OpenMP build of OpenBLAS)
  libdnnl-dev                       # bf16 GEMM (oneDNN matmul; OpenBLAS 0.3.21 has no sbgemm)
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin        # collectives (later issues)
  coinor-libcbc-dev                 # planner ILP
  zlib1g-dev                        # checkpoint CRC-32
  libpcre2-dev                      # BPE pre-tokenization (\p{L} patterns, JIT)
  libsentencepiece-dev sentencepiece  # SentencePiece tokenizers; spm_encode is the test oracle
  fortunes                          # default training corpus
  python3                           # fault-injection tests (tests/mpi/check_kill.py), soak and fuzz scripts
  python3-protobuf                  # the independent reader of TensorBoard event files (tests/reference/check_tensorboard.py)
  librsvg2-bin                      # rsvg-convert: loom plot --out FILE.png renders its SVG with it
  clang libclang-rt-14-dev          # libFuzzer targets (scripts/fuzz.sh)
  slurm-wlm                         # srun runs loom's ranks (tests/mpi/check_slurm.sh: a one-machine cluster)
)
if [[ "${1:-}" == "--oracle" ]]; then
  pkgs+=(python3-torch python3-numpy google-perftools libgoogle-perftools4)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all ${#pkgs[@]} packages present"
