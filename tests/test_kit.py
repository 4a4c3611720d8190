"""The host kit's rules, tested once for every tier that uses them (``effecthost.contract.kit``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from group_support import group as effect_group

from effecthost.contract import (
    CursorExhausted,
    DispositionWidened,
    EffectEnvelope,
    EffectGroup,
    GroupClosed,
    GroupHandle,
    GroupShapeError,
    GroupShapeMismatch,
    HandleMismatch,
    LoserPolicy,
    NoExecutor,
    ReplayMismatch,
    UnknownGroup,
    WakePolicy,
    kit,
)
from effecthost.contract.kit import (
    GroupRecord,
    HandleClaim,
    Offer,
    RankLedger,
    RecordedChild,
    Tombstone,
)

KEY = "s:group:b:0"
RTC, CANCEL = LoserPolicy.RUN_TO_COMPLETION, LoserPolicy.CANCEL


def group(*names: str, disposition: LoserPolicy = RTC, key: str = KEY) -> EffectGroup:
    children = [
        EffectEnvelope(replay_key=f"rk-{n}", kind="tool_call", name=n, input={"secret": n})
        for n in names
    ]
    return EffectGroup(key=key, wake=WakePolicy.FIRST, disposition=disposition, children=children)


def record(**changes: object) -> GroupRecord:
    fields: dict[str, object] = {
        "key": KEY,
        "child_count": 2,
        "wake": "first",
        "declared": "run_to_completion",
    }
    fields.update(changes)
    return GroupRecord(**fields)  # type: ignore[arg-type]


def handle(consumed: int = 0, **changes: object) -> GroupHandle:
    fields: dict[str, object] = {
        "group_key": KEY,
        "child_count": 2,
        "consumed": consumed,
        "wake": WakePolicy.FIRST,
        "disposition": RTC,
    }
    fields.update(changes)
    return GroupHandle(**fields)  # type: ignore[arg-type]


def test_record_takes_engine_strings_and_defaults_effective_to_declared() -> None:
    r = record(declared="cancel")
    assert r.wake is WakePolicy.FIRST and r.declared is CANCEL and r.in_force is CANCEL
    assert record(effective="cancel").in_force is CANCEL


# -- await: R-2 order ------------------------------------------------------------------------


def test_await_order_unknown_closed_mismatch_exhausted() -> None:
    """R-2: UnknownGroup → GroupClosed → HandleMismatch → CursorExhausted."""
    wrong = handle(consumed=3, child_count=3)  # mismatched *and* at its own end
    with pytest.raises(UnknownGroup):
        kit.check_await(KEY, wrong, None)
    with pytest.raises(GroupClosed):
        kit.check_await(KEY, wrong, Tombstone(KEY))
    with pytest.raises(GroupClosed):
        kit.check_await(KEY, wrong, record(closed=True))
    with pytest.raises(HandleMismatch):
        kit.check_await(KEY, wrong, record())
    with pytest.raises(CursorExhausted) as exhausted:
        kit.check_await(KEY, handle(consumed=2), record())
    assert exhausted.value.rank == 3
    assert kit.check_await(KEY, handle(consumed=1), record()) == record()


@pytest.mark.parametrize(
    "field,value",
    [("child_count", 3), ("wake", WakePolicy.ALL), ("disposition", CANCEL)],
)
def test_handle_fence_compares_each_field_with_the_declared_shape(
    field: str, value: object
) -> None:
    """G-20: child count, wake and disposition; the declared disposition, not a narrowed one."""
    with pytest.raises(HandleMismatch) as refused:
        kit.check_handle(KEY, handle(**{field: value}), record())
    assert refused.value.group_key == KEY
    kit.check_handle(KEY, handle(), record(effective=CANCEL))  # narrowed by a close: passes


def test_handle_claim_from_the_wire_is_fenced_like_a_handle() -> None:
    kit.check_handle(KEY, HandleClaim(2, "first", "run_to_completion"), record())
    with pytest.raises(HandleMismatch):
        kit.check_handle(KEY, HandleClaim(2, "all", "run_to_completion"), record())


# -- close -----------------------------------------------------------------------------------


def test_narrowing_only_narrows_and_none_keeps_the_disposition_in_force() -> None:
    """G-26, R-3."""
    assert kit.narrow(KEY, RTC, None) is RTC
    assert kit.narrow(KEY, RTC, CANCEL) is CANCEL
    assert kit.narrow(KEY, "cancel", None) is CANCEL
    assert kit.narrow(KEY, CANCEL, CANCEL) is CANCEL
    with pytest.raises(DispositionWidened):
        kit.narrow(KEY, CANCEL, "run_to_completion")


def test_close_order_and_no_ops() -> None:
    """R-2 (HandleMismatch → DispositionWidened), R-4 (a closed or retired group: no-op)."""
    with pytest.raises(UnknownGroup):
        kit.check_close(KEY, handle(), None, None)
    # retired: a no-op whatever is asked, a mismatched handle included
    assert kit.check_close(KEY, handle(child_count=5), Tombstone(KEY), RTC) is None
    with pytest.raises(HandleMismatch):
        kit.check_close(KEY, handle(disposition=CANCEL), record(declared=RTC), RTC)
    with pytest.raises(HandleMismatch):  # before the narrowing
        kit.check_close(KEY, handle(wake="all"), record(effective=CANCEL), RTC)
    assert kit.check_close(KEY, handle(), record(closed=True, effective=CANCEL), RTC) is None
    with pytest.raises(DispositionWidened):
        kit.check_close(KEY, handle(), record(effective=CANCEL), RTC)
    assert kit.check_close(KEY, handle(), record(), None) is RTC
    assert kit.check_close(KEY, handle(), record(), "cancel") is CANCEL
    assert kit.check_close(KEY, None, record(), CANCEL) is CANCEL  # no handle sent


# -- open ------------------------------------------------------------------------------------


def recorded_of(g: EffectGroup) -> list[RecordedChild]:
    return [RecordedChild(p, c.replay_key, c.envelope_hash()) for p, c in enumerate(g.children)]


def test_first_open_and_a_matching_reopen() -> None:
    g = group("a", "b")
    assert kit.check_reopen(Offer.of(g), None) is False
    assert kit.check_reopen(Offer.of(g), record(), recorded_of(g)) is True


def test_reopen_order_closed_shape_hash() -> None:
    """R-2: GroupClosed → GroupShapeMismatch → ReplayMismatch."""
    g = group("a", "b")
    reshaped = Offer.of(group("a", "x", "y"))
    with pytest.raises(GroupClosed):
        kit.check_reopen(reshaped, Tombstone(KEY))
    with pytest.raises(GroupClosed):
        kit.check_reopen(reshaped, record(closed=True), recorded_of(g))
    with pytest.raises(GroupShapeMismatch):
        kit.check_reopen(reshaped, record(), recorded_of(g))
    with pytest.raises(ReplayMismatch) as mismatch:
        kit.check_reopen(Offer.of(group("a", "c")), record(), recorded_of(g))
    assert (mismatch.value.position, mismatch.value.replay_key) == (1, "rk-c")
    assert "secret" not in str(mismatch.value)


@pytest.mark.parametrize(
    "changed",
    [{"wake": "all"}, {"declared": "cancel"}, {"child_count": 3}],
)
def test_shape_fence_each_field(changed: dict[str, object]) -> None:
    """G-13: the declared disposition is compared, not a narrowed one."""
    g = group("a", "b")
    with pytest.raises(GroupShapeMismatch):
        kit.check_reopen(Offer.of(g), record(**changed), recorded_of(g))
    assert kit.check_reopen(Offer.of(g), record(effective="cancel"), recorded_of(g))


def test_hash_fence_compares_every_child_and_skips_unrecorded_positions() -> None:
    """G-02, R-7: every recorded child, not the first one only."""
    g = group("a", "b")
    same_key_other_input = effect_group(
        KEY,
        [
            g.children[0],
            EffectEnvelope(replay_key="rk-b", kind="tool_call", name="b", input={"other": 1}),
        ],
        WakePolicy.FIRST,
        RTC,
    )
    with pytest.raises(ReplayMismatch):
        kit.check_reopen(Offer.of(same_key_other_input), record(), recorded_of(g))
    assert kit.check_reopen(Offer.of(same_key_other_input), record(), recorded_of(g)[:1])


def test_offer_from_engine_fields_matches_offer_of_group() -> None:
    g = group("a", "b")
    wire = Offer(
        key=KEY,
        child_count=2,
        wake="first",  # type: ignore[arg-type]
        disposition="run_to_completion",  # type: ignore[arg-type]
        children=tuple([c.replay_key, c.envelope_hash()] for c in g.children),  # type: ignore[misc]
    )
    assert wire == Offer.of(g)


def test_resolve_first_open_names_the_first_miss_in_position_order() -> None:
    """G-10: the first unresolvable child in position order, ids only."""
    g = group("a", "b", "c")
    runnable = {"a"}
    with pytest.raises(GroupShapeError) as refused:
        kit.resolve_first_open(g, lambda c: c.name if c.name in runnable else None)
    assert (refused.value.position, refused.value.replay_key) == (1, "rk-b")
    assert "secret" not in str(refused.value)
    got = kit.resolve_first_open(g, lambda c: c.name, skip=lambda p, _c: p == 2)
    assert got == ["a", "b", None]
    assert kit.first_unresolvable(g, lambda c: c.name if c.name != "c" else None) == (
        2,
        g.children[2],
    )


def test_first_unresolvable_skips_host_kinds() -> None:
    """G-51: sleep and await_event are run by the host, not the resolver."""
    g = effect_group(
        KEY,
        [
            EffectEnvelope(replay_key="t", kind="sleep", name="sleep", input={"seconds": 1}),
            EffectEnvelope(replay_key="e", kind="await_event", name="go", input=None),
        ],
        WakePolicy.FIRST,
        RTC,
    )
    assert kit.first_unresolvable(g, lambda _c: None) is None


# -- ranks and drain ---------------------------------------------------------------------------


def test_rank_ledger_first_settlement_per_position_wins() -> None:
    """G-15, G-17, G-35: rank = count + 1; a duplicate settles nothing."""
    ledger = RankLedger(3)
    assert ledger.settle(2) == 1
    assert ledger.settle(0) == 2
    assert ledger.settle(2) is None  # a duplicate delivery takes no rank
    assert (ledger.count, ledger.order, ledger.unsettled()) == (2, [2, 0], [1])
    assert ledger.position_at(1) == 2 and ledger.position_at(3) is None
    assert ledger.rank_of(0) == 2 and not ledger.complete
    assert ledger.settle(1) == 3 and ledger.complete
    assert RankLedger(3, [2, 0]).order == [2, 0]
    with pytest.raises(ValueError):
        ledger.settle(3)
    assert kit.next_rank(4, False) == 5 and kit.next_rank(4, True) is None


def test_no_executor_names_ids_only() -> None:
    """G-11, G-12."""
    entry = kit.no_executor(KEY, "rk-a", 0, kit.RESOLVER_MISS)
    assert isinstance(entry, NoExecutor)
    assert (entry.group_key, entry.replay_key, entry.position) == (KEY, "rk-a", 0)
    assert kit.RESOLVER_MISS in str(entry)


def test_cursor_refuses_a_rank_below_one_from_engine_requests() -> None:
    """G-20: an engine request naming rank 0 is refused, never served."""
    with pytest.raises(CursorExhausted):
        kit.check_cursor(KEY, -1, 2)
    assert kit.check_cursor(KEY, 1, 2) == 2


def test_replay_key_taken_names_both_groups() -> None:
    """R-6."""
    refused = kit.replay_key_taken(KEY, 1, "rk-a", "other:group:x:0")
    assert isinstance(refused, ReplayMismatch)
    assert (refused.group_key, refused.position, refused.replay_key) == (KEY, 1, "rk-a")
    assert "other:group:x:0" in str(refused)
    assert "another group" in str(kit.replay_key_taken(KEY, 0, "rk-a", None))


KIT_REFUSALS = (
    "HandleMismatch(",
    "CursorExhausted(",
    "DispositionWidened(",
    "GroupShapeMismatch(",
    "GroupShapeError(",
    "GroupClosed(",
    "ReplayMismatch(",
)


def test_no_tier_builds_a_kit_refusal_itself() -> None:
    """G-13, G-20, G-26, R-2, R-4: the fences live once, in the kit; a tier that raised one
    of their refusals itself would be a second copy of the rule that can drift."""
    import effecthost.hosts

    root = Path(effecthost.hosts.__file__).parent
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if any(name in line for name in KIT_REFUSALS)
    ]
    assert not found, found


@pytest.mark.parametrize(
    ("wake", "declared", "effective", "ranked", "held"),
    [
        (WakePolicy.FIRST, CANCEL, None, [], False),
        (WakePolicy.FIRST, CANCEL, None, ["cancelled"], True),
        (WakePolicy.FIRST, RTC, CANCEL, ["error"], True),  # narrowed to CANCEL
        (WakePolicy.FIRST, RTC, None, ["success"], False),
        (WakePolicy.FIRST_SUCCESS, CANCEL, None, ["error", "cancelled"], False),
        (WakePolicy.FIRST_SUCCESS, CANCEL, None, ["error", "success"], True),
        (WakePolicy.FIRST_SUCCESS, RTC, None, ["success"], False),
        (WakePolicy.ALL, CANCEL, None, ["success", "success"], False),
    ],
)
def test_decided_is_cancel_in_force_and_the_wake_policy_met(
    wake: WakePolicy,
    declared: LoserPolicy,
    effective: LoserPolicy | None,
    ranked: list[str],
    held: bool,
) -> None:
    """R-13: ``FIRST`` when rank 1 exists, ``FIRST_SUCCESS`` when a success holds a rank,
    ``ALL`` never; only with ``CANCEL`` in force (declared or narrowed)."""
    record = GroupRecord(KEY, 3, wake, declared, effective)
    assert kit.decided(record, ranked) is held
    assert kit.decided(record, iter(ranked)) is held
    assert kit.decided_kind(record) is (wake is not WakePolicy.ALL and record.in_force is CANCEL)
