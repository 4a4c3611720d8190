"""A deployment's sealing is recorded before any outcome is written (G-48, issue 21): a
writer without a sealer records no outcome in a sealed deployment, even before a sealed
row exists, whichever process settles the child; both substrates. A database of the
previous release (no record) is inferred from its rows and still opens."""

from __future__ import annotations

import secrets
from contextlib import aclosing
from typing import Any

import pytest
from group_support import echo_tools
from group_support import group as effect_group
from sql_support import Substrate

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    LoserPolicy,
    StoreRefused,
    ToolRegistry,
    WakePolicy,
)
from effecthost.hosts.sql import SealedDeployment, SqlEffectHost
from effecthost.payloads import AesGcmSealer, InMemoryKeyStore, PayloadPolicy

pytestmark = pytest.mark.anyio


def _host(sub: Substrate, sealed: bool) -> SqlEffectHost:
    policy = PayloadPolicy(sealer=AesGcmSealer(InMemoryKeyStore())) if sealed else None
    return SqlEffectHost(
        sub.make_store(), echo_tools(), lease_ttl=3.0, renew_every=0.5,
        poll_interval=0.05, payloads=policy,
    )  # fmt: skip


def _group() -> EffectGroup:
    key = f"dep{secrets.token_hex(4)}:group:g:0"
    return effect_group(
        key, [EffectEnvelope(replay_key=f"{key}:0", kind="tool_call", name="echo", input=1)]
    )


async def _outcomes(sub: Substrate) -> list[Any]:
    return [tuple(r) for r in await sub.sql("SELECT outcome FROM eh_children", ())]


async def test_a_plaintext_writer_records_nothing_in_a_sealed_deployment_without_sealed_rows(
    substrate: Substrate,
) -> None:
    """G-48, issue 21: once a sealing host has started, a host without a sealer refuses
    to open a group and to run a drain pass (``SealedDeployment``, a ``StoreRefused``),
    though no sealed outcome exists yet; it still starts and reads."""
    sealing = _host(substrate, sealed=True)
    await sealing.start()
    await sealing.aclose()
    plain = _host(substrate, sealed=False)
    async with aclosing(plain):
        with pytest.raises(SealedDeployment) as refused:
            await plain.open_effect_group(_group())
        assert isinstance(refused.value, StoreRefused)
        with pytest.raises(SealedDeployment):
            await plain.drain().run_pass()
        assert await plain.open_group_keys() == []
    assert await _outcomes(substrate) == []


async def test_a_writer_started_before_the_deployment_was_sealed_refuses_its_next_pass(
    substrate: Substrate,
) -> None:
    """G-48, issue 21: a group opened by a sealing host is sealed for every writer: a
    plaintext host that started before the sealing one refuses its next drain pass and
    event delivery instead of settling that group's children in plaintext."""
    plain = _host(substrate, sealed=False)
    await plain.start()
    sealing = _host(substrate, sealed=True)
    async with aclosing(plain), aclosing(sealing):
        await sealing.start()
        with pytest.raises(SealedDeployment):
            await plain.drain().run_pass()
        with pytest.raises(SealedDeployment):
            await plain.open_effect_group(_group())


async def test_a_database_of_the_previous_release_is_inferred_from_its_rows(
    substrate: Substrate,
) -> None:
    """G-48, issue 21: a database without the sealing record (the previous release) still
    opens: a plaintext one stays writable by a plaintext host, and a sealed outcome in it
    makes the deployment sealed."""
    first = _host(substrate, sealed=False)
    group = _group()
    await first.open_effect_group(group)
    await first.await_next_settlement(group.handle())
    await first.aclose()
    await substrate.sql("DROP TABLE eh_sealing", ())
    again = _host(substrate, sealed=False)
    async with aclosing(again):
        await again.drain().run_pass()  # plaintext, as recorded: allowed
        assert (await again.await_next_settlement(group.handle())).outcome.value == 1
    await substrate.sql("DROP TABLE eh_sealing", ())
    await substrate.sql(
        "UPDATE eh_children SET outcome = {0}", ('{"form":"sealed","sealed":true}',)
    )
    late = _host(substrate, sealed=False)
    async with aclosing(late):
        with pytest.raises(SealedDeployment):
            await late.open_effect_group(_group())


async def test_a_plaintext_close_in_a_sealed_deployment_records_no_cancelled_outcome(
    substrate: Substrate,
) -> None:
    """G-48, issue 21: a plaintext host closing a group ``CANCEL`` in a sealed deployment
    records the cancel request (the close succeeds) but no plaintext cancelled outcome; a
    sealing host's drain then cancels the child and retires the group."""
    import asyncio

    never = asyncio.Event()

    async def hold(value: Any) -> Any:
        await never.wait()

    keys = InMemoryKeyStore()
    policy = PayloadPolicy(sealer=AesGcmSealer(keys))

    def host(payloads: PayloadPolicy | None) -> SqlEffectHost:
        return SqlEffectHost(
            substrate.make_store(), ToolRegistry({"hold": hold}), lease_ttl=0.6,
            renew_every=0.1, poll_interval=0.05, payloads=payloads,
        )  # fmt: skip

    key = f"dep{secrets.token_hex(4)}:group:g:0"
    group = effect_group(
        key,
        [EffectEnvelope(replay_key=f"{key}:0", kind="tool_call", name="hold", input=1)],
        WakePolicy.ALL,
        LoserPolicy.CANCEL,
    )
    opener = host(policy)
    handle = await opener.open_effect_group(group)
    await opener.abandon()
    plain = host(None)
    sealing = host(policy)
    async with aclosing(sealing), aclosing(plain):
        for _ in range(200):  # the abandoned lease expires on the database clock
            rows = await substrate.sql("SELECT lease_expires FROM eh_children", ())
            await plain.start()
            now = await plain.store.now()
            if all(r[0] is None or r[0] < now for r in rows):
                break
            await asyncio.sleep(0.05)  # waiting for an external clock, not ordering
        await plain.close_effect_group(handle)
        assert await _outcomes(substrate) == [(None,)]
        report = await sealing.drain().run_pass()
        assert [tuple(c) for c in report.cancelled] == [(key, f"{key}:0")]
        assert await _outcomes(substrate) == []  # settled, sealed, and the group retired
