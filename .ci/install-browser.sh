#!/usr/bin/env bash
# Install Debian's Chromium for the report's browser test (tests/integration/test_report.py). Does nothing
# when it is there. Needs root and apt; the test runs Chromium headless on a file:// page, no network.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install-browser: chromium is missing and this is not a root shell with apt-get; install it by hand" >&2
    exit 2
fi
echo "install-browser: installing chromium" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null 2>&1 || { echo "install-browser: chromium still missing after the install" >&2; exit 1; }
