"""Payload references and sealed settlements: G-47…G-50.

The checks need the host's help to look at and tamper with what it recorded, through
:class:`~effecthost.conformance.HostUnderTest` hooks (``stored_outcome``,
``transplant_outcome``, ``reader``, ``destroy_keys``); a host that does not declare
``payload_refs`` or ``sealing`` skips them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from effecthost.contract import (
    EffectController,
    EffectGroup,
    EffectHostError,
    GroupHandle,
    LoserPolicy,
    PayloadShredded,
    SealedPayloadUnreadable,
    WakePolicy,
    group_key,
)

from .._context import CheckContext
from .._registry import check

if TYPE_CHECKING:
    from effecthost.payloads import StoredOutcome

LARGE_BYTES = 64 * 1024
"""An outcome this large is above any inline threshold a ``payload_refs`` host may use."""


def _large(marker: str) -> dict[str, Any]:
    return {"marker": marker, "blob": "L" * LARGE_BYTES}


async def _settled(t: CheckContext, ctl: EffectController, key: str, count: int) -> None:
    """Wait until ``count`` children of ``key`` have settled, without consuming a rank."""
    await t.eventually(
        lambda: ctl.settlement_order(key),
        lambda order: len(order) >= count,
        f"{count} settlement(s) of {key!r}",
    )


def _leaks(error: EffectHostError, *secrets: str, stored: Iterable[StoredOutcome] = ()) -> bool:
    """True if the error's text or attributes carry any of ``secrets`` or of the sealed
    bytes ``stored`` holds inline (as recorded, base64, or as hex): an error carries ids
    only, and a ciphertext handed out is a copy of the sealed value taken off-site."""
    text = f"{error!s} {error!r} {vars(error)!r}"
    return any(fragment in text for fragment in [*secrets, *_ciphertexts(stored)])


def _ciphertexts(stored: Iterable[StoredOutcome]) -> list[str]:
    """Distinctive fragments of each inline sealed envelope's ciphertext."""
    found: list[str] = []
    for outcome in stored:
        if outcome.envelope is None:
            continue
        text = outcome.envelope.ciphertext
        found.append(text[:24])
        try:
            found.append(base64.b64decode(text, validate=True).hex()[:32])
        except (binascii.Error, ValueError):
            pass
    return [fragment for fragment in found if len(fragment) >= 16]


@check("G-47", requires=("payload_refs",))
async def check_large_outcomes_round_trip_by_reference(t: CheckContext) -> None:
    """An outcome above the inline threshold is recorded as a reference and served whole;
    a small one stays in the rank record; a second cursor reads the same value again."""
    ctl = await t.ctl()
    large = _large(t.tag("large-marker"))
    group = t.group("g", [t.step("large", result=large), t.step("small", result="s")])
    handle = await t.open(ctl, group)
    t.release("large")
    first = await t.next_is(ctl, handle, "large")
    t.expect(first.outcome.value == large, "the large outcome did not round-trip")
    stored = await t.host.stored_outcome(group.key, t.tag("large"))
    t.expect(stored.form == "ref", f"a {LARGE_BYTES}-byte outcome is recorded {stored.form}")
    t.expect(
        t.tag("large-marker") not in stored.model_dump_json(),
        "the rank record of a by-reference outcome carries the value",
    )
    t.release("small")
    await t.next_is(ctl, handle, "small")
    small = await t.host.stored_outcome(group.key, t.tag("small"))
    t.expect(small.form != "ref", "a one-character outcome went by reference")
    again = await t.next(ctl, group.handle())
    t.expect(again.outcome.value == large, "rank 1 read again differs")


@check("G-48", requires=("sealing",))
async def check_a_sealed_outcome_is_bound_to_its_slot(t: CheckContext) -> None:
    """A sealed outcome copied into another slot of its group, or into a slot of another
    group, fails with SealedPayloadUnreadable; the original still opens. (Replay keys are
    unique across groups on some tiers, so the other group has its own.)"""
    ctl = await t.ctl()
    refs = t.host.capabilities.payload_refs
    x_value: Any = _large(t.tag("x-secret")) if refs else t.tag("x-secret")
    a = t.group(
        "a",
        [t.step("x", result=x_value), t.step("y", result=t.tag("y-secret")), t.step("z")],
    )
    handle_a = await t.open(ctl, a)
    for count, label in enumerate(("x", "y", "z"), start=1):
        t.release(label)
        await _settled(t, ctl, a.key, count)
    b = t.group("b", [t.step("bx", gate=False), t.step("by", gate=False)])
    handle_b = await t.open(ctl, b)
    await _settled(t, ctl, b.key, 2)

    await t.host.transplant_outcome(source=(a.key, t.tag("y")), target=(a.key, t.tag("z")))
    await t.host.transplant_outcome(source=(a.key, t.tag("x")), target=(b.key, t.tag("bx")))
    await t.host.transplant_outcome(source=(a.key, t.tag("y")), target=(b.key, t.tag("by")))

    first = await t.next_is(ctl, handle_a, "x")
    t.expect(first.outcome.value == x_value, "the sealed outcome of x did not open in its slot")
    second = await t.next_is(ctl, handle_a, "y")
    t.expect(second.outcome.value == t.tag("y-secret"), "y did not open in its slot")
    error = await t.refuses(
        SealedPayloadUnreadable,
        ctl.await_next_settlement(handle_a),
        "y's sealed outcome copied into z's slot of the same group",
    )
    t.expect(handle_a.consumed == 2, f"a refusal advanced the handle to {handle_a.consumed}")
    copied = await t.host.stored_outcome(a.key, t.tag("z"))
    t.expect(
        not _leaks(error, t.tag("y-secret"), stored=[copied]),
        "the refusal carries plaintext or the sealed bytes",
    )
    for consumed, what in ((0, "rank 1"), (1, "rank 2")):
        cursor = handle_b.copy_cursor()
        cursor.consumed = consumed
        await t.refuses(
            SealedPayloadUnreadable,
            ctl.await_next_settlement(cursor),
            f"{what} of a group whose outcomes were copied from another group",
        )
        t.expect(cursor.consumed == consumed, "a refusal advanced the handle")


@check("G-49", requires=("sealing",))
async def check_an_unopenable_outcome_is_refused_and_changes_nothing(t: CheckContext) -> None:
    """A reader with no key store, or the wrong one, gets SealedPayloadUnreadable (ids
    only), its handle stays, the record is unchanged; the right reader then reads the same
    rank."""
    ctl = await t.ctl()
    secret = t.tag("the-secret")
    labels = ["small", "large"] if t.host.capabilities.payload_refs else ["small"]
    values: dict[str, Any] = {"small": {"secret": secret}, "large": _large(secret)}
    group = t.group("g", [t.step(label, gate=False, result=values[label]) for label in labels])
    handle = await t.open(ctl, group)
    await _settled(t, ctl, group.key, len(labels))
    order = await ctl.settlement_order(group.key)
    before = {label: await t.host.stored_outcome(group.key, t.tag(label)) for label in labels}
    for label, stored in before.items():
        t.expect(stored.sealed, f"{label}'s outcome is recorded unsealed ({stored.form})")
        t.expect(secret not in stored.model_dump_json(), f"{label}'s record carries plaintext")

    for keys in ("none", "wrong"):
        reader = await t.host.reader(keys=keys)
        for consumed in range(len(labels)):
            cursor = handle.copy_cursor()
            cursor.consumed = consumed
            error = await t.refuses(
                SealedPayloadUnreadable,
                reader.await_next_settlement(cursor),
                f"rank {consumed + 1} read with key store {keys!r}",
            )
            t.expect(cursor.consumed == consumed, f"a refusal ({keys}) advanced the handle")
            t.expect(error.group_key == group.key, "the refusal does not name the group key")
            t.expect(
                not _leaks(error, secret, stored=before.values()),
                f"the refusal ({keys}) carries plaintext or the sealed bytes",
            )
        after = {label: await t.host.stored_outcome(group.key, t.tag(label)) for label in labels}
        t.expect(after == before, f"a refusal ({keys}) changed the recorded outcomes")
        t.expect(await ctl.settlement_order(group.key) == order, "a refusal changed the ranks")

    right = await t.host.reader(keys="right")
    seen = {}
    for _ in labels:
        settlement = await t.next(right, handle)
        seen[settlement.replay_key] = settlement.outcome.value
    t.expect(
        seen == {t.tag(label): values[label] for label in labels},
        "the correctly keyed reader did not read the refused ranks",
    )


@check("G-50", requires=("sealing",))
async def check_a_destroyed_key_shreds_its_scope(t: CheckContext) -> None:
    """After the scope's keys are destroyed its outcomes fail with PayloadShredded (the
    handle stays); a reader that never held the key still says SealedPayloadUnreadable;
    another scope is untouched."""
    ctl = await t.ctl()
    secret = t.tag("erased")
    group = t.group("g", [t.step("gone", gate=False, result=secret)])
    other = EffectGroup(
        key=group_key(f"{t.scope}kept", "b", 0),
        wake=WakePolicy.ALL,
        disposition=LoserPolicy.RUN_TO_COMPLETION,
        children=[t.step("kept", gate=False, result="still here")],
    )
    handle = await t.open(ctl, group)
    kept = await t.open(ctl, other)
    await _settled(t, ctl, group.key, 1)
    await _settled(t, ctl, other.key, 1)
    shredded = await t.host.stored_outcome(group.key, t.tag("gone"))
    await t.host.destroy_keys(group.key)

    right = await t.host.reader(keys="right")
    error = await _refused(t, PayloadShredded, right, handle, "a rank whose key was destroyed")
    t.expect(
        not _leaks(error, secret, stored=[shredded]),
        "PayloadShredded carries plaintext or the sealed bytes",
    )
    for keys in ("none", "wrong"):
        reader = await t.host.reader(keys=keys)
        await _refused(
            t, SealedPayloadUnreadable, reader, handle, f"key store {keys!r} never held the key"
        )
    settlement = await t.next(right, kept)
    t.expect(settlement.outcome.value == "still here", "destroying one scope touched another")


async def _refused(
    t: CheckContext,
    error: type[EffectHostError],
    controller: EffectController,
    handle: GroupHandle,
    what: str,
) -> EffectHostError:
    cursor = handle.copy_cursor()
    raised = await t.refuses(error, controller.await_next_settlement(cursor), what)
    t.expect(cursor.consumed == handle.consumed, f"{what}: the refusal advanced the handle")
    return raised


@check("G-48", requires=("sealing",))
async def check_sealing_binds_the_position(t: CheckContext) -> None:
    """Ruling R-10: a sealed value's associated data binds the child's position as well as
    the group key and the replay key: sealed for one position, it opens at that position
    and fails with SealedPayloadUnreadable at any other, under the same group key and
    replay key. (Checked on the sealing every host uses: no host hook can move a recorded
    value to another position of the same replay key.)"""
    from effecthost.payloads import AesGcmSealer, InMemoryKeyStore

    sealer = AesGcmSealer(InMemoryKeyStore())
    key, replay = t.key("g"), t.tag("x")
    secret = t.tag("positioned").encode()
    sealed = sealer.seal(key, replay, secret, position=1)
    t.expect(sealer.open(key, replay, sealed, position=1) == secret, "it did not open in place")
    for position in (0, 2, None):
        try:
            sealer.open(key, replay, sealed, position=position)
        except SealedPayloadUnreadable:
            continue
        raise AssertionError(f"a value sealed for position 1 opened at position {position}")
