#!/usr/bin/env bash
# Installs qflash's build dependencies (Debian 12 packages). Idempotent; needs root or sudo.
set -euo pipefail
pkgs=(build-essential cmake pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcli11-dev
      libgtest-dev libbenchmark-dev libcpp-httplib-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
echo "qflash: build dependencies present"
