#!/usr/bin/env bash
# Installs kvsplit's build and test dependencies from Debian 12 packages.
# Idempotent: prints nothing and touches nothing when everything is already present.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git python3
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libyaml-cpp-dev
  libcli11-dev nlohmann-json3-dev libpcre2-dev libicu-dev libxxhash-dev liburing-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev
  python3-grpcio python3-protobuf python3-matplotlib
  openssl
  clang libclang-rt-14-dev clang-format
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The CUDA toolkit is optional: the build uses it when nvcc is found (PATH or /usr/local/cuda).
