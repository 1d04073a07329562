#!/usr/bin/env bash
# Installs qflash's build and test dependencies: Debian 12 packages, and in .venv/ the Python
# packages the server's client tests use (the openai client; playwright, which drives Debian's
# chromium: no browser is downloaded) and numpy for the demo-corpus tests (tests/quality).
# Idempotent; needs root or sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcli11-dev
      libgtest-dev libbenchmark-dev python3-venv chromium)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
# Debian's python3, so the venv does not depend on whichever python3 is first on PATH.
py_pkgs=(openai==2.8.1 playwright==1.56.0 numpy==2.2.6)
if ! .venv/bin/python -c "import openai, playwright, numpy" >/dev/null 2>&1; then
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q "${py_pkgs[@]}"
fi
echo "qflash: build and test dependencies present"
