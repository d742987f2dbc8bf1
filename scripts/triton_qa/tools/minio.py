"""A stand-in for the MinIO server, for Triton's qa/L0_storage_S3_local.

    minio.py server [-C <config dir>] --address <host>:<port> <volume> ...

Triton's L0_storage_S3_local downloads MinIO at test time, runs it on 127.0.0.1:4572, fills
buckets with the AWS CLI and serves model repositories from them (``s3://<host>:4572/...``).
This serves the same S3 API on that address with moto's S3 server (path-style requests, every
object in memory: nothing written to the volume folders, which are only checked to exist).
What MinIO has and this has not: signatures are not checked, so a client with a wrong secret
key is served (the script's "access decline" check then fails, a limit of the stand-in).
SIGTERM / SIGINT stop it.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from moto.server import ThreadedMotoServer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="minio")
    parser.add_argument("command", choices=["server"])
    parser.add_argument("-C", "--config-dir", default="")
    parser.add_argument("--address", default=":9000")
    parser.add_argument("volumes", nargs="*")
    args = parser.parse_intermixed_args(argv)
    host, _, port = args.address.rpartition(":")
    server = ThreadedMotoServer(ip_address=host or "127.0.0.1", port=int(port), verbose=False)
    server.start()
    print(f"minio (nursery-qa stand-in, moto's S3): API: http://{host or '127.0.0.1'}:{port}",
          flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
