#!/bin/sh
# Install Debian's Prometheus server, promtool and Alertmanager when missing, for the
# alerting-rule tests (tests/integration/test_prometheus_alerts.py) and for trying
# deploy/prometheus/ by hand. Prints the directory holding `prometheus` and `promtool`.
# The packages' systemd units are never started: the tests run their own server on
# loopback with a private data directory.
set -eu
find_dir() {
    for d in /usr/bin /usr/local/bin; do
        if [ -x "$d/prometheus" ] && [ -x "$d/promtool" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}
if find_dir; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
echo "prometheus-local: installing Debian's prometheus ..." >&2
# policy-rc.d 101 keeps the package scripts from starting the system services; a
# machine without one gets a temporary one for the install.
cleanup=
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    cleanup=1
fi
# apt's and dpkg's progress goes to a log, shown only when the install fails: the
# test command's output stays readable.
log=$(mktemp)
if ! { $SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager \
        || { $SUDO apt-get update -qq \
            && $SUDO apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager; }; \
     } >"$log" 2>&1; then
    cat "$log" >&2
    echo "prometheus-local: installing Debian's prometheus failed (output above)" >&2
fi
rm -f "$log"
status=0
find_dir || status=$?
if [ -n "$cleanup" ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
exit $status
