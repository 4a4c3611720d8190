"""The memory host with a payload policy: outcomes by reference, sealed at rest, refusals
that change nothing (G-47…G-50)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from gated_tools import Lab, group, step
from group_support import group as effect_group

from effecthost.contract import (
    EffectEnvelope,
    GroupHandle,
    InvalidEnvelope,
    LoserPolicy,
    Outcome,
    PayloadMissing,
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
    StoredOutcome,
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


async def open_settled(host: MemoryEffectHost, *children: dict[str, Any]) -> GroupHandle:
    """Group ``KEY`` of ``children`` opened, every child settled."""
    handle = await host.open_effect_group(group(KEY, *children))
    await settled(host, KEY, len(children))
    return handle


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
    handle = await open_settled(host, secret_step("small", 1), secret_step("big", 20_000))
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
    handle = await open_settled(host, secret_step("a", 50_000), secret_step("b", 9_000))
    data = read_all(payload_dir)
    assert data, "nothing went by reference"
    assert SECRET.encode() not in data and b"ppppppppppppppppp" not in data
    for child in host._groups[KEY].settled:
        assert child.stored is not None and SECRET not in child.stored.model_dump_json()
    assert [(await host.await_next_settlement(handle)).outcome.ok for _ in range(2)] == [True] * 2


async def test_a_destroyed_scope_key_shreds_and_the_handle_stays(
    host: MemoryEffectHost, keys: InMemoryKeyStore
) -> None:
    handle = await open_settled(host, secret_step("a", 1))
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


# -- hostile records (G-48, G-49, R-10) -------------------------------------------------


def _typed(exc: BaseException) -> bool:
    return isinstance(exc, SealedPayloadUnreadable | PayloadShredded | PayloadMissing)


def _payload_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*.payload")}


def _flip(text: str, rng: random.Random) -> str:
    at = rng.randrange(len(text))
    return text[:at] + chr(ord(text[at]) ^ (1 << rng.randrange(7))) + text[at + 1 :]


async def test_r10_swapped_positions_are_refused_on_memory(host: MemoryEffectHost) -> None:
    """R-10: two settled children whose positions are swapped in the record are refused
    (each value was sealed for its own position), the handle stays, and swapping back
    reads them again."""
    handle = await open_settled(host, secret_step("a", 1), secret_step("b", 2))
    first, second = host._groups[KEY].settled
    first.position, second.position = second.position, first.position
    for rank in (1, 2):
        cursor = handle.copy_cursor()
        cursor.consumed = rank - 1
        with pytest.raises(SealedPayloadUnreadable) as caught:
            await host.await_next_settlement(cursor)
        assert cursor.consumed == rank - 1 and caught.value.rank == rank
    first.position, second.position = second.position, first.position
    got = [await host.await_next_settlement(handle) for _ in range(2)]
    assert {(s.position, s.outcome.value["pad"]) for s in got} == {(0, "p"), (1, "pp")}


async def test_g49_corrupted_records_on_memory_are_typed_and_change_nothing(
    host: MemoryEffectHost, payload_dir: Path
) -> None:
    """G-48, G-49: seeded corruptions of a sealed inline record (each envelope field bit-
    flipped, truncated, emptied) and of a by-reference payload file (truncated, emptied,
    bit-flipped) read as a typed refusal quoting no ciphertext, or as the sealed value;
    the handle and the records never change."""
    handle = await open_settled(host, secret_step("small", 1), secret_step("big", 20_000))
    record = host._groups[KEY]
    rng = random.Random(11)
    refused = 0
    for trial in range(120):
        child = record.settled[trial % 2]
        rank = trial % 2 + 1
        original = child.stored
        assert original is not None
        saved = _payload_files(payload_dir)
        files = sorted(saved)
        quoted: list[str] = []
        if original.envelope is not None:
            field = rng.choice(["nonce", "ciphertext", "key_id", "cipher", "scope", "format"])
            text = getattr(original.envelope, field)
            quoted.append(original.envelope.ciphertext)
            how = rng.choice(["flip", "truncate", "empty"])
            text = {"flip": _flip, "truncate": lambda t, r: t[: r.randrange(len(t))]}.get(
                how, lambda t, r: ""
            )(text, rng)
            child.stored = original.model_copy(
                update={"envelope": original.envelope.model_copy(update={field: text})}
            )
        else:
            path = files[0]
            data = saved[path]
            quoted.append(json.loads(data)["ciphertext"])
            how = rng.choice(["flip", "truncate", "empty"])
            if how == "flip":
                at = rng.randrange(len(data))
                data = data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
            path.write_bytes(data[: rng.randrange(len(data))] if how == "truncate" else b"" if how == "empty" else data)  # fmt: skip
        before = snapshot(host, KEY)
        cursor = handle.copy_cursor()
        cursor.consumed = rank - 1
        try:
            got = await host.await_next_settlement(cursor)
        except Exception as exc:
            assert _typed(exc), repr(exc)
            assert cursor.consumed == rank - 1
            text = f"{exc!s} {exc!r} {vars(exc)!r}"
            assert SECRET not in text and not any(q[:16] in text for q in quoted)
            refused += 1
        else:
            assert got.outcome.value["secret"] == SECRET
        assert snapshot(host, KEY) == before
        child.stored = original
        for path, data in saved.items():
            path.write_bytes(data)
    assert refused > 100


async def test_g49_forged_plaintext_in_a_sealed_memory_slot_is_refused_unless_mixed(
    host: MemoryEffectHost, policy: PayloadPolicy
) -> None:
    """G-49, ADR 0130 D8: an unsealed record planted in a slot of a sealing host is
    refused (the host never writes one); a reader declaring ``accept_plaintext`` reads it."""
    handle = await open_settled(host, secret_step("a", 1))
    child = host._groups[KEY].settled[0]
    child.stored = StoredOutcome(form="inline", outcome=Outcome.success("forged"))
    with pytest.raises(SealedPayloadUnreadable):
        await host.await_next_settlement(handle.copy_cursor())
    mixed = host.with_payloads(replace(policy, accept_plaintext=True))
    assert (await mixed.await_next_settlement(handle)).outcome.value == "forged"


async def test_g49_a_tool_result_shaped_like_an_envelope_is_a_typed_failure_on_memory(
    policy: PayloadPolicy,
) -> None:
    """G-49: a tool returning a value with a sealed envelope's shape settles as a typed
    ``SealedShapeRefused`` failure: the rank is readable, nothing ciphertext-shaped is
    served."""

    async def relay(spec: dict[str, Any]) -> Any:
        return {"relayed": [{"format": "effecthost.sealed/2", "ciphertext": "QUJD"}]}

    host = MemoryEffectHost(ToolRegistry({"relay": relay}), payloads=policy)
    try:
        handle = await host.open_effect_group(group(KEY, step("r", name="relay")))
        settlement = await host.await_next_settlement(handle)
        assert settlement.outcome.error is not None
        assert settlement.outcome.error.type == "SealedShapeRefused"
    finally:
        await host.aclose()


async def test_g49_an_event_payload_shaped_like_an_envelope_is_refused_and_records_nothing(
    host: MemoryEffectHost,
) -> None:
    """G-49, ADR 0130 D6: a sealed value is minted by the host's sealer, never by a caller;
    an event payload carrying the shape is ``InvalidEnvelope`` and settles nothing."""
    g = effect_group(KEY, [EffectEnvelope(replay_key=f"{KEY}:ev", kind="await_event", name="ev")])
    await host.open_effect_group(g)
    forged = {"wrapped": [{"format": "effecthost.sealed/2", "ciphertext": "QUJD"}]}
    with pytest.raises(InvalidEnvelope):
        await host.deliver_event(KEY, "ev", forged)
    assert host._groups[KEY].settled == []
    assert await host.deliver_event(KEY, "ev", {"wrapped": json.dumps(forged)}) == 1
