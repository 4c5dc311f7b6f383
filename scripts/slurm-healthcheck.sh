#!/bin/bash
# trainguard pre-flight as a Slurm HealthCheckProgram or Prolog: drain this node, with
# the failing check as the reason, when `trainguard preflight` fails.
#
#   slurm.conf:  HealthCheckProgram=/usr/local/sbin/slurm-healthcheck.sh
#                HealthCheckInterval=300
#                HealthCheckNodeState=IDLE        # never stress GPUs under a running job
#   or           Prolog=/usr/local/sbin/slurm-healthcheck.sh --prolog
#
# Usage: slurm-healthcheck.sh [--prolog] [EXTRA trainguard preflight ARGUMENTS...]
#
# On failure it runs
#   scontrol update nodename=<node> state=drain reason="trainguard preflight: <check> on device <i>: <reason>"
# and, in --prolog mode, exits 1 (Slurm then requeues the job and drains the node
# itself, possibly replacing our reason with "Prolog error": the full reason is also
# sent to syslog with the tag trainguard-preflight). As a HealthCheckProgram it exits 0:
# the drain is the verdict, and slurmd must not wait on us at start-up.
#
# Environment (all optional):
#   TRAINGUARD                 the trainguard command (default: trainguard); may hold words
#   TRAINGUARD_PREFLIGHT_ARGS  arguments for `trainguard preflight` (default: --level quick)
#   TRAINGUARD_HC_TIMEOUT      seconds before the check counts as failed (default 50:
#                              Slurm kills a HealthCheckProgram after 60 s)
#   TRAINGUARD_HC_ON_ERROR     drain (default) or ignore: what to do when trainguard
#                              itself cannot run (not installed, crashed, bad arguments)
#   TRAINGUARD_HC_REPORT       keep the JSON report here (default: not kept)
#   SLURMD_NODENAME            the node to drain (default: hostname -s; set it when one
#                              host runs several slurmd)
#   SCONTROL, PYTHON           the scontrol and python3 to use
set -u

mode=healthcheck
if [ "${1:-}" = "--prolog" ]; then
    mode=prolog
    shift
fi
node="${SLURMD_NODENAME:-$(hostname -s)}"
scontrol="${SCONTROL:-scontrol}"
python="${PYTHON:-python3}"
limit="${TRAINGUARD_HC_TIMEOUT:-50}"
report=$(mktemp "${TMPDIR:-/tmp}/tg-preflight.XXXXXX")
errors=$(mktemp "${TMPDIR:-/tmp}/tg-preflight-err.XXXXXX")
trap 'rm -f "$report" "$errors"' EXIT

# shellcheck disable=SC2086  # both variables hold several words on purpose
timeout --kill-after=5 "$limit" ${TRAINGUARD:-trainguard} preflight --json \
    ${TRAINGUARD_PREFLIGHT_ARGS:---level quick} "$@" >"$report" 2>"$errors"
rc=$?
if [ -n "${TRAINGUARD_HC_REPORT:-}" ]; then
    cp "$report" "$TRAINGUARD_HC_REPORT" 2>/dev/null || true
fi

case "$rc" in
0)
    exit 0
    ;;
1)
    # The first failed check, as "<check> on device <index>: <reason>".
    reason=$("$python" - "$report" <<'EOF' 2>/dev/null
import json, sys
data = json.load(open(sys.argv[1]))
index = {d["uuid"]: d["index"] for d in data.get("devices", [])}
f = data["failures"][0]
where = f" on device {index.get(f['device'], f['device'])}" if f.get("device") else ""
more = len(data["failures"]) - 1
print(f"{f['check']}{where}: {f['reason']}" + (f" (+{more} more)" if more else ""))
EOF
    ) || reason="a check failed (report unreadable)"
    ;;
124 | 137)
    reason="did not finish within ${limit} s"
    ;;
*)
    if [ "${TRAINGUARD_HC_ON_ERROR:-drain}" = "ignore" ]; then
        exit 0
    fi
    last=$(tail -n 1 "$errors" 2>/dev/null)
    reason="could not run (exit $rc): ${last:-no output}"
    ;;
esac

# One line, no control characters, short enough for sinfo.
reason=$(printf '%s' "trainguard preflight: $reason" | tr -s '\n\r\t' '   ' | cut -c1-240)
logger -t trainguard-preflight "node $node: $reason" 2>/dev/null || true
"$scontrol" update nodename="$node" state=drain reason="$reason"
if [ "$mode" = prolog ]; then
    exit 1
fi
exit 0
