"""effecthost.payloads: stores, sealing bound to the slot, key rotation and erasure."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from effecthost.contract import (
    Outcome,
    PayloadMissing,
    PayloadShredded,
    SealedPayloadUnreadable,
    canonical_json,
)
from effecthost.payloads import (
    AesGcmSealer,
    FileKeyStore,
    FilesystemPayloadStore,
    InMemoryKeyStore,
    MemoryPayloadStore,
    PayloadPolicy,
    PayloadRef,
    PayloadStore,
    SealedEnvelope,
    StoredOutcome,
    decode_outcome,
    default_scope,
    encode_outcome,
)

pytestmark = pytest.mark.anyio

GROUP = "tenant-7:group:abc123:0"
OTHER_GROUP = "tenant-7:group:abc123:1"
SECRET = "correct horse battery staple"


def sealed_policy(
    keys: InMemoryKeyStore | FileKeyStore, store: PayloadStore | None = None
) -> PayloadPolicy:
    return PayloadPolicy(store=store or MemoryPayloadStore(), sealer=AesGcmSealer(keys))


def assert_no_leak(error: BaseException, *secrets: str) -> None:
    text = f"{error!s} {error!r} {vars(error)!r}"
    for secret in secrets:
        assert secret not in text
    assert error.__cause__ is None
    assert error.__context__ is None or not isinstance(error.__context__, ValueError)


def files(root: Path, pattern: str = "*") -> list[Path]:
    return sorted(root.rglob(pattern))


# -- stores ----------------------------------------------------------------------------


@pytest.fixture(params=["memory", "filesystem"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> PayloadStore:
    if request.param == "memory":
        return MemoryPayloadStore()
    return FilesystemPayloadStore(tmp_path / "payloads")


async def test_store_round_trip_and_fresh_names(store: PayloadStore) -> None:
    first = await store.put(GROUP, "r1", b"one")
    second = await store.put(GROUP, "r1", b"two")
    assert first.name != second.name
    assert await store.get(first) == b"one"
    assert await store.get(second) == b"two"
    assert (first.group_key, first.replay_key, first.size) == (GROUP, "r1", 3)


async def test_missing_payload_is_typed_and_names_the_slot(store: PayloadStore) -> None:
    ref = await store.put(GROUP, "r1", b"data")
    await store.delete_group(GROUP)
    await store.delete_group(GROUP)  # idempotent
    with pytest.raises(PayloadMissing) as caught:
        await store.get(ref)
    assert (caught.value.group_key, caught.value.replay_key) == (GROUP, "r1")


async def test_delete_group_keeps_other_groups(store: PayloadStore) -> None:
    kept = await store.put(OTHER_GROUP, "r1", b"kept")
    await store.put(GROUP, "r1", b"gone")
    await store.delete_group(GROUP)
    assert await store.get(kept) == b"kept"


async def test_a_reference_whose_bytes_changed_is_missing(store: PayloadStore) -> None:
    ref = await store.put(GROUP, "r1", b"data")
    forged = ref.model_copy(update={"digest": "0" * 64})
    with pytest.raises(PayloadMissing):
        await store.get(forged)


async def test_filesystem_store_hashes_group_keys_and_leaves_no_temp_files(
    tmp_path: Path,
) -> None:
    store = FilesystemPayloadStore(tmp_path)
    await store.put("../../etc:group:x:0", "r/1", b"payload")
    entries = [p.relative_to(tmp_path) for p in files(tmp_path)]
    assert all(".." not in str(p) and "etc" not in str(p) for p in entries)
    assert not [p for p in entries if p.name.startswith(".put-")]
    again = FilesystemPayloadStore(tmp_path)  # a second instance reads what the first wrote
    ref = await store.put(GROUP, "r1", b"persisted")
    assert await again.get(ref) == b"persisted"


# -- policy: inline, by reference ------------------------------------------------------


async def test_small_outcomes_inline_large_by_reference_without_sealing() -> None:
    store = MemoryPayloadStore()
    policy = PayloadPolicy(store=store)
    small = await encode_outcome(policy, GROUP, "r1", Outcome.success("s"), position=0)
    assert small.form == "inline"
    big_value = "x" * 5000
    big = await encode_outcome(policy, GROUP, "r2", Outcome.success(big_value), position=0)
    assert big.form == "ref" and not big.sealed and big.ref is not None
    assert SECRET not in big.model_dump_json()
    decoded = await decode_outcome(policy, GROUP, "r2", big, position=0)
    assert decoded == Outcome.success(big_value)
    restored = StoredOutcome.model_validate_json(big.model_dump_json())
    assert await decode_outcome(policy, GROUP, "r2", restored, position=0) == decoded


async def test_threshold_is_measured_on_canonical_json() -> None:
    outcome = Outcome.success("y" * 100)
    size = len(canonical_json(outcome.model_dump(mode="json")))
    at = PayloadPolicy(store=MemoryPayloadStore(), inline_threshold=size)
    below = PayloadPolicy(store=MemoryPayloadStore(), inline_threshold=size - 1)
    assert (await encode_outcome(at, GROUP, "r", outcome, position=0)).form == "inline"
    assert (await encode_outcome(below, GROUP, "r", outcome, position=0)).form == "ref"
    with pytest.raises(ValueError):
        PayloadPolicy(inline_threshold=-1)


async def test_a_reference_with_no_store_configured_is_missing_with_rank() -> None:
    policy = PayloadPolicy(store=MemoryPayloadStore(), inline_threshold=0)
    stored = await encode_outcome(policy, GROUP, "r1", Outcome.success(1), position=0)
    with pytest.raises(PayloadMissing) as caught:
        await decode_outcome(PayloadPolicy(), GROUP, "r1", stored, rank=4, position=0)
    assert caught.value.rank == 4


async def test_a_deleted_payload_is_missing_never_none() -> None:
    store = MemoryPayloadStore()
    policy = PayloadPolicy(store=store, inline_threshold=0)
    stored = await encode_outcome(policy, GROUP, "r1", Outcome.success({"a": 1}), position=0)
    await store.delete_group(GROUP)
    with pytest.raises(PayloadMissing) as caught:
        await decode_outcome(policy, GROUP, "r1", stored, rank=2, position=0)
    assert caught.value.ids() == {
        "code": "payload_missing",
        "group_key": GROUP,
        "replay_key": "r1",
        "position": 0,
        "rank": 2,
    }


def test_stored_outcome_carries_exactly_one_form() -> None:
    with pytest.raises(ValueError):
        StoredOutcome(form="inline")
    with pytest.raises(ValueError):
        StoredOutcome(form="inline", outcome=Outcome.success(1), sealed=True)


# -- sealing ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [10, 10_000], ids=["inline", "by-reference"])
async def test_sealed_round_trip_keeps_plaintext_out_of_the_record(size: int) -> None:
    store = MemoryPayloadStore()
    policy = sealed_policy(InMemoryKeyStore(), store)
    value = {"secret": SECRET, "pad": "p" * size}
    stored = await encode_outcome(policy, GROUP, "r1", Outcome.success(value), position=0)
    assert stored.sealed and stored.form == ("sealed" if size < 4096 else "ref")
    assert SECRET not in stored.model_dump_json()
    for payloads in store._groups.values():
        assert all(SECRET.encode() not in data for data in payloads.values())
    assert (await decode_outcome(policy, GROUP, "r1", stored, position=0)).value == value


def envelope_of(stored: StoredOutcome) -> SealedEnvelope:
    assert stored.envelope is not None
    return stored.envelope


async def test_every_seal_uses_a_fresh_nonce() -> None:
    policy = sealed_policy(InMemoryKeyStore())
    outcome = Outcome.success(SECRET)
    envelopes = [
        envelope_of(await encode_outcome(policy, GROUP, "r1", outcome, position=0))
        for _ in range(50)
    ]
    nonces = {e.nonce for e in envelopes}
    assert len(nonces) == 50
    assert all(len(base64.b64decode(n)) == 12 for n in nonces)
    assert len({e.ciphertext for e in envelopes}) == 50
    assert {e.cipher for e in envelopes} == {"aes-256-gcm"}
    assert {e.format for e in envelopes} == {"effecthost.sealed/2"}


@pytest.mark.parametrize(
    ("group", "replay_key"),
    [(GROUP, "r2"), (OTHER_GROUP, "r1"), ("tenant-8:group:abc123:0", "r1")],
    ids=["other-slot", "other-group", "other-scope"],
)
@pytest.mark.parametrize("size", [10, 10_000], ids=["inline", "by-reference"])
async def test_a_sealed_value_moved_to_another_slot_fails_typed(
    group: str, replay_key: str, size: int
) -> None:
    keys = InMemoryKeyStore()
    policy = sealed_policy(keys)
    stored = await encode_outcome(
        policy, GROUP, "r1", Outcome.success(SECRET + "p" * size), position=0
    )
    with pytest.raises(SealedPayloadUnreadable) as caught:
        await decode_outcome(policy, group, replay_key, stored, rank=1, position=0)
    assert (caught.value.group_key, caught.value.replay_key, caught.value.rank) == (
        group,
        replay_key,
        1,
    )
    assert_no_leak(caught.value, SECRET, envelope_of_or_ref(stored))


def envelope_of_or_ref(stored: StoredOutcome) -> str:
    return stored.envelope.ciphertext[:40] if stored.envelope else SECRET


async def test_a_sealed_value_never_decodes_without_a_key_store() -> None:
    stored = await encode_outcome(
        sealed_policy(InMemoryKeyStore()),
        GROUP,
        "r1",
        Outcome.success(SECRET),
        position=0,
    )
    for policy in (None, PayloadPolicy(), PayloadPolicy(store=MemoryPayloadStore())):
        with pytest.raises(SealedPayloadUnreadable) as caught:
            await decode_outcome(policy, GROUP, "r1", stored, position=0)
        assert_no_leak(caught.value, SECRET, envelope_of(stored).ciphertext[:40])


async def test_wrong_key_unknown_cipher_and_tampering_are_unreadable() -> None:
    keys = InMemoryKeyStore()
    policy = sealed_policy(keys)
    stored = await encode_outcome(policy, GROUP, "r1", Outcome.success(SECRET), position=0)
    envelope = envelope_of(stored)
    ciphertext = envelope.ciphertext

    other = InMemoryKeyStore()  # a key store that never held the key
    wrong_material = InMemoryKeyStore()  # the same key id, other material
    wrong_material.add(default_scope(GROUP), envelope.key_id, b"\x01" * 32)
    raw = bytearray(base64.b64decode(ciphertext))
    raw[0] ^= 1
    tampered = envelope.model_copy(update={"ciphertext": base64.b64encode(bytes(raw)).decode()})
    cases = [
        (sealed_policy(other), stored),
        (sealed_policy(wrong_material), stored),
        (
            policy,
            StoredOutcome(
                form="sealed", sealed=True, envelope=envelope.model_copy(update={"cipher": "rot13"})
            ),
        ),
        (policy, StoredOutcome(form="sealed", sealed=True, envelope=tampered)),
        (
            policy,
            StoredOutcome(
                form="sealed", sealed=True, envelope=envelope.model_copy(update={"nonce": "!!"})
            ),
        ),
    ]
    for reader, value in cases:
        with pytest.raises(SealedPayloadUnreadable) as caught:
            await decode_outcome(reader, GROUP, "r1", value, position=0)
        assert_no_leak(caught.value, SECRET, ciphertext[:40], ciphertext[-40:])
        assert not isinstance(caught.value, PayloadShredded)


async def test_a_by_reference_envelope_is_never_decoded_as_plaintext() -> None:
    store = MemoryPayloadStore()
    stored = await encode_outcome(
        sealed_policy(InMemoryKeyStore(), store),
        GROUP,
        "r1",
        Outcome.success(SECRET * 300),
        position=0,
    )
    assert stored.ref is not None
    forged = StoredOutcome(form="ref", ref=stored.ref, sealed=False)  # the marker stripped
    with pytest.raises(SealedPayloadUnreadable):
        await decode_outcome(PayloadPolicy(store=store), GROUP, "r1", forged, position=0)


def test_envelope_repr_never_shows_ciphertext() -> None:
    envelope = SealedEnvelope(
        cipher="aes-256-gcm", scope="s", key_id="k", nonce="n", ciphertext="SECRETBYTES"
    )
    assert "SECRETBYTES" not in repr(envelope) and "SECRETBYTES" not in str(envelope)


async def test_rotation_new_seals_use_the_newest_key_old_ones_still_open() -> None:
    keys = InMemoryKeyStore()
    policy = sealed_policy(keys)
    old = await encode_outcome(policy, GROUP, "r1", Outcome.success("old"), position=0)
    new_id = keys.rotate(default_scope(GROUP))
    new = await encode_outcome(policy, GROUP, "r2", Outcome.success("new"), position=0)
    assert envelope_of(new).key_id == new_id != envelope_of(old).key_id
    assert (await decode_outcome(policy, GROUP, "r1", old, position=0)).value == "old"
    assert (await decode_outcome(policy, GROUP, "r2", new, position=0)).value == "new"


async def test_destroying_a_scope_shreds_its_payloads_only() -> None:
    keys = InMemoryKeyStore()
    store = MemoryPayloadStore()
    policy = sealed_policy(keys, store)
    inline = await encode_outcome(policy, GROUP, "r1", Outcome.success(SECRET), position=0)
    keys.rotate(default_scope(GROUP))
    by_ref = await encode_outcome(policy, GROUP, "r2", Outcome.success(SECRET * 500), position=0)
    kept = await encode_outcome(
        policy, "tenant-8:group:x:0", "r1", Outcome.success("kept"), position=0
    )
    assert keys.destroy("tenant-7") == 2
    for replay_key, stored in (("r1", inline), ("r2", by_ref)):
        with pytest.raises(PayloadShredded) as caught:
            await decode_outcome(policy, GROUP, replay_key, stored, rank=1, position=0)
        assert caught.value.replay_key == replay_key and caught.value.rank == 1
        assert_no_leak(caught.value, SECRET)
        # only the store that destroyed the key says so
        with pytest.raises(SealedPayloadUnreadable):
            await decode_outcome(
                sealed_policy(InMemoryKeyStore(), store),
                GROUP,
                replay_key,
                stored,
                position=0,
            )
    assert (
        await decode_outcome(policy, "tenant-8:group:x:0", "r1", kept, position=0)
    ).value == "kept"
    fresh = await encode_outcome(policy, GROUP, "r3", Outcome.success("after"), position=0)
    assert (await decode_outcome(policy, GROUP, "r3", fresh, position=0)).value == "after"


async def test_the_key_scope_is_configurable() -> None:
    keys = InMemoryKeyStore()
    policy = PayloadPolicy(sealer=AesGcmSealer(keys, scope_of=lambda key: key))
    stored = await encode_outcome(policy, GROUP, "r1", Outcome.success(1), position=0)
    assert envelope_of(stored).scope == GROUP
    keys.destroy("tenant-7")
    assert (await decode_outcome(policy, GROUP, "r1", stored, position=0)).value == 1
    keys.destroy(GROUP)
    with pytest.raises(PayloadShredded):
        await decode_outcome(policy, GROUP, "r1", stored, position=0)


def test_default_scope() -> None:
    assert default_scope("a:b:group:0123:4") == "a:b"
    assert default_scope("plain-key") == "plain-key"


async def test_file_key_store_persists_across_instances(tmp_path: Path) -> None:
    first = FileKeyStore(tmp_path / "keys")
    stored = await encode_outcome(
        sealed_policy(first), GROUP, "r1", Outcome.success(SECRET), position=0
    )
    second = FileKeyStore(tmp_path / "keys")
    assert (
        await decode_outcome(sealed_policy(second), GROUP, "r1", stored, position=0)
    ).value == SECRET
    new_id = second.rotate("tenant-7")
    assert first.current("tenant-7")[0] == new_id
    key_files = files(tmp_path / "keys", "*.key")
    assert key_files and all(p.stat().st_mode & 0o077 == 0 for p in key_files)
    assert "tenant-7" not in " ".join(str(p) for p in files(tmp_path / "keys"))

    assert first.destroy("tenant-7") == 2
    assert not files(tmp_path / "keys", "*.key")
    third = FileKeyStore(tmp_path / "keys")
    with pytest.raises(PayloadShredded):
        await decode_outcome(sealed_policy(third), GROUP, "r1", stored, position=0)
    with pytest.raises(SealedPayloadUnreadable):
        await decode_outcome(
            sealed_policy(FileKeyStore(tmp_path / "elsewhere")),
            GROUP,
            "r1",
            stored,
            position=0,
        )


def test_key_stores_never_show_key_material() -> None:
    keys = InMemoryKeyStore()
    _, material = keys.current("s")
    assert material.hex() not in repr(keys) and repr(material) not in repr(keys)
    assert repr(material) not in repr(AesGcmSealer(keys))
    with pytest.raises(ValueError):
        keys.add("s", "k", b"short")


def test_payload_ref_rejects_unsafe_names() -> None:
    with pytest.raises(ValueError):
        PayloadRef(group_key=GROUP, replay_key="r", name="../x", size=1, digest="0" * 64)


async def test_g49_an_envelope_in_a_plaintext_slot_is_refused_not_served() -> None:
    from effecthost.contract import Outcome, SealedPayloadUnreadable
    from effecthost.payloads import (
        AesGcmSealer,
        InMemoryKeyStore,
        PayloadPolicy,
        StoredOutcome,
        decode_outcome,
    )

    sealer = AesGcmSealer(InMemoryKeyStore())
    envelope = sealer.seal(
        "s:group:g:0", "s:group:g:0:0", b'{"status":"success","value":1}', position=0
    )
    smuggled = StoredOutcome(
        form="inline", outcome=Outcome.success(envelope.model_dump(mode="json"))
    )
    for policy in (
        PayloadPolicy(sealer=sealer),
        PayloadPolicy(sealer=sealer, accept_plaintext=True),
    ):
        with pytest.raises(SealedPayloadUnreadable) as caught:
            await decode_outcome(
                policy, "s:group:g:0", "s:group:g:0:0", smuggled, rank=1, position=0
            )
        assert caught.value.rank == 1
        assert envelope.ciphertext not in str(caught.value)
