"""Payload references and sealed settlements on the Restate tier (G-47…G-50): the suite
with ``sealed_factory``, nothing sealed in plaintext in the Restate state (admin SQL), and
a reader without the key refused with the state byte-identical before and after."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from group_support import event
from group_support import group as effect_group
from restate_secret_tools import registry
from suite_support import assert_suite_passed

from effecthost.conformance import run_suite
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    GroupClosed,
    GroupHandle,
    SealedPayloadUnreadable,
    WakePolicy,
    group_key,
)
from effecthost.hosts.restate import GROUP, PAYLOAD, RestateController, file_payload_policy
from effecthost.hosts.restate.testing import LocalRestate, sealed_factory
from effecthost.payloads import PayloadPolicy, StoredOutcome, group_directory_name

pytestmark = pytest.mark.anyio
TIMEOUT = 20.0
HERE = os.path.dirname(os.path.abspath(__file__))  # the endpoint imports the tools here
SMALL_SECRET = "restate-sealed-small-7f3a9c"
LARGE_SECRET = "restate-sealed-large-b41e06"


@dataclass
class Sealed:
    local: LocalRestate
    payload_dir: Path
    key_dir: Path
    policy: PayloadPolicy
    controllers: list[RestateController]

    def controller(self, policy: PayloadPolicy | None) -> RestateController:
        ctl = self.local.controller(registry, owner="tests", payloads=policy)
        self.controllers.append(ctl)
        return ctl


@pytest.fixture
async def sealed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Sealed]:
    paths = [HERE, os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    payload_dir, key_dir = tmp_path / "payloads", tmp_path / "keys"
    local = LocalRestate(
        tmp_path / "restate",
        "restate_secret_tools:registry",
        endpoint_args=["--payload-dir", str(payload_dir), "--key-dir", str(key_dir)],
    )
    built = Sealed(local, payload_dir, key_dir, file_payload_policy(payload_dir, key_dir), [])
    try:
        await local.start()
        yield built
    finally:
        for ctl in built.controllers:
            await ctl.aclose()
        await local.stop()


def _reveal(tag: str, secret: str, pad: int = 0) -> EffectEnvelope:
    """A child whose outcome carries ``secret``; its input carries only the reversal."""
    return EffectEnvelope(
        replay_key=tag,
        kind=EffectKind.TOOL_CALL,
        name="reveal",
        input={"reversed": secret[::-1], "pad": pad},
    )


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def _state_rows(ctl: RestateController, key: str) -> list[dict[str, Any]]:
    """Every state row of the group object ``key`` (all columns), in a stable order."""
    rows = await ctl.query(
        f"SELECT * FROM state WHERE service_name = {_sql(GROUP)} AND service_key = {_sql(key)}"
    )
    return sorted(rows, key=lambda row: str(row["key"]))


def _all_bytes(rows: list[dict[str, Any]]) -> bytes:
    """Every column of ``rows`` as bytes: the text as shown, and the binary columns (hex
    in the admin SQL answer: ``value``, ``raw``) decoded."""
    parts = [json.dumps(rows).encode()]
    for row in rows:
        for column in ("value", "raw"):
            if isinstance(row.get(column), str):
                parts.append(bytes.fromhex(row[column]))
    return b"\n".join(parts)


async def _settled(ctl: RestateController, key: str, count: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while len(await ctl.settlement_order(key)) < count:
        assert loop.time() < deadline, f"{count} settlements of {key!r}"
        await asyncio.sleep(0.05)  # polling an engine fact, not ordering anything


async def _two_settled(ctl: RestateController, name: str) -> tuple[EffectGroup, GroupHandle]:
    """A group of a small and a large secret-bearing child, opened; both settled."""
    small = _reveal("sealed.small", SMALL_SECRET)
    large = _reveal("sealed.large", LARGE_SECRET, pad=20_000)
    group = effect_group(group_key("sealed", name, 0), [small, large])
    handle = await ctl.open_effect_group(group)
    await _settled(ctl, group.key, 2)
    return group, handle


@pytest.mark.idle
async def test_conformance_suite_passes_sealed() -> None:
    report = await run_suite(sealed_factory, keep=True)
    assert_suite_passed(report, may_miss={"payload_limit", "transient_faults"})
    passed = {i for r in report.by_status("passed") for i in r.check.ids}
    assert {"G-47", "G-48", "G-49", "G-50"} <= passed, report.table()


async def test_nothing_sealed_is_plaintext_in_the_restate_state(sealed: Sealed) -> None:
    ctl = sealed.controller(sealed.policy)
    group, handle = await _two_settled(ctl, "plain")
    key = group.key

    rows = await _state_rows(ctl, key)
    dump = _all_bytes(rows)
    assert rows and SMALL_SECRET.encode() not in dump and LARGE_SECRET.encode() not in dump
    forms = {}
    for row in rows:
        if str(row["key"]).startswith("rank:"):
            record = json.loads(row["value_utf8"])
            stored = StoredOutcome.model_validate(record["stored"])
            assert stored.sealed
            forms[record["replay_key"]] = stored.form
    assert forms == {"sealed.small": "sealed", "sealed.large": "ref"}
    # the payload object is not used, and the payload store holds only the envelope
    payload_rows = await ctl.query(
        f"SELECT * FROM state WHERE service_name = {_sql(PAYLOAD)} AND service_key = {_sql(key)}"
    )
    assert payload_rows == []
    group_dir = sealed.payload_dir / group_directory_name(key)
    files = list(group_dir.glob("*.payload"))
    assert len(files) == 1 and LARGE_SECRET.encode() not in files[0].read_bytes()
    # the child invocations' journals carry the stored form only (children of an ALL
    # group are started by the group object's ``collect``, others by its ``open``)
    journal = await ctl.query(
        f"SELECT j.* FROM sys_journal j JOIN sys_invocation i ON j.id = i.id "
        f"WHERE i.target_service_name = 'EffecthostChild' "
        f"AND i.invoked_by_target IN ({_sql(f'{GROUP}/{key}/open')}, "
        f"{_sql(f'{GROUP}/{key}/collect')})"
    )
    recorded = _all_bytes(journal)
    assert b'"ciphertext"' in recorded, "the journal does not hold the stored form"
    assert SMALL_SECRET.encode() not in recorded and LARGE_SECRET.encode() not in recorded
    # and so do the group object's (``collect`` receives the settlements, ``settle_batch``
    # records them)
    journal = await ctl.query(
        f"SELECT j.* FROM sys_journal j JOIN sys_invocation i ON j.id = i.id "
        f"WHERE i.target_service_name = {_sql(GROUP)} AND i.target_service_key = {_sql(key)}"
    )
    recorded = _all_bytes(journal)
    assert SMALL_SECRET.encode() not in recorded and LARGE_SECRET.encode() not in recorded

    values = {}
    for _ in range(2):
        settlement = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
        values[settlement.replay_key] = settlement.outcome.value
    assert values["sealed.small"] == {"secret": SMALL_SECRET, "blob": ""}
    assert values["sealed.large"]["secret"] == LARGE_SECRET

    await ctl.close_effect_group(handle)
    assert not group_dir.exists(), "close left the group's payloads"
    with pytest.raises(GroupClosed):
        await ctl.await_next_settlement(group.handle())


async def test_a_reader_without_the_key_is_refused_and_changes_nothing(sealed: Sealed) -> None:
    ctl = sealed.controller(sealed.policy)
    group, handle = await _two_settled(ctl, "refused")
    key = group.key
    before = await _state_rows(ctl, key)

    keyless = sealed.controller(PayloadPolicy(store=sealed.policy.store))
    bare = sealed.controller(None)
    for reader in (keyless, bare):
        for consumed in (0, 1):
            cursor = handle.copy_cursor()
            cursor.consumed = consumed
            with pytest.raises(SealedPayloadUnreadable) as refused:
                await asyncio.wait_for(reader.await_next_settlement(cursor), TIMEOUT)
            assert cursor.consumed == consumed
            text = f"{refused.value!s} {vars(refused.value)!r}"
            assert SMALL_SECRET not in text and LARGE_SECRET not in text
            assert refused.value.group_key == key and refused.value.rank == consumed + 1

    after = await _state_rows(ctl, key)
    assert after == before, "a refused read changed the group object's state"
    assert handle.consumed == 0
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.rank == 1 and first.outcome.ok
    await ctl.close_effect_group(handle)


async def test_R11_a_closed_groups_payloads_go_when_it_retires(sealed: Sealed) -> None:
    """R-11, G-47: a ``RUN_TO_COMPLETION`` race closed while its ``await_event`` loser
    waits keeps the winner's stored payload until the group retires; the event settles the
    loser, whose settlement retires the group and deletes the payloads."""
    ctl = sealed.controller(sealed.policy)
    key = group_key("sealed", "retire", 0)
    win = _reveal("sealed.retire.win", LARGE_SECRET, pad=20_000)
    group = effect_group(key, [win, event("sealed.retire.wait")], WakePolicy.FIRST)
    handle = await ctl.open_effect_group(group)
    first = await asyncio.wait_for(ctl.await_next_settlement(handle), TIMEOUT)
    assert first.replay_key == "sealed.retire.win"
    await ctl.close_effect_group(handle)
    group_dir = sealed.payload_dir / group_directory_name(key)
    assert list(group_dir.glob("*.payload")), "the payloads went before the group retired"
    assert await ctl.deliver_event(key, "go", 1) == 1
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:  # retirement has no event to wait on: polling a fact
        if not group_dir.exists() or loop.time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert not group_dir.exists(), "retirement left the group's payloads"
    assert {row["key"] for row in await _state_rows(ctl, key)} == {"tombstone"}
    assert await ctl.deliver_event(key, "go", 2) == 0
