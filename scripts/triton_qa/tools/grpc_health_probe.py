"""A stand-in for grpc-health-probe (github.com/grpc-ecosystem/grpc-health-probe), which
L0_grpc installs with `go install` at test time; the harness's `go` shim puts this script in
its place instead (nothing is fetched at test time).

It asks the standard gRPC health service (/grpc.health.v1.Health/Check, service "") of
-addr and prints what the Go tool prints: `status: SERVING` (exit 0), `status: <other>`
(exit 4), or `timeout: failed to connect service "<addr>" within 1s` (exit 2)."""
from __future__ import annotations

import argparse
import sys

import grpc

STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def main() -> int:
    parser = argparse.ArgumentParser(prog="grpc-health-probe")
    parser.add_argument("-addr", required=True)
    parser.add_argument("-service", default="")
    parser.add_argument("-connect-timeout", default="1s")
    args = parser.parse_args()
    seconds = float(args.connect_timeout.rstrip("s"))
    channel = grpc.insecure_channel(args.addr)
    try:
        grpc.channel_ready_future(channel).result(timeout=seconds)
    except grpc.FutureTimeoutError:
        print(f'timeout: failed to connect service "{args.addr}" within {args.connect_timeout}')
        return 2
    service = args.service.encode()
    request = (b"\x0a" + bytes([len(service)]) + service) if service else b""
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    try:
        answer = check(request, timeout=1)
    except grpc.RpcError as exc:
        print(f"error: health rpc failed: {exc.code()}: {exc.details()}")
        return 3
    status = answer[1] if len(answer) >= 2 and answer[0] == 0x08 else 0
    print(f"status: {STATUS.get(status, status)}")
    return 0 if status == 1 else 4


if __name__ == "__main__":
    sys.exit(main())
