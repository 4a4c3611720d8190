"""The memory host with a payload policy: outcomes by reference, sealed at rest, refusals
that change nothing (G-47…G-50)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from gated_tools import Lab, group, step

from effecthost.contract import (
    LoserPolicy,
    PayloadShredded,
    SealedPayloadUnreadable,
    ToolRegistry,
)
from effecthost.hosts.memory import MemoryEffectHost
from effecthost.payloads import (
    AesGcmSealer,
    FilesystemPayloadStore,
    InMemoryKeyStore,
    MemoryPayloadStore,
    PayloadPolicy,
    default_scope,
    group_directory_name,
)

pytestmark = pytest.mark.anyio

SECRET = "the-launch-code-0451"
KEY = "tenant-1:group:batch:0"


async def secret_tool(spec: dict[str, Any]) -> Any:
    """Computes a secret that is not in its input (the input is recorded in plaintext)."""
    return {"secret": SECRET[::-1][::-1], "pad": "p" * int(spec["pad"])}


def registry(lab: Lab) -> ToolRegistry:
    return ToolRegistry({"step": lab.step, "secret": secret_tool})


def secret_step(label: str, pad: int) -> dict[str, Any]:
    return step(label, gate=False, name="secret", pad=pad)


@pytest.fixture
def keys() -> InMemoryKeyStore:
    return InMemoryKeyStore()


@pytest.fixture
def payload_dir(tmp_path: Path) -> Path:
    return tmp_path / "payloads"


@pytest.fixture
def policy(keys: InMemoryKeyStore, payload_dir: Path) -> PayloadPolicy:
    return PayloadPolicy(store=FilesystemPayloadStore(payload_dir), sealer=AesGcmSealer(keys))


@pytest.fixture
async def host(policy: PayloadPolicy) -> AsyncIterator[MemoryEffectHost]:
    host = MemoryEffectHost(registry(Lab()), payloads=policy)
    yield host
    await host.aclose()


def snapshot(host: MemoryEffectHost, key: str) -> list[tuple[Any, ...]]:
    record = host._groups[key]
    return [
        (
            c.replay_key,
            c.position,
            c.seq,
            c.state,
            c.fence,
            c.outcome,
            c.stored.model_dump_json() if c.stored else None,
        )
        for c in record.settled
    ] + [(record.counter, record.closed, len(record.settled))]


async def settled(host: MemoryEffectHost, key: str, count: int) -> None:
    record = host._groups[key]
    with anyio.fail_after(5):
        while len(record.settled) < count:
            await record.changed.wait()


def read_all(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


async def test_a_large_outcome_goes_by_reference_and_round_trips(
    host: MemoryEffectHost, payload_dir: Path
) -> None:
    g = group(KEY, secret_step("big", 20_000))
    handle = await host.open_effect_group(g)
    settlement = await host.await_next_settlement(handle)
    assert settlement.outcome.value == {"secret": SECRET, "pad": "p" * 20_000}
    child = host._groups[KEY].settled[0]
    assert child.outcome is None and child.stored is not None
    assert child.stored.form == "ref" and child.stored.sealed
    assert (payload_dir / group_directory_name(KEY)).is_dir()


async def test_a_reader_without_the_key_is_refused_and_nothing_changes(
    host: MemoryEffectHost, policy: PayloadPolicy
) -> None:
    g = group(KEY, secret_step("small", 1), secret_step("big", 20_000))
    handle = await host.open_effect_group(g)
    await settled(host, KEY, 2)
    before = snapshot(host, KEY)
    readers = {
        "no key store": host.with_payloads(PayloadPolicy(store=policy.store)),
        "another key store": host.with_payloads(
            PayloadPolicy(store=policy.store, sealer=AesGcmSealer(InMemoryKeyStore()))
        ),
        "no policy": host.with_payloads(None),
    }
    for name, reader in readers.items():
        for rank in (1, 2):
            cursor = handle.copy_cursor()
            cursor.consumed = rank - 1
            with pytest.raises(SealedPayloadUnreadable) as caught:
                await reader.await_next_settlement(cursor)
            assert cursor.consumed == rank - 1, name
            assert caught.value.rank == rank
            assert SECRET not in f"{caught.value} {vars(caught.value)}"
            assert snapshot(host, KEY) == before, name
    # the correctly configured process reads the same ranks afterwards
    values = [(await host.await_next_settlement(handle)).outcome.value for _ in range(2)]
    assert sorted(v["secret"] for v in values) == [SECRET, SECRET]
    assert handle.consumed == 2


async def test_nothing_sealed_is_in_plaintext_in_the_payload_directory(
    host: MemoryEffectHost, payload_dir: Path
) -> None:
    g = group(KEY, secret_step("a", 50_000), secret_step("b", 9_000))
    handle = await host.open_effect_group(g)
    await settled(host, KEY, 2)
    data = read_all(payload_dir)
    assert data, "nothing went by reference"
    assert SECRET.encode() not in data and b"ppppppppppppppppp" not in data
    for child in host._groups[KEY].settled:
        assert child.stored is not None and SECRET not in child.stored.model_dump_json()
    assert [(await host.await_next_settlement(handle)).outcome.ok for _ in range(2)] == [True] * 2


async def test_a_destroyed_scope_key_shreds_and_the_handle_stays(
    host: MemoryEffectHost, keys: InMemoryKeyStore
) -> None:
    handle = await host.open_effect_group(group(KEY, secret_step("a", 1)))
    await settled(host, KEY, 1)
    keys.destroy(default_scope(KEY))
    with pytest.raises(PayloadShredded):
        await host.await_next_settlement(handle)
    assert handle.consumed == 0


async def test_retirement_deletes_the_groups_payloads(
    host: MemoryEffectHost, payload_dir: Path
) -> None:
    handle = await host.open_effect_group(group(KEY, secret_step("a", 20_000)))
    await host.await_next_settlement(handle)
    assert (payload_dir / group_directory_name(KEY)).exists()
    await host.close_effect_group(handle)
    await host.aclose()  # waits for the scheduled deletion
    assert not (payload_dir / group_directory_name(KEY)).exists()


async def test_cancelled_losers_are_sealed_too(keys: InMemoryKeyStore) -> None:
    lab = Lab()
    host = MemoryEffectHost(
        registry(lab), payloads=PayloadPolicy(store=MemoryPayloadStore(), sealer=AesGcmSealer(keys))
    )
    try:
        g = group(KEY, step("held"), disposition=LoserPolicy.CANCEL)
        handle = await host.open_effect_group(g)
        with anyio.fail_after(5):
            await lab.started["held"].wait()
        record = host._groups[KEY]
        await host.close_effect_group(handle)
        with anyio.fail_after(5):
            while not record.settled:
                await record.changed.wait()
        assert record.settled[0].stored is not None and record.settled[0].stored.sealed
    finally:
        await host.aclose()


async def test_without_a_policy_outcomes_are_recorded_as_before() -> None:
    host = MemoryEffectHost(registry(Lab()))
    try:
        handle = await host.open_effect_group(group(KEY, secret_step("a", 20_000)))
        settlement = await host.await_next_settlement(handle)
        child = host._groups[KEY].settled[0]
        assert child.stored is None and child.outcome == settlement.outcome
        assert host._encoded == {}
    finally:
        await host.aclose()
