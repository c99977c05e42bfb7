#!/usr/bin/env bash
# Installs the Debian packages hcomm builds, tests and runs with. Safe to rerun.
set -euo pipefail
# python3-*: the Python package's tests and examples, run with Debian's /usr/bin/python3;
# pip and venv for the test of `pip install --no-build-isolation python/`.
# gnuplot-nox: hcomm-bench --plot. libhwloc-dev: optional, this host's cores and NUMA nodes for
# the topology layer.
pkgs=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin gnuplot-nox libhwloc-dev python3
      python3-numpy python3-torch python3-pytest python3-pip python3-venv)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
