"""The long fuzzing campaign: every decoder the test suite fuzzes, for a million inputs each.

Each ``tests/property/test_fuzz_*.py`` module defines ``TARGETS: dict[str, Callable[[bytes],
None]]`` (a target returns normally or raises only its decoder's documented errors; any other
exception, or a hang, is a bug) and may define ``SEEDS: dict[str, list[bytes]]`` of valid
inputs. This runner imports them all (a module that is absent or fails to import is reported,
not fatal), runs a mutation fuzzer on every target, each target in its own child process (a
crash of the interpreter -- a signal, the memory limit -- costs that target's run, not the
campaign), and writes a markdown report with inputs/s and every crash and hang, each input
saved under ``bench/results/fuzz-<date>/`` (the report is its ``summary.md``).

    python -m bench.fuzz                        # 1,000,000 inputs per target
    python -m bench.fuzz --inputs 20000 --targets json_infer,grpc_infer
    python -m bench.fuzz --engine atheris       # coverage-guided, where atheris is installed
    python -m bench.fuzz --replay FILE --target tensors:json_infer   # rerun one saved input

Engines. ``mutate`` (the default, no dependency): a corpus seeded from ``SEEDS`` and grown by
every input that ran a function no input had run before (``sys.setprofile`` call events:
function-level coverage, about halving the rate) or raised a crash signature not seen before,
mutated by bit flips, byte inserts and deletes, runs of a
byte, "interesting" integers (as decimal text and as protobuf varints) and splicing of two
corpus entries. ``atheris`` (libFuzzer, coverage-guided; ``pip install atheris``): the
nursery package is instrumented, libFuzzer runs ``--inputs`` inputs and stops at its first
crash.

Watchdogs. A per-input alarm (``signal.setitimer``) turns an input that runs past
``--hang-seconds`` into a recorded hang; the parent kills a child whose heartbeat stops for
``--kill-seconds`` (a hang inside C code, where the alarm cannot interrupt) and saves the
input it was running, which the child keeps in a small shared file. ``RLIMIT_AS`` caps each
child's memory (``--memory-mb``), so an allocation on a client's word surfaces as a
MemoryError (a recorded crash) instead of swapping the machine.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import json
import mmap
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROPERTY = ROOT / "tests" / "property"
MAX_INPUT = 1 << 16  # inputs are cut to this size (the shared "current input" file holds it)
INTERESTING = [0, 1, 7, 8, 127, 128, 255, 256, 4095, 4096, 65535, 65536, 2**31 - 1, 2**31,
               2**32 - 1, 2**32, 2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1, -2**31,
               -2**63]


# -- discovery ------------------------------------------------------------------------------


def discover(modules: list[str] | None = None) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """``{"<area>:<target>": (module, target)}`` for every fuzz module (or the ``modules``
    named), and notes on modules that could not be imported."""
    found: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    names = modules or [f"tests.property.{p.stem}" for p in sorted(PROPERTY.glob("test_fuzz_*.py"))]
    for module in names:
        area = module.rsplit(".", 1)[-1].removeprefix("test_fuzz_")
        try:
            targets = importlib.import_module(module).TARGETS
        except Exception as exc:  # a sibling's module may be half-written: report, go on
            notes.append(f"`{module}` not fuzzed: {type(exc).__name__}: {exc}")
            continue
        for name in targets:
            found[f"{area}:{name}"] = (module, name)
    return found, notes


def load_target(module: str, name: str) -> tuple[Callable[[bytes], None], list[bytes]]:
    mod = importlib.import_module(module)
    seeds = list(getattr(mod, "SEEDS", {}).get(name, [])) or [b""]
    return mod.TARGETS[name], seeds


# -- the mutator ----------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class Mutator:
    """A few random edits of a corpus entry, libFuzzer's kinds of edit, in pure Python."""

    def __init__(self, rng: random.Random, corpus: list[bytes]) -> None:
        self.rng = rng
        self.corpus = corpus

    def __call__(self) -> bytes:
        rng = self.rng
        data = bytearray(rng.choice(self.corpus))
        for _ in range(1 + int(rng.expovariate(0.7))):
            self._edit(data)
        return bytes(data[:MAX_INPUT])

    def _edit(self, data: bytearray) -> None:
        rng = self.rng
        kind = rng.randrange(9)
        n = len(data)
        at = rng.randrange(n + 1)
        if kind == 0 and n:  # flip a bit
            data[at % n] ^= 1 << rng.randrange(8)
        elif kind == 1 and n:  # set a byte
            data[at % n] = rng.randrange(256)
        elif kind == 2:  # insert bytes
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 1, 2, 4))))
        elif kind == 3 and n:  # delete a run
            del data[at : at + rng.choice((1, 1, 2, 4, 16))]
        elif kind == 4:  # an interesting integer as decimal text, replacing a digit run
            text = str(rng.choice(INTERESTING)).encode()
            end = at
            while end < n and (48 <= data[end] <= 57 or data[end] == 45):
                end += 1
            data[at:end] = text
        elif kind == 5:  # an interesting integer as a varint or a fixed-width integer
            value = rng.choice(INTERESTING)
            if rng.random() < 0.6:
                packed = _varint(value)
            else:
                packed = (value & ((1 << 64) - 1)).to_bytes(8, "little")[: rng.choice((4, 8))]
            data[at : at + (len(packed) if rng.random() < 0.5 else 0)] = packed
        elif kind == 6 and n:  # duplicate a chunk (repetition: nesting, long headers)
            start = rng.randrange(n)
            chunk = data[start : start + rng.randrange(1, 64)]
            data[at:at] = chunk * rng.choice((1, 2, 8, 64))
        elif kind == 7:  # splice with another corpus entry
            other = rng.choice(self.corpus)
            cut = rng.randrange(len(other) + 1)
            data[at:] = other[cut:]
        elif kind == 8 and n:  # a run of one byte
            byte = rng.choice((0, 0xFF, 0x7F, 0x80, 0x20, 0x5B, 0x7B, 0x22))
            data[at : at + rng.randrange(1, 8)] = bytes([byte]) * rng.randrange(1, 32)


# -- the child: one target ------------------------------------------------------------------


class Hang(BaseException):
    """Raised by the per-input alarm (a BaseException: a target's ``except Exception`` must
    not swallow it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang


def _signature(exc: BaseException) -> str:
    """Where an exception came from: its type and the innermost frame in the project."""
    tb = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in tb if str(ROOT) in f.filename] or list(tb)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def _save(out_dir: Path, label: str, kind: str, data: bytes, text: str) -> str:
    digest = hashlib.sha1(data).hexdigest()[:12]
    stem = f"{kind}-{label.replace(':', '-')}-{digest}"
    (out_dir / f"{stem}.bin").write_bytes(data)
    (out_dir / f"{stem}.txt").write_text(text)
    return f"{stem}.bin"


def _record(table: dict[str, dict[str, Any]], sig: str, message: str, data: bytes, out_dir: Path,
            label: str, kind: str, text: str) -> None:
    """One entry per signature: how often it was seen and its smallest input, saved."""
    entry = table.get(sig)
    if entry is None:
        table[sig] = {"signature": sig, "message": message, "count": 1,
                      "file": _save(out_dir, label, kind, data, text), "size": len(data)}
        return
    entry["count"] += 1
    if len(data) < entry["size"]:  # keep the smallest reproducer
        entry["file"] = _save(out_dir, label, kind, data, text)
        entry["size"] = len(data)


def run_child(args: argparse.Namespace) -> None:
    module, name = args.child.split(":", 1)
    label = f"{module.rsplit('.', 1)[-1].removeprefix('test_fuzz_')}:{name}"
    out_dir = Path(args.out)
    if args.memory_mb:
        limit = args.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if args.engine == "atheris":
        _run_atheris(args, module, name, label, out_dir)
        return
    target, seeds = load_target(module, name)
    # the input being run, for the parent to save if this process hangs in C code
    current = open(out_dir / f".current-{os.getpid()}", "w+b")  # noqa: SIM115 - kept open
    current.truncate(MAX_INPUT + 4)
    shared = mmap.mmap(current.fileno(), MAX_INPUT + 4)
    heartbeat = out_dir / f".heartbeat-{os.getpid()}"
    signal.signal(signal.SIGALRM, _on_alarm)
    rng = random.Random(args.seed)
    corpus = list(seeds)
    mutate = Mutator(rng, corpus)
    seen: set[str] = set()
    covered: set[Any] = set()  # code objects (functions) any input has run
    hits: set[Any] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            hits.add(frame.f_code)

    crashes: dict[str, dict[str, Any]] = {}
    hangs: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    last_beat = start
    done = 0
    for i in range(args.inputs):
        data = seeds[i] if i < len(seeds) else mutate()
        shared[:4] = struct.pack("<I", len(data))
        shared[4 : 4 + len(data)] = data
        signal.setitimer(signal.ITIMER_REAL, args.hang_seconds)
        behaviour = "ok"
        hits.clear()
        if args.feedback:
            sys.setprofile(profile)
        try:
            target(data)
        except Hang as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sig = f"hang in {_signature(exc).split(' at ', 1)[1]}"  # where the alarm found it
            text = (f"input ran past {args.hang_seconds} s (per-input alarm)\n\n"
                    + "".join(traceback.format_exception(exc)))
            _record(hangs, sig, f"ran past {args.hang_seconds} s", data, out_dir, label, "hang", text)
            behaviour = "hang"
        except Exception as exc:  # a bug: the target allows only documented errors
            signal.setitimer(signal.ITIMER_REAL, 0)
            sig = _signature(exc)
            _record(crashes, sig, str(exc)[:300], data, out_dir, label, "crash",
                    "".join(traceback.format_exception(exc)))
            behaviour = sig
        finally:
            sys.setprofile(None)
            signal.setitimer(signal.ITIMER_REAL, 0)
        done = i + 1
        new_code = not hits <= covered
        if new_code:
            covered |= hits
        if behaviour not in seen or new_code:  # a new behaviour: worth mutating further
            seen.add(behaviour)
            corpus.append(data)
        elif behaviour == "ok" and len(corpus) < args.corpus_max and rng.random() < 0.02:
            corpus.append(data)  # accepted inputs reach deeper than refused ones
        now = time.perf_counter()
        if now - last_beat > 1.0:
            heartbeat.write_text(str(done))
            last_beat = now
        if args.max_seconds and now - start > args.max_seconds:
            break
    elapsed = time.perf_counter() - start
    result = {"target": label, "engine": "mutate", "inputs": done, "seconds": elapsed,
              "crashes": list(crashes.values()), "hangs": list(hangs.values()), "corpus": len(corpus),
              "behaviours": len(covered)}
    (out_dir / f".result-{label.replace(':', '-')}.json").write_text(json.dumps(result))
    shared.close()
    current.close()
    os.unlink(out_dir / f".current-{os.getpid()}")
    heartbeat.unlink(missing_ok=True)


def _run_atheris(args: argparse.Namespace, module: str, name: str, label: str,
                 out_dir: Path) -> None:
    import atheris  # optional: pip install atheris

    with atheris.instrument_imports(include=["nursery"]):
        target, seeds = load_target(module, name)
    corpus_dir = out_dir / f"corpus-{label.replace(':', '-')}"
    corpus_dir.mkdir(exist_ok=True)
    for i, seed in enumerate(seeds):
        (corpus_dir / f"seed-{i}").write_bytes(seed)
    prefix = out_dir / f"crash-{label.replace(':', '-')}-"

    def one(data: bytes) -> None:
        target(data)

    argv = [sys.argv[0], f"-runs={args.inputs}", f"-timeout={max(1, int(args.hang_seconds))}",
            f"-rss_limit_mb={args.memory_mb or 2048}", f"-max_len={MAX_INPUT}",
            f"-artifact_prefix={prefix}", f"-seed={args.seed}", "-print_final_stats=1",
            str(corpus_dir)]
    atheris.Setup(argv, one)
    atheris.Fuzz()


# -- the parent: every target, the report ---------------------------------------------------


def _remove_leftovers(pid: int) -> None:
    """What a child named ``nursery_fuzz_<pid>_...`` in /dev/shm or the temp folder (the fuzz
    modules' convention) and could not remove itself: killed, or ended by libFuzzer, it ran
    no atexit handler."""
    import shutil
    import tempfile

    for folder in (Path("/dev/shm"), Path(tempfile.gettempdir())):
        for path in folder.glob(f"nursery_fuzz_{pid}_*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def _run_target(args: argparse.Namespace, label: str, module: str, name: str,
                out_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.fuzz", "--child", f"{module}:{name}", "--out", str(out_dir),
           "--inputs", str(args.inputs), "--seed", str(args.seed), "--engine", args.engine,
           "--hang-seconds", str(args.hang_seconds), "--memory-mb", str(args.memory_mb),
           "--corpus-max", str(args.corpus_max), "--max-seconds", str(args.max_seconds),
           *([] if args.feedback else ["--no-feedback"])]
    start = time.perf_counter()
    started = time.time()
    log_path = out_dir / f"{label.replace(':', '-')}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        killed = ""
        beat = out_dir / f".heartbeat-{proc.pid}"
        while proc.poll() is None:
            time.sleep(0.5)
            try:
                last = beat.stat().st_mtime
            except FileNotFoundError:
                last = started  # the child is still importing, or has not beaten yet
            if args.engine == "mutate" and time.time() - last > args.kill_seconds:
                proc.kill()
                proc.wait()
                killed = f"no heartbeat for {args.kill_seconds} s: killed"
    _remove_leftovers(proc.pid)
    elapsed = time.perf_counter() - start
    result_path = out_dir / f".result-{label.replace(':', '-')}.json"
    if args.engine == "mutate" and result_path.exists():
        result = json.loads(result_path.read_text())
        result_path.unlink()
        return result
    result = {"target": label, "engine": args.engine, "inputs": 0, "seconds": elapsed,
              "crashes": [], "hangs": [], "corpus": 0, "behaviours": 0}
    log_text = log_path.read_text(errors="replace")
    if args.engine == "atheris":
        _read_atheris_log(result, log_text, out_dir, label)
        corpus_dir = out_dir / f"corpus-{label.replace(':', '-')}"
        result["corpus"] = sum(1 for _ in corpus_dir.iterdir()) if corpus_dir.exists() else 0
        return result
    current = out_dir / f".current-{proc.pid}"
    data = b""
    if current.exists():
        raw = current.read_bytes()
        data = raw[4 : 4 + struct.unpack("<I", raw[:4])[0]]
        current.unlink()
    (out_dir / f".heartbeat-{proc.pid}").unlink(missing_ok=True)
    why = killed or f"child exited with status {proc.returncode}"
    text = f"{why}\n\nlast lines of its output:\n{log_text[-3000:]}"
    entry = {"signature": why, "message": log_text.strip().splitlines()[-1][:300] if log_text.strip()
             else "", "count": 1, "file": _save(out_dir, label, "hang" if killed else "crash", data,
                                                text), "size": len(data)}
    (result["hangs"] if killed else result["crashes"]).append(entry)
    return result


def _read_atheris_log(result: dict[str, Any], log: str, out_dir: Path, label: str) -> None:
    for line in log.splitlines():
        if line.startswith("Done ") and " runs in " in line:  # "Done 20000 runs in 3 second(s)"
            result["inputs"] = int(line.split()[1])
        if "stat::number_of_executed_units:" in line:
            result["inputs"] = int(line.split(":")[-1])
        parts = line.split()
        if "cov:" in parts:
            result["behaviours"] = int(parts[parts.index("cov:") + 1])
    for path in out_dir.glob(f"crash-{label.replace(':', '-')}-*"):
        if path.suffix not in (".txt", ".bin"):
            kind = "hang" if "timeout" in log[-4000:] else "crash"
            tail = log[log.find("=== Uncaught Python exception"):][:3000] if \
                "Uncaught Python exception" in log else log[-3000:]
            entry = {"signature": tail.strip().splitlines()[1][:200] if tail.strip().count("\n")
                     else "libFuzzer artifact", "message": "", "count": 1,
                     "file": _save(out_dir, label, kind, path.read_bytes(), tail),
                     "size": path.stat().st_size}
            path.unlink()
            (result["hangs"] if kind == "hang" else result["crashes"]).append(entry)


def write_report(path: Path, args: argparse.Namespace, results: list[dict[str, Any]],
                 notes: list[str], wall: float) -> None:
    lines = [f"# Fuzzing campaign {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC", "",
             f"Engine `{args.engine}`, {args.inputs:,} inputs per target (asked), seed {args.seed}, "
             f"per-input alarm {args.hang_seconds} s, memory limit {args.memory_mb} MB per child, "
             f"{wall:.0f} s in all. Machine: {os.cpu_count()} CPUs, Python "
             f"{sys.version.split()[0]}.", "",
             "| target | inputs | seconds | inputs/s | crashes (unique) | hangs | corpus | functions |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        rate = r["inputs"] / r["seconds"] if r["seconds"] else 0.0
        lines.append(f"| `{r['target']}` | {r['inputs']:,} | {r['seconds']:.1f} | {rate:,.0f} | "
                     f"{len(r['crashes'])} | {len(r['hangs'])} | {r['corpus']} | {r['behaviours']} |")
    lines.append("")
    if args.engine == "atheris":
        lines += ["(`functions` is libFuzzer's final coverage count for this engine.)", ""]
    for note in notes:
        lines.append(f"- {note}")
    found = [(r["target"], kind, e) for r in results for kind in ("crashes", "hangs")
             for e in r[kind]]
    lines += ["", "## Crashes and hangs", ""]
    if not found:
        lines.append("None: every target returned normally or raised only its documented errors.")
    for target, kind, e in found:
        lines += [f"### `{target}`: {e['signature']}", "",
                  f"- kind: {kind[:-1] if kind == 'hangs' else 'crash'}; seen {e['count']} time(s)",
                  f"- message: `{e['message']}`" if e.get("message") else "- message: (none)",
                  f"- smallest input ({e['size']} bytes): `{e['file']}` (traceback beside it, .txt)",
                  f"- replay: `python -m bench.fuzz --replay {path.parent / e['file']} "
                  f"--target {target}`", ""]
    path.write_text("\n".join(lines) + "\n")


def replay(args: argparse.Namespace) -> None:
    found, _ = discover(args.module)
    module, name = found[args.target]
    target, _ = load_target(module, name)
    data = Path(args.replay).read_bytes()
    target(data)  # let any exception show its traceback
    print(f"{args.target}: {len(data)} bytes, returned normally or with a documented error")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="nursery's fuzzing campaign")
    parser.add_argument("--inputs", type=int, default=1_000_000, help="inputs per target")
    parser.add_argument("--targets", default="", help="comma-separated names (area:target or target)")
    parser.add_argument("--engine", choices=("mutate", "atheris"), default="mutate")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang-seconds", type=float, default=2.0, help="per-input alarm")
    parser.add_argument("--kill-seconds", type=float, default=30.0,
                        help="kill a child whose heartbeat stops this long")
    parser.add_argument("--memory-mb", type=int, default=2048, help="RLIMIT_AS per child (0: none)")
    parser.add_argument("--corpus-max", type=int, default=4000)
    parser.add_argument("--no-feedback", dest="feedback", action="store_false",
                        help="blind mutation: no function-level coverage feedback")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop a target after this long (0: run all its inputs)")
    parser.add_argument("--jobs", type=int, default=1, help="targets fuzzed at once")
    parser.add_argument("--out", default="", help="results folder (default bench/results/fuzz-<date>)")
    parser.add_argument("--module", action="append", default=None,
                        help="fuzz this module's TARGETS instead of tests/property/test_fuzz_*.py")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--replay", default="", help="rerun one saved input (with --target)")
    parser.add_argument("--target", default="")
    args = parser.parse_args(argv)
    if args.child:
        run_child(args)
        return
    if args.replay:
        replay(args)
        return
    found, notes = discover(args.module)
    if args.targets:
        wanted = set(args.targets.split(","))
        found = {k: v for k, v in found.items() if k in wanted or k.split(":", 1)[1] in wanted}
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.out) if args.out else ROOT / "bench" / "results" / f"fuzz-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: list[dict[str, Any]] = []
    pending = list(found.items())
    running: list[Any] = []
    if args.jobs <= 1:
        for label, (module, name) in pending:
            print(f"fuzzing {label} ...", flush=True)
            results.append(_run_target(args, label, module, name, out_dir))
            r = results[-1]
            print(f"  {r['inputs']:,} inputs in {r['seconds']:.1f} s, {len(r['crashes'])} crash "
                  f"signature(s), {len(r['hangs'])} hang(s)", flush=True)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(args.jobs) as pool:
            running = [pool.submit(_run_target, args, label, module, name, out_dir)
                       for label, (module, name) in pending]
            results = [f.result() for f in running]
    report = out_dir / "summary.md"
    write_report(report, args, results, notes, time.perf_counter() - start)
    print(f"report: {report}")


if __name__ == "__main__":
    main()
