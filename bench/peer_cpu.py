"""Server CPU per request beside every row of the peer sweep (``bench/peer.sh``).

The shared harness (``../shared/bench/run_anchors.sh``) reports throughput and latency only.
``bench/peer.sh`` runs this module's sampler beside it: every second it finds the
process listening on each server's HTTP port (Triton 8100, nursery 8110), adds up user + system
CPU of every process in that server's session (Python-backend stubs included, Triton's and
nursery's alike: the harness starts each server in a session of its own) and reads the
server's own request count (``/v2/models/stats``, successes). Afterwards ``attach`` matches
each perf_analyzer run (its raw log: the start time is in its name, the end is the log's
modification time) to the samples taken during it and writes ``cpu.md`` beside the summary:
per row, infer/s and CPU µs per request, and for nursery the ratios against Triton.

    python bench/peer_cpu.py sample OUT/cpu.jsonl      # until killed
    python bench/peer_cpu.py attach OUT                 # OUT = the results folder
"""
from __future__ import annotations

import csv
import datetime as dt
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

PORTS = {8100: "triton", 8110: "nursery"}
TICK = os.sysconf("SC_CLK_TCK")


def _listening_inodes() -> dict[int, str]:
    """inode -> server name for the sockets listening on the ports of interest."""
    found: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            port = int(parts[1].rsplit(":", 1)[1], 16)
            if parts[3] == "0A" and port in PORTS:  # 0A: LISTEN
                found[int(parts[9])] = PORTS[port]
    return found


def _stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _owners(inodes: dict[int, str]) -> dict[str, int]:
    """server name -> session id of the process holding its listening socket."""
    owners: dict[str, int] = {}
    wanted = {f"socket:[{inode}]": name for inode, name in inodes.items()}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                name = wanted.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if name is not None:
                stat = _stat(pid)
                if stat is not None:
                    owners[name] = int(stat[3])  # the session id
    return owners


def _session_cpu(session: int) -> float:
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        stat = _stat(pid)
        if stat is not None and int(stat[3]) == session:
            total += int(stat[11]) + int(stat[12])
    return total / TICK


def _successes(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/stats", timeout=1) as r:
            stats = json.loads(r.read())
    except (OSError, ValueError):
        return None
    return sum(int(m.get("inference_stats", {}).get("success", {}).get("count", 0))
               for m in stats.get("model_stats", []))


def sample(path: Path) -> None:
    owners: dict[str, int] = {}
    with path.open("a") as out:
        while True:
            if set(owners) != set(PORTS.values()):
                owners = _owners(_listening_inodes())
            for name, session in list(owners.items()):
                port = next(p for p, n in PORTS.items() if n == name)
                count = _successes(port)
                if count is None:  # gone: look again next time
                    owners.pop(name)
                    continue
                out.write(json.dumps({"t": time.time(), "server": name,
                                      "cpu": _session_cpu(session), "ok": count}) + "\n")
            out.flush()
            time.sleep(1.0)


def _middle(values: list[float]) -> float | None:
    """The median run (the upper one of an even count), or None without runs."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def attach(folder: Path) -> str:
    samples = [json.loads(line) for line in (folder / "cpu.jsonl").read_text().splitlines()
               if line.strip()]
    rows = {}
    with (folder / "results.csv").open() as f:
        for r in csv.DictReader(f):
            rows.setdefault((r["server"], r["batching"], r["protocol"], r["model"],
                             r["concurrency"]), []).append(r)
    cpu: dict[tuple[str, ...], list[float]] = {}
    for log in sorted((folder / "raw").glob("*.log")):
        # server_batching_protocol_<model>_c<N>_HHMMSS: the model's name may hold "_"
        server, batching, proto, rest = log.stem.split("_", 3)
        model, conc, hms = rest.rsplit("_", 2)
        end = dt.datetime.fromtimestamp(log.stat().st_mtime)
        start = end.replace(hour=int(hms[:2]), minute=int(hms[2:4]), second=int(hms[4:6]))
        if start > end:
            start -= dt.timedelta(days=1)
        during = [s for s in samples if s["server"] == server
                  and start.timestamp() <= s["t"] <= end.timestamp()]
        if len(during) < 2 or during[-1]["ok"] <= during[0]["ok"]:
            continue
        per = (during[-1]["cpu"] - during[0]["cpu"]) / (during[-1]["ok"] - during[0]["ok"])
        cpu.setdefault((server, batching, proto, model, conc[1:]), []).append(per * 1e6)
    lines = ["| protocol | model | c | batching | nursery infer/s | Triton infer/s | ratio | "
             "nursery CPU µs/req | Triton CPU µs/req | CPU ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def rate(key: tuple[str, ...]) -> float | None:
        return _middle([float(r["infer_per_s"]) for r in rows.get(key, []) if r["infer_per_s"]])

    def used(key: tuple[str, ...]) -> float | None:
        return _middle(cpu.get(key, []))

    def show(x: float | None, fmt: str) -> str:
        return format(x, fmt) if x is not None else "-"

    for key in sorted(k for k in rows if k[0] == "nursery"):
        _, batching, proto, model, conc = key
        peer = ("triton", *key[1:])
        n, t, nc, tc = rate(key), rate(peer), used(key), used(peer)
        lines.append(f"| {proto} | {model} | {conc} | {batching} | {show(n, '.0f')} | "
                     f"{show(t, '.0f')} | {show(n / t if n and t else None, '.2f')} | "
                     f"{show(nc, '.0f')} | {show(tc, '.0f')} | "
                     f"{show(nc / tc if nc and tc else None, '.2f')} |")
    text = "\n".join(lines) + "\n"
    (folder / "cpu.md").write_text(text)
    return text


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("sample", "attach"):
        sys.exit(__doc__)
    if sys.argv[1] == "sample":
        sample(Path(sys.argv[2]))
    else:
        print(attach(Path(sys.argv[2])), end="")
