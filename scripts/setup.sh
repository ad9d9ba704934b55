#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for pidlease: Debian's ZooKeeper 3.8 (and a Java
# runtime if missing), then a virtualenv in .venv with the project and its test tools.
# Safe to run again; it installs only what is missing. Needs no standard input.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

# --bench also installs the peers the benchmarks compare against (NATS, Redis) and their clients.
bench=0; [ "${1:-}" = "--bench" ] && bench=1

need_apt=()
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
if [ $bench = 1 ]; then
  command -v nats-server >/dev/null 2>&1 || need_apt+=(nats-server)
  command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
fi
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
# The dashboard's browser test drives Debian's Chromium; CI validates docker-compose.yml.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
# A real Kafka client for the Kafka listener's tests; nft/iptables for the network-namespace
# nemesis suite (its NFQUEUE delayer needs libnetfilter-queue's headers and a compiler).
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
[ -f /usr/include/libnetfilter_queue/libnetfilter_queue.h ] || need_apt+=(libnetfilter-queue-dev)
# pip builds netfilterqueue (the test extra) from source against those headers.
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "== installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq </dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" </dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
echo "== installing pidlease into .venv"
extras=test,spark; [ $bench = 1 ] && extras=test,spark,bench
.venv/bin/pip install -q --disable-pip-version-check -e ".[$extras]" </dev/null
echo "== ready: .venv/bin/pidlease --help"
