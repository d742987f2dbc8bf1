#!/usr/bin/env bash
# Install Azurite, Microsoft's Azure Storage emulator (an npm package), under .tools/azurite/
# in this checkout: the tests of as:// repositories start its blob service on a free
# loopback port (tests/cloud_servers.py). Needs node >= 18 and npm.
#
# Afterwards: .tools/azurite/node_modules/.bin/azurite-blob --version
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.tools/azurite"
VERSION="${AZURITE_VERSION:-3.35.0}"
if [ -x "$DEST/node_modules/.bin/azurite-blob" ] \
    && "$DEST/node_modules/.bin/azurite-blob" --version >/dev/null 2>&1; then
  echo "azurite already installed: $DEST/node_modules/.bin/azurite-blob"; exit 0
fi
mkdir -p "$DEST"
npm install --prefix "$DEST" --no-audit --no-fund --loglevel=error "azurite@$VERSION"
"$DEST/node_modules/.bin/azurite-blob" --version
