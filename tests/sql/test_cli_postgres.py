"""``effecthost inspect`` and ``drain --postgres`` against a bad DSN, an unreachable server
and a schema without effecthost tables (SPEC §7): one line, an exit code of its own, and
nothing created by inspect."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from cli_support import cli

from effecthost.cli import ExitCode
from effecthost.hosts.sql import postgres_host
from effecthost.hosts.sql.testing import free_port


def assert_one_line(run: subprocess.CompletedProcess[str], code: int, word: str) -> None:
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effecthost: "), run.stderr
    assert word in lines[0], lines
    assert "secret-pw" not in run.stderr  # a DSN's password never reaches the message


async def _schemas(dsn: str) -> set[str]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return {r[0] for r in await conn.fetch("SELECT nspname FROM pg_namespace")}
    finally:
        await conn.close()


async def _tables(dsn: str, schema: str) -> set[str]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
        return {r[0] for r in rows}
    finally:
        await conn.close()


@pytest.mark.parametrize("command", ["inspect", "drain"])
def test_a_malformed_dsn_is_one_line(command: str) -> None:
    """SPEC §7: a malformed DSN is refused in one line (exit bad-dsn)."""
    extra = ["--once"] if command == "drain" else []
    run = cli(command, "--postgres", "postgresql://u:secret-pw@127.0.0.1:notaport/db", *extra)
    assert_one_line(run, ExitCode.BAD_DSN, "malformed DSN")


@pytest.mark.parametrize("command", ["inspect", "drain"])
def test_an_unreachable_server_is_one_line(command: str) -> None:
    """SPEC §7: nothing listening is reported in one line (exit unreachable)."""
    extra = ["--once"] if command == "drain" else []
    dsn = f"postgresql://u:secret-pw@127.0.0.1:{free_port()}/db"
    run = cli(command, "--postgres", dsn, "--connect-timeout", "5", *extra)
    assert_one_line(run, ExitCode.UNREACHABLE, "cannot connect")


@pytest.mark.parametrize("command", ["inspect", "drain"])
def test_a_schema_without_our_tables_is_refused_and_not_created(
    pg_dsn: str, pg_schema: str, command: str
) -> None:
    """SPEC §7: inspect and drain of a schema without effecthost tables create no schema
    and no table; they say so in one line (exit foreign)."""
    extra = ["--once"] if command == "drain" else []
    before = asyncio.run(_schemas(pg_dsn))
    run = cli(command, "--postgres", pg_dsn, "--schema", pg_schema, *extra)
    assert_one_line(run, ExitCode.FOREIGN, "no effecthost tables")
    assert asyncio.run(_schemas(pg_dsn)) == before
    assert pg_schema not in before


def test_inspect_reads_an_existing_schema_in_read_only_transactions(
    pg_dsn: str, pg_schema: str
) -> None:
    """SPEC §7: inspect of a real schema lists it and adds nothing."""

    async def make() -> None:
        host = await postgres_host(pg_dsn, None, schema=pg_schema)
        await host.aclose()

    asyncio.run(make())
    tables = asyncio.run(_tables(pg_dsn, pg_schema))
    run = cli("inspect", "--postgres", pg_dsn, "--schema", pg_schema)
    assert run.returncode == 0, run.stderr
    assert "0 open group(s)" in run.stderr
    assert asyncio.run(_tables(pg_dsn, pg_schema)) == tables
