#!/usr/bin/env bash
# Install NVIDIA's perf_analyzer (the load generator the tests and benchmarks use) under
# .tools/perf_analyzer/ in this checkout. No root needed where libb64 is already installed.
#
# Why not `pip install perf-analyzer`: its binary wheels need glibc >= 2.38 (Debian 12 has
# 2.36). The tritonclient 2.51.0 wheel is the newest whose bin/perf_analyzer runs on glibc
# 2.36. That binary links libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel; no GPU is
# needed for HTTP/gRPC runs) and libb64.so.0d (Debian package libb64-0d).
#
# Afterwards: .tools/perf_analyzer/perf_analyzer --version   (a wrapper that sets the paths)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.tools/perf_analyzer"
PY="${PYTHON:-python3}"
if [ -x "$DEST/perf_analyzer" ] && "$DEST/perf_analyzer" --version >/dev/null 2>&1; then
  echo "perf_analyzer already installed: $DEST/perf_analyzer"; exit 0
fi
rm -rf "$DEST"; mkdir -p "$DEST/lib" "$DEST/wheels"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DEST/wheels" \
  tritonclient==2.51.0 nvidia-cuda-runtime-cu12==12.9.79
"$PY" - "$DEST" <<'PYEOF'
import glob, os, sys, zipfile
dest = sys.argv[1]
with zipfile.ZipFile(glob.glob(f"{dest}/wheels/tritonclient-*.whl")[0]) as z:
    data = z.read("tritonclient-2.51.0.data/data/bin/perf_analyzer")
with open(f"{dest}/perf_analyzer.bin", "wb") as f:
    f.write(data)
os.chmod(f"{dest}/perf_analyzer.bin", 0o755)
with zipfile.ZipFile(glob.glob(f"{dest}/wheels/nvidia_cuda_runtime_cu12-*.whl")[0]) as z:
    for name in z.namelist():
        if "/lib/libcudart.so" in name:
            with open(f"{dest}/lib/{os.path.basename(name)}", "wb") as f:
                f.write(z.read(name))
PYEOF
rm -rf "$DEST/wheels"
have_b64() { ldconfig -p 2>/dev/null | grep 'libb64.so.0d' >/dev/null || [ -e "$DEST/lib/libb64.so.0d" ]; }
if ! have_b64; then
  # unpack Debian's libb64-0d next to the binary (no root needed), else install it as root
  (cd "$DEST" && apt-get download libb64-0d >/dev/null 2>&1 && dpkg -x libb64-0d_*.deb pkg &&
     cp pkg/usr/lib/x86_64-linux-gnu/libb64.so.0d* lib/ && rm -rf pkg libb64-0d_*.deb) || true
fi
if ! have_b64 && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q libb64-0d >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libb64-0d >/dev/null 2>&1; } || true
fi
have_b64 || { echo "libb64.so.0d (Debian package libb64-0d) is missing" >&2; exit 1; }
cat > "$DEST/perf_analyzer" <<'WRAP'
#!/usr/bin/env bash
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$HERE/perf_analyzer.bin" "$@"
WRAP
chmod +x "$DEST/perf_analyzer"
"$DEST/perf_analyzer" --version >/dev/null 2>&1 || { echo "perf_analyzer does not run" >&2; exit 1; }
echo "installed $DEST/perf_analyzer"
