"""How the combinators build a group from calls: its key (G-05), its identity across
releases and call forms (G-03), and the byte limit of a whole group (R-8)."""

from __future__ import annotations

from effecthost.combinators import (
    Call,
    Scope,
    all_,
    any_,
    build_group,
    next_group_key,
    race,
    sleep,
    tool,
    wait_event,
)
from effecthost.contract import (
    EmptyGroup,
    InvalidEnvelope,
    LoserPolicy,
    OccurrenceCounter,
    PayloadTooLarge,
    WakePolicy,
    group_key,
)

from .._context import CheckContext
from .._registry import check
from ._recording import Recording

GOLDEN_KEY = "golden:group:a64bd419a709508b41f3cdda:0"
"""The key every release builds for :func:`_golden_calls` in scope ``golden``: a batch id
is a content hash of the calls (G-05), and a caller restarted on another release rebuilds
its group's key from its saved scope, so the hash of the same calls never changes."""


def _golden_calls() -> list[Call]:
    return [
        tool("search", {"q": "näive", "n": [1, 2.5, None]}),
        sleep(1.5),
        wait_event("approved"),
    ]


class _Name(str):
    """A caller's own string type for a tool's name."""


@check("G-05")
async def check_group_keys_are_foretold_and_refused_alike(t: CheckContext) -> None:
    """G-05: ``next_group_key`` names the key ``build_group`` gives the same calls next —
    also for a batch already reached (occurrence 1) — and each batch counts its own
    occurrences, whatever form its calls come in (a caller's subclass of ``Call`` takes
    the general path). The key helper refuses an empty scope id, an empty batch id and a
    negative occurrence with ``InvalidEnvelope`` naming the ids it was given. A saved
    counter may hold any count from 0 to 2**63-1, 0 included. The same calls give the
    same key on every release (a checked-in key)."""
    for scope_id, batch, occurrence in (("", "b", 0), ("s", "", 0), ("", "", 0)):
        try:
            group_key(scope_id, batch, occurrence)
        except InvalidEnvelope:
            pass
        else:
            raise AssertionError(f"group_key({scope_id!r}, {batch!r}, {occurrence}) was built")
    try:
        group_key(t.tag("scope"), t.tag("batch"), -1)
    except InvalidEnvelope as refused:
        named = repr(t.tag("scope")) in refused.message and repr(t.tag("batch")) in refused.message
        t.expect(named, f"the refusal of a negative occurrence names no ids: {refused}")
    else:
        raise AssertionError("group_key accepted a negative occurrence")

    class Form(Call):
        pass

    for form in (Call, Form):
        scope = Scope(scope_id=t.tag(form.__name__))
        a = [form(kind="tool_call", name="a", input={"n": 1})]
        b = [form(kind="tool_call", name="b", input=None)]
        keys = []
        for calls in (a, b, a, b):
            foretold = next_group_key(scope, calls)
            built = build_group(scope, calls, WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
            t.expect(foretold == built.key, f"next_group_key said {foretold}, built {built.key}")
            keys.append(built.key.rsplit(":", 1)[1])
        t.expect(keys == ["0", "0", "1", "1"], f"{form.__name__} calls got occurrences {keys}")

    zero = OccurrenceCounter.from_json('{"counts": {"b": 0}}')
    t.expect(zero.next("b") == 0, "a saved count of 0 did not continue at occurrence 0")
    scope = Scope.from_json('{"scope_id": "s", "counter": {"counts": {"b": 0}}}')
    t.expect(scope.counter.counts == {"b": 0}, f"a saved scope read back {scope.counter}")

    golden = build_group(
        Scope(scope_id="golden"), _golden_calls(), WakePolicy.FIRST, LoserPolicy.CANCEL
    )
    t.expect(golden.key == GOLDEN_KEY, f"the golden calls got key {golden.key}")


@check("G-03")
async def check_a_tool_call_is_the_same_whatever_its_name_type(t: CheckContext) -> None:
    """``tool(name, input)`` builds the same call, and so the same group (key, children,
    hashes), for a name given as a caller's own ``str`` subclass as for a plain string; a
    name that is not a string at all is bad input, refused with the contract's typed
    ``InvalidEnvelope`` (SPEC §7), never a validation library's own error."""
    plain = tool("search", {"q": [1, "two"]})
    subclassed = tool(_Name("search"), {"q": [1, "two"]})
    t.expect(subclassed == plain, f"tool() with a str subclass built {subclassed!r}")
    groups = [
        build_group(Scope(scope_id=t.scope), [call], WakePolicy.FIRST, LoserPolicy.CANCEL)
        for call in (plain, subclassed)
    ]
    shapes = [(g.key, [c.envelope_hash() for c in g.children]) for g in groups]
    t.expect(shapes[0] == shapes[1], f"the two name forms built {shapes}")
    for bad in (5, None, ["search"]):
        try:
            tool(bad, None)  # type: ignore[arg-type]
        except InvalidEnvelope:
            pass
        except Exception as other:
            raise AssertionError(f"tool({bad!r}) raised {type(other).__name__}") from None
        else:
            raise AssertionError(f"tool({bad!r}) built a call")
    try:
        Scope(scope_id="")
    except InvalidEnvelope:
        pass
    except Exception as other:
        raise AssertionError(f"Scope(scope_id='') raised {type(other).__name__}") from None
    else:
        raise AssertionError("a scope with an empty id was built")


CHUNK = "p" * 4000
"""A string short enough for ``build_group``'s fast path (the common value); 42 of them
make an input of 168 kB, whose upper bound (six bytes a character) is within
``MAX_JSON_BYTES``, so the fast path takes it too."""


@check("G-03", "G-04")
async def check_a_group_over_the_byte_limit_is_refused_before_any_host(t: CheckContext) -> None:
    """Ruling R-8: one limits policy, the same on every tier, also for a whole group: its
    children's canonical envelopes together may take ``MAX_GROUP_BYTES`` (16 MiB) and no
    more, however small each child is. A hundred children of 168 kB each (each within
    every limit; 99 of them fit) are ``PayloadTooLarge`` naming the group key they would
    have had and the child that crossed the limit (position 99 and its replay key); a
    combinator given them refuses before touching a host: nothing is opened or
    recorded."""
    calls = [tool(t.tag("pad"), {"pad": [CHUNK] * 42})] * 100
    key = next_group_key(Scope(scope_id=t.scope), calls)
    counted = Recording(await t.ctl())
    refused = await t.refuses(
        PayloadTooLarge, all_(counted, Scope(scope_id=t.scope), calls), "all_ over the limit"
    )
    found = {name: getattr(refused, name) for name in ("group_key", "position", "replay_key")}
    expected = {"group_key": key, "position": 99, "replay_key": f"{key}:99"}
    t.expect(found == expected, f"the refusal of a group over the byte limit names {found}")
    t.expect(not counted.opened, "all_ opened a group over the byte limit")
    ctl = await t.ctl()
    t.expect(key not in await ctl.open_group_keys(), "a group over the byte limit is recorded")


@check("G-04")
async def check_empty_calls_are_refused_with_a_message(t: CheckContext) -> None:
    """G-04 with SPEC §7 (a clear typed error): ``race([])``, ``any([])`` and
    ``build_group`` with no calls are ``EmptyGroup`` whose ``message`` is text saying
    what was refused (there is no group, so no id to name), and no host is touched."""
    ctl = Recording(await t.ctl())
    scope = Scope(scope_id=t.scope)
    refusals = [
        await t.refuses(EmptyGroup, race(ctl, scope, []), "race([])"),
        await t.refuses(EmptyGroup, any_(ctl, scope, []), "any([])"),
    ]
    try:
        build_group(scope, [], WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
    except EmptyGroup as refused:
        refusals.append(refused)
    else:
        raise AssertionError("build_group built a group of no calls")
    messages = [refused.message for refused in refusals]
    t.expect(
        all(isinstance(m, str) and m for m in messages),
        f"the refusals of empty calls say {messages}",
    )
    t.expect(not ctl.opened, "a refusal of empty calls opened a group")
