"""The decode path of sealed settlements under hostile records (G-48, G-49, R-10).

Every recorded form a host can hand :func:`decode_outcome` (a ``StoredOutcome``, the JSON
text or bytes a SQL row holds, the document Restate and Temporal record) is corrupted in
generated ways; the read either returns the value that was sealed or raises a typed error
whose message quotes no ciphertext and no plaintext.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effecthost.contract import (
    EffectHostError,
    Outcome,
    PayloadMissing,
    PayloadShredded,
    SealedPayloadUnreadable,
)
from effecthost.payloads import (
    AesGcmSealer,
    InMemoryKeyStore,
    MemoryPayloadStore,
    PayloadPolicy,
    StoredOutcome,
    decode_outcome,
    encode_outcome,
    looks_sealed,
)

GROUP = "tenant-7:group:abc123:0"
SECRET = "correct horse battery staple"

pytestmark = pytest.mark.anyio
TYPED = (SealedPayloadUnreadable, PayloadShredded, PayloadMissing)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _windows(text: str, width: int = 12) -> set[str]:
    return {text[i : i + width] for i in range(0, max(1, len(text) - width + 1))}


def assert_quotes_nothing(error: BaseException, *secrets: str) -> None:
    """No plaintext, and no 12-character run of any ciphertext, in the error or its
    attributes; no chained exception that could quote them."""
    text = f"{error!s} {error!r} {vars(error)!r}"
    for secret in secrets:
        for window in _windows(secret):
            assert window not in text, f"the error quotes {window!r}"
    assert error.__cause__ is None
    assert error.__suppress_context__ or error.__context__ is None


class Sealed:
    """One sealed outcome of each form, and the secrets a leak would show."""

    def __init__(self) -> None:
        self.keys = InMemoryKeyStore()
        self.store = MemoryPayloadStore()
        self.policy = PayloadPolicy(store=self.store, sealer=AesGcmSealer(self.keys))
        self.value = {"secret": SECRET}
        self.inline = run(
            encode_outcome(self.policy, GROUP, "r1", Outcome.success(self.value), position=0)
        )
        self.by_ref = run(
            encode_outcome(
                self.policy, GROUP, "r2", Outcome.success({**self.value, "pad": "p" * 6000}),
                position=1,
            )
        )  # fmt: skip

    def ciphertexts(self) -> list[str]:
        assert self.inline.envelope is not None
        texts = [self.inline.envelope.ciphertext]
        for data in self.store._groups[GROUP].values():
            texts.append(json.loads(data)["ciphertext"])
        return texts


SEALED = Sealed()


def _corrupt(text: bytes, how: str, where: int, bit: int) -> bytes:
    if not text:
        return text
    at = where % len(text)
    if how == "truncate":
        return text[:at]
    if how == "flip":
        return text[:at] + bytes([text[at] ^ (1 << bit)]) + text[at + 1 :]
    if how == "delete":
        return text[:at] + text[at + 1 :]
    if how == "duplicate":
        return text[: at + 1] + text[at:]
    raise AssertionError(how)


def _slot(replay_key: str) -> tuple[str, str, int]:
    return GROUP, replay_key, 0 if replay_key == "r1" else 1


def _expect_typed_or_original(recorded: Any, replay_key: str, policy: PayloadPolicy) -> None:
    group_key, replay_key, position = _slot(replay_key)
    try:
        outcome = run(
            decode_outcome(policy, group_key, replay_key, recorded, position=position, rank=3)
        )
    except TYPED as exc:
        assert (exc.group_key, exc.replay_key, exc.rank) == (group_key, replay_key, 3)
        assert_quotes_nothing(exc, SECRET, *SEALED.ciphertexts())
        return
    assert outcome.value["secret"] == SECRET  # an unchanged meaning (a redundant bit)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    form=st.sampled_from(["r1", "r2"]),
    how=st.sampled_from(["truncate", "flip", "delete", "duplicate"]),
    where=st.integers(min_value=0, max_value=10_000),
    bit=st.integers(min_value=0, max_value=7),
    as_text=st.booleans(),
)
def test_g49_corrupted_records_are_typed_and_quote_nothing(
    form: str, how: str, where: int, bit: int, as_text: bool
) -> None:
    """G-48, G-49: a truncated or bit-flipped record (text or bytes, as a SQL row holds
    it) is ``SealedPayloadUnreadable`` / ``PayloadMissing``, never a pydantic, JSON or
    Unicode error, and quotes no ciphertext; or it still opens to the sealed value."""
    stored = SEALED.inline if form == "r1" else SEALED.by_ref
    raw = _corrupt(stored.model_dump_json().encode(), how, where, bit)
    recorded: Any = raw
    if as_text:
        try:
            recorded = raw.decode("utf-8")
        except UnicodeDecodeError:
            recorded = raw
    _expect_typed_or_original(recorded, form, SEALED.policy)


@pytest.mark.parametrize(
    "recorded",
    [
        "",
        b"",
        " ",
        "null",
        "[]",
        "42",
        '"x"',
        "{}",
        '{"form": "sealed"}',
        '{"form": "ref", "sealed": true}',
        '{"form": "inline", "sealed": true}',
        {"form": 7},
        {"form": "sealed", "envelope": "x", "sealed": True},
        {"status": "success", "value": {"format": "effecthost.sealed/2", "ciphertext": "AAAA"}},
        "[" * 100_000,
        b"\xff\xfe" + b"{}",
    ],
    ids=lambda v: repr(v)[:24],
)
def test_g49_malformed_records_are_typed(recorded: Any) -> None:
    """G-49: empty, non-object, wrong-typed, absurdly deep or non-UTF-8 records raise a
    typed refusal (ids only), never pydantic's ``ValidationError`` or ``RecursionError``."""
    with pytest.raises(TYPED) as caught:
        run(decode_outcome(SEALED.policy, GROUP, "r1", recorded, position=0, rank=1))
    assert_quotes_nothing(caught.value, SECRET)


@pytest.mark.parametrize("form", ["r1", "r2"])
@pytest.mark.parametrize("kind", ["leading space", "sealed false", "as dict", "as bytes"])
def test_g49_each_recorded_shape_of_a_sealed_form(form: str, kind: str) -> None:
    """G-49: the same record as each tier holds it (text with a leading space, a dict, bytes)
    opens; with ``"sealed": false`` on a sealed form it is refused, typed."""
    stored = SEALED.inline if form == "r1" else SEALED.by_ref
    text = stored.model_dump_json()
    _, replay_key, position = _slot(form)
    recorded: Any = {
        "leading space": " " + text,
        "sealed false": text.replace('"sealed":true', '"sealed":false'),
        "as dict": json.loads(text),
        "as bytes": text.encode(),
    }[kind]
    decode = decode_outcome(SEALED.policy, GROUP, replay_key, recorded, position=position)
    if kind == "sealed false":
        with pytest.raises(SealedPayloadUnreadable) as caught:
            run(decode)
        assert_quotes_nothing(caught.value, SECRET, *SEALED.ciphertexts())
    else:
        assert run(decode).value["secret"] == SECRET


def test_g49_a_forged_envelope_quotes_no_ciphertext_in_its_ids() -> None:
    """G-49: the ids an error quotes from a forged envelope (cipher, key id, scope) are
    capped, so an attacker-placed field cannot carry ciphertext into a log line."""
    assert SEALED.inline.envelope is not None
    long = SEALED.inline.envelope.ciphertext * 3
    for field in ("cipher", "key_id", "scope"):
        forged = SEALED.inline.envelope.model_copy(update={field: long})
        recorded = StoredOutcome(form="sealed", envelope=forged, sealed=True)
        with pytest.raises(SealedPayloadUnreadable) as caught:
            run(decode_outcome(SEALED.policy, GROUP, "r1", recorded, position=0))
        assert_quotes_nothing(caught.value, SECRET, long)


# -- the position is bound --------------------------------------------------------


@pytest.mark.parametrize("size", [10, 10_000], ids=["inline", "by-reference"])
async def test_r10_a_sealed_value_read_at_another_position_fails(size: int) -> None:
    """R-10, G-48: the associated data binds the position: the same group key and replay
    key under another position does not open."""
    keys = InMemoryKeyStore()
    policy = PayloadPolicy(store=MemoryPayloadStore(), sealer=AesGcmSealer(keys))
    outcome = Outcome.success(SECRET + "p" * size)
    stored = await encode_outcome(policy, GROUP, "r1", outcome, position=2)
    assert (await decode_outcome(policy, GROUP, "r1", stored, position=2)).value == outcome.value
    for position in (0, 1, 3):
        with pytest.raises(SealedPayloadUnreadable) as caught:
            await decode_outcome(policy, GROUP, "r1", stored, position=position, rank=1)
        assert caught.value.position == position
        assert_quotes_nothing(caught.value, SECRET)


async def test_r10_an_envelope_of_the_previous_format_is_refused_by_name() -> None:
    """R-10: an envelope of format ``effecthost.sealed/1`` (no position in its associated
    data) is refused as such, typed, not opened without its position."""
    assert SEALED.inline.envelope is not None
    old = SEALED.inline.envelope.model_copy(update={"format": "effecthost.sealed/1"})
    recorded = StoredOutcome(form="sealed", envelope=old, sealed=True)
    with pytest.raises(SealedPayloadUnreadable, match=r"effecthost\.sealed/1"):
        await decode_outcome(SEALED.policy, GROUP, "r1", recorded, position=0)


# -- the shape guard and forged plaintext (ADR 0130 D2, D8) -----------------------------


def _envelope_doc() -> dict[str, Any]:
    assert SEALED.inline.envelope is not None
    return SEALED.inline.envelope.model_dump(mode="json")


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome.success({"a": [1, {"b": _envelope_doc()}]}),
        Outcome.success([[[_envelope_doc()]]]),
        Outcome.success({"format": "effecthost.sealed/1", "x": 1}),
        Outcome.failure("E", "m", data={"nested": [_envelope_doc()]}),
    ],
    ids=["in-a-dict", "in-a-list", "older-format", "in-failure-data"],
)
async def test_g49_an_envelope_anywhere_in_a_plaintext_value_is_refused(outcome: Outcome) -> None:
    """G-49, ADR 0130 D2: a value shaped like a sealed envelope at any depth of a plaintext
    outcome (value or failure data) is refused, not served."""
    policy = PayloadPolicy(store=MemoryPayloadStore(), accept_plaintext=True)
    for recorded in (StoredOutcome(form="inline", outcome=outcome), outcome.model_dump()):
        with pytest.raises(SealedPayloadUnreadable) as caught:
            await decode_outcome(policy, GROUP, "r1", recorded, position=0, rank=2)
        assert_quotes_nothing(caught.value, SEALED.ciphertexts()[0])


def test_looks_sealed_walks_the_whole_value_without_recursing() -> None:
    """G-49: the shape guard finds an envelope at any depth, iteratively (a deep value
    does not blow the stack), and ignores look-alikes that are not the format tag."""
    deep: Any = _envelope_doc()
    for _ in range(50_000):
        deep = [deep]
    assert looks_sealed(deep)
    assert looks_sealed({"x": {"format": "effecthost.sealed/9"}})
    assert not looks_sealed({"format": "effecthost.sealed"})  # no version: not the tag
    assert not looks_sealed({"format": 1, "y": ["effecthost.sealed/2"]})
    assert not looks_sealed(json.dumps(_envelope_doc()))  # wrapped as a string: a value


async def test_g49_a_tool_result_shaped_like_an_envelope_is_recorded_as_a_typed_failure() -> None:
    """G-49, ADR 0130 D6: sealing a result that already carries an envelope shape would
    make a rank every reader refuses; it is recorded as the child's typed failure."""
    for policy in (SEALED.policy, PayloadPolicy(store=MemoryPayloadStore())):
        stored = await encode_outcome(
            policy, GROUP, "r9", Outcome.success({"relay": _envelope_doc()}), position=4
        )
        outcome = await decode_outcome(policy, GROUP, "r9", stored, position=4)
        assert outcome.error is not None and outcome.error.type == "SealedShapeRefused"
        assert SEALED.ciphertexts()[0][:12] not in outcome.model_dump_json()


async def test_g49_forged_plaintext_on_a_sealing_host_is_refused_unless_mixed() -> None:
    """G-49, ADR 0130 D8: a host whose policy seals refuses an unsealed record (inline or
    by reference) in a slot, since it never writes one; ``accept_plaintext=True`` (a mixed
    deployment) reads it."""
    store = MemoryPayloadStore()
    plain = PayloadPolicy(store=store, inline_threshold=10)
    forged = [
        StoredOutcome(form="inline", outcome=Outcome.success("forged")),
        Outcome.success("forged").model_dump(),
        await encode_outcome(plain, GROUP, "r1", Outcome.success("forged" * 10), position=0),
    ]
    sealing = PayloadPolicy(store=store, sealer=AesGcmSealer(InMemoryKeyStore()))
    mixed = PayloadPolicy(
        store=store, sealer=AesGcmSealer(InMemoryKeyStore()), accept_plaintext=True
    )
    for recorded in forged:
        with pytest.raises(SealedPayloadUnreadable) as caught:
            await decode_outcome(sealing, GROUP, "r1", recorded, position=0, rank=1)
        assert "forged" not in str(caught.value)
        outcome = await decode_outcome(mixed, GROUP, "r1", recorded, position=0)
        assert str(outcome.value).startswith("forged")


async def test_g47_a_reference_to_another_slot_is_refused() -> None:
    """G-47, R-10: a by-reference record names its slot; one copied to another slot is
    refused even unsealed (its bytes would be another child's outcome)."""
    policy = PayloadPolicy(store=MemoryPayloadStore(), inline_threshold=10)
    stored = await encode_outcome(policy, GROUP, "r1", Outcome.success("v" * 100), position=0)
    for group_key, replay_key in ((GROUP, "r2"), ("tenant-7:group:other:0", "r1")):
        with pytest.raises(PayloadMissing):
            await decode_outcome(policy, group_key, replay_key, stored, position=0)


def test_every_refusal_is_an_effect_host_error() -> None:
    assert all(issubclass(cls, EffectHostError) for cls in TYPED)
    assert re.fullmatch(r"[A-Za-z0-9+/=]+", SEALED.ciphertexts()[0])
    assert base64.b64decode(SEALED.ciphertexts()[0])


# -- limits, pinned as they are (docs/security.md, "not covered" rows) ------------------


async def test_limit_an_older_value_of_the_same_slot_opens() -> None:
    """G-48 (a limit): an older sealed outcome of the same slot and position, restored
    from a backup, opens; the records' own integrity must prevent rollback."""
    policy = PayloadPolicy(sealer=AesGcmSealer(InMemoryKeyStore()))
    old = await encode_outcome(policy, GROUP, "r1", Outcome.success("old"), position=0)
    await encode_outcome(policy, GROUP, "r1", Outcome.success("new"), position=0)
    assert (await decode_outcome(policy, GROUP, "r1", old, position=0)).value == "old"


async def test_limit_an_envelope_length_follows_the_plaintext() -> None:
    """G-48 (a limit): sizes are visible; an envelope's length follows the plaintext's."""
    policy = PayloadPolicy(sealer=AesGcmSealer(InMemoryKeyStore()))
    lengths = []
    for size in (1, 100, 1000):
        stored = await encode_outcome(policy, GROUP, "r1", Outcome.success("x" * size), position=0)
        assert stored.envelope is not None
        lengths.append(len(base64.b64decode(stored.envelope.ciphertext)))
    assert lengths[1] - lengths[0] == 99 and lengths[2] - lengths[1] == 900


async def test_limit_ids_and_inputs_stay_plaintext() -> None:
    """G-48 (a limit): a sealed record names its group key, replay key, scope and key id
    in the clear (they index every record and error); only the outcome is sealed."""
    policy = PayloadPolicy(sealer=AesGcmSealer(InMemoryKeyStore()))
    stored = await encode_outcome(policy, GROUP, "r1", Outcome.success(SECRET), position=0)
    text = stored.model_dump_json()
    assert stored.envelope is not None
    assert "tenant-7" in text and stored.envelope.key_id in text and SECRET not in text


def test_every_threat_row_names_tests_that_exist() -> None:
    """docs/security.md's threat table names, per row, tests that exist, so the mapping of
    threats to tests is checkable."""
    root = Path(__file__).parent
    doc = (root.parent / "docs" / "security.md").read_text("utf-8")
    table = doc[doc.index("| Threat |") :]
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]
    assert len(rows) >= 15
    for row in rows:
        named = re.findall(r"`(?:tests/)?([\w/]+\.py)::(\w+)`", row)
        assert named, row
        for file, name in named:
            candidates = [root / file, *root.glob(f"*/{file}")]
            sources = [p.read_text("utf-8") for p in candidates if p.exists()]
            assert any(f"def {name}(" in src for src in sources), (file, name)
