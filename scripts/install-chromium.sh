#!/bin/sh
# Install Debian's headless-capable Chromium for the dashboard's browser test
# (tests/e2e/test_dashboard_*.py) when it is missing. The Playwright Python
# package drives this executable; `playwright install` is never used because
# the network is closed except for the package mirrors.
set -eu
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
# apt's and dpkg's progress goes to a log, shown only when the install fails.
log=$(mktemp)
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "install-chromium: installing Debian's chromium failed (output above)" >&2
    exit 1
fi
rm -f "$log"
command -v chromium
