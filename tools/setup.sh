#!/usr/bin/env bash
# Installs the system packages Strata builds against, when they are missing.
# Idempotent; works on Debian 12 and Ubuntu 24.04. Everything comes from apt.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libeigen3-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  liburing-dev libsentencepiece-dev catch2 libopenmpi-dev openmpi-bin
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "[setup] all packages present"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "[setup] missing packages: ${missing[*]}; install them with your package manager" >&2
  exit 1
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "[setup] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# A machine without a package mirror (an offline GPU host with the libraries preinstalled from elsewhere) still
# builds: the install failing is a warning here, and CMake names any library that is really missing.
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
  echo "[setup] warning: could not install ${missing[*]}; continuing with what is installed" >&2
fi
