#!/usr/bin/env bash
# An OpenSSH server on loopback, for the tests of `trainguard slurm watch --ssh`.
#
#   scripts/sshd-local.sh up      install Debian's openssh-server when sshd is missing,
#                                 generate keys, start sshd; prints the environment lines
#   scripts/sshd-local.sh down    stop it and remove everything it wrote
#   scripts/sshd-local.sh status  exit 0 when it answers
#   scripts/sshd-local.sh env     print the environment lines again
#
# What `up` prints on stdout (one `export NAME=value` a line):
#   TRAINGUARD_SSHD_PORT         the port (127.0.0.1 only)
#   TRAINGUARD_SSHD_USER         the user it lets in (the one running this script)
#   TRAINGUARD_SSHD_KEY          a private key authorised for that user (ed25519, no passphrase)
#   TRAINGUARD_SSHD_KNOWN_HOSTS  a known-hosts file holding this server's host key
#   TRAINGUARD_SSHD_DIR          where all of it lives
#
# Key authentication only (no passwords, no PAM), a generated host key, its own config,
# log and pid file; nothing outside $TRAINGUARD_SSHD_DIR (default /tmp/trainguard-sshd)
# changes except the package install. The port: $TRAINGUARD_SSHD_PORT (default 17222).
# As root sshd uses its privilege-separation directory /run/sshd (created when missing);
# as another user it runs without (it then only lets that user in). Idempotent.
set -euo pipefail

cmd="${1:-up}"
dir="${TRAINGUARD_SSHD_DIR:-/tmp/trainguard-sshd}"
port="${TRAINGUARD_SSHD_PORT:-17222}"
user="$(id -un)"

say() { echo "sshd-local: $*" >&2; }
die() { say "$*"; exit 1; }

sshd_bin() {
    local p
    for p in /usr/sbin/sshd /usr/local/sbin/sshd "$(command -v sshd 2>/dev/null || true)"; do
        [ -n "$p" ] && [ -x "$p" ] && { echo "$p"; return 0; }
    done
    return 1
}

install_packages() {
    sshd_bin >/dev/null && command -v ssh-keygen >/dev/null && return 0
    say "installing openssh-server (Debian) ..."
    export DEBIAN_FRONTEND=noninteractive
    mkdir -p "$dir"
    # As scripts/slurm-local.sh: update the package lists only when the install needs it.
    if ! apt-get install -y --no-install-recommends openssh-server openssh-client \
        >"$dir/apt.log" 2>&1; then
        apt-get update >>"$dir/apt.log" 2>&1 || true
        apt-get install -y --no-install-recommends openssh-server openssh-client \
            >>"$dir/apt.log" 2>&1 || { tail -20 "$dir/apt.log" >&2; die "could not install openssh-server"; }
    fi
}

print_env() {
    echo "export TRAINGUARD_SSHD_PORT=$port"
    echo "export TRAINGUARD_SSHD_USER=$user"
    echo "export TRAINGUARD_SSHD_KEY=$dir/client_key"
    echo "export TRAINGUARD_SSHD_KNOWN_HOSTS=$dir/known_hosts"
    echo "export TRAINGUARD_SSHD_DIR=$dir"
}

pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
our_pid() { [ -s "$dir/sshd.pid" ] && cat "$dir/sshd.pid" 2>/dev/null || true; }

answers() {
    ssh -F none -T -o BatchMode=yes -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile="$dir/known_hosts" -o GlobalKnownHostsFile=/dev/null \
        -o IdentitiesOnly=yes -i "$dir/client_key" -o ConnectTimeout=3 -p "$port" \
        "$user@127.0.0.1" true </dev/null >/dev/null 2>&1
}

write_files() {
    mkdir -p "$dir"
    chmod 700 "$dir"
    [ -s "$dir/host_key" ] || ssh-keygen -q -t ed25519 -N '' -C trainguard-sshd-host -f "$dir/host_key"
    [ -s "$dir/client_key" ] || ssh-keygen -q -t ed25519 -N '' -C trainguard-sshd-client -f "$dir/client_key"
    cp "$dir/client_key.pub" "$dir/authorized_keys"
    chmod 600 "$dir/authorized_keys" "$dir/client_key"
    echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$dir/host_key.pub")" >"$dir/known_hosts"
    cat >"$dir/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
AllowUsers $user
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
StrictModes no
AllowTcpForwarding no
X11Forwarding no
PrintMotd no
MaxSessions 10
LogLevel VERBOSE
EOF
}

up() {
    install_packages
    local pid sshd
    pid="$(our_pid)"
    if pid_alive "$pid" && [ -s "$dir/client_key" ] && answers; then
        print_env
        return 0
    fi
    write_files
    sshd="$(sshd_bin)" || die "sshd not found"
    # root: sshd's privilege separation needs its empty directory (no systemd made it).
    [ "$(id -u)" -ne 0 ] || mkdir -p /run/sshd
    "$sshd" -t -f "$dir/sshd_config" || die "sshd rejects $dir/sshd_config"
    "$sshd" -f "$dir/sshd_config" -E "$dir/sshd.log"
    local i
    for ((i = 0; i < 50; i++)); do
        answers && { print_env; return 0; }
        sleep 0.1
    done
    tail -20 "$dir/sshd.log" >&2 || true
    die "sshd did not answer on 127.0.0.1:$port"
}

down() {
    local pid
    pid="$(our_pid)"
    if pid_alive "$pid"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do pid_alive "$pid" || break; sleep 0.1; done
    fi
    rm -rf "$dir"
}

case "$cmd" in
    up) up ;;
    down) down ;;
    status) pid_alive "$(our_pid)" && answers ;;
    env) print_env ;;
    *) die "usage: $0 up|down|status|env" ;;
esac
