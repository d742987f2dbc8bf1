"""Stand-in for `triton_shm_monitor`, a pybind module built in Triton's test container from
python_backend's sources. Triton's qa/common/shm_util.py opens one monitor per
/dev/shm/triton_python_backend_shm_region_* file (the shared-memory pool of Triton's Python
backend) to catch leaks in that pool. nursery has no such pool, so under nursery the probe finds
no region and this class is never built; if a region of that name does exist (a Triton run on the
same machine), the probe fails loudly rather than reading a number nursery cannot give."""


class SharedMemoryManager:
    def __init__(self, name: str) -> None:
        raise RuntimeError(f"nursery-qa: cannot monitor {name}: Triton's Python-backend "
                           "shared-memory pool does not exist under nursery")
