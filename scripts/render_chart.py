"""Render deploy/helm/nursery into deploy/rendered/ (default values, and the S3 example), or
with --check say whether the committed renders are what the chart renders now.

The rendering is Helm's own: Helm's Go SDK (v4) through `helm-python-sdk` (libhelm_c, a C ABI
over the SDK, installed from PyPI by the `deploy` extra), since the `helm` binary itself is not
on PyPI. As `helm template` does, the values are first checked against the chart's
values.schema.json, and the manifests are written in Helm's install order, each after a
`# Source:` line.

    python scripts/render_chart.py           # rewrite deploy/rendered/*.yaml
    python scripts/render_chart.py --check   # exit 1 if they differ
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "nursery"
RENDERED = ROOT / "deploy" / "rendered"
RELEASE, NAMESPACE = "nursery", "default"
# name -> values file (None: the chart's defaults)
RENDERS: dict[str, Path | None] = {
    "default.yaml": None,
    "s3.yaml": ROOT / "deploy" / "helm" / "examples" / "s3-values.yaml",
}
# Helm's install order (pkg/release/util/kind_sorter.go), for the kinds the chart has;
# other kinds (the ServiceMonitor) come last, as in `helm template`
INSTALL_ORDER = ["Namespace", "ServiceAccount", "Secret", "ConfigMap", "Service",
                 "Deployment", "HorizontalPodAutoscaler"]


def render(values_file: Path | None) -> str:
    from helm_python.chart import Chart  # the deploy extra

    chart = Chart.load(CHART)
    values = yaml.safe_load(values_file.read_text()) if values_file else None
    chart.validate_schema(values)
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for source, text in manifests.items():
        if source.endswith("NOTES.txt") or not text.strip():
            continue
        kind = (yaml.safe_load(text) or {}).get("kind", "")
        rank = INSTALL_ORDER.index(kind) if kind in INSTALL_ORDER else len(INSTALL_ORDER)
        docs.append((rank, source, text.strip()))
    return "".join(f"---\n# Source: {source}\n{text}\n" for _, source, text in sorted(docs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, values in RENDERS.items():
        text = render(values)
        path = RENDERED / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale renders: {', '.join(stale)} (run python scripts/render_chart.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
