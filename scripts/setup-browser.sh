#!/usr/bin/env bash
# Installs Debian's headless Chromium for the report's browser test, if it is not there yet (needs root or sudo).
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium >/dev/null
command -v chromium >/dev/null
