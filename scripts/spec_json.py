"""Regenerate src/effecthost/conformance/spec.json from docs/spec.md."""

from __future__ import annotations

from pathlib import Path

from effecthost.conformance._spec import DATA_FILE, parse_spec, to_json

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    rules = parse_spec((ROOT / "docs" / "spec.md").read_text("utf-8"))
    target = ROOT / "src" / "effecthost" / "conformance" / DATA_FILE
    target.write_text(to_json(rules) + "\n", "utf-8")
    print(f"{len(rules)} rules written to {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
