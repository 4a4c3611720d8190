"""A host's own byte limit (§7, R-8), for a host built with one below the contract's.

A host may be configured to accept less than the contract's limits allow (a message size
of its engine, a column size). What it does at that limit is the contract's rule all the
same: an oversized payload is bad input, refused with ``PayloadTooLarge`` naming ids and
changing nothing recorded; a tool result over it is the child's typed failure. A host
declares the capability ``payload_limit`` and its limit (``max_payload_bytes``).
"""

from __future__ import annotations

from typing import Any

from effecthost.contract import (
    EffectEnvelope,
    EffectKind,
    PayloadTooLarge,
    UnknownGroup,
    WakePolicy,
    canonical_json,
)

from .._context import INPUT_MARKER, CheckContext
from .._registry import check
from .._tools import STEP, step_input


def _limit(t: CheckContext) -> int:
    limit = t.host.max_payload_bytes
    t.expect(limit is not None, "the host declares payload_limit but no max_payload_bytes")
    assert limit is not None
    return limit


def _sized(t: CheckContext, label: str, size: int) -> EffectEnvelope:
    """A step that runs at once and whose input encodes (canonical JSON) to ``size`` bytes."""
    spec: dict[str, Any] = {**step_input(t.tag(label), gate=False), "note": INPUT_MARKER, "pad": ""}
    spec["pad"] = "p" * (size - len(canonical_json(spec)))
    assert len(canonical_json(spec)) == size
    return EffectEnvelope(replay_key=t.tag(label), kind=EffectKind.TOOL_CALL, name=STEP, input=spec)


@check("G-10", requires=("payload_limit",))
async def check_an_input_over_the_hosts_limit_is_refused_and_records_nothing(
    t: CheckContext,
) -> None:
    """§7 (bad input, an oversized payload): a first open whose child's input encodes to
    more than the host's byte limit is ``PayloadTooLarge`` carrying the group key, that
    child's replay key and its position — also when it is not the first child — and
    records nothing: the key is not listed, has no order, no child ran, and a second try
    is refused the same way. An input of exactly the limit is accepted and runs."""
    limit = _limit(t)
    ctl = await t.ctl()
    group = t.group("g", [t.step("small", gate=False), _sized(t, "big", limit + 1)])
    for attempt in ("an open", "a second open"):
        await t.refuses(
            PayloadTooLarge,
            ctl.open_effect_group(group),
            f"{attempt} with an input over the host's limit",
            names={"group_key": group.key, "replay_key": t.tag("big"), "position": 1},
        )
    t.expect(group.key not in await ctl.open_group_keys(), "the refused group is listed")
    await t.refuses(UnknownGroup, ctl.settlement_order(group.key), "the refused group's order")
    t.expect(t.count("started", "small") == 0, "a child of the refused group ran")
    fits = t.group("fits", [_sized(t, "edge", limit)])
    handle = await t.open(ctl, fits)
    await t.next_is(ctl, handle, "edge")


@check("G-01", requires=("payload_limit",))
async def check_a_result_over_the_hosts_limit_settles_as_a_typed_failure(
    t: CheckContext,
) -> None:
    """Ruling R-8 at the host's own limit: a tool result larger than the host's byte
    limit (though within the contract's) settles as the child's failure of type
    ``PayloadTooLarge`` whose message names the child's replay key, never the value;
    its sibling settles as usual."""
    limit = _limit(t)
    ctl = await t.ctl()
    big = EffectEnvelope(
        replay_key=t.tag("big"),
        kind=EffectKind.TOOL_CALL,
        name=STEP,
        input={
            **step_input(t.tag("big"), gate=False, result_bytes=limit + 1),
            "note": INPUT_MARKER,
        },
    )
    handle = await t.open(ctl, t.group("g", [big, t.step("ok", gate=False, result="fine")]))
    settled = await t.settled(ctl, handle, 2)
    bad = settled[t.tag("big")].outcome
    t.expect(
        bad.status == "error" and bad.error is not None and bad.error.type == "PayloadTooLarge",
        f"a result over the host's limit settled as {bad.status} "
        f"({bad.error.type if bad.error else 'no error'})",
    )
    assert bad.error is not None
    t.expect(
        t.tag("big") in bad.error.message, "the failure's message does not name the replay key"
    )
    t.expect("r" * 64 not in bad.error.message, "the failure's message carries the result")
    t.expect(settled[t.tag("ok")].outcome.value == "fine", "the sibling did not settle as usual")


@check("G-51", requires=("payload_limit",))
async def check_an_event_over_the_hosts_limit_is_refused_and_settles_nothing(
    t: CheckContext,
) -> None:
    """Ruling R-5 and §7: an event payload larger than the host's byte limit is
    ``PayloadTooLarge`` carrying the group key and settles nothing; the wait it was sent
    to stays pending, and an event of exactly the limit then reaches and settles it."""
    limit = _limit(t)
    ctl = await t.ctl()
    group = t.group("g", [t.event("e", "ping")], wake=WakePolicy.FIRST)
    handle = await t.open(ctl, group)
    await t.refuses(
        PayloadTooLarge,
        ctl.deliver_event(group.key, "ping", "p" * (limit + 1)),
        "an event over the host's limit",
        names={"group_key": group.key},
    )
    t.expect(await ctl.settlement_order(group.key) == [], "a refused event settled the wait")
    edge = "q" * (limit - len(canonical_json("")))
    assert len(canonical_json(edge)) == limit
    reached = await t.within(ctl.deliver_event(group.key, "ping", edge), "an event of the limit")
    t.expect(reached == 1, f"an event of exactly the limit reached {reached} waits, not 1")
    await t.next_is(ctl, handle, "e")  # its outcome wraps the value: over the limit itself
