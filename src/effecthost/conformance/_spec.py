"""The specification's rules as data, so the CLI can print them (``--explain``).

``docs/spec.md`` is the source. ``spec.json`` beside this module is generated from it
with ``python -m effecthost.conformance._spec docs/spec.md`` and shipped in the package
(the docs are not); a test keeps the two equal.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path

_HEADING = re.compile(r"^### ((?:G|R)-\d+) · (.+)$")
_SECTION = re.compile(r"^## (.+)$")
_FIELD = re.compile(r"^\*\*(Rule|Why|Edges|See)\.\*\*\s*(.*)$")
_ID = re.compile(r"\b(?:G-\d{2}|R-\d+)\b")
DATA_FILE = "spec.json"


@dataclass(frozen=True)
class Rule:
    """One obligation (``G-xx``) or ruling (``R-n``) of the specification."""

    id: str
    title: str
    section: str
    rule: str
    why: str
    edges: str = ""
    see: tuple[str, ...] = ()

    @property
    def is_ruling(self) -> bool:
        return self.id.startswith("R-")


def parse_spec(text: str) -> dict[str, Rule]:
    """Every ``### ID · title`` entry of ``text`` with its fields, in document order.

    Field text is kept as written (markdown, line breaks included) so that what the CLI
    prints is the page's own wording.

    Raises:
        ValueError: an id appears twice, or an entry lacks its rule or why.
    """
    entries: dict[str, dict[str, object]] = {}
    section = ""
    current: dict[str, object] | None = None
    field: str | None = None
    for line in text.splitlines():
        if heading := _HEADING.match(line):
            ident, title = heading.groups()
            if ident in entries:
                raise ValueError(f"{ident} appears twice in the specification")
            current = {"id": ident, "title": title.strip(), "section": section}
            entries[ident] = current
            field = None
        elif line.startswith("#"):
            if top := _SECTION.match(line):
                section = re.sub(r"^\d+\.\s*", "", top.group(1)).strip()
            current, field = None, None
        elif current is not None and (marker := _FIELD.match(line)):
            field = marker.group(1).lower()
            current[field] = marker.group(2)
        elif current is not None and field is not None:
            current[field] = f"{current[field]}\n{line}"
    rules: dict[str, Rule] = {}
    for ident, entry in entries.items():
        fields = {k: str(v).strip() for k, v in entry.items()}
        if not fields.get("rule") or not fields.get("why"):
            raise ValueError(f"{ident} needs a **Rule.** and a **Why.**")
        rules[ident] = Rule(
            id=ident,
            title=fields["title"],
            section=fields["section"],
            rule=fields["rule"],
            why=fields["why"],
            edges=fields.get("edges", ""),
            see=tuple(_ID.findall(fields.get("see", ""))),
        )
    return rules


def to_json(rules: dict[str, Rule]) -> str:
    """The shipped form of ``rules``."""
    return json.dumps([asdict(rule) for rule in rules.values()], indent=1, ensure_ascii=False)


@cache
def spec_rules() -> dict[str, Rule]:
    """The shipped rules by id, in the page's order."""
    text = resources.files("effecthost.conformance").joinpath(DATA_FILE).read_text("utf-8")
    return {
        entry["id"]: Rule(**{**entry, "see": tuple(entry["see"])}) for entry in json.loads(text)
    }


def first_sentence(text: str) -> str:
    """The first sentence of a docstring, on one line."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(?=\s|$)", flat)
    return match.group(1) if match else flat


def main(argv: list[str]) -> int:
    """Regenerate the shipped data from ``docs/spec.md``."""
    if len(argv) != 1:
        print("usage: python -m effecthost.conformance._spec docs/spec.md", file=sys.stderr)
        return 2
    rules = parse_spec(Path(argv[0]).read_text("utf-8"))
    target = Path(__file__).with_name(DATA_FILE)
    target.write_text(to_json(rules) + "\n", "utf-8")
    print(f"{len(rules)} rules written to {target.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
