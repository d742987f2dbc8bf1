"""What reading a shared-memory input costs: the registry's ``fstat`` + ``os.preadv`` copy
against the ``mmap`` view it replaced (zero copy, but a SIGBUS that kills the server when the
client shrinks its region while a request that reads it is queued).

    python -m bench.shm_read [--size 1048576] [--repeat 2000]

Prints microseconds per read (best of five runs of ``--repeat`` reads) for:
  mmap view         a memoryview slice of the mapping + np.frombuffer (what main did)
  mmap view + copy  the same, copied (what a copy through the mapping would cost)
  registry.read     SharedMemoryRegistry.read: lookup, fstat, preadv into a fresh buffer
  preadv only       os.preadv into a fresh numpy buffer, no checks
"""

from __future__ import annotations

import argparse
import mmap
import os
import timeit
import uuid

import numpy as np

from nursery.shm.system import SharedMemoryRegistry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    size = args.size
    key = f"nursery_bench_{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/{key}"
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    registry = SharedMemoryRegistry()
    fd = os.open(path, os.O_RDWR)
    mapping = mmap.mmap(fd, size)
    view = memoryview(mapping)
    try:
        registry.register_system("bench", "/" + key, 0, size)

        def mmap_view() -> None:
            np.frombuffer(view[0:size], dtype=np.float32)

        def mmap_copy() -> None:
            np.frombuffer(view[0:size], dtype=np.float32).copy()

        def registry_read() -> None:
            np.frombuffer(registry.read("bench", 0, size), dtype=np.float32)

        def preadv_only() -> None:
            out = np.empty(size, dtype=np.uint8)
            os.preadv(fd, [out], 0)

        assert bytes(registry.read("bench", 0, size)) == bytes(view)
        print(f"input of {size} bytes, best of 5 x {args.repeat} reads (microseconds per read)")
        for label, fn in (("mmap view", mmap_view), ("mmap view + copy", mmap_copy),
                          ("registry.read", registry_read), ("preadv only", preadv_only)):
            best = min(timeit.repeat(fn, number=args.repeat, repeat=5)) / args.repeat
            print(f"  {label:<18} {best * 1e6:9.1f} us  ({size / best / 1e9:6.2f} GB/s)")
    finally:
        registry.close()
        view.release()
        mapping.close()
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
