"""The conformance suite: one set of checks for every tier and any third-party host.

A factory ``(FactoryEnv) -> HostUnderTest`` declares :class:`HostCapabilities`; checks
needing an undeclared capability are printed skips. Run it with
``effecthost conformance MODULE:FACTORY`` or ``pytest --effecthost-factory MODULE:FACTORY``.
"""

from ._context import CheckContext, CheckFailed
from ._host import FactoryEnv, HostCapabilities, HostUnderTest
from ._lab import Lab, LabClient, LabEvent, mark_killed
from ._process import Deployment, ProcessHostUnderTest
from ._registry import OBLIGATIONS, Check, all_checks, check
from ._reports import json_report, junit_xml
from ._runner import (
    CheckResult,
    Factory,
    SuiteReport,
    SuiteRun,
    load_factory,
    matches,
    obligation_table,
    run_suite,
    skip_reason,
)
from ._spec import Rule, UnknownRule, explain, spec_rules
from ._tools import STEP, UNROUTABLE, ConformanceResolver, conformance_resolver, step_input

__all__ = [
    "OBLIGATIONS",
    "STEP",
    "UNROUTABLE",
    "Check",
    "CheckContext",
    "CheckFailed",
    "CheckResult",
    "ConformanceResolver",
    "Deployment",
    "Factory",
    "FactoryEnv",
    "HostCapabilities",
    "HostUnderTest",
    "Lab",
    "LabClient",
    "LabEvent",
    "ProcessHostUnderTest",
    "Rule",
    "SuiteReport",
    "SuiteRun",
    "UnknownRule",
    "all_checks",
    "check",
    "conformance_resolver",
    "explain",
    "json_report",
    "junit_xml",
    "load_factory",
    "mark_killed",
    "matches",
    "obligation_table",
    "run_suite",
    "skip_reason",
    "spec_rules",
    "step_input",
]
