"""Identity, encoding, construction and capability: G-01…G-07, and the limits policy (R-8)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from effecthost.combinators import Call, Scope, all_, build_group, race, sleep, tool, wait_event
from effecthost.contract import (
    EffectController,
    EffectEnvelope,
    EffectGroup,
    EffectGroupUnsupported,
    EffectHostError,
    EffectKind,
    EmptyGroup,
    GroupMembership,
    GroupShapeMismatch,
    InvalidEnvelope,
    LoserPolicy,
    MembershipConflict,
    MembershipUnsupported,
    OccurrenceCounter,
    ReplayMismatch,
    WakePolicy,
    group_key,
    limits,
    validate_deployment,
)

from .._context import INPUT_MARKER, CheckContext
from .._registry import check
from .._tools import STEP, ConformanceResolver, step_input
from .refusals import refused_unwired


def golden_vectors() -> list[dict[str, Any]]:
    """The checked-in canonical encodings and hashes (G-01, G-02)."""
    text = resources.files("effecthost.conformance").joinpath("golden_vectors.json").read_text()
    vectors: list[dict[str, Any]] = json.loads(text)["vectors"]
    return vectors


@check("G-01")
async def check_ungrouped_encoding_matches_golden_vectors(t: CheckContext) -> None:
    """Ungrouped envelopes encode and hash exactly as the golden vectors say, with no
    membership key — as an encoding that never knew about groups would."""
    ungrouped = [v for v in golden_vectors() if v["envelope"].get("membership") is None]
    t.expect(len(ungrouped) >= 3, "golden vectors must include ungrouped envelopes")
    for vector in ungrouped:
        envelope = EffectEnvelope.model_validate(vector["envelope"])
        t.expect(
            envelope.canonical_bytes().decode() == vector["canonical"],
            f"canonical bytes of {vector['name']} drifted",
        )
        t.expect(envelope.envelope_hash() == vector["hash"], f"hash of {vector['name']} drifted")
        legacy = json.dumps(
            {k: vector["envelope"][k] for k in ("input", "kind", "name", "replay_key")},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode()
        t.expect(b"membership" not in envelope.canonical_bytes(), "membership key present")
        t.expect(
            hashlib.sha256(legacy).hexdigest() == envelope.envelope_hash(),
            f"{vector['name']}: hash differs from the group-unaware encoding",
        )


@check("G-02")
async def check_wake_and_disposition_are_in_every_child_hash(t: CheckContext) -> None:
    """Grouped vectors match, every wake × disposition pair hashes differently, and a
    host refuses a replay whose wake drifted or whose child changed, at any position
    (the fence compares every child's hash, not ``children[0]``'s)."""
    for vector in golden_vectors():
        if vector["envelope"].get("membership") is None:
            continue
        envelope = EffectEnvelope.model_validate(vector["envelope"])
        t.expect(envelope.envelope_hash() == vector["hash"], f"hash of {vector['name']} drifted")
    base = EffectEnvelope(replay_key="r", kind="tool_call", name="t", input={"a": 1})
    hashes = {
        base.with_membership(
            GroupMembership(group_key="k", position=0, wake=wake, disposition=loser)
        ).envelope_hash()
        for wake in WakePolicy
        for loser in LoserPolicy
    }
    t.expect(len(hashes) == 6, "wake and disposition must each change the child hash")

    ctl = await t.ctl()
    group = t.group("g", [t.step("a"), t.step("b")])
    handle = await t.open(ctl, group)
    drifted = t.group("g", [t.step("a"), t.step("b")], wake=WakePolicy.FIRST)
    await t.refuses(EffectHostError, ctl.open_effect_group(drifted), "reopen with drifted wake")
    for position, changed in enumerate(
        (
            t.group("g", [t.step("a", result="other"), t.step("b")]),
            t.group("g", [t.step("a"), t.step("b", result="other")]),
        )
    ):
        await t.refuses(
            ReplayMismatch,
            ctl.open_effect_group(changed),
            "reopen with a changed child",
            names={
                "group_key": group.key,
                "replay_key": changed.children[position].replay_key,
                "position": position,
            },
        )
    t.release("a", "b")
    first = await t.next(ctl, handle)
    t.expect(first.outcome.ok, "the recorded group must be untouched by the refusals")


@check("G-03")
async def check_one_constructor_stamps_and_refuses(t: CheckContext) -> None:
    """The group constructor stamps unstamped children from their index and refuses a
    foreign key, a permuted position, a drifted wake or a drifted disposition."""
    a, b = t.step("a"), t.step("b")
    group = t.group("g", [a, b], wake=WakePolicy.FIRST, disposition=LoserPolicy.CANCEL)
    for index, child in enumerate(group.children):
        t.expect(
            child.membership
            == GroupMembership(
                group_key=group.key,
                position=index,
                wake=WakePolicy.FIRST,
                disposition=LoserPolicy.CANCEL,
            ),
            f"child {index} not stamped from its index",
        )
    t.expect(EffectGroup.model_validate(group.model_dump()) == group, "re-construction drifts")
    good = group.children[0].membership
    assert good is not None
    drifts: dict[str, GroupMembership] = {
        "group key": good.model_copy(update={"group_key": "other:group:x:0"}),
        "position": good.model_copy(update={"position": 1}),
        "wake": good.model_copy(update={"wake": WakePolicy.ALL}),
        "disposition": good.model_copy(update={"disposition": LoserPolicy.RUN_TO_COMPLETION}),
    }
    for what, membership in drifts.items():
        try:
            EffectGroup(
                key=group.key,
                wake=WakePolicy.FIRST,
                disposition=LoserPolicy.CANCEL,
                children=[a.with_membership(membership), b],
            )
        except MembershipConflict as exc:
            t.expect(exc.position == 0 and exc.group_key == group.key, "ids missing")
            continue
        raise AssertionError(f"a child with a drifted {what} was accepted")
    handle = group.handle()
    t.expect(handle.child_count == 2 and handle.consumed == 0, "handle not taken from group")


class _CallForm(Call):
    """A call in a form of the caller's own (a subclass): built by the general path."""


def _built(t: CheckContext, scope_id: str, calls: list[Call], policies: Any, form: bool) -> Any:
    """What ``build_group`` makes of ``calls`` twice over in one fresh scope (two
    occurrences): keys, wake, disposition, children and hashes; or the refusal's type."""
    wake, disposition = policies
    scope = Scope(scope_id=scope_id)
    if form:
        calls = [_CallForm(kind=c.kind, name=c.name, input=c.input) for c in calls]
    made = []
    try:
        for _ in range(2):
            group = build_group(scope, calls, wake, disposition)
            children = [(c.model_dump(mode="json"), c.envelope_hash()) for c in group.children]
            made.append((group.key, group.wake, group.disposition, children))
    except EffectHostError as refused:
        return f"{type(refused).__name__}: {refused}"
    return made


@check("G-03", "G-05")
async def check_every_form_of_a_call_builds_the_same_group(t: CheckContext) -> None:
    """``build_group`` builds one group for the same calls whatever form they come in (the
    library's own ``Call`` or a caller's subclass of it): the same key and occurrence, the
    same stamped children and hashes; at the limits (a key, a replay key, a name, the
    number of children) it accepts and refuses alike, with the same error."""
    first, every = (
        (WakePolicy.FIRST, LoserPolicy.CANCEL),
        (WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION),
    )
    plain = [tool("x", {"q": [1, "two"]}), tool("y"), sleep(1.5), wait_event("e")]
    # a key ``{scope}:group:{24 hex}:0`` of MAX_KEY_BYTES - 2 bytes: replay keys ``:0``..``:9``
    # fit, ``:10`` does not
    fitted = "s" * (limits.MAX_KEY_BYTES - 2 - len(":group:") - 24 - len(":0"))
    name = "n" * limits.MAX_NAME_BYTES
    cases: list[tuple[str, str, list[Call], Any]] = [
        ("plain calls", t.scope, plain, first),
        ("plain calls under ALL", t.scope, plain, every),
        ("a name at the limit", t.scope, [tool(name)], first),
        ("a name over the limit", t.scope, [tool(name + "n")], first),
        ("a kind over the limit", t.scope, [Call(kind="k" * 257, name="x")], first),
        ("a key at the limit", fitted, [tool(f"c{i}") for i in range(10)], first),
        ("a replay key over the limit", fitted, [tool(f"c{i}") for i in range(11)], first),
        ("a key over the limit", fitted + "sss", [tool("c")], first),
        ("one child too many", t.scope, [tool("c")] * (limits.MAX_CHILDREN + 1), every),
    ]
    for what, scope_id, calls, policies in cases:
        ours = _built(t, scope_id, calls, policies, form=False)
        theirs = _built(t, scope_id, calls, policies, form=True)
        t.expect(ours == theirs, f"{what}: the two forms built differently: {ours} != {theirs}")
        accepted = not isinstance(ours, str)
        t.expect(accepted == ("over" not in what and "too many" not in what), f"{what}: {ours}")
    scope = Scope(scope_id=t.scope)
    batches = [plain[:1], plain[1:2], plain[:1], plain[1:2], plain[:1]]
    occurrences = [build_group(scope, c, *first).key.rsplit(":", 1)[1] for c in batches]
    t.expect(occurrences == ["0", "0", "1", "1", "2"], f"interleaved occurrences {occurrences}")
    made = _built(t, t.scope, plain, first, form=False)
    keys = [key for key, *_ in made]
    t.expect([k.rsplit(":", 1)[1] for k in keys] == ["0", "1"], f"occurrences of {keys}")
    for key, wake, disposition, children in made:
        t.expect((wake, disposition) == first, f"{key} declares {wake}, {disposition}")
        for index, (child, _hash) in enumerate(children):
            t.expect(child["replay_key"] == f"{key}:{index}", f"child {index} of {key}: {child}")
            t.expect(
                (child["kind"], child["name"]) == (plain[index].kind, plain[index].name),
                f"child {index} of {key} is {child['kind']} {child['name']!r}",
            )
            t.expect(child["input"] == plain[index].input, f"child {index}'s input changed")


class _Untouchable(EffectController):
    """A controller that fails any group call: proves a combinator stayed local."""

    def supports_effect_groups(self) -> bool:
        return True

    async def open_effect_group(self, group: EffectGroup) -> Any:
        raise AssertionError("the host was touched")


@check("G-04")
async def check_empty_groups_are_refused(t: CheckContext) -> None:
    """``EmptyGroup`` from the constructor and the host; ``all([])`` is ``[]`` and
    ``race([])`` is refused, neither touching a host."""
    try:
        t.group("empty", [])
    except EmptyGroup as exc:
        t.expect(exc.group_key == t.key("empty"), "EmptyGroup must name the key")
    else:
        raise AssertionError("an empty group was constructed")
    scope = Scope(scope_id=t.scope)
    t.expect(await all_(_Untouchable(), scope, []) == [], "all([]) must be []")
    await t.refuses(EmptyGroup, race(_Untouchable(), scope, []), "race([])")
    ctl = await t.ctl()
    t.expect(t.key("empty") not in await ctl.open_group_keys(), "an empty group was recorded")


@check("G-05")
async def check_group_keys_carry_a_saved_occurrence(t: CheckContext) -> None:
    """Keys are ``{scope}:group:{batch}:{occurrence}``; identical batches in one scope
    get distinct keys, also across a save and restore of the counter."""
    t.expect(group_key("s", "b", 3) == "s:group:b:3", "key format")
    scope = Scope(scope_id=t.scope)
    calls = [tool("x", {"q": 1}), tool("y")]
    first = build_group(scope, calls, WakePolicy.FIRST, LoserPolicy.RUN_TO_COMPLETION)
    second = build_group(scope, calls, WakePolicy.FIRST, LoserPolicy.RUN_TO_COMPLETION)
    t.expect(first.key != second.key, "two identical batches collided")
    t.expect(first.key.rsplit(":", 1)[0] == second.key.rsplit(":", 1)[0], "batch id unstable")
    t.expect(first.key.startswith(f"{t.scope}:group:"), "scope missing from key")
    restored = Scope.from_json(scope.to_json())
    third = build_group(restored, calls, WakePolicy.FIRST, LoserPolicy.RUN_TO_COMPLETION)
    t.expect(third.key not in (first.key, second.key), "restored counter reused an occurrence")
    counter = OccurrenceCounter()
    t.expect([counter.next("b"), counter.next("b"), counter.next("c")] == [0, 1, 0], "counter")


@check("G-05")
async def check_a_saved_scope_is_read_back_strictly(t: CheckContext) -> None:
    """The saved scope and occurrence counter are part of the caller's continuation
    (G-05): read back, they continue the same occurrences; a saved form that is not
    exactly ``{"scope_id", "counter": {"counts": {batch id: count}}}`` (a missing or
    extra field, a field of the wrong type, a scope id or batch id that is not a key, a
    count that is not an integer from 0 to 2**63-1) is ``InvalidEnvelope``, whose
    message names no part of the text."""
    secret = f"{INPUT_MARKER}-saved"
    top = 2**63 - 1
    counter = OccurrenceCounter()
    counter.next("b")
    again = OccurrenceCounter.from_json(counter.to_json())
    t.expect(again.counts == {"b": 1}, f"a counter read back counts {again.counts}")
    t.expect(again.next("b") == 1, "a counter read back repeated an occurrence")
    for text, counts in (
        ('{"scope_id": "s"}', {}),
        ('{"scope_id": "s", "counter": {}}', {}),
        (json.dumps({"scope_id": "s", "counter": {"counts": {"b": top}}}), {"b": top}),
    ):
        scope = Scope.from_json(text)
        t.expect((scope.scope_id, scope.counter.counts) == ("s", counts), f"{text} read as {scope}")
    counters = [
        "[]",
        '{"counts": [], "x": 1}',
        '{"other": {}}',
        '{"counts": []}',
        '{"counts": {"": 1}}',
        f'{{"counts": {{"{secret}\\u0000": 1}}}}',
        '{"counts": {"b": -1}}',
        json.dumps({"counts": {"b": top + 1}}),
        '{"counts": {"b": 1.0}}',
        '{"counts": {"b": true}}',
    ]
    scopes = [
        "[]",
        '{"counter": {}}',
        '{"scope_id": "s", "counter": {}, "x": 1}',
        '{"scope_id": "", "counter": {}}',
        f'{{"scope_id": "{secret}\\u0000", "counter": {{}}}}',
        '{"scope_id": 5, "counter": {}}',
        '{"scope_id": "s", "counter": []}',
        *(f'{{"scope_id": "s", "counter": {text}}}' for text in counters[1:]),
    ]
    for reader, texts in ((OccurrenceCounter.from_json, counters), (Scope.from_json, scopes)):
        for text in texts:
            try:
                reader(text)
            except InvalidEnvelope as error:
                t.expect(bool(error.message), f"the refusal of {text} has no message")
                t.expect(secret not in str(error), f"the refusal of {text} quotes it")
            else:
                raise AssertionError(f"{reader.__qualname__} accepted {text}")


@check("G-06", "G-53")
async def check_grouped_child_on_ungrouped_path_is_refused(t: CheckContext) -> None:
    """``execute_effect`` with a grouped envelope (a tool, a timer or an event) is a
    ``MembershipUnsupported`` refusal; nothing runs and nothing is stripped."""
    ctl = await t.ctl()
    group = t.group("g", [t.step("a", gate=False), t.sleep("s", 0.01), t.event("e", "ev")])
    for child in group.children:
        executor = ConformanceResolver(t.lab.path).resolve(group.children[0])
        assert executor is not None
        error = await t.refuses(
            MembershipUnsupported, ctl.execute_effect(child, executor), f"{child.kind} child"
        )
        t.expect(error.replay_key == child.replay_key, "refusal must name the replay key")
        t.expect(child.membership is not None, "membership was stripped")
    t.expect(t.count("started", "a") == 0, "the refused child ran")


@check("G-07")
async def check_unwired_controller_refuses_every_group_method(t: CheckContext) -> None:
    """Without a resolver: the flag is false, open/await/close refuse with
    ``EffectGroupUnsupported`` and record nothing, and deployment validation fails."""
    bare = await t.ctl(wired=False)
    wired = await t.ctl()
    t.expect(not bare.supports_effect_groups(), "unwired controller claims group support")
    t.expect(wired.supports_effect_groups(), "wired controller denies group support")
    validate_deployment(wired)
    try:
        validate_deployment(bare)
    except EffectGroupUnsupported:
        pass
    else:
        raise AssertionError("validate_deployment accepted an unwired controller")
    group = t.group("g", [t.step("a", gate=False)])
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "an unwired open": lambda: bare.open_effect_group(group),
        "an unwired await": lambda: bare.await_next_settlement(group.handle()),
        "an unwired close": lambda: bare.close_effect_group(group.handle()),
    }
    await refused_unwired(t, group, calls)


@check("G-13")
async def check_reopen_is_fenced_on_shape(t: CheckContext) -> None:
    """A reopen with another child count, wake or disposition is ``GroupShapeMismatch``
    and leaves the recorded group as it was."""
    ctl = await t.ctl()
    handle = await t.open(ctl, t.group("g", [t.step("a"), t.step("b")]))
    reshaped = {
        "child count": t.group("g", [t.step("a"), t.step("b"), t.step("c")]),
        "shrunk": t.group("g", [t.step("a")]),
        "wake": t.group("g", [t.step("a"), t.step("b")], wake=WakePolicy.FIRST_SUCCESS),
        "disposition": t.group("g", [t.step("a"), t.step("b")], disposition=LoserPolicy.CANCEL),
    }
    for what, group in reshaped.items():
        await t.refuses(
            GroupShapeMismatch,
            ctl.open_effect_group(group),
            f"reopen with another {what}",
            names={"group_key": group.key},
        )
    again = await ctl.open_effect_group(t.group("g", [t.step("a"), t.step("b")]))
    t.expect(again.consumed == 0 and again.child_count == 2, "same-shape reopen failed")
    t.expect(t.count("started", "c") == 0, "a refused reopen dispatched a child")
    t.release("b")
    await t.next_is(ctl, handle, "b")


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@check("G-01")
async def check_one_limits_policy_for_inputs_and_results(t: CheckContext) -> None:
    """Ruling R-8: one limits policy, the same on every tier: an input nested 64 levels
    deep or holding either end of the signed 64-bit range is accepted; one level deeper or
    one past either end is ``InvalidEnvelope`` when the envelope is built, before any host;
    a tool result over the limits settles as the child's typed failure, not a hang, and its
    sibling settles as usual."""
    accepted = {"64 levels": _nested(64), "2**63 - 1": 2**63 - 1, "-2**63": -(2**63)}
    refused = {"65 levels": _nested(65), "2**63": 2**63, "-2**63 - 1": -(2**63) - 1}
    for what, value in accepted.items():
        try:
            EffectEnvelope(replay_key=t.tag("in"), kind="tool_call", name="t", input=value)
        except InvalidEnvelope:
            raise AssertionError(f"an input of {what} was refused") from None
    for what, value in refused.items():
        try:
            EffectEnvelope(replay_key=t.tag("in"), kind="tool_call", name="t", input=value)
        except InvalidEnvelope:
            continue
        raise AssertionError(f"an input of {what} was accepted")
    ctl = await t.ctl()
    over = EffectEnvelope(
        replay_key=t.tag("over"),
        kind=EffectKind.TOOL_CALL,
        name=STEP,
        input={**step_input(t.tag("over"), gate=False, over_limits=True), "note": INPUT_MARKER},
    )
    handle = await t.open(ctl, t.group("g", [over, t.step("ok", gate=False)]))
    settled = await t.settled(ctl, handle, 2)
    bad = settled[t.tag("over")].outcome
    t.expect(
        bad.status == "error"
        and bad.error is not None
        and bad.error.type in ("InvalidEnvelope", "PayloadTooLarge"),
        f"a result over the limits settled as {bad.status} "
        f"({bad.error.type if bad.error else 'no error type'})",
    )
    t.expect(
        settled[t.tag("ok")].outcome.ok, "the sibling of an over-limits result did not succeed"
    )
