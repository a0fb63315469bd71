#!/usr/bin/env python3
"""Lint and render a Helm chart with the real Helm engine, with no helm binary.

Uses the helm-python-sdk package from PyPI (import name ``helm_python``), which binds Helm's Go
SDK through its bundled C library. .ci/run installs it in a venv; tests/it/chart.rs runs this
script with that venv's python (AMBIENTD_HELM_PYTHON).

    helm_render.py CHART [-f VALUES]... [--set K=V]... [--name N] [--namespace NS] [--notes]

Prints the rendered manifests as multi-document YAML, each document after a
``# Source: <template>`` line as ``helm template`` prints them, sorted by template path
(``--notes``: NOTES.txt instead). Exits 1 with the engine's message when the chart fails to
lint (errors, or warnings: lint is strict), to validate against its schema, or to render;
2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merges ``override`` into ``base`` as Helm merges -f files (maps merge, rest replace)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", help="chart directory or .tgz")
    parser.add_argument("-f", "--values", action="append", default=[], help="values file (YAML or JSON)")
    parser.add_argument("--set", action="append", default=[], help="a --set expression")
    parser.add_argument("--name", default="ambientd", help="release name")
    parser.add_argument("--namespace", default="istio-system", help="release namespace")
    parser.add_argument("--notes", action="store_true", help="print NOTES.txt instead of the manifests")
    args = parser.parse_args()

    try:
        import helm_python as helm
    except ImportError as error:
        print(f"helm-python-sdk is not installed (pip install helm-python-sdk): {error}", file=sys.stderr)
        return 3

    try:
        values: dict[str, Any] = {}
        for path in args.values:
            with open(path, encoding="utf-8") as file:
                values = merge(values, helm.values_from_yaml(file.read()))
        for expression in args.set:
            values = merge(values, helm.parse_set_string(expression))

        report = helm.lint(args.chart, values, strict=True, namespace=args.namespace)
        # Severity: 1 info, 2 warning, 3 error. Strict: warnings fail too.
        labels = {2: "W", 3: "E"}
        problems = [
            f"[{labels.get(m.get('severity'), m.get('severity'))}] {m.get('path', '')}: {m.get('error', '')}"
            for m in report.get("messages", [])
            if m.get("severity", 0) >= 2
        ] + [str(e) for e in report.get("errors") or []]
        if problems:
            unique = list(dict.fromkeys(p.strip() for p in problems))
            print("helm lint failed:\n" + "\n".join(unique), file=sys.stderr)
            return 1

        with helm.Chart.load(args.chart) as chart:
            chart.validate_schema(values)
            rendered = chart.render(values, name=args.name, namespace=args.namespace, is_install=True)
    except helm.HelmError as error:
        print(f"helm: {type(error).__name__}: {error}", file=sys.stderr)
        return 1

    if args.notes:
        notes = [text for path, text in rendered.items() if path.endswith("NOTES.txt")]
        sys.stdout.write("".join(notes))
        return 0
    for path in sorted(rendered):
        text = rendered[path]
        if path.endswith("NOTES.txt") or not text.strip():
            continue
        for document in text.split("\n---"):
            if document.strip():
                sys.stdout.write(f"---\n# Source: {path}\n{document.strip(chr(10))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
