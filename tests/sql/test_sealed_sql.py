"""Payload references and sealed settlements on the SQL tier (G-47…G-50), both substrates.

Nothing sealed appears in plaintext in the SQLite file (nor its WAL) or in any text/bytea
column of the library's PostgreSQL tables, while a keyed reader gets the value; a reader
without the key (or with the wrong one) is refused and the rows stay byte-identical; a
retired group's payload rows are gone; an older schema version is refused.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import sqlite3
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from group_support import group as effect_group
from sql_support import Substrate, group, tool

from effecthost.contract import (
    EffectEnvelope,
    EffectGroup,
    EffectKind,
    InvalidEnvelope,
    PayloadMissing,
    SealedPayloadUnreadable,
    ToolRegistry,
    group_key,
)
from effecthost.hosts.sql import (
    SCHEMA_VERSION,
    SchemaVersionError,
    SqlEffectHost,
    SqliteStore,
)
from effecthost.hosts.sql.testing import sqlite_sql
from effecthost.payloads import AesGcmSealer, InMemoryKeyStore, PayloadPolicy, StoredOutcome

pytestmark = pytest.mark.anyio

TABLES = ("eh_groups", "eh_children", "eh_payloads", "eh_retired", "eh_schema")
LARGE = 64 * 1024


def _registry(secret: str) -> ToolRegistry:
    async def reveal(size: Any) -> Any:
        if size == "large":
            return {"secret": secret, "blob": "L" * LARGE}
        return {"secret": secret}

    return ToolRegistry({"reveal": reveal})


def _group(scope: str) -> EffectGroup:
    key = group_key(scope, "g", 0)
    return group(key, [tool(f"{key}.{size}", size, "reveal") for size in ("small", "large")])


def _host(sub: Substrate, resolver: ToolRegistry, payloads: PayloadPolicy | None) -> SqlEffectHost:
    return SqlEffectHost(
        sub.make_store(), resolver, lease_ttl=3.0, renew_every=0.5, poll_interval=0.05,
        payloads=payloads,
    )  # fmt: skip


def _sealing_and_reader(sub: Substrate) -> tuple[str, EffectGroup, SqlEffectHost, SqlEffectHost]:
    """A secret, a group of tools that reveal it, a host that seals their outcomes and a
    reader with the same key."""
    secret = f"plain-{secrets.token_hex(8)}"
    keys = InMemoryKeyStore()
    host = _host(sub, _registry(secret), PayloadPolicy(sealer=AesGcmSealer(keys)))
    reader = _host(sub, _registry("unused"), PayloadPolicy(sealer=AesGcmSealer(keys)))
    return secret, _group(f"t{secrets.token_hex(4)}"), host, reader


async def _settle(host: SqlEffectHost, group: EffectGroup) -> None:
    await host.open_effect_group(group)
    for _ in range(400):
        if len(await host.settlement_order(group.key)) == group.child_count:
            return
        await asyncio.sleep(0.01)  # waiting for the children to run, not ordering
    raise AssertionError("the children did not settle")


# the group's owner-lease expiry is a heartbeat the owner's keeper renews while the group
# is open: not a change the operation under test makes
_GROUPS = (
    "SELECT group_key, wake, disposition, effective, child_count, counter, state, created_at, "
    "closed_at, owner FROM eh_groups"
)


def _select_all(table: str) -> str:
    return _GROUPS if table == "eh_groups" else f"SELECT * FROM {table}"


async def _dump(sub: Substrate) -> list[Any]:
    """Every row of the library's tables, in a fixed order, as raw values (but the
    owner-lease expiry)."""
    out = []
    for table in TABLES:
        rows = (
            await sub.sql(f"{_select_all(table)} ORDER BY 1, 2", ())
            if table != ("eh_schema")
            else await sub.sql("SELECT * FROM eh_schema", ())
        )
        out.append((table, [tuple(r) for r in rows]))
    return out


async def _postgres_columns(sub: Substrate) -> list[bytes]:
    """Every text and bytea value of the library's tables in the test schema."""
    columns = await sub.sql(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND data_type IN ('text', 'bytea')",
        (),
    )
    assert {c[0] for c in columns} >= {"eh_children", "eh_payloads", "eh_groups"}
    values: list[bytes] = []
    for table, column, kind in columns:
        for (value,) in await sub.sql(f"SELECT {column} FROM {table}", ()):
            if value is not None:
                values.append(bytes(value) if kind == "bytea" else str(value).encode())
    return values


def _sqlite_bytes(path: Path) -> list[bytes]:
    files = [path, path.with_name(path.name + "-wal")]
    return [f.read_bytes() for f in files if f.exists()]


async def test_nothing_sealed_is_stored_in_plaintext_and_a_keyed_reader_reads_it(
    substrate: Substrate,
) -> None:
    secret, group, host, reader = _sealing_and_reader(substrate)
    async with aclosing(reader), aclosing(host):
        await _settle(host, group)
        forms = {
            key: StoredOutcome.model_validate_json(row[0]).form
            for key in (f"{group.key}.small", f"{group.key}.large")
            for row in await substrate.sql(
                "SELECT outcome FROM eh_children WHERE replay_key = {0}", (key,)
            )
        }
        assert forms == {f"{group.key}.small": "sealed", f"{group.key}.large": "ref"}
        handle = group.handle()
        values = [(await reader.await_next_settlement(handle)).outcome.value for _ in range(2)]
        assert {v["secret"] for v in values} == {secret}
        assert any(v.get("blob") == "L" * LARGE for v in values)

        needles = (secret.encode(), b"L" * 256)
        if substrate.path is not None:
            before = _sqlite_bytes(substrate.path)  # the WAL holds every page written
            await substrate.sql("PRAGMA wal_checkpoint(FULL)", ())
            after = _sqlite_bytes(substrate.path)  # the checkpointed file
            assert len(after) == 2 and after[0]
            for blob in before + after:
                assert not any(needle in blob for needle in needles)
        else:
            values_ = await _postgres_columns(substrate)
            assert any(b"effecthost.sealed/2" in v for v in values_)
            for blob in values_:
                assert not any(needle in blob for needle in needles)


async def test_without_a_policy_the_same_outcome_is_plaintext_in_the_sqlite_file(
    tmp_path: Path,
) -> None:
    """The control of the test above: the search does find an unsealed outcome."""
    secret = f"plain-{secrets.token_hex(8)}"
    path = tmp_path / "plain.sqlite3"
    sub = Substrate("sqlite", lambda: SqliteStore(path), sqlite_sql(path), path)
    host = _host(sub, _registry(secret), None)
    async with aclosing(host):
        group = _group("control")
        await _settle(host, group)
        row = await sub.sql("SELECT outcome FROM eh_children WHERE replay_key = {0}", (
            f"{group.key}.small",
        ))  # fmt: skip
        assert row[0][0].startswith('{"status"')  # the default form, unchanged
        assert any(secret.encode() in blob for blob in _sqlite_bytes(path))


async def test_a_reader_without_the_key_is_refused_and_the_rows_are_byte_identical(
    substrate: Substrate,
) -> None:
    secret = f"plain-{secrets.token_hex(8)}"
    keys = InMemoryKeyStore()
    group = _group(f"t{secrets.token_hex(4)}")
    host = _host(substrate, _registry(secret), PayloadPolicy(sealer=AesGcmSealer(keys)))
    none = _host(substrate, _registry("unused"), PayloadPolicy())
    wrong = _host(substrate, _registry("unused"), PayloadPolicy(sealer=AesGcmSealer(
        InMemoryKeyStore()
    )))  # fmt: skip
    plain = _host(substrate, _registry("unused"), None)  # no policy at all
    right = _host(substrate, _registry("unused"), PayloadPolicy(sealer=AesGcmSealer(keys)))
    try:
        await _settle(host, group)
        before = await _dump(substrate)
        for reader in (none, wrong, plain):
            for consumed in (0, 1):
                cursor = group.handle()
                cursor.consumed = consumed
                with pytest.raises(SealedPayloadUnreadable) as raised:
                    await reader.await_next_settlement(cursor)
                assert cursor.consumed == consumed
                assert raised.value.group_key == group.key
                assert secret not in f"{raised.value!s} {raised.value!r} {vars(raised.value)!r}"
        assert await _dump(substrate) == before
        handle = group.handle()
        got = [(await right.await_next_settlement(handle)).outcome.value for _ in range(2)]
        assert {v["secret"] for v in got} == {secret}
    finally:
        for h in (host, none, wrong, plain, right):
            await h.aclose()


async def test_a_sealed_outcome_moved_to_another_group_fails_and_retirement_deletes_payloads(
    substrate: Substrate,
) -> None:
    """The SQL tier keys child rows by replay key, so the other slot is another group's
    child: the associated data (group key and replay key) no longer matches."""
    keys = InMemoryKeyStore()
    host = _host(substrate, _registry("s"), PayloadPolicy(sealer=AesGcmSealer(keys)))
    a, b = _group(f"a{secrets.token_hex(4)}"), _group(f"b{secrets.token_hex(4)}")
    async with aclosing(host):
        await _settle(host, a)
        await _settle(host, b)
        for size in ("small", "large"):
            await substrate.sql(
                "UPDATE eh_children SET outcome = (SELECT outcome FROM eh_children "
                "WHERE replay_key = {0}) WHERE replay_key = {1}",
                (f"{a.key}.{size}", f"{b.key}.{size}"),
            )
        for consumed in (0, 1):
            cursor = b.handle()
            cursor.consumed = consumed
            with pytest.raises(SealedPayloadUnreadable):
                await host.await_next_settlement(cursor)
            assert cursor.consumed == consumed

        count = "SELECT count(*) FROM eh_payloads WHERE group_key = {0}"
        assert (await substrate.sql(count, (a.key,)))[0][0] == 1
        handle = a.handle()
        for _ in range(2):
            await host.await_next_settlement(handle)
        await host.close_effect_group(handle)  # every child ranked: the group retires
        assert (await substrate.sql(count, (a.key,)))[0][0] == 0
        assert await substrate.sql("SELECT 1 FROM eh_retired WHERE group_key = {0}", (a.key,))


async def test_a_version_1_database_is_refused_with_schema_version_error(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    store = SqliteStore(path)
    await store.start()
    await store.aclose()
    with sqlite3.connect(path) as conn:  # what a release before the payload table recorded
        conn.execute("UPDATE eh_schema SET version = 1")
    conn.close()
    with pytest.raises(SchemaVersionError) as raised:
        await SqliteStore(path).start()
    assert (raised.value.found, raised.value.expected) == (1, SCHEMA_VERSION)


# -- hostile rows (G-48, G-49, R-10) ----------------------------------------------------


async def _outcome_row(sub: Substrate, group: EffectGroup, seq: int) -> str:
    rows = await sub.sql(
        "SELECT outcome FROM eh_children WHERE group_key = {0} AND seq = {1}", (group.key, seq)
    )
    return str(rows[0][0])


async def _set_outcome(sub: Substrate, group: EffectGroup, seq: int, value: str | bytes) -> None:
    cast = "CAST({0} AS TEXT)" if isinstance(value, bytes) else "{0}"
    await sub.sql(
        f"UPDATE eh_children SET outcome = {cast} WHERE group_key = {{1}} AND seq = {{2}}",
        (value, group.key, seq),
    )


def _raw_dump_sqlite(path: Path) -> list[Any]:
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    conn.text_factory = bytes  # a corrupted row need not be UTF-8
    try:
        return [conn.execute(f"{_select_all(table)} ORDER BY 1").fetchall() for table in TABLES]
    finally:
        conn.close()


async def _raw_dump(sub: Substrate) -> list[Any]:
    if sub.path is not None:
        return await asyncio.to_thread(_raw_dump_sqlite, sub.path)
    return await _dump(sub)


def _corruptions(text: str, rng: random.Random, raw_bytes: bool) -> list[str | bytes]:
    """What the issue's 480 tries did to a recorded outcome, and seeded bit flips."""
    data = text.encode()
    out: list[str | bytes] = [
        "",
        " " + text,
        text[: len(text) // 2],
        text[:-1],
        text.replace('"sealed":true', '"sealed":false'),
        text.replace('"form":"ref"', '"form":"sealed"').replace('"form":"sealed"', '"form":"inline"'),
        "[" * 50_000,
    ]  # fmt: skip
    for _ in range(30):
        at = rng.randrange(len(data))
        bit = rng.randrange(8 if raw_bytes else 7)
        flipped = data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]
        if b"\0" in flipped:
            continue
        try:
            out.append(flipped.decode())
        except UnicodeDecodeError:
            out.append(flipped)  # SQLite keeps a row that is not UTF-8; PostgreSQL cannot
    return out


async def test_g49_corrupted_rows_are_typed_quote_nothing_and_change_nothing(
    substrate: Substrate,
) -> None:
    """G-48, G-49: a child row's outcome truncated, emptied, with a leading space,
    ``"sealed": false`` on a sealed form, another form tag, absurdly deep, or bit-flipped
    (on SQLite also into bytes that are not UTF-8) reads as ``SealedPayloadUnreadable`` /
    ``PayloadMissing`` (never a pydantic or ``sqlite3`` error), quotes no ciphertext, leaves
    the cursor and every row as they were; or it still opens to the sealed value."""
    secret, group, host, reader = _sealing_and_reader(substrate)
    rng = random.Random(480)
    refused = 0
    async with aclosing(reader), aclosing(host):
        await _settle(host, group)
        for seq in (1, 2):
            original = await _outcome_row(substrate, group, seq)
            envelope = StoredOutcome.model_validate_json(original).envelope
            ciphertext = envelope.ciphertext if envelope is not None else None
            for bad in _corruptions(original, rng, substrate.name == "sqlite"):
                await _set_outcome(substrate, group, seq, bad)
                before = await _raw_dump(substrate)
                cursor = group.handle()
                cursor.consumed = seq - 1
                reader._ahead.clear()
                try:
                    got = await reader.await_next_settlement(cursor)
                except (SealedPayloadUnreadable, PayloadMissing) as exc:
                    assert cursor.consumed == seq - 1
                    text = f"{exc!s} {exc!r} {vars(exc)!r}"
                    assert secret not in text
                    assert ciphertext is None or not any(
                        ciphertext[i : i + 12] in text for i in range(len(ciphertext) - 12)
                    )
                    refused += 1
                else:
                    assert got.outcome.value["secret"] == secret
                assert await _raw_dump(substrate) == before
            await _set_outcome(substrate, group, seq, original)
        assert refused >= 50


async def test_r10_swapped_position_columns_are_refused(substrate: Substrate) -> None:
    """R-10: swapping two children's position columns no longer delivers a correctly
    keyed value under the wrong position: each read is refused, the cursor and the rows
    stay; swapping back reads both again."""
    keys = InMemoryKeyStore()
    group = _group(f"t{secrets.token_hex(4)}")
    host = _host(substrate, _registry("s"), PayloadPolicy(sealer=AesGcmSealer(keys)))
    small, large = f"{group.key}.small", f"{group.key}.large"

    async def swap() -> None:
        move = "UPDATE eh_children SET position = {0} WHERE replay_key = {1}"
        old = {
            key: (await substrate.sql("SELECT position FROM eh_children WHERE replay_key = {0}", (key,)))[0][0]
            for key in (small, large)
        }  # fmt: skip
        await substrate.sql(move, (-1, small))
        await substrate.sql(move, (old[small], large))
        await substrate.sql(move, (old[large], small))

    async with aclosing(host):
        await _settle(host, group)
        await swap()
        reader = _host(substrate, _registry("unused"), PayloadPolicy(sealer=AesGcmSealer(keys)))
        async with aclosing(reader):
            before = await _dump(substrate)
            for consumed in (0, 1):
                cursor = group.handle()
                cursor.consumed = consumed
                reader._ahead.clear()
                with pytest.raises(SealedPayloadUnreadable):
                    await reader.await_next_settlement(cursor)
                assert cursor.consumed == consumed
            assert await _dump(substrate) == before
            await swap()
            reader._ahead.clear()
            handle = group.handle()
            got = [await reader.await_next_settlement(handle) for _ in range(2)]
            assert {(s.position, s.replay_key) for s in got} == {(0, small), (1, large)}


async def test_g49_forged_plaintext_in_a_sealed_sql_row_is_refused_unless_mixed(
    substrate: Substrate,
) -> None:
    """G-49, ADR 0130 D8: a plain outcome written into a child row of a sealing host (the
    default form of a host without a policy) is refused; a reader declaring
    ``accept_plaintext`` reads it."""
    keys = InMemoryKeyStore()
    group = _group(f"t{secrets.token_hex(4)}")
    host = _host(substrate, _registry("s"), PayloadPolicy(sealer=AesGcmSealer(keys)))
    mixed = _host(
        substrate,
        _registry("unused"),
        PayloadPolicy(sealer=AesGcmSealer(keys), accept_plaintext=True),
    )
    async with aclosing(mixed), aclosing(host):
        await _settle(host, group)
        await _set_outcome(
            substrate, group, 1, '{"status":"success","value":"forged","error":null}'
        )
        host._ahead.clear()
        with pytest.raises(SealedPayloadUnreadable):
            await host.await_next_settlement(group.handle())
        assert (await mixed.await_next_settlement(group.handle())).outcome.value == "forged"


async def test_g49_an_event_payload_shaped_like_an_envelope_is_refused_and_records_nothing(
    substrate: Substrate,
) -> None:
    """G-49, ADR 0130 D6: an event payload carrying a sealed envelope's shape is
    ``InvalidEnvelope`` and the rows stay byte-identical."""
    key = group_key(f"t{secrets.token_hex(4)}", "g", 0)
    group = effect_group(
        key, [EffectEnvelope(replay_key=f"{key}.ev", kind=EffectKind.AWAIT_EVENT, name="ev")]
    )
    host = _host(substrate, _registry("s"), PayloadPolicy(sealer=AesGcmSealer(InMemoryKeyStore())))
    async with aclosing(host):
        await host.open_effect_group(group)
        before = await _dump(substrate)
        forged = [{"format": "effecthost.sealed/2", "ciphertext": "QUJD"}]
        with pytest.raises(InvalidEnvelope):
            await host.deliver_event(key, "ev", {"x": forged})
        assert await _dump(substrate) == before
