"""The specification's rules as data, so the CLI can print them (``--explain``).

``docs/spec.md`` is the source. ``spec.json`` beside this module is generated from it
with ``python scripts/spec_json.py`` and shipped in the package (the docs are not); a test
keeps the two equal.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources

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


class UnknownRule(LookupError):
    """An id that names no obligation or ruling of the specification."""


def normalize_id(ident: str) -> str:
    """``g-5`` → ``G-05``, ``r-04`` → ``R-4``; anything else upper-cased as given."""
    match = re.fullmatch(r"([GgRr])-0*(\d+)", ident.strip())
    if match is None:
        return ident.strip().upper()
    letter, number = match.group(1).upper(), int(match.group(2))
    return f"G-{number:02d}" if letter == "G" else f"R-{number}"


def explain(ident: str) -> str:
    """The full text of obligation or ruling ``ident`` and the checks that cite it.

    Raises:
        UnknownRule: the specification has no such id.
    """
    from ._registry import all_checks

    rules = spec_rules()
    key = normalize_id(ident)
    rule = rules.get(key)
    if rule is None:
        ids = [r.id for r in rules.values()]
        obligations = [i for i in ids if i.startswith("G-")]
        rulings = [i for i in ids if i.startswith("R-")]
        raise UnknownRule(
            f"unknown rule id {ident!r}: the specification has {obligations[0]}…"
            f"{obligations[-1]} and {rulings[0]}…{rulings[-1]}"
        )
    lines = [f"{rule.id} · {rule.title}", f"docs/spec.md, section {rule.section!r}", ""]
    for label, text in (("Rule", rule.rule), ("Why", rule.why), ("Edges", rule.edges)):
        if text:
            lines += [label, *_reflow(text, "  "), ""]
    if rule.see:
        named = ", ".join(f"{i} ({rules[i].title})" if i in rules else i for i in rule.see)
        lines += [*_reflow(f"See: {named}", ""), ""]
    covering = [c for c in all_checks() if cites(c.ids, c.doc, rule.id)]
    if covering:
        lines.append(f"Checks citing {rule.id} ({len(covering)}):")
        for found in covering:
            needs = f"  (needs {', '.join(found.requires)})" if found.requires else ""
            lines += [f"  {found.node_name}{needs}", *_reflow(first_sentence(found.doc), "    ")]
    elif rule.is_ruling:
        lines.append(f"No conformance check cites {rule.id} directly.")
    else:
        lines += _reflow(
            f"No conformance check cites {rule.id}: it binds the implementation of the "
            f"tiers of section {rule.section!r}.",
            "",
        )
    return "\n".join(lines)


def cites(ids: tuple[str, ...], doc: str, ident: str) -> bool:
    """Whether a check with obligation ``ids`` and docstring ``doc`` tests ``ident``: an
    obligation among its ids, a ruling among its ids or named in its docstring (a check is
    registered under obligations; the ruling it tests is in the sentence it states)."""
    if ident in ids:
        return True
    return ident.startswith("R-") and re.search(rf"\b{re.escape(ident)}\b", doc) is not None


def _reflow(text: str, indent: str, width: int = 88) -> list[str]:
    """``text`` (markdown paragraphs and ``- `` items) wrapped to ``width``, nothing cut."""
    blocks: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            blocks.append("")
        elif stripped.startswith("- ") or not blocks or not blocks[-1]:
            blocks.append(stripped)
        else:
            blocks[-1] = f"{blocks[-1]} {stripped}"
    wrapped: list[str] = []
    for block in blocks:
        if not block:
            wrapped.append("")
            continue
        hang = "  " if block.startswith("- ") else ""
        wrapped += textwrap.wrap(
            block,
            width,
            initial_indent=indent,
            subsequent_indent=indent + hang,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return wrapped
