"""Machine-readable reports of a run, for a third party's CI: JUnit XML and JSON."""

from __future__ import annotations

import json
import socket
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

if TYPE_CHECKING:
    from ._runner import SuiteReport

JSON_FORMAT = "effecthost-conformance/1"


def junit_xml(report: SuiteReport) -> str:
    """One ``testcase`` per check run: ``classname`` its obligation ids (``G-13,G-26``),
    ``name`` the check; a skip carries its reason, a failure its whole failure text."""
    results = report.results
    counts = report.counts()
    seconds = f"{sum(r.seconds for r in results):.3f}"
    root = ElementTree.Element(
        "testsuites",
        name="effecthost conformance",
        tests=str(counts["checks"]),
        failures=str(counts["failed"]),
        errors="0",
        skipped=str(counts["skipped"]),
        time=seconds,
    )
    suite = ElementTree.SubElement(
        root,
        "testsuite",
        name=f"effecthost conformance: {report.factory}",
        tests=str(counts["checks"]),
        failures=str(counts["failed"]),
        errors="0",
        skipped=str(counts["skipped"]),
        time=seconds,
        timestamp=report.started_at,
        hostname=socket.gethostname(),
    )
    properties = ElementTree.SubElement(suite, "properties")
    declared = report.capabilities.declared() if report.capabilities else []
    for name, value in (("factory", report.factory), ("capabilities", ",".join(declared))):
        ElementTree.SubElement(properties, "property", name=name, value=value)
    for result in results:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=",".join(result.check.ids),
            name=result.check.name,
            time=f"{result.seconds:.3f}",
        )
        if result.status == "skipped":
            ElementTree.SubElement(case, "skipped", message=result.reason)
        elif result.status == "failed":
            failure = ElementTree.SubElement(
                case, "failure", message=result.reason.splitlines()[0] if result.reason else ""
            )
            failure.text = result.failure_text()
    ElementTree.indent(root)
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def json_report(report: SuiteReport) -> dict[str, Any]:
    """The run as plain data: the factory, its capability declaration, a summary and each
    check with its ids, status, duration, reason and (when failed) the failure text and
    the last lab events."""
    capabilities = report.capabilities
    return {
        "format": JSON_FORMAT,
        "factory": report.factory,
        "started_at": report.started_at,
        "ok": report.ok,
        "capabilities": (
            {f.name: bool(getattr(capabilities, f.name)) for f in fields(capabilities)}
            if capabilities is not None
            else None
        ),
        "timeout": report.timeout,
        "summary": report.counts(),
        "checks": [
            {
                "name": r.check.name,
                "node": r.check.node_name,
                "ids": list(r.check.ids),
                "requires": list(r.check.requires),
                "status": r.status,
                "seconds": round(r.seconds, 6),
                "reason": r.reason,
                "missing": list(r.missing),
                "failure": r.failure_text() if r.status == "failed" else None,
                "events": [
                    {"at": round(e.at, 6), "kind": e.kind, "tag": e.tag, "data": e.data}
                    for e in r.events
                ],
            }
            for r in report.results
        ],
    }


def write_junit(report: SuiteReport, path: str | Path) -> None:
    Path(path).write_text(junit_xml(report), encoding="utf-8")


def write_json(report: SuiteReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(json_report(report), indent=2) + "\n", encoding="utf-8")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
