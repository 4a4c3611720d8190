"""The PostgreSQL substrate (extra ``postgres``: asyncpg, loaded lazily).

Every table and function lives in one schema (``effecthost`` by default), so several
deployments or test runs can share a server. Decisions are taken under row locks, so READ
COMMITTED is enough: a fenced UPDATE that waited for a takeover's lock re-checks its
WHERE clause against the new row version and matches nothing.

The finalize is one round trip: the plpgsql function ``eh_finalize`` runs the normative
order of G-31 (fenced UPDATE of the child row; no counter bump when it matched nothing;
``counter = counter + 1 … RETURNING`` on the group row, written back as the child's
sequence) inside the caller's single-statement transaction, and ``pg_notify`` wakes
waiters in every process at commit (G-21). ``eh_finalize_many_open`` is the batched form
for several children of one group: every fenced UPDATE first, then one counter bump for
those that matched, also one round trip (row by row for a small batch; set-based and
planned per call for a large one).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import logging
import random
import re
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from typing import Any, ParamSpec, TypeVar

from effecthost.hosts import require

from ._preflight import DatabaseProblem, DatabaseRefused
from ._store import (
    CREATE_GROUP,
    G_COLUMNS,
    SCHEMA_VERSION,
    ChildSpec,
    Claim,
    Closed,
    Decide,
    Expected,
    Finalize,
    GroupRow,
    Opened,
    OpenRequest,
    Renewal,
    ReplayKeyTaken,
    SchemaVersionError,
    Sent,
    SqlStore,
    _mark,
    group_row,
    tables,
)

NOW = "extract(epoch from clock_timestamp())::float8"
"""The database clock in epoch seconds (``clock_timestamp``: not frozen at tx start)."""

# the batched finalize (G-31) for large batches, set-based and planned for each call's own
# size (a plan cached for small batches would scan every child the owner holds, once per
# child of the batch): every fenced UPDATE first, then one counter bump
_FINALIZE_MANY_PLANNED = f"""CREATE OR REPLACE FUNCTION eh_finalize_many_planned(
            p_keys text[], p_hashes text[], p_owner text, p_fences bigint[],
            p_outcomes text[], p_channel text)
        RETURNS bigint[] LANGUAGE plpgsql
        SET plan_cache_mode = force_custom_plan AS $$
        DECLARE
            n integer := coalesce(array_length(p_keys, 1), 0);
            seqs bigint[] := array_fill(NULL::bigint, ARRAY[n]);
            matched integer[];
            matched_keys text[];
            groups text[];
            m integer;
            top bigint;
            w boolean;
        BEGIN
            -- (1) the fenced UPDATE of every child of the batch, each row on its own five
            -- fence columns: every child row is locked before the group row
            WITH done AS (
                UPDATE eh_children c SET state = 'settled', outcome = u.outcome,
                       lease_owner = NULL, lease_expires = NULL, settled_at = {NOW}
                  FROM unnest(p_keys, p_hashes, p_fences, p_outcomes)
                       WITH ORDINALITY AS u(key, hash, fence, outcome, i)
                 WHERE c.replay_key = u.key AND c.envelope_hash = u.hash
                   AND c.lease_owner = p_owner AND c.fence = u.fence AND c.state = 'claimed'
                RETURNING u.i, u.key, c.group_key)
            SELECT array_agg(i ORDER BY i), array_agg(key ORDER BY i),
                   array_agg(DISTINCT group_key)
              INTO matched, matched_keys, groups FROM done;
            -- (2) no fenced update matched: nothing written, no counter bump
            m := coalesce(array_length(matched, 1), 0);
            IF m = 0 THEN
                RETURN seqs;
            END IF;
            IF array_length(groups, 1) > 1 THEN
                RAISE EXCEPTION 'eh_finalize_many: children of one group only';
            END IF;
            -- (3) one bump for the m that matched; sequences in the order given
            UPDATE eh_groups SET counter = counter + m WHERE group_key = groups[1]
            RETURNING counter, watched INTO top, w;
            -- joined on the matched keys themselves: a subscript of a text array walks
            -- it from the start, once per row
            UPDATE eh_children c SET seq = top - m + r.k
              FROM unnest(matched_keys) WITH ORDINALITY AS r(key, k)
             WHERE c.replay_key = r.key;
            FOR k IN 1..m LOOP
                seqs[matched[k]] := top - m + k;
            END LOOP;
            IF w THEN
                PERFORM pg_notify(p_channel, 's:' || groups[1]);
            END IF;
            RETURN seqs;
        END $$"""

DDL = [
    *tables(
        text="text",
        int="integer",
        big="bigint",
        real="float8",
        bool="boolean",
        false="false",
        blob="bytea",
    ),
    f"""CREATE OR REPLACE FUNCTION eh_finalize(
            p_key text, p_hash text, p_owner text, p_fence bigint, p_outcome text,
            p_channel text)
        RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            g text;
            s bigint;
            w boolean;
        BEGIN
            -- (1) the fenced UPDATE of the child row, on all five fence columns
            UPDATE eh_children SET state = 'settled', outcome = p_outcome,
                   lease_owner = NULL, lease_expires = NULL, settled_at = {NOW}
             WHERE replay_key = p_key AND envelope_hash = p_hash AND lease_owner = p_owner
               AND fence = p_fence AND state = 'claimed'
            RETURNING group_key INTO g;
            -- (2) rowcount 0: nothing was written; no counter bump
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
            -- (3) rowcount 1: bump the counter in the statement that reads it (child row
            -- locked first, then the group row) and write it as the child's sequence
            UPDATE eh_groups SET counter = counter + 1 WHERE group_key = g
            RETURNING counter, watched INTO s, w;
            UPDATE eh_children SET seq = s WHERE replay_key = p_key;
            -- (4) wake other processes only when a waiter watches the group: its flag is
            -- set under this row's lock, so it is read here after any such waiter committed
            IF w THEN
                PERFORM pg_notify(p_channel, 's:' || g);
            END IF;
            RETURN s;
        END $$""",
    _FINALIZE_MANY_PLANNED,
    f"""CREATE OR REPLACE FUNCTION eh_claim(p_key text, p_owner text, p_ttl float8)
        RETURNS TABLE (fence bigint, attempt integer, cancel_requested boolean,
                       lease_expires float8)
        LANGUAGE sql AS $$
            UPDATE eh_children c SET lease_owner = p_owner, fence = c.fence + 1,
                   lease_expires = {NOW} + p_ttl, attempt = c.attempt + 1, state = 'claimed'
             WHERE c.replay_key = p_key AND c.state <> 'settled'
               AND (c.lease_owner IS NULL OR c.lease_expires < {NOW})
            RETURNING c.fence, c.attempt, c.cancel_requested, c.lease_expires
        $$""",
    """CREATE OR REPLACE FUNCTION eh_settle_free(
            p_key text, p_owner text, p_outcome text, p_channel text)
        RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            f bigint;
            h text;
        BEGIN
            SELECT c.fence INTO f FROM eh_claim(p_key, p_owner, 60.0) AS c;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
            SELECT envelope_hash INTO h FROM eh_children WHERE replay_key = p_key;
            RETURN eh_finalize(p_key, h, p_owner, f, p_outcome, p_channel);
        END $$""",
    # the finalizes above, unchanged, then whether the group row read ``open`` at that
    # commit: the counter bump holds the group row's lock to the commit, so no close can
    # commit in between, and a later close retires the group itself
    """CREATE OR REPLACE FUNCTION eh_finalize_open(
            p_key text, p_hash text, p_owner text, p_fence bigint, p_outcome text,
            p_channel text, OUT seq bigint, OUT still_open boolean)
        LANGUAGE plpgsql AS $$
        BEGIN
            seq := eh_finalize(p_key, p_hash, p_owner, p_fence, p_outcome, p_channel);
            IF seq IS NOT NULL THEN
                SELECT g.state = 'open' INTO still_open FROM eh_children c
                  JOIN eh_groups g ON g.group_key = c.group_key WHERE c.replay_key = p_key;
            END IF;
        END $$""",
    # the batched finalize (G-31) and, in the same transaction, whether the group row
    # read ``open`` under its lock: each child of a small batch through its own fenced
    # UPDATE in the order given (every child row locked before the group row), then one
    # counter bump for those that matched, sequences in the order they matched
    f"""CREATE OR REPLACE FUNCTION eh_finalize_many_open(
            p_keys text[], p_hashes text[], p_owner text, p_fences bigint[],
            p_outcomes text[], p_channel text, OUT seqs bigint[], OUT still_open boolean)
        LANGUAGE plpgsql AS $$
        DECLARE
            n integer := coalesce(array_length(p_keys, 1), 0);
            matched integer[] := '{{}}';
            m integer;
            g text;
            grp text;
            top bigint;
            st text;
            w boolean;
        BEGIN
            -- every child row of the batch locked by key before any is written (G-32)
            PERFORM 1 FROM eh_children WHERE replay_key = ANY(p_keys)
               AND lease_owner = p_owner AND state = 'claimed'
             ORDER BY replay_key FOR UPDATE;
            IF n > 32 THEN
                seqs := eh_finalize_many_planned(p_keys, p_hashes, p_owner, p_fences,
                                                 p_outcomes, p_channel);
                FOR i IN 1..n LOOP
                    IF seqs[i] IS NOT NULL THEN
                        SELECT gr.state = 'open' INTO still_open FROM eh_children c
                          JOIN eh_groups gr ON gr.group_key = c.group_key
                         WHERE c.replay_key = p_keys[i];
                        RETURN;
                    END IF;
                END LOOP;
                RETURN;
            END IF;
            seqs := array_fill(NULL::bigint, ARRAY[n]);
            -- (1) each child through its own fenced UPDATE, on all five fence columns
            FOR i IN 1..n LOOP
                UPDATE eh_children SET state = 'settled', outcome = p_outcomes[i],
                       lease_owner = NULL, lease_expires = NULL, settled_at = {NOW}
                 WHERE replay_key = p_keys[i] AND envelope_hash = p_hashes[i]
                   AND lease_owner = p_owner AND fence = p_fences[i] AND state = 'claimed'
                RETURNING group_key INTO g;
                IF FOUND THEN
                    IF grp IS NULL THEN
                        grp := g;
                    ELSIF grp <> g THEN
                        RAISE EXCEPTION 'eh_finalize_many: children of one group only';
                    END IF;
                    matched := matched || i;
                END IF;
            END LOOP;
            -- (2) no fenced update matched: nothing written, no counter bump
            m := coalesce(array_length(matched, 1), 0);
            IF m = 0 THEN
                RETURN;
            END IF;
            -- (3) one bump for the m that matched; sequences in the order they matched
            UPDATE eh_groups SET counter = counter + m WHERE group_key = grp
            RETURNING counter, state, watched INTO top, st, w;
            still_open := st = 'open';
            FOR k IN 1..m LOOP
                seqs[matched[k]] := top - m + k;
                UPDATE eh_children SET seq = top - m + k WHERE replay_key = p_keys[matched[k]];
            END LOOP;
            IF w THEN
                PERFORM pg_notify(p_channel, 's:' || grp);
            END IF;
        END $$""",
    """CREATE OR REPLACE FUNCTION eh_finalize_many(
            p_keys text[], p_hashes text[], p_owner text, p_fences bigint[],
            p_outcomes text[], p_channel text)
        RETURNS bigint[] LANGUAGE sql AS $$
            SELECT seqs FROM eh_finalize_many_open(p_keys, p_hashes, p_owner, p_fences,
                                                   p_outcomes, p_channel)
        $$""",
    # the open: the group row, owned by the opener, and every child row in one
    # transaction, group row first; children in replay-key order, so two opens that
    # share keys wait on each other in one order. Every row it writes is new, so no
    # statement that locks existing rows (child rows by key, then group rows) waits on
    # it: see Store.open_group. Returns the group's created_at, or NULL when another open
    # recorded the group first (nothing written here). A refusal raises and rolls back:
    # EH001 the key was retired meanwhile; EH002 a replay key is held by another group
    # (DETAIL the key, HINT the holder)
    f"""CREATE OR REPLACE FUNCTION eh_open(
            p_key text, p_wake text, p_disposition text, p_count integer, p_owner text,
            p_ttl float8, p_keys text[], p_positions integer[], p_kinds text[],
            p_names text[], p_envelopes text[], p_hashes text[], p_claims boolean[],
            p_sleeps float8[], p_trace text)
        RETURNS float8 LANGUAGE plpgsql AS $$
        DECLARE
            n integer := coalesce(array_length(p_keys, 1), 0);
            created float8 := {NOW};
            done integer;
            taken text;
            holder text;
        BEGIN
            INSERT INTO eh_groups (group_key, wake, disposition, effective, child_count,
                                   created_at, owner, owner_expires, trace_context)
            VALUES (p_key, p_wake, p_disposition, p_disposition, p_count, created,
                    p_owner, {NOW} + p_ttl, p_trace)
            ON CONFLICT (group_key) DO NOTHING;
            IF NOT FOUND THEN
                RETURN NULL;
            END IF;
            PERFORM 1 FROM eh_retired WHERE group_key = p_key;
            IF FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'EH001', MESSAGE = 'effecthost: group retired';
            END IF;
            INSERT INTO eh_children (replay_key, group_key, position, kind, name, envelope,
                   envelope_hash, state, lease_owner, fence, lease_expires, attempt, due_at)
            SELECT k, p_key, p, kd, nm, env, h,
                   CASE WHEN cl THEN 'claimed' ELSE 'pending' END,
                   CASE WHEN cl THEN p_owner END, CASE WHEN cl THEN 1 ELSE 0 END,
                   CASE WHEN cl THEN {NOW} + p_ttl END, CASE WHEN cl THEN 1 ELSE 0 END,
                   CASE WHEN sl IS NOT NULL THEN {NOW} + sl END
              FROM unnest(p_keys, p_positions, p_kinds, p_names, p_envelopes, p_hashes,
                          p_claims, p_sleeps) AS t(k, p, kd, nm, env, h, cl, sl)
             ORDER BY k
            ON CONFLICT DO NOTHING;
            GET DIAGNOSTICS done = ROW_COUNT;
            IF done < n THEN
                SELECT t.k, c.group_key INTO taken, holder
                  FROM unnest(p_keys, p_positions) AS t(k, p)
                  LEFT JOIN eh_children c ON c.replay_key = t.k
                 WHERE c.group_key IS DISTINCT FROM p_key
                 ORDER BY t.p LIMIT 1;
                RAISE EXCEPTION USING ERRCODE = 'EH002',
                    MESSAGE = 'effecthost: replay key held by another group',
                    DETAIL = coalesce(taken, ''), HINT = coalesce(holder, '');
            END IF;
            RETURN created;
        END $$""",
    # the retirement (G-36) in one round trip, the statements of ``retire`` in its order
    # (child rows locked first, then the group row); nothing unless the group is closed
    f"""CREATE OR REPLACE FUNCTION eh_retire(p_key text)
        RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE
            n bigint;
            e text;
        BEGIN
            PERFORM 1 FROM eh_groups WHERE group_key = p_key AND state = 'closed';
            IF NOT FOUND THEN
                RETURN false;
            END IF;
            SELECT count(*) FILTER (WHERE s.state <> 'settled') INTO n
              FROM (SELECT state FROM eh_children WHERE group_key = p_key
                     ORDER BY replay_key FOR UPDATE) s;
            IF n > 0 THEN
                RETURN false;
            END IF;
            DELETE FROM eh_groups WHERE group_key = p_key AND state = 'closed'
            RETURNING effective INTO e;
            IF NOT FOUND THEN
                RETURN false;
            END IF;
            DELETE FROM eh_children WHERE group_key = p_key;
            DELETE FROM eh_payloads WHERE group_key = p_key;
            INSERT INTO eh_retired (group_key, effective, retired_at)
            VALUES (p_key, e, {NOW}) ON CONFLICT DO NOTHING;
            RETURN true;
        END $$""",
    # close (child rows first, then the group row) and, when every child has already
    # settled, the retirement in the same transaction: then every child row is locked
    # before the group row, as ``retire`` locks them. 0: not recorded, 1: closed,
    # 2: closed and retired
    f"""CREATE OR REPLACE FUNCTION eh_close_retire(
            p_key text, p_effective text, p_channel text)
        RETURNS integer LANGUAGE plpgsql AS $$
        DECLARE
            n bigint;
            w boolean;
        BEGIN
            SELECT count(*) INTO n FROM eh_children
             WHERE group_key = p_key AND state <> 'settled';
            IF n = 0 THEN
                SELECT count(*) FILTER (WHERE s.state <> 'settled') INTO n
                  FROM (SELECT state FROM eh_children WHERE group_key = p_key
                         ORDER BY replay_key FOR UPDATE) s;
            END IF;
            IF n > 0 THEN
                IF p_effective = 'cancel' THEN
                    PERFORM 1 FROM eh_children WHERE group_key = p_key AND state <> 'settled'
                     ORDER BY replay_key FOR UPDATE;
                    UPDATE eh_children SET cancel_requested = true
                     WHERE group_key = p_key AND state <> 'settled';
                END IF;
                UPDATE eh_groups SET effective = p_effective, state = 'closed',
                       closed_at = coalesce(closed_at, {NOW})
                 WHERE group_key = p_key;
                IF NOT FOUND THEN
                    RETURN 0;
                END IF;
                -- children left unsettled: their drivers (cancels marked) and waiters
                -- may be in other processes (R-4: a parked waiter learns of the close)
                PERFORM pg_notify(p_channel, 'c:' || p_key);
                RETURN 1;
            END IF;
            -- every child settled: closed and retired at once, the tombstone recording
            -- the disposition this close puts in force
            DELETE FROM eh_groups WHERE group_key = p_key RETURNING watched INTO w;
            IF NOT FOUND THEN
                RETURN 0;
            END IF;
            DELETE FROM eh_children WHERE group_key = p_key;
            DELETE FROM eh_payloads WHERE group_key = p_key;
            INSERT INTO eh_retired (group_key, effective, retired_at)
            VALUES (p_key, p_effective, {NOW}) ON CONFLICT DO NOTHING;
            IF w THEN
                PERFORM pg_notify(p_channel, 'c:' || p_key);
            END IF;
            RETURN 2;
        END $$""",
    # the close of a group as one call (R-2, R-4, G-26, G-36): every child row locked (by
    # key), then the group row, and only when the row reads open with the shape the caller
    # expects, the close (cancel marks under ``cancel``) or, every child settled, the close
    # and the retirement; otherwise nothing is written and the caller decides on the row
    # returned. o_done: 0 nothing written, 1 closed, 2 closed and retired
    f"""CREATE OR REPLACE FUNCTION eh_close_group(
            p_key text, p_count integer, p_wake text, p_declared text, p_effective text,
            p_channel text, OUT o_done integer, OUT o_wake text, OUT o_disposition text,
            OUT o_effective text, OUT o_count integer, OUT o_counter bigint,
            OUT o_state text, OUT o_created float8, OUT o_closed float8,
            OUT o_tombstone text)
        LANGUAGE plpgsql AS $$
        DECLARE
            n bigint;
            w boolean;
        BEGIN
            o_done := 0;
            SELECT count(*) FILTER (WHERE s.state <> 'settled') INTO n
              FROM (SELECT c.state FROM eh_children c WHERE c.group_key = p_key
                     ORDER BY c.replay_key FOR UPDATE) s;
            SELECT g.wake, g.disposition, g.effective, g.child_count, g.counter, g.state,
                   g.created_at, g.closed_at, g.watched
              INTO o_wake, o_disposition, o_effective, o_count, o_counter, o_state,
                   o_created, o_closed, w
              FROM eh_groups g WHERE g.group_key = p_key FOR UPDATE;
            IF NOT FOUND THEN
                SELECT r.effective INTO o_tombstone FROM eh_retired r
                 WHERE r.group_key = p_key;
                RETURN;
            END IF;
            IF p_effective IS NULL OR o_state <> 'open' OR o_count <> p_count
               OR o_wake <> p_wake OR o_disposition <> p_declared THEN
                RETURN;
            END IF;
            -- a watched group wakes its waiters elsewhere; children left unsettled, their
            -- drivers (cancels marked) and waiters, which may be in other processes (R-4)
            IF w OR n > 0 THEN
                PERFORM pg_notify(p_channel, 'c:' || p_key);
            END IF;
            IF n > 0 THEN
                IF p_effective = 'cancel' THEN
                    UPDATE eh_children SET cancel_requested = true
                     WHERE group_key = p_key AND state <> 'settled';
                END IF;
                UPDATE eh_groups SET effective = p_effective, state = 'closed',
                       closed_at = coalesce(closed_at, {NOW})
                 WHERE group_key = p_key;
                o_done := 1;
                RETURN;
            END IF;
            DELETE FROM eh_groups WHERE group_key = p_key;
            DELETE FROM eh_children WHERE group_key = p_key;
            DELETE FROM eh_payloads WHERE group_key = p_key;
            INSERT INTO eh_retired (group_key, effective, retired_at)
            VALUES (p_key, p_effective, {NOW}) ON CONFLICT DO NOTHING;
            o_done := 2;
        END $$""",
    # a waiter's read of the ranks (G-21), marking the group watched first when a child of
    # it is unsettled and not in p_local (the children the waiter's own host drives, which
    # wake it in-process): the finalizes and closes that follow then notify. The mark is
    # its own statement under the group row's lock, so a finalize either bumped the
    # counter before it (and committed before the read below, a later snapshot, sees it)
    # or reads the mark under that lock and notifies
    """CREATE OR REPLACE FUNCTION eh_watch_ranks(
            p_key text, p_seq bigint, p_limit integer, p_local text[])
        RETURNS TABLE (r_wake text, r_disposition text, r_effective text,
                       r_count integer, r_counter bigint, r_state text, r_created float8,
                       r_closed float8, r_seq bigint, r_position integer, r_replay_key text,
                       r_outcome text)
        LANGUAGE plpgsql AS $$
        BEGIN
            -- counter counts the settled children: more unsettled than local ones
            UPDATE eh_groups g SET watched = true
             WHERE g.group_key = p_key AND NOT g.watched
               AND g.child_count - g.counter > (
                   SELECT count(*) FROM eh_children c WHERE c.replay_key = ANY (p_local)
                      AND c.group_key = p_key AND c.state <> 'settled');
            RETURN QUERY SELECT g.wake, g.disposition, g.effective, g.child_count, g.counter,
                   g.state, g.created_at, g.closed_at, c.seq, c.position, c.replay_key,
                   c.outcome
              FROM eh_groups g
              LEFT JOIN eh_children c ON c.group_key = g.group_key AND c.seq >= p_seq
               AND c.seq < p_seq + p_limit
             WHERE g.group_key = p_key ORDER BY c.seq;
        END $$""",
    # the keeper's renewal (G-33, R-1): the leases of children with a live driver, then
    # the ownership of open groups; child rows locked by key, then group rows by key
    f"""CREATE OR REPLACE FUNCTION eh_renew(
            p_owner text, p_ttl float8, p_keys text[], p_groups text[])
        RETURNS TABLE (r_kind text, r_key text, r_fence bigint, r_cancel boolean)
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM 1 FROM eh_children c WHERE c.replay_key = ANY(p_keys)
               AND c.lease_owner = p_owner AND c.state = 'claimed'
             ORDER BY c.replay_key FOR UPDATE;
            RETURN QUERY UPDATE eh_children c SET lease_expires = {NOW} + p_ttl
             WHERE c.replay_key = ANY(p_keys) AND c.lease_owner = p_owner
               AND c.state = 'claimed' AND c.lease_expires >= {NOW}
            RETURNING 'c'::text, c.replay_key, c.fence, c.cancel_requested;
            PERFORM 1 FROM eh_groups g WHERE g.group_key = ANY(p_groups)
               AND g.owner = p_owner AND g.state = 'open'
             ORDER BY g.group_key FOR UPDATE;
            RETURN QUERY UPDATE eh_groups g SET owner_expires = {NOW} + p_ttl
             WHERE g.group_key = ANY(p_groups) AND g.owner = p_owner AND g.state = 'open'
               AND g.owner_expires >= {NOW}
            RETURNING 'g'::text, g.group_key, 0::bigint, false;
        END $$""",
]


def _driver_errors() -> tuple[type[BaseException], ...]:
    """What asyncpg raises when the server is down, restarting or dropped the connection
    (and any other server error): the host retries these and never lets one reach a
    caller (R-12). Without asyncpg, :meth:`PostgresStore.start` refuses anyway."""
    try:
        asyncpg: Any = importlib.import_module("asyncpg")
    except ImportError:
        return (OSError, TimeoutError)
    return (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.exceptions.InternalClientError,
        OSError,
        TimeoutError,
    )


class _OwnerLive(Exception):
    """Rolls back a drain's cancel: the group's caller is live again (R-1)."""


_RETRY_STATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock detected
_RETRIES = 6
_P = ParamSpec("_P")
_T = TypeVar("_T")
log = logging.getLogger("effecthost.sql")


def _retried(
    fn: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Run a one-transaction operation again when the server rolled it back as a
    serialization failure or a deadlock victim (SQLSTATE 40001 / 40P01): nothing of it
    was written. Bounded; the last failure propagates."""

    @functools.wraps(fn)
    async def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        for attempt in range(_RETRIES):
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                if getattr(exc, "sqlstate", None) not in _RETRY_STATES or attempt == _RETRIES - 1:
                    raise
                log.warning("%s rolled back (%s): retrying", fn.__name__, exc.sqlstate)  # type: ignore[attr-defined]
                await asyncio.sleep(random.uniform(0, 0.005 * 2**attempt))
        raise AssertionError("unreachable")

    return run


def _spec_arrays(specs: list[ChildSpec]) -> list[list[Any]]:
    """The children of an open as the column arrays :sql:`eh_open` and the insert take."""
    return [
        [s.replay_key for s in specs],
        [s.position for s in specs],
        [s.kind for s in specs],
        [s.name for s in specs],
        [s.envelope for s in specs],
        [s.envelope_hash for s in specs],
        [s.claim for s in specs],
        [s.sleep_seconds for s in specs],
    ]


def _taken(specs: list[ChildSpec], replay_key: str, holder: str | None) -> ReplayKeyTaken:
    position = next((s.position for s in specs if s.replay_key == replay_key), -1)
    return ReplayKeyTaken(replay_key, position, holder)


@functools.cache
def _sql(text: str) -> str:
    """Shared SQL (:mod:`._store`) in PostgreSQL's words: ``$n`` placeholders, its clock."""
    parts = text.replace("{now}", NOW).replace("{outcome}", "c.outcome").split("?")
    return parts[0] + "".join(f"${n}{part}" for n, part in enumerate(parts[1:], 1))


_FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION (\w+)\(")


def _function_name(statement: str) -> str | None:
    found = _FUNCTION.search(statement)
    return found.group(1) if found else None


def _function_body(statement: str) -> str:
    """The text between the ``$$`` quotes: what ``pg_proc.prosrc`` records."""
    return statement.split("$$")[1]


class _Connections:
    """The store's connections, lent one statement or one transaction at a time: a pool
    without asyncpg's per-call costs (a task and a reset per release, a timeout scope per
    acquire: more CPU than the statement itself). At most ``size`` are open; the first is
    connected by :meth:`start`, the others when needed.

    A connection is lent again only when it comes back idle: the body ended normally or
    by an error of the statement (the server refused it, or this code's own), and no
    transaction is left open. One that comes back after a cancellation, a timeout or a
    dropped socket is in an unknown state (a statement may still run on it) and is
    terminated; the next acquire connects anew. This store's statements leave no session
    state behind (no ``SET``, ``LISTEN``, session advisory lock or cursor), so nothing is
    reset between loans."""

    def __init__(self, asyncpg: Any, connect: Callable[[], Coroutine[Any, Any, Any]], size: int):
        self._asyncpg = asyncpg
        self._connect = connect
        self._size = max(1, size)
        self._idle: list[Any] = []
        self._lent: set[Any] = set()
        self._open = 0  # idle, lent or connecting
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._connects: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._unusable = (
            asyncpg.InterfaceError,
            asyncpg.exceptions.InternalClientError,
            OSError,
            TimeoutError,
        )

    async def start(self) -> None:
        self._open += 1
        try:
            conn = await self._connect()
        except BaseException:
            self._open -= 1
            raise
        self._idle.append(conn)

    async def _take(self) -> Any:
        while True:
            if self._closed:
                raise self._asyncpg.InterfaceError("the store's connections are closed")
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    self._lent.add(conn)
                    return conn
                self._open -= 1
            if self._open < self._size:
                self._open += 1
                # a connect is never interrupted half-way (asyncpg would leave a failed
                # future of its handshake behind): a caller that goes away leaves the
                # connection to the pool once it is made
                task = asyncio.get_running_loop().create_task(self._connect())
                self._connects.add(task)
                task.add_done_callback(self._connects.discard)
                try:
                    conn = await asyncio.shield(task)
                except asyncio.CancelledError:
                    if task.done() and not task.cancelled() and task.exception() is None:
                        self._lent.add(task.result())
                        self._give(task.result(), None)
                    elif not task.done():
                        task.add_done_callback(self._connected)
                    else:
                        self._open -= 1
                        self._wake()
                    raise
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
                self._lent.add(conn)
                return conn
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the turn passes on
                raise

    def _connected(self, task: asyncio.Task[Any]) -> None:
        """A connect whose caller went away: the connection joins the idle ones."""
        if task.cancelled() or task.exception() is not None:
            self._open -= 1
            self._wake()
            return
        self._lent.add(task.result())
        self._give(task.result(), None)

    def _give(self, conn: Any, exc: BaseException | None) -> None:
        self._lent.discard(conn)
        reusable = (
            not self._closed
            and not conn.is_closed()
            and (
                exc is None or (isinstance(exc, Exception) and not isinstance(exc, self._unusable))
            )
            and not conn.is_in_transaction()
        )
        if reusable:
            self._idle.append(conn)
        else:
            self._open -= 1
            if not conn.is_closed():
                conn.terminate()
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        conn = await self._take()
        try:
            yield conn
        except BaseException as exc:
            self._give(conn, exc)
            raise
        self._give(conn, None)

    async def _call(self, method: str, query: str, *args: Any) -> Any:
        if self._idle and not self._closed and not self._idle[-1].is_closed():
            conn = self._idle.pop()  # the common case, without a coroutine of its own
            self._lent.add(conn)
        else:
            conn = await self._take()
        try:
            result = await getattr(conn, method)(query, *args)
        except BaseException as exc:
            self._give(conn, exc)
            raise
        self._give(conn, None)
        return result

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        return await self._call("fetch", query, *args)  # type: ignore[no-any-return]

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return await self._call("fetchrow", query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self._call("fetchval", query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        return await self._call("execute", query, *args)  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Close the idle connections; terminate those lent (their bodies then fail) and
        those being made, once made."""
        self._closed = True
        if self._connects:
            await asyncio.wait(list(self._connects), timeout=5)
        idle, self._idle = self._idle, []
        for conn in list(self._lent):
            conn.terminate()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)  # it finds the connections closed
        for conn in idle:
            try:
                await asyncio.wait_for(conn.close(), 5)
            except (TimeoutError, Exception):
                conn.terminate()

    def terminate(self) -> None:
        self._closed = True
        for conn in [*self._idle, *self._lent]:
            conn.terminate()
        self._idle = []


_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")


class PostgresStore(SqlStore):
    """A PostgreSQL store over an asyncpg pool, in schema ``schema``."""

    wakes_across_processes = True

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "effecthost",
        pool_size: int = 8,
        fault: Callable[[str], None] | None = None,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        if not _IDENT.match(schema):
            raise ValueError(f"schema name {schema!r} must match {_IDENT.pattern}")
        self.dsn = dsn
        self.schema = schema
        self.create = create and not read_only
        self.read_only = read_only
        self.channel = f"effecthost_{schema}"
        self.pool_size = pool_size
        self.fault = fault
        self._pool: Any = None  # a _Connections once started
        self.open_at_finalize: set[str] = set()
        self._listener: Any = None
        self._callback: Callable[[str, str], None] | None = None
        self._relisten: asyncio.Task[None] | None = None
        self.driver_errors = _driver_errors()

    def _fault(self, point: str) -> None:
        if self.fault is not None:
            self.fault(point)

    def _prepare(self, sql: str) -> str:
        return _sql(sql)

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        return await self._pool.fetch(_sql(sql), *args)  # type: ignore[no-any-return]

    async def _fetchrow(self, sql: str, *args: Any) -> Any | None:
        return await self._pool.fetchrow(_sql(sql), *args)

    @_retried
    async def _execute(self, sql: str, *args: Any) -> int:
        status = await self._pool.execute(_sql(sql), *args)
        return int(status.rsplit(" ", 1)[1])

    async def _snapshot(self, *reads: tuple[str, tuple[Any, ...]]) -> list[list[Any]]:
        async with (
            self._pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return [await conn.fetch(_sql(q), *a) for q, a in reads]

    async def start(self) -> None:
        """Connect; create the schema when absent, or check its version. A start that
        failed part-way (the server went down) may be called again; once the pool exists
        it returns at once.

        A schema that holds other objects but no effecthost tables is refused and nothing
        is created in it (an absent or empty schema is new). With ``create=False`` or
        ``read_only=True`` a schema without this release's tables is refused and nothing
        is created; ``read_only`` sessions default to read-only transactions.

        Raises:
            DatabaseRefused: the schema holds another application's objects, or
                (``create=False`` or ``read_only``) no effecthost tables.
            SchemaVersionError: the schema records another schema version.
        """
        if self._pool is not None:
            return
        (asyncpg,) = require("postgres", "postgres", "asyncpg")
        self._asyncpg = asyncpg
        self.input_errors = (
            UnicodeEncodeError,
            OverflowError,
            asyncpg.DataError,
            asyncpg.exceptions.ProgramLimitExceededError,
        )
        settings = {"search_path": self.schema, "application_name": "effecthost"}
        if self.read_only:
            settings["default_transaction_read_only"] = "on"
        admin = await asyncpg.connect(self.dsn)
        try:
            if self.create:
                await self._schema(admin)
            else:
                await self._check_schema(admin)
        finally:
            await admin.close()
        pool = _Connections(
            asyncpg,
            functools.partial(asyncpg.connect, self.dsn, server_settings=settings),
            self.pool_size,
        )
        await pool.start()
        self._pool = pool

    async def _schema(self, conn: Any) -> None:
        async with conn.transaction():
            # one process creates the schema at a time
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.channel)
            await self._refuse_foreign(conn)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            await conn.execute(f"SET LOCAL search_path = {self.schema}")
            await conn.execute("CREATE TABLE IF NOT EXISTS eh_schema (version integer NOT NULL)")
            found = await conn.fetchval("SELECT max(version) FROM eh_schema")
            if found is None:
                for statement in DDL:
                    await conn.execute(statement)
                await conn.execute("INSERT INTO eh_schema (version) VALUES ($1)", SCHEMA_VERSION)
            elif found != SCHEMA_VERSION:
                raise SchemaVersionError(int(found), where=self._where)
            else:
                # the version numbers the table layout; functions are code: a schema made
                # by another release of this version gets this release's functions where
                # they are missing or differ (same signatures, same tables), under the
                # advisory lock above
                rows = await conn.fetch(
                    "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = $1::regnamespace",
                    self.schema,
                )
                found_src = {r["proname"]: r["prosrc"] for r in rows}
                for statement in DDL:
                    name = _function_name(statement)
                    if name and found_src.get(name) != _function_body(statement):
                        await conn.execute(statement)

    @property
    def _where(self) -> str:
        """The database named in refusals: the schema (a DSN may carry a password)."""
        return f"PostgreSQL schema {self.schema!r}"

    async def _refuse_foreign(self, conn: Any) -> None:
        """A schema without ``eh_schema`` that holds objects not named ``eh_…`` is another
        application's: refused before anything is created in it (an absent or empty
        schema is new, and so is one holding only a payload store's ``eh_payload_store``)."""
        if await conn.fetchval("SELECT to_regclass($1)", f"{self.schema}.eh_schema"):
            return
        objects = await conn.fetchval(
            "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = n.oid "
            "AND relname NOT LIKE 'eh\\_%') "
            "+ (SELECT count(*) FROM pg_proc WHERE pronamespace = n.oid "
            "AND proname NOT LIKE 'eh\\_%') "
            "FROM pg_namespace n WHERE n.nspname = $1",
            self.schema,
        )
        if objects:
            raise DatabaseRefused(
                DatabaseProblem.FOREIGN,
                f"{self._where} holds objects but no effecthost tables (another application's?)",
            )

    async def _check_schema(self, conn: Any) -> None:
        """The schema's version, read only: no schema, table or function is created."""
        found = await conn.fetchval("SELECT to_regclass($1)", f"{self.schema}.eh_schema")
        if found is None:
            raise DatabaseRefused(
                DatabaseProblem.FOREIGN, f"schema {self.schema!r} holds no effecthost tables"
            )
        version = await conn.fetchval(f"SELECT max(version) FROM {self.schema}.eh_schema")
        if version != SCHEMA_VERSION:
            if version is None:
                raise DatabaseRefused(
                    DatabaseProblem.FOREIGN,
                    f"schema {self.schema!r}: eh_schema records no schema version",
                )
            raise SchemaVersionError(int(version), where=self._where)

    async def recorded_sealing(self) -> bool | None:
        """Whether this deployment is sealed (see :meth:`SqliteStore.recorded_sealing`)."""
        if not await self._pool.fetchval("SELECT to_regclass($1)", f"{self.schema}.eh_sealing"):
            return None
        found = await self._pool.fetchval(f"SELECT bool_or(sealed) FROM {self.schema}.eh_sealing")
        return None if found is None else bool(found)

    async def record_sealing(self, sealed: bool) -> None:
        """Record whether outcomes here are sealed; once sealed, always sealed."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self.channel)
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.schema}.eh_sealing (sealed boolean NOT NULL)"
            )
            await conn.execute(
                f"INSERT INTO {self.schema}.eh_sealing SELECT $1 "
                f"WHERE NOT EXISTS (SELECT 1 FROM {self.schema}.eh_sealing)",
                sealed,
            )
            if sealed:
                await conn.execute(f"UPDATE {self.schema}.eh_sealing SET sealed = true")

    async def listen(self, callback: object) -> None:
        """Deliver this schema's notifications to ``callback``. When the listening
        connection is lost (the server restarted), it is opened again in the background,
        with backoff; waiters poll meanwhile (R-12)."""
        assert callable(callback)
        self._callback = callback
        if self._listener is None:
            self._listener = await self._connect_listener()

    async def _connect_listener(self) -> Any:
        listener = await self._asyncpg.connect(self.dsn)
        try:
            await listener.add_listener(self.channel, self._on_notify)
        except BaseException:
            listener.terminate()
            raise
        listener.add_termination_listener(self._on_listener_lost)
        return listener

    def _on_listener_lost(self, conn: Any) -> None:
        if self._listener is not conn or self._pool is None:
            return  # closed by aclose, or already replaced
        self._listener = None
        if self._relisten is None or self._relisten.done():
            self._relisten = asyncio.get_running_loop().create_task(
                self._listen_again(), name="effecthost-pg-relisten"
            )

    async def _listen_again(self) -> None:
        delay = 0.05
        while self._pool is not None and self._listener is None:
            try:
                listener = await self._connect_listener()
            except self.driver_errors:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if self._pool is None:
                listener.terminate()
                return
            self._listener = listener

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if self._callback is not None and ":" in payload:
            kind, key = payload.split(":", 1)
            self._callback(kind, key)

    async def aclose(self) -> None:
        listener, pool = self._listener, self._pool
        self._listener = self._pool = None
        if self._relisten is not None:
            self._relisten.cancel()
            with contextlib.suppress(BaseException):
                await self._relisten
            self._relisten = None
        if listener is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.close(), 5)
        if pool is not None:
            await pool.close()

    # -- reads --------------------------------------------------------------------------

    async def read_ranks(
        self, group_key: str, seq: int, limit: int, local: Collection[str] | None = None
    ) -> tuple[GroupRow, list[tuple[int, int, str, str | bytes]]] | None:
        """With ``local`` (a waiter's read), :sql:`eh_watch_ranks` marks the group
        watched first when it must (G-21)."""
        if local is not None:
            rows = await self._pool.fetch(
                "SELECT * FROM eh_watch_ranks($1, $2, $3, $4)", group_key, seq, limit, list(local)
            )
            if not rows:
                return None
            head = rows[0]
            group = GroupRow(group_key, *(head[i] for i in range(8)))
            found = [
                (int(r[8]), r[9], r[10], r[11])
                for r in rows
                if r[8] is not None and r[11] is not None
            ]
            return group, found
        return await super().read_ranks(group_key, seq, limit)

    # -- writes -------------------------------------------------------------------------

    @_retried
    async def _create(self, r: OpenRequest) -> tuple[bool, GroupRow]:
        row = await self._pool.fetchrow(_sql(CREATE_GROUP), *r.create_values)
        if row is not None:
            return True, group_row(row)
        existing = await self.get_group(r.group_key)
        assert existing is not None, "a group row vanished between insert and read"
        return False, existing

    @_retried
    async def insert_children(
        self, group_key: str, specs: list[ChildSpec], owner: str, ttl: float
    ) -> list[str]:
        rows = await self._pool.fetch(
            "INSERT INTO eh_children (replay_key, group_key, position, kind, name, envelope, "
            "envelope_hash, state, lease_owner, fence, lease_expires, attempt, due_at) "
            "SELECT k, $1, p, kd, nm, env, h, "
            "CASE WHEN cl THEN 'claimed' ELSE 'pending' END, "
            "CASE WHEN cl THEN $2 END, CASE WHEN cl THEN 1 ELSE 0 END, "
            f"CASE WHEN cl THEN {NOW} + $3 END, CASE WHEN cl THEN 1 ELSE 0 END, "
            f"CASE WHEN sl IS NOT NULL THEN {NOW} + sl END "
            "FROM unnest($4::text[], $5::int[], $6::text[], $7::text[], $8::text[], "
            "$9::text[], $10::bool[], $11::float8[]) AS t(k, p, kd, nm, env, h, cl, sl) "
            "ORDER BY k ON CONFLICT DO NOTHING RETURNING replay_key",
            group_key,
            owner,
            ttl,
            *_spec_arrays(specs),
        )
        return [r[0] for r in rows]

    @_retried
    async def claim(
        self, replay_key: str, owner: str, ttl: float, sent: Sent | None = None
    ) -> Claim | None:
        async with self._pool.acquire() as conn:
            _mark(sent)
            row = await conn.fetchrow("SELECT * FROM eh_claim($1, $2, $3)", replay_key, owner, ttl)
        if row is None:
            return None
        return Claim(
            replay_key,
            int(row["fence"]),
            int(row["attempt"]),
            bool(row["cancel_requested"]),
            float(row["lease_expires"]),
        )

    @_retried
    async def renew(
        self, owner: str, ttl: float, keys: list[str], groups: list[str], sent: Sent | None = None
    ) -> tuple[list[Renewal], list[str]]:
        async with self._pool.acquire() as conn:
            _mark(sent)
            rows = await conn.fetch(
                "SELECT * FROM eh_renew($1, $2, $3, $4)", owner, ttl, keys, groups
            )
        children = [Renewal(r[1], int(r[2]), bool(r[3])) for r in rows if r[0] == "c"]
        return children, [r[1] for r in rows if r[0] == "g"]

    @_retried
    async def finalize(
        self, replay_key: str, envelope_hash: str, owner: str, fence: int, outcome: str
    ) -> int | None:
        row = await self._pool.fetchrow(
            "SELECT * FROM eh_finalize_open($1, $2, $3, $4, $5, $6)",
            replay_key,
            envelope_hash,
            owner,
            fence,
            outcome,
            self.channel,
        )
        if row["seq"] is None:
            return None
        if row["still_open"]:
            self.open_at_finalize.add(replay_key)
        return int(row["seq"])

    @_retried
    async def finalize_many(self, owner: str, items: list[Finalize]) -> list[int | None]:
        row = await self._pool.fetchrow(
            "SELECT * FROM eh_finalize_many_open($1, $2, $3, $4, $5, $6)",
            [i.replay_key for i in items],
            [i.envelope_hash for i in items],
            owner,
            [i.fence for i in items],
            [i.outcome for i in items],
            self.channel,
        )
        seqs = [None if v is None else int(v) for v in row["seqs"]]
        if row["still_open"]:
            self.open_at_finalize.update(
                item.replay_key for item, seq in zip(items, seqs, strict=True) if seq is not None
            )
        return seqs

    @_retried
    async def settle_free(
        self, replay_key: str, owner: str, outcome: str, orphan: bool = False
    ) -> int | None:
        if orphan:
            return await self._settle_orphan(replay_key, owner, outcome)
        value = await self._pool.fetchval(
            "SELECT eh_settle_free($1, $2, $3, $4)",
            replay_key,
            owner,
            outcome,
            self.channel,
        )
        return None if value is None else int(value)

    async def _settle_orphan(self, replay_key: str, owner: str, outcome: str) -> int | None:
        """The claim (child row locked), then the group row locked and its owner read: a
        live owner other than ``owner`` (a reopen committed meanwhile) rolls it all back."""
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                fence = await conn.fetchval(
                    "SELECT fence FROM eh_claim($1, $2, 60.0)", replay_key, owner
                )
                if fence is None:
                    return None
                live = await conn.fetchval(
                    f"SELECT g.state = 'open' AND g.owner_expires >= {NOW} "
                    "AND g.owner IS DISTINCT FROM $2 FROM eh_groups g "
                    "JOIN eh_children c ON c.group_key = g.group_key "
                    "WHERE c.replay_key = $1 FOR UPDATE OF g",
                    replay_key,
                    owner,
                )
                if live:
                    raise _OwnerLive
                value = await conn.fetchval(
                    "SELECT eh_finalize(c.replay_key, c.envelope_hash, $2, $3, $4, $5) "
                    "FROM eh_children c WHERE c.replay_key = $1",
                    replay_key,
                    owner,
                    fence,
                    outcome,
                    self.channel,
                )
                return None if value is None else int(value)
        except _OwnerLive:
            return None

    @_retried
    async def close(self, group_key: str, effective: str) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            if effective == "cancel":  # child rows first (by key), then the group row
                await conn.execute(
                    "SELECT 1 FROM eh_children WHERE group_key = $1 AND state <> 'settled' "
                    "ORDER BY replay_key FOR UPDATE",
                    group_key,
                )
                await conn.execute(
                    "UPDATE eh_children SET cancel_requested = true "
                    "WHERE group_key = $1 AND state <> 'settled'",
                    group_key,
                )
            # a watched group wakes its waiters elsewhere; children left unsettled, their
            # drivers (cancels marked) and waiters, which may be in other processes
            wake = await conn.fetchval(
                "UPDATE eh_groups SET effective = $1, state = 'closed', "
                f"closed_at = coalesce(closed_at, {NOW}) WHERE group_key = $2 "
                "RETURNING watched OR EXISTS (SELECT 1 FROM eh_children "
                "WHERE group_key = $2 AND state <> 'settled')",
                effective,
                group_key,
            )
            if wake:
                await conn.execute("SELECT pg_notify($1, $2)", self.channel, "c:" + group_key)
            return wake is not None

    @_retried
    async def retire_closed(self, group_key: str) -> bool:
        return bool(await self._pool.fetchval("SELECT eh_retire($1)", group_key))

    @_retried
    async def close_retire(self, group_key: str, effective: str) -> tuple[bool, bool]:
        done = await self._pool.fetchval(
            "SELECT eh_close_retire($1, $2, $3)", group_key, effective, self.channel
        )
        return done >= 1, done == 2

    async def _open(self, r: OpenRequest) -> Opened:
        """A first open is one round trip: ``before_create`` (the resolution, which writes
        nothing) runs first, then :sql:`eh_open` records the group row, owned by
        ``owner``, and its children in one transaction, or refuses a retired key or a
        replay key another group holds and writes nothing. When the resolution refuses, or
        the group turns out to be recorded, or retired, the record is read first (so
        refusals keep R-2's order and a reopen refuses nothing for a resolver miss) and
        answered from as :meth:`_open_read_first` does."""
        try:
            r.before_create()
        except Exception:
            pass
        else:
            opened = await self._eh_open(r)
            if opened is not None:
                return opened
        return await self._open_read_first(r)

    async def _eh_open(self, r: OpenRequest) -> Opened | None:
        """:sql:`eh_open`: the created group, or ``None`` when the key is recorded or
        retired (nothing written).

        Raises:
            ReplayKeyTaken: a replay key is recorded for another group (nothing written).
        """
        try:
            async with self._pool.acquire() as conn:
                _mark(r.sent)
                done = await conn.fetchval(
                    "SELECT eh_open($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, "
                    "$15)",
                    *r.group_values,
                    *_spec_arrays(r.specs),
                    r.trace_context,
                )
        except self._asyncpg.PostgresError as exc:
            if exc.sqlstate == "EH002":
                raise _taken(r.specs, exc.detail, exc.hint or None) from None
            if exc.sqlstate != "EH001":
                raise
            return None  # retired: the lookup answers with the tombstone
        if done is None:
            return None  # recorded by another open: read it as a reopen does
        self._fault("open:after_commit")
        row = GroupRow(
            r.group_key, r.wake, r.disposition, r.disposition, r.child_count, 0, "open", done
        )
        return Opened(True, row)

    async def _open_read_first(self, r: OpenRequest) -> Opened:
        """A read (the group row, its tombstone, and the first child by position whose
        replay key another group holds), then either, for a group recorded open,
        ``reopen`` and the change of owner (R-1; an update of the group row alone, only
        while it is still open: what ``reopen`` checked, the shape and the children,
        never changes once recorded), or ``before_create`` and :sql:`eh_open`: the group
        row, owned by ``owner``, and its children in one transaction. When another open
        committed the group in between, or a close came between the read and the change
        of owner, the record is read again and answered from."""
        for _attempt in range(3):
            row = await self._pool.fetchrow(
                f"SELECT {G_COLUMNS}, r.effective AS tombstone, h.replay_key AS taken, "
                "h.group_key AS holder FROM (SELECT $1::text AS k) q "
                "LEFT JOIN eh_groups g ON g.group_key = q.k "
                "LEFT JOIN eh_retired r ON r.group_key = q.k "
                "LEFT JOIN LATERAL (SELECT c.replay_key, c.group_key "
                "  FROM unnest($2::text[]) WITH ORDINALITY AS t(k, i) "
                "  JOIN eh_children c ON c.replay_key = t.k AND c.group_key <> q.k "
                "  ORDER BY t.i LIMIT 1) h ON g.group_key IS NULL AND r.group_key IS NULL",
                r.group_key,
                [s.replay_key for s in r.specs],
            )
            if row["group_key"] is not None:
                record = group_row(row)
                children = tuple(await self.children(r.group_key))
                if record.state != "open":
                    return Opened(False, record, None, children)
                if r.reopen is not None:
                    r.reopen(record, children)
                assert r.owner is not None, "an open names its owner"
                if not await self.own(r.group_key, r.owner, r.ttl, r.trace_context):
                    continue  # closed or retired since the read
                return Opened(False, record, None, children)
            if row["tombstone"] is not None:
                return Opened(False, None, str(row["tombstone"]))
            if row["taken"] is not None:
                raise _taken(r.specs, row["taken"], row["holder"])
            r.before_create()
            opened = await self._eh_open(r)
            if opened is not None:
                return opened
            # recorded or retired by another open since the read: read it again
        raise RuntimeError(f"group {r.group_key!r} changed under three opens in a row")

    @_retried
    async def close_group(
        self, group_key: str, decide: Decide, expect: Expected | None = None
    ) -> Closed:
        """One round trip when the group is open as ``expect`` says: :sql:`eh_close_group`
        locks the children, then the group row, and closes (and retires) it in that
        transaction; ``decide`` then answers on the row as it was, which is
        ``expect.target``. Otherwise that call wrote nothing and ``decide`` answers on
        the row it returned (a refusal, a no-op, or, without ``expect``, the close by
        :meth:`close_retire`)."""
        row = await self._pool.fetchrow(
            "SELECT * FROM eh_close_group($1, $2, $3, $4, $5, $6)",
            group_key,
            None if expect is None else expect.child_count,
            None if expect is None else expect.wake,
            None if expect is None else expect.declared,
            None if expect is None else expect.target,
            self.channel,
        )
        record = None
        if row["o_state"] is not None:
            record = GroupRow(
                group_key,
                row["o_wake"],
                row["o_disposition"],
                row["o_effective"],
                row["o_count"],
                row["o_counter"],
                row["o_state"],
                row["o_created"],
                row["o_closed"],
            )
        self._fault("close:after_commit")
        tombstone = row["o_tombstone"]
        target = decide(record, None if tombstone is None else str(tombstone))
        done = row["o_done"]
        if done:
            assert expect is not None and target == expect.target, "close: decided otherwise"
            return record, True, done == 2
        return await self._close_as_decided(group_key, record, target)

    @_retried
    async def retire(self, group_key: str) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            # child rows first (locked), then the group row
            states = await conn.fetch(
                "SELECT state FROM eh_children WHERE group_key = $1 ORDER BY replay_key FOR UPDATE",
                group_key,
            )
            if any(r[0] != "settled" for r in states):
                return False
            effective = await conn.fetchval(
                "DELETE FROM eh_groups WHERE group_key = $1 AND state = 'closed' "
                "RETURNING effective",
                group_key,
            )
            if effective is None:
                return False
            await conn.execute("DELETE FROM eh_children WHERE group_key = $1", group_key)
            await conn.execute("DELETE FROM eh_payloads WHERE group_key = $1", group_key)
            await conn.execute(
                "INSERT INTO eh_retired (group_key, effective, retired_at) "
                f"VALUES ($1, $2, {NOW}) ON CONFLICT DO NOTHING",
                group_key,
                effective,
            )
            return True

    # -- the payload table ----------------------------------------------------------------
