"""Payload references, sealed settlements and the sealing codec on the Temporal tier
(G-47…G-50).

- the payload checks of the conformance suite with ``sealed_factory`` (the full suite
  with ``sealed_factory`` takes about as long as ``test_conformance.py``; run it with
  ``effecthost conformance effecthost.hosts.temporal.testing:sealed_factory``);
- nothing sealed appears in plaintext in the Temporal history or the payload store, the
  caller still reads it, and a retired group's stored payloads are deleted;
- a caller without the codec gets ``SealedPayloadUnreadable`` and its handle stays; a
  worker without the codec fails its workflow tasks and runs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message
from group_support import group as effect_group
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType

from effecthost.conformance import STEP, run_suite, step_input
from effecthost.conformance._lab import Lab
from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    SealedPayloadUnreadable,
    group_key,
)
from effecthost.hosts.temporal import (
    CODEC_ENCODING,
    EffectGroupWorkflow,
    SealingCodec,
    TemporalEffectHost,
)
from effecthost.hosts.temporal.testing import (
    SealedTemporalHostUnderTest,
    WorkerProcess,
    sealed_factory,
)
from effecthost.payloads import InMemoryKeyStore, PayloadPolicy, group_directory_name

from ._support import on_host, require_cli, running_host, temporal_controller

SECRET_INPUT = "input-plaintext-7f3a9c"
SECRET_SMALL = "outcome-plaintext-small-41d2"
SECRET_LARGE = "outcome-plaintext-large-9be0"

pytestmark = pytest.mark.timeout(120)


@pytest.mark.timeout(180)
def test_payload_checks_pass_with_sealed_factory() -> None:
    require_cli()
    report = asyncio.run(run_suite(sealed_factory, select="G-47 or G-48 or G-49 or G-50"))
    print(report.table())
    failed = [f"{r.check.node_name}: {r.reason}" for r in report.by_status("failed")]
    assert report.ok, "\n".join(failed)
    assert not report.by_status("skipped"), report.table()
    assert {r.check.ids[0] for r in report.by_status("passed")} >= {"G-47", "G-48", "G-49", "G-50"}


@contextlib.asynccontextmanager
async def sealed_host(root: Path) -> AsyncIterator[tuple[SealedTemporalHostUnderTest, Lab]]:
    async with running_host(root, make=sealed_factory, restart_server=True) as (host, lab):
        assert isinstance(host, SealedTemporalHostUnderTest)
        yield host, lab


def _child(tag: str, result: Any) -> EffectEnvelope:
    return EffectEnvelope(
        replay_key=tag,
        kind=EffectKind.TOOL_CALL,
        name=STEP,
        input={**step_input(tag, gate=False, result=result), "note": SECRET_INPUT},
    )


def _group(name: str) -> EffectGroup:
    return effect_group(
        group_key(f"test-payloads-{uuid.uuid4().hex[:8]}", name, 0),
        [
            _child("small", {"secret": SECRET_SMALL}),
            _child("large", {"secret": SECRET_LARGE, "blob": "L" * (64 * 1024)}),
        ],
    )


def _payloads(message: Message) -> Iterator[Payload]:
    """Every ``Payload`` anywhere in a protobuf message."""
    if isinstance(message, Payload):
        yield message
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if isinstance(value, Message):
            yield from _payloads(value)
            continue
        items = value.values() if hasattr(value, "values") else value  # repeated or map
        for item in items:
            if isinstance(item, Message):
                yield from _payloads(item)


async def _wait(predicate: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.05
    while not await predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(delay)  # polling the server until the state shows up
        delay = min(delay * 2, 0.5)


@on_host(sealed_host)
async def test_history_carries_no_plaintext_and_retirement_deletes_payloads(
    host: SealedTemporalHostUnderTest, _lab: Lab
) -> None:
    ctl = await temporal_controller(host)
    group = _group("plain")
    handle = await ctl.open_effect_group(group)
    seen = {}
    for _ in range(2):
        settlement = await ctl.await_next_settlement(handle)
        seen[settlement.replay_key] = settlement.outcome.value
    assert seen["small"]["secret"] == SECRET_SMALL
    assert seen["large"]["secret"] == SECRET_LARGE
    assert (await host.stored_outcome(group.key, "large")).form == "ref"
    assert (await host.stored_outcome(group.key, "small")).form == "sealed"

    history = await ctl.client.get_workflow_handle(group.key).fetch_history()
    text = json.dumps(history.to_json_dict())
    payloads = [p for event in history.events for p in _payloads(event)]
    sealed = [p for p in payloads if p.metadata.get("encoding") == CODEC_ENCODING]
    # start input, two activity inputs and results, the waiting updates' results
    assert len(sealed) >= 5, len(sealed)
    for secret in (SECRET_INPUT, SECRET_SMALL, SECRET_LARGE):
        assert secret not in text
        for payload in payloads:
            assert secret.encode() not in payload.data
            assert secret.encode() not in payload.SerializeToString()
    # The walk finds the plaintext once the codec opens the payloads (the test would
    # see a leak), and the stored outcomes are envelopes, not outcomes.
    opened = await SealingCodec(host.keys).decode(sealed)
    assert any(SECRET_INPUT.encode() in p.data for p in opened)
    store_dir = host.payload_dir / group_directory_name(group.key)
    stored_files = list(store_dir.iterdir())
    assert stored_files
    for path in stored_files:
        assert SECRET_LARGE.encode() not in path.read_bytes()

    # Retirement (closed, every child ranked) deletes the group's stored payloads.
    await ctl.close_effect_group(handle)
    await ctl.client.get_workflow_handle(group.key).result()

    async def deleted() -> bool:
        return not store_dir.exists()

    await _wait(deleted)


@on_host(sealed_host)
async def test_without_the_codec_nothing_is_read(
    host: SealedTemporalHostUnderTest, lab: Lab
) -> None:
    ctl = await temporal_controller(host)
    assert host.client is not None

    # A caller without the codec (same payload store, no keys): a typed refusal, ids
    # only, the handle stays, and nothing is added to history.
    group = _group("reader")
    handle = await ctl.open_effect_group(group)
    await _wait(lambda: _settled(ctl, group.key, 2))
    before = len((await ctl.client.get_workflow_handle(group.key).fetch_history()).events)
    plain = TemporalEffectHost(
        host.client,
        host.task_queue,
        host.resolver(),
        payloads=PayloadPolicy(store=host.policy.store),
    )
    try:
        cursor = handle.copy_cursor()
        with pytest.raises(SealedPayloadUnreadable) as raised:
            await plain.await_next_settlement(cursor)
        assert cursor.consumed == 0
        assert raised.value.group_key == group.key
        assert raised.value.rank == 1
        for secret in (SECRET_INPUT, SECRET_SMALL, SECRET_LARGE):
            assert secret not in f"{raised.value!s} {vars(raised.value)!r}"
    finally:
        await plain.aclose()
    after = len((await ctl.client.get_workflow_handle(group.key).fetch_history()).events)
    assert after == before
    assert (await ctl.await_next_settlement(handle)).rank == 1

    # A worker without the codec (its own task queue): it cannot decode the group's
    # start input, so every workflow task fails and no child is scheduled.
    queue = f"no-codec-{uuid.uuid4().hex[:8]}"
    worker = WorkerProcess(
        host.address,
        host.namespace,
        queue,
        lab.path,
        host.env.work_dir / "no-codec-worker.log",
    )
    await worker.start()
    try:
        sealed_ctl = TemporalEffectHost(
            host.client, queue, host.resolver(), payloads=host.policy, keys=host.keys
        )
        stuck = _group("stuck")
        wf = await sealed_ctl.client.start_workflow(
            EffectGroupWorkflow.run,
            sealed_ctl._group_spec(stuck),
            id=stuck.key,
            task_queue=queue,
        )

        async def task_failed() -> bool:
            with contextlib.suppress(Exception):
                events = (await wf.fetch_history()).events
                return any(
                    e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in events
                )
            return False

        await _wait(task_failed)
        events = (await wf.fetch_history()).events
        assert not any(e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED for e in events)
        await wf.terminate("test: a worker without the codec")
        await sealed_ctl.aclose()
    finally:
        await worker.terminate()


async def _settled(ctl: TemporalEffectHost, key: str, count: int) -> bool:
    return len(await ctl.settlement_order(key)) >= count


def test_limit_the_codec_binds_a_fixed_slot() -> None:
    """G-50, R-10 (a limit, docs/security.md): a codec sees a payload and nothing of where
    it sits, so it binds a fixed slot and no position: a codec-sealed payload opens
    wherever it is moved in the same deployment's history. Another key store cannot open
    it, typed."""
    keys = InMemoryKeyStore()
    codec = SealingCodec(keys)
    first = Payload(metadata={"encoding": b"json/plain"}, data=b'"first"')
    second = Payload(metadata={"encoding": b"json/plain"}, data=b'"second"')
    sealed = asyncio.run(codec.encode([first, second]))
    assert json.loads(sealed[0].data)["format"] == "effecthost.sealed/2"
    assert asyncio.run(codec.decode(list(reversed(sealed)))) == [second, first]
    with pytest.raises(SealedPayloadUnreadable):
        asyncio.run(SealingCodec(InMemoryKeyStore()).decode(sealed))
