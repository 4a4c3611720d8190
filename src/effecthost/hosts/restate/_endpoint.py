"""The Restate services of the tier: the group object, the child service, the payload
object (SPEC §4). :func:`build_services` binds them to a resolver; nothing here runs
outside a Restate endpoint process.

Group object state (keyed by group key), beside nothing else:

- ``shape``: child count, wake, declared and effective disposition, epoch, owner,
  ``layout`` (:data:`LAYOUT`; absent on groups of the release before) and ``spilled``
  (an outcome went to the payload object) — the shape fence lives beside the counter
  (G-38);
- ``children``: the recorded envelopes (position order) with their hashes;
- ``counter``; ``rank:{n}`` → ``{position, replay_key, outcome | ref | stored}`` (G-40):
  with a :class:`~effecthost.payloads.PayloadPolicy`, ``stored`` is the
  :class:`~effecthost.payloads.StoredOutcome` the child encoded (inline, sealed or a
  reference into the policy's store), never the plaintext of a sealed outcome (G-47);
- ``settled:{replay_key}`` → rank (the state-level dedup);
- ``invs`` → the children's invocation ids in position order, for a group declaring
  ``CANCEL`` (the cancels of G-41; groups of earlier releases keep one
  ``inv:{replay_key}`` per child instead; a ``RUN_TO_COMPLETION`` group finds them by
  idempotency key if a close narrows it); ``targets`` for routed children;
- ``waiters`` → rank → awakeable ids of parked readers; ``evw:``/``evp:`` for events;
- ``held`` → awakeable ids of losers of a decided group re-run after a crash, which
  start their tools only once a read parks (R-13); ``decided`` once a success of a
  ``FIRST_SUCCESS`` group declaring ``CANCEL`` took a rank;
- after close, ``tombstone`` (so a late read is ``GroupClosed``, not a hang) with the
  disposition in force; while some child has not settled it is ``pending`` and carries
  the shape (no ``shape`` key: the group is no longer listed as open), and the rest
  stays: the children, the counter, ``settled:``, the ranks and the event waits, so the
  closed group keeps its replay keys and its events still reach its waits (R-11). When
  the last child settles the group retires: only the tombstone is left, without
  ``pending``. A group closed by the release before retired at close.

Replay-key object state (keyed by replay key): ``holder`` → ``{group_key, token}``, the
group that claimed the key (R-6); keyed by a prefix (``claim_bucket``): one
``holder:{replay_key}`` per key ``{prefix}:{n}``, so a combinator's open claims its
children's keys in one call. A first open claims every child's key before it records
anything and releases what it claimed when a claim is refused. Close releases
nothing: a claim of a key whose holder has retired takes the key over, so retiring a
group costs no invocation per child.

An ``ALL`` group that runs its losers to completion has its children started by the
group object's shared ``collect`` handler (one invocation per :data:`COLLECT_SLICE`
children), each child returning its settlement to it, and ranked by ``settle_batch`` in
batches; other groups' children send their settlement to ``settle`` themselves.

No exclusive handler awaits anything another handler of the same key resolves. The
handlers that run once per child or per read (``settle``, ``register_waiter``,
``await_rank``) read state lazily, so their cost does not grow with the group.
"""

import json
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import timedelta
from typing import Any

from effecthost import telemetry
from effecthost.contract import (
    EffectEnvelope,
    EffectHostError,
    EffectKind,
    EngineUnavailable,
    ExecutionInput,
    GroupExecutors,
    LoserPolicy,
    NoExecutor,
    Outcome,
    WakePolicy,
    canonical_json,
    kit,
    sleep_seconds,
)
from effecthost.hosts import require
from effecthost.payloads import PayloadPolicy, decode_outcome, encode_outcome

from ._nodes import Nodes, _Unreachable, url_list
from ._wire import (
    CHILD,
    GROUP,
    INLINE_LIMIT,
    OWNER,
    PAYLOAD,
    REPLAY_KEY,
    child_headers,
    claim_bucket,
    error,
    idempotency_key,
)

require("restate", "restate", "restate", "httpx")

import httpx  # noqa: E402
import restate  # noqa: E402
from restate import TerminalError  # noqa: E402

CANCEL = LoserPolicy.CANCEL.value
CANCELLED_CODE = 409
UNBOUND_CODE = 404
LAYOUT = 2
"""The group object's state layout; groups recorded before it carry none (see docs)."""
BATCH = 64
"""At most this many recorded ranks answer one read."""
ADMIN_TIMEOUT = 5.0
"""Seconds one admin request (a guard read, a target check) may take on one node."""
ADMIN_BOUND = 10.0
"""Seconds an admin read fails over between nodes (and through the SQL view's errors
while partition leadership moves) before the attempt fails and is retried."""
COLLECT_FROM = 2
"""Groups of at least this many children that wake on ``ALL`` and run their losers to
completion have their settlements collected and recorded in batches (see ``collect``)."""
COLLECT_SLICE = 128
"""Children per ``collect`` invocation of a wide group: what one wake-up of a collector
looks at, whatever the group's width."""


async def _get(ctx: Any, name: str) -> Any:
    """Read one state key as plain JSON (the SDK's ``get`` is generic over a hint)."""
    return await ctx.get(name)


def _reads(ctx: Any, *names: str) -> list[Awaitable[Any]]:
    """Issue reads of several state keys at once: under lazy state they cost one round
    trip to the server together, not one each."""
    return [ctx.get(name) for name in names]


def _refusal(exc: EffectHostError) -> dict[str, Any]:
    """A kit refusal as a handler returns it (the client raises the same error again)."""
    return error(
        exc.code.value,
        exc.message,
        group_key=exc.group_key,
        replay_key=exc.replay_key,
        position=exc.position,
        rank=exc.rank,
    )


def _known(key: str, shape: dict[str, Any]) -> kit.GroupRecord:
    """The group object's ``shape`` as the kit's fences read it (an unretired group;
    close replaces the state with a tombstone)."""
    return kit.GroupRecord(
        key, shape["child_count"], shape["wake"], shape["declared"], shape["effective"]
    )


def _closing(tombstone: Any) -> bool:
    """Whether a tombstone is of a closed group some child of which has not settled yet
    (R-11: it retires when the last one settles)."""
    return isinstance(tombstone, dict) and bool(tombstone.get("pending"))


def _guarded(ctx: Any, req: dict[str, Any]) -> bool:
    """Whether this attempt of a tool child reads its group's tombstone before it starts
    the tool: when the group declared ``CANCEL``, and on every re-run, which the SDK
    tells by replaying the tool's run an earlier attempt journaled. Asked right before
    that run; an SDK that cannot tell counts as a re-run. A first attempt of a child of a
    group declaring ``RUN_TO_COMPLETION`` reads nothing, so most groups (``all``) cost no
    read: if a close narrows that group to ``CANCEL``, the engine's cancel stops it."""
    return bool(req.get("cancel")) or _rerun(ctx)


def _rerun(ctx: Any) -> bool:
    """Whether this attempt replays a tool's run an earlier attempt journaled (it was cut
    off while the tool ran); an SDK that cannot tell counts as a re-run."""
    probe = getattr(getattr(ctx, "vm", None), "is_replaying", None)
    return True if probe is None else bool(probe())


def _decided(state: dict[str, Any]) -> bool:
    """R-13: whether the group state read by a re-run (``shape``, ``decided``,
    ``counter``) is of an open group whose losers stay down: ``CANCEL`` in force and its
    wake policy met (``FIRST``: rank 1 exists; ``FIRST_SUCCESS``: a success holds a rank,
    which ``settle`` marks as ``decided``). ``ALL`` never is."""
    shape = state.get("shape")
    if not isinstance(shape, dict) or shape.get("effective") != LoserPolicy.CANCEL.value:
        return False
    if shape.get("wake") == WakePolicy.ALL.value:
        return False
    if state.get("decided"):
        return True
    return shape.get("wake") == WakePolicy.FIRST.value and int(state.get("counter") or 0) >= 1


HELD = {"held": True}
"""What the tool's run of a held re-run records instead of an outcome (R-13), with the
outcome it settles with if the hold ends in a cancel (``cancelled``)."""


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _claim(req: dict[str, Any], consumed: int = 0) -> kit.HandleClaim:
    return kit.HandleClaim(req["child_count"], req["wake"], req["disposition"], consumed)


def build_services(
    resolver: GroupExecutors | None,
    *,
    admin_url: str | Sequence[str] | None = None,
    retry_policy: Any = None,
    payloads: PayloadPolicy | None = None,
) -> list[Any]:
    """The group object, child service and payload object, bound to ``resolver``.

    ``admin_url`` lets a routed child check that its target is bound (G-14), and a tool
    child's re-runs (and every attempt of a child of a group declaring ``CANCEL``) read
    the group's tombstone before they start the tool (the per-attempt cancel guard;
    without it only the engine's cancel stops a loser). One URL or several (the nodes
    of a cluster): a read fails over between them (R-12).
    ``retry_policy``: a ``restate.InvocationRetryPolicy`` for all three (optional).
    ``payloads``: the payload policy (store, inline threshold, sealer) every child encodes
    its outcome with before it settles; the group object then records only that stored
    form and retirement deletes the group's stored payloads (G-47…G-50). Callers must
    read with a controller configured with the same store and keys. Without it, outcomes
    above :data:`INLINE_LIMIT` go to the payload object and nothing is sealed.
    """
    store = payloads.store if payloads is not None else None
    admin_urls = None if admin_url is None else url_list(admin_url, "admin API")
    options: dict[str, Any] = {}
    if retry_policy is not None:
        options["invocation_retry_policy"] = retry_policy
    group = restate.VirtualObject(GROUP, **options)
    child = restate.Service(CHILD, **options)
    payload = restate.VirtualObject(PAYLOAD, **options)
    replay = restate.VirtualObject(REPLAY_KEY, **options)
    owner = restate.VirtualObject(OWNER, **options)

    # -- owner object (R-1) -----------------------------------------------------------

    @owner.handler(name="beat")
    async def owner_beat(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        """Keep this incarnation live for ``ttl`` more seconds: the lapse this beat
        schedules (a delayed send, on the engine's timers) ends the lease unless a later
        beat came first. The controller's drain reads live incarnations from the state."""
        beat = int(await _get(ctx, "beat") or 0) + 1
        ctx.set("beat", beat)
        ttl = timedelta(seconds=float(req["ttl"]))
        ctx.object_send(owner_lapse, ctx.key(), {"beat": beat}, send_delay=ttl)

    @owner.handler(name="lapse")
    async def owner_lapse(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        if await _get(ctx, "beat") == req["beat"]:
            ctx.clear_all()

    @owner.handler(name="leave")
    async def owner_leave(ctx: restate.ObjectContext) -> None:
        ctx.clear_all()

    # -- replay-key object (R-6) ------------------------------------------------------

    async def live_holder(ctx: Any, held: dict[str, Any] | None) -> str | None:
        """The group holding the key, or ``None`` when none does: a group that retired
        holds nothing (retirement releases nothing itself; R-11)."""
        if held is None or await ctx.object_call(retired, held["group_key"], None):
            return None
        return str(held["group_key"])

    @replay.handler()
    async def claim(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
        """Hold this replay key for ``group_key``; another group's claim is answered with
        the holder, unless that group has retired. The same group claims again freely (a
        retried or repeated first open), and its newest token is the one a release must
        name."""
        held = await _get(ctx, "holder")
        if held is not None and held["group_key"] != req["group_key"]:
            holder = await live_holder(ctx, held)
            if holder is not None:
                return {"ok": False, "holder": holder}
        ctx.set("holder", {"group_key": req["group_key"], "token": req["token"]})
        return {"ok": True}

    @replay.handler()
    async def release(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        """Free the key if ``group_key`` holds it under ``token`` (a late release of an
        earlier, refused open of the same group frees nothing a newer open claimed)."""
        holder = await _get(ctx, "holder")
        if holder == {"group_key": req["group_key"], "token": req["token"]}:
            ctx.clear("holder")

    @replay.handler(kind="shared")
    async def holder(ctx: restate.ObjectSharedContext) -> str | None:
        return await live_holder(ctx, await _get(ctx, "holder"))

    # The keys of the form ``{prefix}:{n}`` are held by the object keyed ``prefix``
    # (``claim_bucket``), under ``holder:{replay key}``: one call claims all of them.

    async def live_holders(
        ctx: Any, keys: list[str], group_key: str | None = None
    ) -> list[str | None]:
        """For each key of this object, the group other than ``group_key`` holding it
        (``None``: none does); a closed holder is asked once, whatever it held."""
        reads = _reads(ctx, *(f"holder:{rk}" for rk in keys))
        held = [await read for read in reads]
        alive: dict[str, str | None] = {}
        answer: list[str | None] = []
        for entry in held:
            if entry is None or entry["group_key"] == group_key:
                answer.append(None)
                continue
            other = entry["group_key"]
            if other not in alive:
                alive[other] = await live_holder(ctx, entry)
            answer.append(alive[other])
        return answer

    @replay.handler(state_preload=False)
    async def claim_keys(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
        """``claim`` for several keys of this object at once, all or none: the keys
        another live group holds are answered with their holders and nothing is taken."""
        keys: list[str] = req["keys"]
        holders = await live_holders(ctx, keys, req["group_key"])
        refused = [
            {"replay_key": rk, "holder": other}
            for rk, other in zip(keys, holders, strict=True)
            if other is not None
        ]
        if refused:
            return {"ok": False, "refused": refused}
        for rk in keys:
            ctx.set(f"holder:{rk}", {"group_key": req["group_key"], "token": req["token"]})
        return {"ok": True}

    @replay.handler(state_preload=False)
    async def release_keys(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        """``release`` for several keys of this object."""
        token = {"group_key": req["group_key"], "token": req["token"]}
        reads = _reads(ctx, *(f"holder:{rk}" for rk in req["keys"]))
        for rk, read in zip(req["keys"], reads, strict=True):
            if await read == token:
                ctx.clear(f"holder:{rk}")

    @replay.handler(kind="shared", state_preload=False)
    async def holders(ctx: restate.ObjectSharedContext, keys: list[str]) -> list[str | None]:
        return await live_holders(ctx, keys)

    def claim_calls(ctx: Any, key: str, envelopes: list[dict[str, Any]], body: Any) -> list[Any]:
        """The claims (``body`` given) or the holder reads (``body`` ``None``) of a group's
        replay keys, issued together: one call per key of its own object and one per
        object holding keys of the form ``{prefix}:{n}``. Each entry: the
        ``(position, replay key)`` it covers, its bucket (``None``: a key's own object),
        the call."""
        singles: list[tuple[int, str]] = []
        buckets: dict[str, list[tuple[int, str]]] = {}
        for position, envelope in enumerate(envelopes):
            rk = envelope["replay_key"]
            bucket = claim_bucket(rk)
            if bucket is None:
                singles.append((position, rk))
            else:
                buckets.setdefault(bucket, []).append((position, rk))
        calls: list[Any] = []
        for position, rk in singles:
            call = (
                ctx.object_call(holder, rk, None)
                if body is None
                else ctx.object_call(claim, rk, body)
            )
            calls.append(([(position, rk)], None, call))
        for bucket, entries in buckets.items():
            keys = [rk for _, rk in entries]
            call = (
                ctx.object_call(holders, bucket, keys)
                if body is None
                else ctx.object_call(claim_keys, bucket, {**body, "keys": keys})
            )
            calls.append((entries, bucket, call))
        return calls

    def replay_mismatch(key: str, position: int, rk: str, holder: str) -> dict[str, Any]:
        return _refusal(kit.replay_key_taken(key, position, rk, holder))

    # -- payload object ---------------------------------------------------------------

    @payload.handler()
    async def put(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        ctx.set(f"out:{req['replay_key']}", req["outcome"])

    @payload.handler(kind="shared")
    async def get(ctx: restate.ObjectSharedContext, replay_key: str) -> Any:
        return await _get(ctx, f"out:{replay_key}")

    @payload.handler()
    async def clear(ctx: restate.ObjectContext) -> None:
        ctx.clear_all()

    async def delete_payloads(group_key: str) -> None:
        """Delete a closed group's payloads from the policy's store (idempotent)."""
        if store is not None:
            await store.delete_group(group_key)

    # -- group object -----------------------------------------------------------------

    def child_request(
        key: str,
        epoch: str,
        position: int,
        envelope: dict[str, Any],
        target: str | None,
        *,
        cancel: bool,
        first_success: bool = False,
    ) -> tuple[dict[str, Any], str, dict[str, str]]:
        """A child's ``run`` request, idempotency key and headers (G-37); ``cancel``: its
        group declared ``CANCEL`` (every attempt of it reads the group's tombstone);
        ``first_success``: and its wake is ``FIRST_SUCCESS`` (its settlement says whether
        it succeeded, which decides the group, R-13)."""
        body = {
            "group_key": key,
            "epoch": epoch,
            "position": position,
            "envelope": envelope,
            "target": target,
        }
        if cancel:
            body["cancel"] = True
        if first_success:
            body["first_success"] = True
        rk = envelope["replay_key"]
        return (
            body,
            idempotency_key(envelope["name"], position, rk, epoch),
            child_headers(key, position, envelope),
        )

    async def cancel_unsettled(ctx: restate.ObjectContext, epoch: str) -> list[str]:
        """One cancel per unsettled child's invocation, not awaited (G-27, G-41); the
        replay keys it cancelled. A group that declared ``RUN_TO_COMPLETION`` did not
        wait for its children's invocation ids at open: they are asked for here, by
        sending each unsettled child again under its idempotency key, which answers
        with the id of the invocation already holding that key (it does not run again)."""
        listed = await _get(ctx, "invs")  # position order; ``inv:{rk}`` before it
        unsettled: list[tuple[int, dict[str, Any], str | None]] = []
        for position, entry in enumerate(await _get(ctx, "children") or []):
            envelope = entry["envelope"]
            rk = envelope["replay_key"]
            if await _get(ctx, f"settled:{rk}") is None:
                known = listed[position] if listed else await _get(ctx, f"inv:{rk}")
                unsettled.append((position, envelope, known))
        targets: dict[str, str] = await _get(ctx, "targets") or {}
        asked: dict[int, Any] = {}
        for position, envelope, known in unsettled:
            if known is None:
                # only a group declaring RUN_TO_COMPLETION has no ids to cancel by
                body, idem, headers = child_request(
                    ctx.key(), epoch, position, envelope, targets.get(str(position)), cancel=False
                )
                sent = ctx.service_send(run, body, idempotency_key=idem, headers=headers)
                asked[position] = sent.invocation_id()
        cancelled: list[str] = []
        for position, envelope, known in unsettled:
            invocation = known if known is not None else await asked[position]
            ctx.cancel_invocation(invocation)
            cancelled.append(envelope["replay_key"])
        return cancelled

    def collected(req: dict[str, Any]) -> bool:
        """Whether a first open hands its children to ``collect``: a group that wakes on
        ``ALL`` and runs its losers to completion (no cancel needs the invocation ids at
        hand, and no early rank is held up by a batch), opened by a controller that asks
        for it: an open of the release before, replayed here after a cut, sends its
        children itself as its journal says."""
        return bool(
            req.get("collect")
            and req["child_count"] >= COLLECT_FROM
            and req["wake"] == WakePolicy.ALL.value
            and req["disposition"] == LoserPolicy.RUN_TO_COMPLETION.value
        )

    @group.handler(kind="shared", state_preload=False)
    async def collect(ctx: restate.ObjectSharedContext, req: dict[str, Any]) -> None:
        """Start a slice of a wide group's children as calls and have what they settle
        ranked in batches.

        Each child (``collect`` in its request) returns its settlement instead of sending
        it, so a child costs one invocation, not two. While a batch is being recorded
        this invocation waits for that call only; then it takes the settlements of the
        children of its slice that finished meanwhile and sends them, in the order the
        engine journaled their results, to ``settle_batch``. The group object stays the
        rank authority (it ranks each batch in order, with the usual dedup). A child that
        ends with a terminal error (a cancel after a close narrowed the group, an unbound
        target) settles itself as before, and so does one a close started first by its
        idempotency key: their calls answer here without a settlement. A slice holds at
        most :data:`COLLECT_SLICE` children, so a wake-up costs the same at any width.
        Shared: it never holds the group's lock (G-39)."""
        key, first = ctx.key(), int(req["first"])
        targets: dict[str, str] = req.get("targets") or {}
        pending: list[Any] = []
        for offset, envelope in enumerate(req["children"]):
            position = first + offset
            body, idem, headers = child_request(
                key, req["epoch"], position, envelope, targets.get(str(position)), cancel=False
            )
            body["collect"] = True
            if req.get("trace"):
                body["trace"] = req["trace"]  # the caller's trace context (issue 23)
            pending.append(ctx.service_call(run, body, idempotency_key=idem, headers=headers))
        ready: list[dict[str, Any]] = []
        recording: Any = None
        while pending or ready or recording is not None:
            if recording is None and ready:
                recording = ctx.object_call(settle_batch, key, {"settlements": ready})
                ready = []
            if recording is not None:
                await recording  # the children's results gather meanwhile
                recording = None
            else:
                await restate.wait_completed(*pending)
            still: list[Any] = []
            for call in pending:
                if not call.is_completed():
                    still.append(call)
                    continue
                try:
                    result = await call
                except TerminalError:
                    continue  # it settled itself
                if isinstance(result, dict) and "settlement" in result:
                    ready.append(result["settlement"])
            pending = still

    @group.handler()
    async def open(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
        key = ctx.key()
        envelopes: list[dict[str, Any]] = req["children"]
        hashes: list[str] = req["hashes"]
        offer = kit.Offer(
            key,
            req["child_count"],
            req["wake"],
            req["disposition"],
            tuple((e["replay_key"], h) for e, h in zip(envelopes, hashes, strict=True)),
        )
        if await _get(ctx, "tombstone") is not None:
            return _refusal(kit.group_closed(key))
        shape = await _get(ctx, "shape")
        if shape is not None:
            recorded = await _get(ctx, "children") or []
            try:
                kit.check_reopen(
                    offer,
                    _known(key, shape),
                    [
                        kit.RecordedChild(p, c["envelope"]["replay_key"], c["hash"])
                        for p, c in enumerate(recorded)
                    ],
                )
            except EffectHostError as exc:
                return _refusal(exc)
            shape["owner"] = req.get("owner")
            shape["incarnation"] = req.get("incarnation")
            ctx.set("shape", shape)
            return {"ok": True, "epoch": shape["epoch"], "reopened": True}
        epoch = str(ctx.uuid())
        # R-6: claim every child's replay key before anything of the group is recorded
        # (the calls go out together); a refused open releases what it claimed.
        body = {"group_key": key, "token": epoch}
        taken: list[tuple[str | None, list[str]]] = []
        refused: list[tuple[int, str, str]] = []
        for entries, bucket, call in claim_calls(ctx, key, envelopes, body):
            answer = await call
            if answer["ok"]:
                taken.append((bucket, [rk for _, rk in entries]))
            elif bucket is None:
                refused.append((*entries[0], answer["holder"]))
            else:
                at = {rk: p for p, rk in entries}
                refused += [
                    (at[r["replay_key"]], r["replay_key"], r["holder"]) for r in answer["refused"]
                ]
        if refused:
            for bucket, keys in taken:
                if bucket is None:
                    ctx.object_send(release, keys[0], body)
                else:
                    ctx.object_send(release_keys, bucket, {**body, "keys": keys})
            return replay_mismatch(key, *min(refused))
        ctx.set(
            "shape",
            {
                "child_count": req["child_count"],
                "wake": req["wake"],
                "declared": req["disposition"],
                "effective": req["disposition"],
                "epoch": epoch,
                "owner": req.get("owner"),
                "incarnation": req.get("incarnation"),
                "layout": LAYOUT,
            },
        )
        ctx.set(
            "children",
            [{"envelope": e, "hash": h} for e, h in zip(envelopes, hashes, strict=True)],
        )
        ctx.set("counter", 0)
        if req.get("waiter"):
            # a caller inside Restate parks its read of rank 1 here, saving that read's
            # own invocation; ``settle`` resolves it like any parked reader
            ctx.set("waiters", {"1": [req["waiter"]]})
        targets: dict[str, str] = req.get("targets") or {}
        if targets:
            ctx.set("targets", targets)  # a cancel may send a routed child again
        if collected(req):
            # a wide group: its collectors start the children and settle them in batches
            for first in range(0, len(envelopes), COLLECT_SLICE):
                part = range(first, min(first + COLLECT_SLICE, len(envelopes)))
                ctx.object_send(
                    collect,
                    key,
                    {
                        "epoch": epoch,
                        "first": first,
                        "children": envelopes[part.start : part.stop],
                        "targets": {str(p): targets[str(p)] for p in part if str(p) in targets},
                        **({"trace": req["trace"]} if req.get("trace") else {}),
                    },
                )
            return {"ok": True, "epoch": epoch, "reopened": False, "parked": req.get("waiter")}
        handles = []
        for position, envelope in enumerate(envelopes):
            body, idem, headers = child_request(
                key,
                epoch,
                position,
                envelope,
                targets.get(str(position)),
                cancel=req["disposition"] == CANCEL,
                first_success=req["disposition"] == CANCEL
                and req["wake"] == WakePolicy.FIRST_SUCCESS.value,
            )
            if req.get("trace"):
                body["trace"] = req["trace"]  # the caller's trace context (issue 23)
            handles.append(ctx.service_send(run, body, idempotency_key=idem, headers=headers))
        if req["disposition"] == LoserPolicy.CANCEL.value:
            # likely to cancel: keep the ids now (waiting for them holds the group's lock
            # while its children start, so a group that runs its losers to completion
            # asks for them only if a close narrows it to CANCEL)
            ctx.set("invs", [await handle.invocation_id() for handle in handles])
        return {"ok": True, "epoch": epoch, "reopened": False, "parked": req.get("waiter")}

    async def record(
        ctx: restate.ObjectContext, state: dict[str, Any], req: dict[str, Any], settled: bool
    ) -> bool:
        """Rank one settlement against ``state`` (``shape``, ``counter``, ``waiters``,
        ``tombstone`` as read, updated here): dedup, ``rank = counter + 1``, store the
        record, wake its readers (G-38); whether it took a rank. ``state["waiters_dirty"]``
        tells the caller to write ``waiters`` back; a retirement clears everything and sets
        ``retired``."""
        rk = req["replay_key"]
        shape, tombstone = state["shape"], state["tombstone"]
        closing = shape is None and _closing(tombstone)
        if closing:
            shape = tombstone["shape"]
        if shape is None or req.get("epoch") != shape["epoch"]:
            # retired or a stale epoch: harmless, but a late child may have written a
            # payload after retirement deleted the group's: delete again (the key can
            # never be reopened, so nothing of the group is still referenced).
            stored = req.get("stored")
            if store is not None and isinstance(stored, dict) and stored.get("form") == "ref":
                await ctx.run("delete late payload", delete_payloads, args=(ctx.key(),))
            return False
        rank = kit.next_rank(int(state["counter"] or 0), settled)
        if rank is None:
            return False  # the child holds a rank already: a duplicate takes none
        entry = {"position": req["position"], "replay_key": rk}
        if "stored" in req:
            entry["stored"] = req["stored"]
        elif "ref" in req:
            entry["ref"] = req["ref"]
            if not shape.get("spilled"):
                shape["spilled"] = True  # retirement clears the payload object only then
                if closing:  # ``shape`` is the tombstone's own
                    ctx.set("tombstone", tombstone)
                else:
                    ctx.set("shape", shape)
        else:
            entry["outcome"] = req["outcome"]
        state["counter"] = rank
        if not state.get("batched"):
            ctx.set("counter", rank)  # where ``settle`` wrote it (a batch: once, at its end)
        ctx.set(f"rank:{rank}", entry)
        ctx.set(f"settled:{rk}", rank)
        if closing:  # a closed group's child: its rank is never served (R-11)
            if rank >= shape["child_count"]:
                await retire(ctx, shape, tombstone["effective"])
                state.update(shape=None, tombstone={"effective": tombstone["effective"]})
                state.update(retired=True, waiters_dirty=False)
            return True
        if req.get("won") and shape["wake"] == WakePolicy.FIRST_SUCCESS.value:
            ctx.set("decided", True)  # a success holds a rank (R-13; read by re-runs)
        waiters = state["waiters"] or {}
        woken = waiters.pop(str(rank), None)
        if woken:
            for aid in woken:
                ctx.resolve_awakeable(aid, {"record": entry})
            state["waiters"] = waiters
            state["waiters_dirty"] = True
        return True

    @group.handler(state_preload=False)
    async def settle(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any] | None:
        """Rank authority: dedup, ``rank = counter + 1``, store the reference, wake — in
        one handler step (G-38). State is read lazily, all five keys in one round trip,
        so a settle costs the same in a group of 10 or 10,000 children. A settlement that
        asks (``reply``: a traced child calls instead of sending) is answered with the
        rank its child holds (``None``: none, e.g. its group retired)."""
        ranks = await rank_batch(ctx, [req])
        return {"rank": ranks[0]} if req.get("reply") else None

    @group.handler(state_preload=False)
    async def settle_batch(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        """``settle`` for several settlements in one handler step, ranked in the order
        given (what the collector of a wide group saw finish, see ``collect``)."""
        await rank_batch(ctx, req["settlements"])

    async def rank_batch(ctx: restate.ObjectContext, batch: list[dict[str, Any]]) -> list[Any]:
        """What ``settle_batch`` records; the rank each settlement's child holds after it."""
        first, *others = dict.fromkeys(f"settled:{m['replay_key']}" for m in batch)
        # the reads and writes of a batch of one are those of ``settle`` before batches
        # existed, in the same order: a settle of that release cut off mid-step replays
        reads = _reads(ctx, "shape", first, "counter", "waiters", "tombstone", *others)
        shape, mark, counter, waiters, tombstone, *marks = [await read for read in reads]
        state: dict[str, Any] = {
            "shape": shape,
            "counter": counter,
            "waiters": waiters,
            "tombstone": tombstone,
            "batched": len(batch) > 1,
        }
        held = {
            k: m for k, m in zip([first, *others], [mark, *marks], strict=True) if m is not None
        }
        ranks: list[Any] = []
        for message in batch:
            name = f"settled:{message['replay_key']}"
            if await record(ctx, state, message, name in held):
                held[name] = state["counter"]
            ranks.append(held.get(name))
        if state["batched"] and not state.get("retired") and state["counter"] != counter:
            ctx.set("counter", state["counter"])
        if state.get("waiters_dirty"):
            ctx.set("waiters", state["waiters"])
        return ranks

    async def ranks_from(
        ctx: restate.ObjectContext | restate.ObjectSharedContext, rank: int, counter: int
    ) -> list[dict[str, Any]]:
        """The records of ranks ``rank``… up to ``counter`` (at most :data:`BATCH`), read in
        one round trip; a batch stops before a record that refers to the payload object."""
        last = min(counter, rank + BATCH - 1)
        reads = _reads(ctx, *(f"rank:{n}" for n in range(rank, last + 1)))
        records: list[dict[str, Any]] = []
        for n, read in zip(range(rank, last + 1), reads, strict=True):
            record = await read
            if record is None or (records and "ref" in record):
                break
            records.append({"rank": n, **record})
        return records

    @group.handler(state_preload=False)
    async def register_waiter(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        """Answer the awakeable with rank ``rank`` and those after it that are recorded,
        or park it until ``settle`` records that rank.

        With ``claim`` (a handle's shape, sent by a caller inside Restate that awaits the
        awakeable in its own invocation) the handle is fenced first and a refusal is the
        answer (R-2); the wait costs the caller this one invocation."""
        rank, aid = int(req["rank"]), req["awakeable"]
        reads = _reads(ctx, "shape", "tombstone", "counter", "waiters", "held")
        shape, tombstone, counter, waiters, held = [await read for read in reads]
        if "claim" in req:
            key = ctx.key()
            known: kit.Known = (
                _known(key, shape)
                if shape is not None
                else (kit.Tombstone(key) if tombstone is not None else None)
            )
            try:
                kit.check_await(key, _claim(req["claim"], rank - 1), known)  # R-2
            except EffectHostError as exc:
                ctx.resolve_awakeable(aid, _refusal(exc))
                return
        if shape is None:
            ctx.resolve_awakeable(aid, {"closed": True})
            return
        records = await ranks_from(ctx, rank, int(counter or 0))
        if records:
            first = {k: v for k, v in records[0].items() if k != "rank"}
            ctx.resolve_awakeable(aid, {"record": first, "more": records[1:]})
            return
        waiters = waiters or {}
        waiters.setdefault(str(rank), []).append(aid)
        ctx.set("waiters", waiters)
        if held:  # a caller awaits a rank that does not exist yet: the losers run (R-13)
            for child_aid in held:
                ctx.resolve_awakeable(child_aid, {"run": True})
            ctx.clear("held")

    @group.handler(state_preload=False)
    async def hold(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        """Park a re-run of a loser of a decided group (R-13) until a caller awaits a rank
        that does not exist yet (``register_waiter`` answers ``run``) or the group closes
        (``close`` answers ``cancel``; its cancel of the invocation ends the wait too).
        Answered at once when a read is already parked or the group is no longer open."""
        aid = req["awakeable"]
        reads = _reads(ctx, "shape", "tombstone", "waiters", "held")
        shape, tombstone, waiters, held = [await read for read in reads]
        if shape is None or shape["epoch"] != req.get("epoch"):
            closed_cancel = _closing(tombstone) and tombstone["effective"] == CANCEL
            ctx.resolve_awakeable(aid, {"cancel": True} if closed_cancel else {"run": True})
        elif any(waiters.values() if waiters else ()):
            ctx.resolve_awakeable(aid, {"run": True})
        else:
            ctx.set("held", [*(held or []), aid])

    async def known(ctx: restate.ObjectSharedContext | restate.ObjectContext) -> kit.Known:
        """What the group object knows of its key: the record, a tombstone, or nothing."""
        key = ctx.key()
        shape = await _get(ctx, "shape")
        if shape is not None:
            return _known(key, shape)
        return kit.Tombstone(key) if await _get(ctx, "tombstone") is not None else None

    async def materialize(
        ctx: restate.ObjectSharedContext, rank: int, record: dict[str, Any]
    ) -> dict[str, Any]:
        if "ref" in record:
            outcome = await ctx.object_call(get, ctx.key(), record["replay_key"])
            if outcome is None:
                return error(
                    "payload_missing",
                    f"rank {rank} of {ctx.key()!r} refers to a stored outcome that is gone",
                    group_key=ctx.key(),
                    rank=rank,
                )
            record = {**record, "outcome": outcome}
            record.pop("ref")
        return {"rank": rank, **record}

    @group.handler(kind="shared", state_preload=False)
    async def await_rank(ctx: restate.ObjectSharedContext, req: dict[str, Any]) -> dict[str, Any]:
        """Read rank ``consumed + 1`` first (with the recorded ranks after it, as ``more``);
        otherwise park on an awakeable the exclusive handler resolves. Never holds the
        object's lock (G-39)."""
        rank = int(req["rank"])
        key = ctx.key()
        reads = _reads(ctx, "shape", "tombstone", "counter")
        shape, tombstone, counter = [await read for read in reads]
        known: kit.Known = (
            _known(key, shape)
            if shape is not None
            else (kit.Tombstone(key) if tombstone is not None else None)
        )
        try:
            kit.check_await(key, _claim(req, rank - 1), known)  # R-2
        except EffectHostError as exc:
            return _refusal(exc)
        records = await ranks_from(ctx, rank, int(counter or 0))
        more: list[dict[str, Any]] = []
        if records:
            record = {k: v for k, v in records[0].items() if k != "rank"}
            more = records[1:]
        else:
            # The shared handler sees a snapshot: the waker hands over the record itself.
            aid, woken = ctx.awakeable(type_hint=dict)
            ctx.object_send(register_waiter, key, {"rank": rank, "awakeable": aid})
            signal = await woken
            if signal.get("closed"):
                return _refusal(kit.group_closed(key))
            record, more = signal["record"], signal.get("more") or []
        answer = await materialize(ctx, rank, record)
        if more and "error" not in answer:
            answer["more"] = more
        return answer

    @group.handler(kind="shared", state_preload=False)
    async def retired(ctx: restate.ObjectSharedContext) -> bool:
        """Whether the group has retired (closed, and every child settled): then it holds
        none of its replay keys (R-6, R-11). A group closed by the release before retired
        at close (its tombstone has no ``pending``)."""
        tombstone = await _get(ctx, "tombstone")
        return tombstone is not None and not _closing(tombstone)

    @group.handler(kind="shared")
    async def describe(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
        """Shape, settlement order and unsettled children (inspection and the drain)."""
        shape = await _get(ctx, "shape")
        closed = False
        if shape is None:
            tombstone = await _get(ctx, "tombstone")
            if not _closing(tombstone):
                return {"recorded": False, "closed": tombstone is not None}
            shape, closed = tombstone["shape"], True  # ranks show until retirement (R-11)
        counter = int(await _get(ctx, "counter") or 0)
        children = await _get(ctx, "children") or []
        order = []
        for rank in range(1, counter + 1):
            record = await _get(ctx, f"rank:{rank}")
            order.append(record["position"])
        settled = set(order)
        unsettled = [c["envelope"] for i, c in enumerate(children) if i not in settled]
        return {
            "recorded": True,
            "closed": closed,
            "shape": shape,
            "order": order,
            "unsettled": unsettled,
        }

    @group.handler(kind="shared")
    async def claims(ctx: restate.ObjectSharedContext, req: dict[str, Any]) -> dict[str, Any]:
        """The first replay key of ``replay_keys`` another group holds (R-6), read before
        a first open is refused for a child it cannot resolve (R-2: ``ReplayMismatch``
        comes first)."""
        key = ctx.key()
        envelopes = [{"replay_key": rk} for rk in req["replay_keys"]]
        held: list[tuple[int, str, str]] = []
        for entries, bucket, call in claim_calls(ctx, key, envelopes, None):
            answer = await call
            for (position, rk), other in zip(
                entries, [answer] if bucket is None else answer, strict=True
            ):
                if other is not None and other != key:
                    held.append((position, rk, other))
        return replay_mismatch(key, *min(held)) if held else {"ok": True}

    async def retire(ctx: restate.ObjectContext, shape: dict[str, Any], effective: str) -> None:
        """Delete the group's state, its event waits and its payloads, keeping only the
        tombstone (R-4): the group holds none of its replay keys from now on (R-6, R-11)."""
        ctx.clear_all()
        ctx.set("tombstone", {"effective": effective, "epoch": shape["epoch"]})
        if shape.get("spilled") or shape.get("layout") is None:
            ctx.object_send(clear, ctx.key(), None)  # a group of an earlier release: no flag
        if store is not None:
            await ctx.run("delete payloads", delete_payloads, args=(ctx.key(),))

    @group.handler()
    async def close(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
        """Idempotent; narrows only; records the tombstone with the disposition in force,
        then under CANCEL issues one cancel per unsettled child and returns without
        awaiting them (G-41). The group retires (its state goes) when its last child
        settles, here if none is left (R-11)."""
        key = ctx.key()
        try:  # a close of a closed group is a no-op (R-2, R-4)
            policy = kit.check_close(key, _claim(req), await known(ctx), req.get("close_with"))
        except EffectHostError as exc:
            return _refusal(exc)
        if policy is None:
            return {"ok": True}
        shape = await _get(ctx, "shape")
        target = policy.value
        waiters = await _get(ctx, "waiters") or {}
        for aids in waiters.values():
            for aid in aids:
                ctx.resolve_awakeable(aid, {"closed": True})
        for aid in await _get(ctx, "held") or []:  # held losers (R-13)
            ctx.resolve_awakeable(aid, {"cancel": True} if target == CANCEL else {"run": True})
        ctx.clear("held")
        if int(await _get(ctx, "counter") or 0) >= shape["child_count"]:
            await retire(ctx, shape, target)
            return {"ok": True, "cancelled": []}
        # closed, not retired: the tombstone keeps the shape for the children still to
        # settle; it is written before the cancels, so an attempt of a cancelled child
        # that reads it never starts its tool (see ``run``)
        ctx.clear("shape")
        ctx.clear("waiters")
        ctx.set(
            "tombstone",
            {
                "effective": target,
                "epoch": shape["epoch"],
                "pending": True,
                "shape": {**shape, "effective": target},
            },
        )
        cancelled = (
            await cancel_unsettled(ctx, shape["epoch"])
            if target == LoserPolicy.CANCEL.value
            else []
        )
        return {"ok": True, "cancelled": cancelled}

    @group.handler()
    async def drain(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
        """Apply a declared CANCEL for a caller whose earlier incarnation is gone (G-29):
        only while the group is still owned by ``gone``, the incarnation the drain judged
        gone (a reopen since made a live one its owner, R-1)."""
        shape = await _get(ctx, "shape")
        if shape is None:
            return {"cancelled": []}
        cancelled: list[str] = []
        if (
            shape["effective"] == LoserPolicy.CANCEL.value
            and shape.get("owner") == req.get("owner")
            and shape.get("incarnation") != req.get("incarnation")
            and shape.get("incarnation") == req.get("gone", shape.get("incarnation"))
        ):
            cancelled = await cancel_unsettled(ctx, shape["epoch"])
            ctx.clear("held")  # the cancels end the held losers' waits (R-13)
        return {"cancelled": cancelled}

    @group.handler()
    async def deliver(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
        """Deliver an event to the unsettled ``await_event`` children named ``name``."""
        key = ctx.key()
        if await _get(ctx, "shape") is None:
            tombstone = await _get(ctx, "tombstone")
            if tombstone is None:
                return error("unknown_group", f"no group is recorded under {key!r}", group_key=key)
            if not _closing(tombstone):
                return {"reached": 0}  # retired: its event waits are gone (R-11)
        reached = 0
        for entry in await _get(ctx, "children") or []:
            envelope = entry["envelope"]
            rk = envelope["replay_key"]
            if envelope["kind"] != EffectKind.AWAIT_EVENT or envelope["name"] != req["name"]:
                continue
            if await _get(ctx, f"settled:{rk}") is not None or await _get(ctx, f"evd:{rk}"):
                continue
            ctx.set(f"evd:{rk}", True)
            value = {"v": req.get("payload")}
            aid = await _get(ctx, f"evw:{rk}")
            if aid is not None:
                ctx.resolve_awakeable(aid, value)
            else:
                ctx.set(f"evp:{rk}", value)
            reached += 1
        return {"reached": reached}

    @group.handler()
    async def event_wait(ctx: restate.ObjectContext, req: dict[str, Any]) -> None:
        rk, aid = req["replay_key"], req["awakeable"]
        pending = await _get(ctx, f"evp:{rk}")
        if pending is not None:
            ctx.resolve_awakeable(aid, pending)
            ctx.clear(f"evp:{rk}")
        elif await _get(ctx, "children") is not None:  # not retired (R-11)
            ctx.set(f"evw:{rk}", aid)

    # -- child service ----------------------------------------------------------------

    admin: list[Nodes] = []  # one client per endpoint process, made on first use

    async def admin_request(method: str, path: str, **kwargs: Any) -> Any:
        """``method path`` on the first admin node that answers below 500 (R-12);
        none within :data:`ADMIN_BOUND` seconds raises, so the attempt is retried."""
        assert admin_urls is not None
        if not admin:
            client = httpx.AsyncClient(timeout=ADMIN_TIMEOUT)
            admin.append(Nodes(admin_urls, client, (httpx.TransportError,)))
        try:
            return await admin[0].request(method, path, bound=ADMIN_BOUND, **kwargs)
        except _Unreachable as exc:
            raise EngineUnavailable(
                f"no admin API of {list(admin_urls)} answered {method} {path}: {exc}",
                operation="admin read",
                tried_for=exc.tried_for,
            ) from None

    async def group_view(group_key: str, keys: tuple[str, ...]) -> dict[str, Any]:
        """The group object's state entries ``keys``, read afresh (admin SQL) by an
        attempt about to start a tool: a re-run of a cut-off attempt replays journaled
        answers, and its cancel may arrive after it began (issue 25). No invocation is
        spent; without ``admin_url`` nothing is read. A failed read raises, so the
        attempt is retried and the tool does not start."""
        if admin_urls is None:
            return {}
        names = ", ".join(_sql_text(k) for k in keys)
        sql = (
            f"SELECT key, value_utf8 FROM state WHERE service_name = '{GROUP}' "
            f"AND service_key = {_sql_text(group_key)} AND key IN ({names})"
        )
        answer = await admin_request(
            "POST", "/query", json={"query": sql}, headers={"Accept": "application/json"}
        )
        answer.raise_for_status()
        rows = answer.json().get("rows") or []
        return {row["key"]: json.loads(row["value_utf8"]) for row in rows}

    async def guarded_tool(
        group_key: str, envelope: EffectEnvelope, guard: bool, rerun: bool, invocation: str | None
    ) -> dict[str, Any]:
        """The tool's outcome, or ``cancelled`` without starting it when ``guard`` asks
        and its group was closed with ``CANCEL`` (G-27: a loser never starts after its
        close returned), or :data:`HELD` without starting it when ``rerun`` and the group
        is decided (R-13: its losers stay down after a crash)."""
        if guard:
            keys = ("tombstone", "shape", "decided", "counter") if rerun else ("tombstone",)
            state = await group_view(group_key, keys)
            tombstone = state.get("tombstone")
            if isinstance(tombstone, dict) and tombstone.get("effective") == CANCEL:
                return Outcome.cancelled().model_dump(mode="json")
            if rerun and _decided(state):
                return dict(HELD)
        return await execute_tool(envelope, await attempt_of(invocation))

    async def attempt_of(invocation: str | None) -> int:
        """The attempt ``current_child()`` reports (issue 25): 1 on a first run; on a re-run
        of a tool an earlier attempt was cut off in (``invocation`` given), the server's
        retry count of the invocation, at least 2 (2 without an admin URL). A failed read
        raises, so the attempt is retried and the tool does not start."""
        if invocation is None:
            return 1
        if admin_urls is None:
            return 2
        sql = f"SELECT retry_count FROM sys_invocation WHERE id = {_sql_text(invocation)}"
        answer = await admin_request(
            "POST", "/query", json={"query": sql}, headers={"Accept": "application/json"}
        )
        answer.raise_for_status()
        rows = answer.json().get("rows") or []
        count = rows[0].get("retry_count") if rows else None
        return max(2, count) if isinstance(count, int) else 2

    async def execute_tool(envelope: EffectEnvelope, attempt: int = 1) -> dict[str, Any]:
        if resolver is None:
            raise NoExecutor(
                f"child {envelope.replay_key!r}: this endpoint has no resolver registered",
                replay_key=envelope.replay_key,
            )
        executor = resolver.resolve(envelope)
        if executor is None:  # retryable: a later deployment (or un-deny) may run it
            raise NoExecutor(
                f"child {envelope.replay_key!r}: the resolver returned None",
                replay_key=envelope.replay_key,
            )
        outcome = await executor.execute(ExecutionInput(envelope, attempt))
        return outcome.model_dump(mode="json")

    async def route(ctx: restate.Context, target: str, envelope: EffectEnvelope) -> Outcome:
        service, _, handler = target.partition("/")

        async def bound() -> bool:
            if admin_urls is None:
                return True
            answer = await admin_request("GET", f"/services/{service}/handlers/{handler}")
            if answer.status_code == UNBOUND_CODE:
                return False
            answer.raise_for_status()
            return True

        if not await ctx.run("check target", bound):
            raise TerminalError(
                f"no deployment binds {service}/{handler}", status_code=UNBOUND_CODE
            )
        raw = await ctx.generic_call(service, handler, canonical_json(envelope.input))
        return Outcome.success(json.loads(raw) if raw else None)

    async def encode(
        group_key: str, replay_key: str, position: int, document: dict[str, Any]
    ) -> dict[str, Any]:
        """The stored form of an outcome under ``payloads`` (sealed for its slot and
        position, by reference)."""
        assert payloads is not None
        outcome = Outcome.model_validate(document)
        stored = await encode_outcome(payloads, group_key, replay_key, outcome, position=position)
        return stored.model_dump(mode="json")

    async def encoded(
        ctx: restate.Context, group_key: str, rk: str, position: int, outcome: Outcome
    ) -> Any:
        """Encode inside ``ctx.run``: a fresh nonce and payload name per attempt, so the
        journal must fix the one the settlement carries (a replay sends the same)."""
        document = outcome.model_dump(mode="json")
        return await ctx.run("encode outcome", encode, args=(group_key, rk, position, document))

    def tool_action(
        req: dict[str, Any],
        envelope: EffectEnvelope,
        guard: bool,
        rerun: bool,
        seen: dict[str, str],
        invocation: str | None = None,
    ) -> Callable[[], Coroutine[Any, Any, dict[str, Any]]]:
        """The tool's run: its outcome (with a payload policy, its stored form, the
        plaintext status kept in ``seen``), or :data:`HELD`."""
        group_key = req["group_key"]

        async def action() -> dict[str, Any]:
            with telemetry.attached(req.get("trace")):  # the child's span in the caller's trace
                if req.get("trace"):
                    telemetry.rank_later()  # the span waits for the rank ``settle`` replies
                outcome = await guarded_tool(group_key, envelope, guard, rerun, invocation)
            if outcome == HELD:
                # encoded now: once a cancel ends the hold the child awaits nothing more
                # (a cancel still pending would cut that await, and the settle with it)
                outcome = {**HELD, "cancelled": Outcome.cancelled().model_dump(mode="json")}
            elif payloads is not None:
                seen["status"] = outcome["status"]
            if payloads is not None:
                rk, position = envelope.replay_key, req["position"]
                if outcome.get("held"):
                    cancelled = await encode(group_key, rk, position, outcome["cancelled"])
                    return {**outcome, "cancelled": cancelled}
                return await encode(group_key, rk, position, outcome)
            return outcome

        return action

    async def stored_status(group_key: str, rk: str, position: int, stored: Any) -> str | None:
        """The status of a stored outcome whose run this attempt replayed (``None``:
        unreadable here)."""
        try:
            decoded = await decode_outcome(payloads, group_key, rk, stored, position=position)
        except EffectHostError:
            return None
        return decoded.status

    @child.handler()
    async def run(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
        """One child, run once: execute, store the outcome, send the settlement (G-37).

        With a payload policy the tool runs and its outcome is encoded in the same
        ``ctx.run``, so the journal records only the stored form, never the plaintext of
        a sealed outcome; the invocation's result is that stored form too.

        A child whose request carries its caller's trace context (issue 23) calls
        ``settle`` instead of sending it, also in a wide group (its collector then has
        nothing to settle for it), and its span ends with the rank the reply names. The
        request decides, not this process's telemetry, so a replay issues what the
        journal holds; without a trace context the messages are those of an untraced
        release."""
        if not req.get("trace"):
            return await run_child(ctx, req, None)
        rank: list[Any] = [None]
        try:
            return await run_child(ctx, req, rank)
        finally:  # also when cut off: the span held for its rank ends
            telemetry.ranked(req["group_key"], req["position"], rank[0])

    async def run_child(
        ctx: restate.Context, req: dict[str, Any], rank: list[Any] | None
    ) -> dict[str, Any]:
        """``run``; ``rank`` given: settle by a call and put the rank there."""
        envelope = EffectEnvelope.model_validate(req["envelope"])
        group_key, epoch, position = req["group_key"], req["epoch"], req["position"]
        rk = envelope.replay_key
        terminal: TerminalError | None = None
        stored: Any = None
        outcome: Outcome | None = None
        seen: dict[str, str] = {}
        settles_cancelled: Any = None
        try:
            if req.get("target"):
                outcome = await route(ctx, req["target"], envelope)
            elif envelope.kind == EffectKind.SLEEP:
                await ctx.sleep(timedelta(seconds=sleep_seconds(envelope)))
                outcome = Outcome.success(None)
            elif envelope.kind == EffectKind.AWAIT_EVENT:
                aid, arrived = ctx.awakeable(type_hint=dict)
                ctx.object_send(event_wait, group_key, {"replay_key": rk, "awakeable": aid})
                event = await arrived
                outcome = Outcome.success(event.get("v"))
            else:
                guard, rerun = _guarded(ctx, req), _rerun(ctx)
                invocation = ctx.request().id if rerun else None  # a re-run's attempt count
                action = tool_action(req, envelope, guard, rerun, seen, invocation)
                executed: dict[str, Any] = await ctx.run("execute", action)
                if executed.get("held"):
                    # a loser of a decided group re-run after a crash (R-13): it starts
                    # its tool only once a caller awaits a rank that does not exist yet
                    settles_cancelled = executed["cancelled"]
                    aid, woken = ctx.awakeable(type_hint=dict)
                    ctx.object_send(hold, group_key, {"awakeable": aid, "epoch": epoch})
                    if (await woken).get("run"):
                        settles_cancelled = None
                        action = tool_action(req, envelope, guard, False, seen, invocation)
                        executed = await ctx.run("execute held", action)
                    else:
                        executed = settles_cancelled
                if payloads is not None:
                    stored = executed
                else:
                    outcome = Outcome.model_validate(executed)
        except TerminalError as exc:
            terminal = exc
            stored = None
            if exc.status_code == CANCELLED_CODE:
                outcome = Outcome.cancelled()
                if payloads is not None:
                    stored = settles_cancelled  # a held child cut: encoded already
            else:
                outcome = Outcome.failure("TerminalError", exc.message, code=exc.status_code)
        message: dict[str, Any] = {
            "replay_key": rk,
            "position": position,
            "epoch": epoch,
        }
        if payloads is not None:
            if stored is None:
                assert outcome is not None
                stored = await encoded(ctx, group_key, rk, position, outcome)
            message["stored"] = stored
            result: dict[str, Any] = stored
            if req.get("first_success"):
                status = (
                    seen.get("status")
                    or (outcome.status if outcome is not None else None)
                    or await stored_status(group_key, rk, position, stored)
                )
                if status == "success":
                    message["won"] = True
        else:
            assert outcome is not None
            document = outcome.model_dump(mode="json")
            if len(canonical_json(document)) > INLINE_LIMIT:
                await ctx.object_call(put, group_key, {"replay_key": rk, "outcome": document})
                message["ref"] = {"object": PAYLOAD, "key": group_key, "replay_key": rk}
            else:
                message["outcome"] = document
            result = document
            if req.get("first_success") and outcome.status == "success":
                message["won"] = True
        if rank is not None:
            try:
                reply = await ctx.object_call(settle, group_key, {**message, "reply": True})
                rank[0] = reply.get("rank") if isinstance(reply, dict) else None
            except TerminalError:
                pass  # a cancel cut the wait, not the settle: it was sent
        elif req.get("collect") and terminal is None:
            return {"settlement": message}  # its group's collector settles it (``collect``)
        else:
            ctx.object_send(settle, group_key, message)
        if terminal is not None:
            raise terminal
        return result

    return [group, child, payload, replay, owner]


def build_app(
    resolver: GroupExecutors | None,
    *,
    admin_url: str | Sequence[str] | None = None,
    retry_policy: Any = None,
    extra_services: list[Any] | None = None,
    payloads: PayloadPolicy | None = None,
) -> Callable[..., Awaitable[None]]:
    """The ASGI endpoint binding the group object, the child service and the payload
    object (G-42), plus ``extra_services`` (the user's own handlers). ``payloads`` as in
    :func:`build_services`."""
    services = build_services(
        resolver, admin_url=admin_url, retry_policy=retry_policy, payloads=payloads
    )
    app: Callable[..., Awaitable[None]] = restate.app([*services, *(extra_services or [])])
    return app
