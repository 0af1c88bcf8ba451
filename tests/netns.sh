# Sourced by tests and benchmarks that stand in for several hosts with
# network namespaces (root only).
#   netns_reexec SCRIPT ARGS...  re-runs SCRIPT inside a fresh
#       `unshare --net --mount --uts` (everything it creates dies with it),
#       or returns 77 when that cannot be done (not root, no iproute2).
#   netns_hosts N DIR  makes hosts host1..hostN (10.77.0.K/24 on a bridge,
#       names in a private /etc/hosts) and, in DIR, the scripts
#       `inhost HOST CMD...` (CMD in HOST's namespace, with its hostname)
#       and `agent HOST CMD...` (the same for mpirun's plm_rsh_agent).
# Only addresses the caller's namespaces create are used.
netns_reexec() {
  if [ -n "${TESSERA_NETNS_INNER:-}" ]; then
    ip link set lo up  # a fresh network namespace starts with it down
    return 0
  fi
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null ||
     ! unshare --net --mount --uts --fork true 2>/dev/null; then
    return 77
  fi
  TESSERA_NETNS_INNER=1 exec unshare --net --mount --uts --fork bash "$@"
}

netns_hosts() {
  local n=$1 dir=$2 h
  mount --make-rprivate / 2>/dev/null
  # Our own /run/netns: the namespace files never reach the machine's /run.
  mkdir -p /run/netns
  mount -t tmpfs tessera-netns /run/netns
  ip link set lo up
  ip link add br0 type bridge
  ip link set br0 up
  {
    echo "127.0.0.1 localhost"
    for h in $(seq 1 "$n"); do echo "10.77.0.$h host$h"; done
  } >"$dir/hosts"
  mount --bind "$dir/hosts" /etc/hosts
  for h in $(seq 1 "$n"); do
    ip netns add "host$h"
    ip link add "veth$h" type veth peer name eth0 netns "host$h"
    ip link set "veth$h" master br0
    ip link set "veth$h" up
    ip -n "host$h" addr add "10.77.0.$h/24" dev eth0
    ip -n "host$h" link set eth0 up
    ip -n "host$h" link set lo up
  done
  cat >"$dir/inhost" <<'EOF'
#!/usr/bin/env bash
h=$1
shift
exec ip netns exec "$h" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$h" "$@"
EOF
  # mpirun calls its rsh agent as `agent HOST COMMAND...` (a shell command).
  cat >"$dir/agent" <<'EOF'
#!/usr/bin/env bash
h=$1
shift
case "$h" in 10.77.0.*) h=host${h##*.} ;; esac
exec ip netns exec "$h" unshare --uts bash -c "hostname $h && $*"
EOF
  chmod +x "$dir/inhost" "$dir/agent"
}

# Kills every process left in the hosts' namespaces.
netns_cleanup() {
  local h
  for h in $(ip netns list 2>/dev/null | cut -d" " -f1); do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9
  done
}

# netns_shape RATE: limits the link of hosts 1 and 2 to RATE each way
# (into the host, and out of it) with `tc qdisc tbf`.
netns_shape() {
  local h verb=add
  tc qdisc show dev veth1 | grep -q tbf && verb=change
  for h in 1 2; do
    tc qdisc "$verb" dev "veth$h" root tbf rate "$1" burst 256kb latency 100ms
    ip netns exec "host$h" tc qdisc "$verb" dev eth0 root tbf rate "$1" burst 256kb latency 100ms
  done
}
