#!/usr/bin/env bash
# Install the Redis server (Debian's redis-server package): the tests of the Redis response
# cache (--cache-config redis,...) start it on a free loopback port (tests/cloud_servers.py).
# Needs apt-get, as root or through sudo.
#
# Afterwards: redis-server --version
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  echo "redis-server already installed: $(command -v redis-server)"; exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y --no-install-recommends redis-server \
  || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends redis-server; }
redis-server --version
