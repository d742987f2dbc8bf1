"""Re-check L0_model_config's "unexpected model config" failures as a machine without GPUs.

    python scripts/triton_qa/model_config_cpu_compare.py <work>/qa/L0_model_config

Triton's `autofill_noplatform_success` cases compare the configuration a server reports with
expected files written on a GPU machine: their instance group is `KIND_GPU` with `gpus: 0`.
A server on a machine without GPUs (Triton's too) gives `KIND_CPU` instead, so those cases fail
here whatever the server does. For each case the group's `client.log` marks as failed, this
reads the configuration the server reported (the log's "Model config:" block, from
`compare_status.py`) and compares it with each expected file after turning every `KIND_GPU`
group into the group a CPU-only machine gets (`KIND_CPU`, no `gpus`). It prints MATCH when one
then matches, else the lines that still differ. Parsing is nursery's own text-format reader
(`nursery/config/pbtext.py`), so any installed tritonclient will do.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from nursery.config import pbtext
from nursery.schema import inference as pb

FAILED = "*** FAILED: unexpected model config"


def failed_cases(log: str) -> dict[str, str]:
    """Case folder -> the "Model config:" block the server answered, for each failed case."""
    cases: dict[str, str] = {}
    for block in re.split(r"^Test ", log, flags=re.M):
        if not block.startswith("autofill_noplatform_success/") or FAILED not in block:
            continue
        target = block.split("\n", 1)[0].strip()
        found = re.search(r"^Model config:\n(.*?)\n(?:Non-matching:|\*\*\* FAILED)", block,
                          re.S | re.M)
        if found:
            cases[target] = found.group(1)
    return cases


def as_cpu_machine(config: pb.ModelConfig) -> pb.ModelConfig:
    for group in config.instance_group:
        if group.kind == pb.ModelInstanceGroupKind.KIND_GPU:
            group.kind = pb.ModelInstanceGroupKind.KIND_CPU
            group.gpus = []
    return config


def compare(case_dir: Path, answered: str) -> tuple[bool, list[str]]:
    """(matches once GPU groups become CPU ones, the differing lines against the closest file)."""
    got = pbtext.parse(answered, pb.ModelConfigResponse()).config
    closest: list[str] = []
    for expected in sorted(case_dir.glob("expected*")):
        want = as_cpu_machine(pbtext.parse(expected.read_text(), pb.ModelConfig()))
        if want == got:
            return True, []
        diff = _diff(want, got)
        if not closest or len(diff) < len(closest):
            closest = [f"{expected.name}:"] + diff
    return False, closest


def _diff(want: pb.ModelConfig, got: pb.ModelConfig) -> list[str]:
    a, b = want.to_dict(), got.to_dict()
    return [f"  {key}: expected {a.get(key)!r}, served {b.get(key)!r}"
            for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    group = Path(argv[0])
    cases = failed_cases((group / "client.log").read_text(errors="replace"))
    matched = 0
    for target, answered in sorted(cases.items()):
        ok, diff = compare(group / target, answered)
        matched += ok
        print(("MATCH " if ok else "DIFF  ") + target)
        for line in diff:
            print("      " + line)
    print(f"{matched} of {len(cases)} match as a machine without GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
