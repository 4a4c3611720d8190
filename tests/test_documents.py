"""GroupDocument: the kit's rules on a group stored as one JSON document (the Redis example
host's record), without an engine: every method is pure."""

from __future__ import annotations

import json

from gated_tools import group

from effecthost.contract import (
    EffectKind,
    GroupDocument,
    GroupRecord,
    LoserPolicy,
    Outcome,
    Tombstone,
    WakePolicy,
    kit,
    sleep_input,
)

ME, OTHER = "me", "other"


def doc_of(*kinds: str, wake: WakePolicy = WakePolicy.ALL, cancel: bool = False) -> GroupDocument:
    children = [
        {"replay_key": f"c{p}", "kind": kind, "name": "go"}
        if kind == EffectKind.AWAIT_EVENT
        else {"replay_key": f"c{p}", "kind": kind, "name": "sleep", "input": sleep_input(5)}
        if kind == EffectKind.SLEEP
        else {"replay_key": f"c{p}", "kind": kind, "name": "t", "input": {}}
        for p, kind in enumerate(kinds)
    ]
    disposition = LoserPolicy.CANCEL if cancel else LoserPolicy.RUN_TO_COMPLETION
    made = group("g", *children, wake=wake, disposition=disposition)
    doc = GroupDocument.new(made, ME, now=100.0)
    return GroupDocument(json.loads(json.dumps(doc.data)))  # as an engine returns it


def test_a_new_document_is_the_groups_shape_and_records_each_sleeps_due_time() -> None:
    """G-02, G-51: the fences read the declared shape; a sleep's due time is fixed at open."""
    doc = doc_of(EffectKind.TOOL_CALL, EffectKind.SLEEP)
    assert doc.known() == GroupRecord("g", 2, WakePolicy.ALL, LoserPolicy.RUN_TO_COMPLETION)
    assert [c.replay_key for c in doc.recorded_children()] == ["g:c0", "g:c1"]
    assert [c["due"] for c in doc.children] == [None, 105.0]
    assert doc.unsettled() == [(0, doc.children[0]["envelope"]), (1, doc.children[1]["envelope"])]


def test_the_rank_rule_fences_stale_attempts_and_second_settlements() -> None:
    """G-15, G-16, G-17, G-35: the first settlement of a position takes rank count + 1; a
    stale attempt and a second settlement take none and change nothing."""
    doc = doc_of(EffectKind.TOOL_CALL, EffectKind.TOOL_CALL)
    assert doc.begin_attempt(1, ME) == 1 and doc.begin_attempt(1, ME) == 2
    assert not doc.settle(1, 1, Outcome.success("stale"))
    assert doc.settle(1, 2, Outcome.success("b"))
    assert not doc.settle(1, None, Outcome.cancelled())
    assert doc.settle(0, None, Outcome.failure("Boom", "boom"))
    assert doc.ranks == [1, 0]
    first, second = doc.settlement(1), doc.settlement(2)
    assert first is not None and (first.position, first.outcome.value) == (1, "b")
    assert second is not None and second.outcome.status == "error"
    assert doc.settlement(3) is None and doc.settlement(0) is None


def test_the_last_write_retires_the_group_and_frees_its_replay_keys() -> None:
    """G-36, R-4, R-11: whichever of the close and the last settlement lands second
    retires the group; its replay keys are freed and a tombstone stays."""
    by_settlement = doc_of(EffectKind.TOOL_CALL, EffectKind.TOOL_CALL)
    by_settlement.settle(0, None, Outcome.success(0))
    by_settlement.close(LoserPolicy.RUN_TO_COMPLETION)
    assert by_settlement.freed == [] and by_settlement.known().closed  # type: ignore[union-attr]
    assert by_settlement.settle(1, None, Outcome.success(1))
    assert by_settlement.freed == ["g:c0", "g:c1"]
    assert by_settlement.known() == Tombstone("g")
    assert not by_settlement.settle(1, None, Outcome.success(1)) and by_settlement.unsettled() == []

    by_close = doc_of(EffectKind.TOOL_CALL)
    by_close.settle(0, None, Outcome.success(0))
    by_close.close(LoserPolicy.CANCEL)
    assert by_close.freed == ["g:c0"] and by_close.known() == Tombstone("g")


def test_decided_follows_the_kits_rule() -> None:
    """R-13: a CANCEL group whose wake policy is met keeps its losers down."""
    doc = doc_of(EffectKind.TOOL_CALL, EffectKind.TOOL_CALL, wake=WakePolicy.FIRST, cancel=True)
    assert not doc.decided()
    doc.settle(1, None, Outcome.failure("X", "x"))
    assert doc.decided()
    assert not doc_of(EffectKind.TOOL_CALL, cancel=True).decided()  # ALL never is


def test_who_runs_a_child_is_the_runner_while_it_lives() -> None:
    """R-1: a child another live incarnation runs is never started again; one whose
    runner is gone, or never started, is idle."""
    doc = doc_of(EffectKind.TOOL_CALL, EffectKind.TOOL_CALL, EffectKind.TOOL_CALL)
    doc.begin_attempt(0, OTHER)
    doc.begin_attempt(1, ME)
    assert doc.incarnations() == {ME, OTHER}
    mine_runs = {1}.__contains__
    assert doc.idle_positions(ME, {ME, OTHER}, mine_runs) == [2]
    assert doc.idle_positions(ME, {ME}, mine_runs) == [0, 2]
    assert doc.idle_positions(ME, {ME}, lambda _p: False) == [0, 1, 2]


def test_the_drain_leaves_a_live_owner_and_cancels_a_gone_ones_children() -> None:
    """R-1, G-29: another incarnation's drain never touches a live owner's group; once the
    owner is gone it cancels the unsettled children by the disposition in force."""
    doc = doc_of(EffectKind.TOOL_CALL, EffectKind.TOOL_CALL, cancel=True)
    doc.begin_attempt(0, ME)
    doc.settle(1, None, Outcome.success(1))
    started: list[int] = []

    def drain(alive: set[str]) -> tuple[bool, kit.DrainTally]:
        tally = kit.DrainTally()
        changed = doc.drain(
            OTHER, alive, lambda _p: False, wired=True, start=started.append, tally=tally
        )
        return changed, tally

    changed, tally = drain({OTHER, ME})
    assert not changed and tally.report().cancelled == ()
    changed, tally = drain({OTHER})
    assert changed and tally.report().cancelled == (("g", "g:c0"),) and started == []
    assert doc.ranks == [1, 0]
    settled = doc.settlement(2)
    assert settled is not None and settled.outcome.status == "cancelled"
