"""The specification ships with the package: docs/spec.md and the shipped data agree, and
every id the suite cites is a rule of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from effecthost.conformance import OBLIGATIONS, UnknownRule, all_checks, explain, spec_rules
from effecthost.conformance._spec import first_sentence, normalize_id, parse_spec, to_json

ROOT = Path(__file__).parents[1]
SPEC_MD = ROOT / "docs" / "spec.md"
REGENERATE = "python scripts/spec_json.py"


def test_the_shipped_rules_are_docs_spec_md() -> None:
    """Every id of docs/spec.md is shipped with the same title, rule, why and edges, and
    nothing else is shipped."""
    written = parse_spec(SPEC_MD.read_text("utf-8"))
    shipped = spec_rules()
    assert list(written) == list(shipped), f"regenerate with: {REGENERATE}"
    for ident, rule in written.items():
        assert shipped[ident] == rule, f"{ident} differs; regenerate with: {REGENERATE}"


def test_the_spec_has_every_obligation_and_ruling_once() -> None:
    """G-01…G-53 and R-1…R-13, each with a rule and a why; every id it refers to exists."""
    rules = spec_rules()
    expected = [f"G-{n:02d}" for n in range(1, 54)] + [f"R-{n}" for n in range(1, 14)]
    assert list(rules) == expected
    for rule in rules.values():
        assert rule.rule and rule.why and rule.title, rule.id
        assert set(rule.see) <= set(rules), (rule.id, set(rule.see) - set(rules))
    cited = set(re.findall(r"\b(?:G-\d{2}|R-\d+)\b", SPEC_MD.read_text("utf-8")))
    assert cited <= set(rules), sorted(cited - set(rules))


def test_every_id_a_check_cites_is_in_the_spec() -> None:
    rules = spec_rules()
    for check in all_checks():
        assert check.ids, check.name
        assert set(check.ids) <= set(rules), (check.node_name, set(check.ids) - set(rules))
    assert set(OBLIGATIONS) <= set(rules)


def test_the_parser_keeps_the_text_and_refuses_gaps() -> None:
    text = (
        "## 1. Things\n\n### G-01 · A title\n\n**Rule.** One\ntwo.\n\n**Why.** Because.\n\n"
        "**Edges.**\n- a\n  b\n\n**See.** R-1, G-02.\n\n## 2. Other\n\nprose\n"
    )
    rule = parse_spec(text)["G-01"]
    assert (rule.title, rule.section, rule.rule, rule.why) == (
        "A title",
        "Things",
        "One\ntwo.",
        "Because.",
    )
    assert rule.edges == "- a\n  b" and rule.see == ("R-1", "G-02")
    assert '"rule": "One\\ntwo."' in to_json({"G-01": rule})
    with pytest.raises(ValueError, match="G-01 needs"):
        parse_spec("### G-01 · t\n\n**Rule.** r\n")
    with pytest.raises(ValueError, match="twice"):
        parse_spec("### G-01 · t\n**Rule.** r\n**Why.** w\n### G-01 · t\n**Rule.** r\n**Why.** w\n")


def test_explain_prints_the_whole_rule_and_the_checks_citing_it() -> None:
    text = explain("G-20")
    flat = " ".join(text.split())
    rule = spec_rules()["G-20"]
    for part in (rule.rule, rule.why, rule.edges):
        assert " ".join(part.split()) in flat
    covering = [c for c in all_checks() if "G-20" in c.ids]
    assert covering
    for check in covering:
        assert check.node_name in text
        assert " ".join(first_sentence(check.doc).split()) in flat
    assert all(len(line) <= 88 for line in text.splitlines() if " " in line.strip())


def test_explain_accepts_rulings_and_loose_spellings() -> None:
    assert explain("R-4").startswith("R-4 · Closed means closed")
    assert explain("g-5").startswith("G-05 ·")
    assert normalize_id("r-04") == "R-4"
    assert "No conformance check cites G-31" in explain("G-31")


def test_explain_refuses_an_unknown_id() -> None:
    with pytest.raises(UnknownRule, match="G-99"):
        explain("G-99")


def test_first_sentence() -> None:
    assert first_sentence("One thing.  Two\n things.") == "One thing."
    assert first_sentence("No stop at all") == "No stop at all"
    assert first_sentence("Ranks 1…n, each ``consumed + 1``.\nMore.") == (
        "Ranks 1…n, each ``consumed + 1``."
    )


def test_explain_lists_the_checks_whose_sentence_names_a_ruling() -> None:
    """R-9: a ruling is tested by checks registered under obligations; ``--explain`` finds
    them by the sentence they state."""
    text = explain("R-9")
    assert "an_outer_cancellation_closes_the_group" in text
    assert "No conformance check cites R-9" not in text


def test_explain_lists_the_retirement_checks_under_r11() -> None:
    """R-11: each of its two checks cites it, so ``--explain R-11`` lists both."""
    text = explain("R-11")
    assert "a_closed_groups_replay_keys_stay_claimed_until_it_retires" in text
    assert "an_event_reaches_a_closed_group_until_it_retires" in text


def test_every_check_states_the_rule_it_tests() -> None:
    """Each check's docstring states, in at least one full sentence, the rule it tests;
    every ruling it names is one of the specification's."""
    rules = spec_rules()
    for check in all_checks():
        sentence = first_sentence(check.doc)
        assert len(sentence.split()) >= 6 and sentence.endswith("."), check.node_name
        named = set(re.findall(r"\bR-\d+\b", check.doc))
        assert named <= set(rules), (check.node_name, named - set(rules))
