"""Restart time of a server whose repository is a bucket, with and without the download cache
(issue 28).

A 10-model repository of about 200 MB (each model: the add_sub ONNX model and a 20 MB file of
random bytes beside it, which nursery downloads with the model and never reads) is uploaded to
moto's S3 server on loopback. Then ``python -m nursery serve --model-repository s3://...`` is
started and timed until ``/v2/health/ready`` answers, stopped, and started again, in three
ways:

- ``temporary``: Triton's behaviour, downloads into a temporary folder each start;
- ``cache, cold``: ``--cloud-cache-directory`` on an empty folder (the first start);
- ``cache, warm``: the same folder again (a restart: nothing changed, nothing is fetched),
  and ``cache, one changed``: after one model's config is re-uploaded.

    python bench/cloud_restart.py [--models 10] [--megabytes 20] [--rounds 3]

Needs the test extra (moto[server], boto3). Prints the median and range of each way's
start-to-ready seconds; the machine is shared, so compare ways within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import cloud_servers  # noqa: E402
from tests.conftest import ServerProcess, make_models  # noqa: E402


def _ready(server: ServerProcess, timeout: float = 600.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{server.log()}")
        try:
            with urllib.request.urlopen(f"http://{server.url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.02)
    raise TimeoutError(server.log())


def _start(url: str, logs: Path, *extra: str) -> float:
    server = ServerProcess(url, *extra, log_path=logs / f"server-{time.monotonic_ns()}.log")
    try:
        return _ready(server)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--megabytes", type=int, default=20, help="padding per model")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, cloud_servers.moto_server() as port:
        work = Path(scratch)
        cloud = cloud_servers.s3_cloud(port)
        os.environ.update(cloud.env)
        staged = work / "staged"
        for i in range(args.models):
            folder = make_models.write_add_sub(staged, name=f"model_{i:02d}")
            (folder / "1" / "padding.bin").write_bytes(os.urandom(args.megabytes << 20))
        cloud.put(staged)
        total = sum(p.stat().st_size for p in staged.rglob("*") if p.is_file())
        print(f"repository: {args.models} models, {total / 1e6:.0f} MB, {cloud.url}")
        times: dict[str, list[float]] = {"temporary": [], "cache, cold": [], "cache, warm": [],
                                         "cache, one changed": []}
        for round_ in range(args.rounds):
            cache = work / f"cache-{round_}"
            times["temporary"].append(_start(cloud.url, work))
            times["cache, cold"].append(_start(cloud.url, work, f"--cloud-cache-directory={cache}"))
            times["cache, warm"].append(_start(cloud.url, work, f"--cloud-cache-directory={cache}"))
            config = (staged / "model_00" / "config.pbtxt").read_text() + f"\n# round {round_}\n"
            cloud.put_bytes("model_00/config.pbtxt", config.encode())
            times["cache, one changed"].append(
                _start(cloud.url, work, f"--cloud-cache-directory={cache}"))
        print(f"{'way':<22} {'median s':>9} {'min s':>7} {'max s':>7}")
        for way, values in times.items():
            print(f"{way:<22} {statistics.median(values):>9.2f} {min(values):>7.2f} "
                  f"{max(values):>7.2f}")


if __name__ == "__main__":
    main()
