"""The contract's data types: envelopes, groups, handles, outcomes, settlements."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from . import limits
from ._errors import (
    DuplicateReplayKey,
    EffectHostError,
    EmptyGroup,
    InvalidEnvelope,
    MalformedHandle,
    MembershipConflict,
    PayloadTooLarge,
)

JsonValue = Any
_M = TypeVar("_M", bound=BaseModel)
"""A value that round-trips through strict JSON (no NaN, no infinities, string keys)."""


class WakePolicy(StrEnum):
    """When a waiter is woken; part of group identity (G-23). Exactly three variants."""

    FIRST = "first"
    FIRST_SUCCESS = "first_success"
    ALL = "all"


class LoserPolicy(StrEnum):
    """What happens to children still running once the caller is done (G-25)."""

    RUN_TO_COMPLETION = "run_to_completion"
    CANCEL = "cancel"


class EffectKind:
    """The child kinds every tier ships (G-51). The kind field is open: others may exist."""

    TOOL_CALL = "tool_call"
    SLEEP = "sleep"
    AWAIT_EVENT = "await_event"


_CANONICAL_DEPTH = 1000
"""Deepest value :func:`canonical_json` walks; past it a value is refused, not recursed."""


def _reject_non_string_keys(value: JsonValue) -> None:
    if not isinstance(value, dict | list | tuple):
        return
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _CANONICAL_DEPTH:
            raise InvalidEnvelope(f"value is not strict JSON: nested over {_CANONICAL_DEPTH}")
        if isinstance(item, dict):
            if any(not isinstance(key, str) for key in item):
                raise InvalidEnvelope("value is not strict JSON: an object key is not a string")
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)


def canonical_json(value: JsonValue) -> bytes:
    """Strict canonical JSON: sorted keys, no whitespace, UTF-8, no NaN.

    Encodes what it is given (a host encodes whole records with it); the limits on values
    are :func:`normalize_json`'s.

    Raises:
        InvalidEnvelope: the value is not strict JSON (a set, bytes, NaN, a non-string key,
            text that is not valid Unicode, an integer too long to print, nesting past
            1,000 levels or a cycle).
    """
    _reject_non_string_keys(value)
    return _encode_canonical(value)


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _encode_canonical(value: JsonValue) -> bytes:
    """:func:`canonical_json` of a value whose object keys are known to be strings."""
    try:
        return _CANONICAL.encode(value).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidEnvelope(f"value is not strict JSON: {type(exc).__name__}") from None


def _plain_encoder() -> Any:
    """The C encoder :data:`_CANONICAL` uses, built once, without the cycle check: for
    values :func:`_plain` built (bounded depth, plain types), where it is the same text."""
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # pragma: no cover - a Python without the C accelerator
        return lambda value, _level: [_CANONICAL.encode(value)]
    return c_make_encoder(
        None,
        _CANONICAL.default,
        json.encoder.encode_basestring,
        None,
        ":",
        ",",
        True,
        False,
        False,
    )


_PLAIN_ENCODER = _plain_encoder()
_text_of_string = json.encoder.encode_basestring


def _plain_text(value: JsonValue) -> str:
    """Canonical JSON text of a value :func:`_plain` returned (or built only of plain
    JSON types with string keys, within the depth limit)."""
    return "".join(_PLAIN_ENCODER(value, 0))


class _Unusual(Exception):
    """A value :func:`_plain` leaves to the general path (which refuses it or
    normalises a subclass, a large value, ... with its own messages)."""


_MAX_STRING = limits.MAX_STRING_BYTES
_MIN_INT, _MAX_INT = limits.MIN_INT, limits.MAX_INT
_isfinite = math.isfinite


def _plain(value: Any, depth: int, size: list[int]) -> Any:
    """``json.loads(canonical_json(value))`` for a value of exact JSON types within
    the limits, without encoding: a copy with tuples as lists and object keys sorted.
    ``size[0]`` grows by an upper bound of the value's encoded size (a character is at
    most 6 bytes escaped, a number at most 24). Anything else raises :class:`_Unusual`."""
    kind = type(value)
    if kind is str:
        if len(value) > _MAX_STRING or "\x00" in value:
            raise _Unusual
        if not value.isascii() and limits._text_problem(value, _MAX_STRING) is not None:
            raise _Unusual
        size[0] += 6 * len(value) + 2
        return value
    if kind is int:
        if not _MIN_INT <= value <= _MAX_INT:
            raise _Unusual
        size[0] += 20
        return value
    if value is None or kind is bool:
        size[0] += 5
        return value
    if kind is float:
        if not _isfinite(value):
            raise _Unusual
        size[0] += 24
        return value
    if kind is list or kind is tuple:
        if depth >= limits.MAX_DEPTH:
            raise _Unusual
        size[0] += 2 + len(value)
        depth += 1
        items = []  # a loop, not a comprehension: no function object per list (3.11)
        for item in value:
            items.append(_plain(item, depth, size))
        return items
    if kind is dict:
        if depth >= limits.MAX_DEPTH:
            raise _Unusual
        size[0] += 2 + len(value)
        depth += 1
        out = {}
        try:
            keys = sorted(value)
        except TypeError:
            raise _Unusual from None
        for key in keys:
            if type(key) is not str or len(key) > _MAX_STRING or "\x00" in key:
                raise _Unusual
            if not key.isascii() and limits._text_problem(key, _MAX_STRING) is not None:
                raise _Unusual
            out[key] = _plain(value[key], depth, size)
            size[0] += 6 * len(key) + 3
        return out
    raise _Unusual


def _normalized(value: JsonValue) -> JsonValue | _Unusual:
    """:func:`normalize_json`'s result for the common value, or an :class:`_Unusual`
    when the general path must decide."""
    size = [0]
    try:
        copy = _plain(value, 0, size)
    except (_Unusual, RecursionError):
        return _Unusual()
    if size[0] > limits.MAX_JSON_BYTES:
        return _Unusual()  # maybe within the limit: the general path counts exactly
    return copy


def normalize_json(value: JsonValue, *, what: str = "value", **ids: Any) -> JsonValue:
    """Check ``value`` against the limits (:mod:`~effecthost.contract.limits`) and
    round-trip it through canonical JSON (tuples become lists, keys sorted).

    Raises:
        InvalidEnvelope: the value is not strict JSON or is over a limit (depth, integer
            range, NUL, lone surrogate); ``PayloadTooLarge`` (a subclass) for a size.
            ``what`` and ``ids`` name it in the message.
    """
    kind = type(value)
    if value is None or kind is bool:
        return value  # its own round trip; the common tool result skips the encoder
    if kind is int and limits.MIN_INT <= value <= limits.MAX_INT:
        return value
    if kind is str and len(value) <= 4096 and limits._text_problem(value, 4096) is None:
        return value
    fast = _normalized(value)
    if not isinstance(fast, _Unusual):
        return fast
    problem = limits.json_problem(value)
    if problem is None:
        data = _encode_canonical(value)
        if len(data) <= limits.MAX_JSON_BYTES:
            return json.loads(data)
        problem = (f"encodes to {len(data)} bytes, over the limit of {limits.MAX_JSON_BYTES}", True)
    reason, too_large = problem
    raise (PayloadTooLarge if too_large else InvalidEnvelope)(f"{what} {reason}", **ids)


def _summary(exc: ValidationError, model: type[BaseModel]) -> str:
    """Which fields failed and how, without the input (it may be a payload)."""
    parts = set()
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = error["loc"]
        field = str(loc[0]) if loc and loc[0] in model.model_fields else "(input)"
        # our validators' messages name limits, never values; pydantic's may quote input
        why = error["msg"] if error["type"] == "value_error" else error["type"]
        parts.add(f"{field}: {why}")
    return ", ".join(sorted(parts)[:6])


class _Model(BaseModel):
    """A contract model whose constructor refuses with the contract's typed errors (SPEC
    §7), never a pydantic ``ValidationError``. ``model_validate*`` keep pydantic's
    behaviour (hosts validate what they read with them and catch ``ValidationError``)."""

    _refusal: ClassVar[type[EffectHostError]] = InvalidEnvelope

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self._refused(exc) from None
        except (RecursionError, TypeError, ValueError, OverflowError):
            raise self._refusal(f"invalid {type(self).__name__}") from None

    @classmethod
    def _refused(cls, exc: ValidationError) -> EffectHostError:
        return cls._refusal(f"invalid {cls.__name__}: {_summary(exc, cls)}")


_FIELDS_SETS: dict[type[BaseModel], set[str]] = {}
_new_object = object.__new__
_set_attribute = object.__setattr__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _build(cls: type[_M], fields: dict[str, Any]) -> _M:
    """An instance of ``cls`` holding ``fields`` (every field, values the contract
    checked itself) as they are: what ``model_construct`` does without its per-field
    walk. Frozen models only (the fields-set is shared between instances). The slots
    are set through their descriptors: a per-child cost, so the lookups are done once."""
    fields_set = _FIELDS_SETS.get(cls)
    if fields_set is None:
        if cls.__new__ is not _new_object:
            raise TypeError(f"{cls.__name__} has its own __new__")
        fields_set = _FIELDS_SETS[cls] = set(cls.model_fields)
    obj = _new_object(cls)  # what ``cls.__new__`` is, without looking it up each time
    _set_attribute(obj, "__dict__", fields)
    _set_fields_set(obj, fields_set)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


def _key(value: Any, what: str, limit: int = limits.MAX_KEY_BYTES) -> str:
    """A field validator's key check: a ``ValueError`` pydantic turns into the model's
    typed refusal."""
    try:
        return limits.check_key(value, what=what, limit=limit)
    except InvalidEnvelope:
        raise ValueError(f"{what} is not a key within the limits") from None


_GroupKey = Annotated[str, BeforeValidator(lambda value: _key(value, "group key"))]
"""A group key field: a key within the limits (§7), else the model's typed refusal."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class GroupMembership(_Model):
    """Which group a child belongs to and under which rules (G-02, G-03)."""

    model_config = _FROZEN

    group_key: _GroupKey
    position: int = Field(strict=True, ge=0, lt=limits.MAX_CHILDREN)
    wake: WakePolicy
    disposition: LoserPolicy


class EffectEnvelope(_Model):
    """One effect as the journal records it.

    ``membership`` is optional and *omitted* from the canonical encoding when absent, so an
    ungrouped envelope hashes exactly as it did before groups existed (G-01); when present
    it carries wake and disposition into every child's hash (G-02).

    Raises:
        InvalidEnvelope: ``input`` is not strict JSON or is over the limits (R-8,
            ``PayloadTooLarge`` for a size), ``replay_key``/``kind``/``name`` is empty or
            over the key limits, a field has the wrong type or is unknown.
    """

    model_config = _FROZEN
    __slots__ = ("_hash", "_size")
    """The canonical size and sha256 digest once computed (the envelope is frozen and its
    input was normalised at construction): slots, not ``__dict__`` entries, because a
    sixth entry doubles the dict's table; the raw digest, not its hex text, and neither
    the bytes nor a tuple (a wide group holds one envelope per child). Unset until first
    asked; a copy starts unset."""

    replay_key: str
    kind: str
    name: str
    input: JsonValue = None
    membership: GroupMembership | None = None

    @model_validator(mode="before")
    @classmethod
    def _normalize(cls, data: Any) -> Any:
        if isinstance(data, EffectEnvelope):
            return data
        if not isinstance(data, Mapping):
            raise InvalidEnvelope("an envelope is built from a mapping of its fields")
        raw = data.get("replay_key")
        storable = isinstance(raw, str) and limits._text_problem(raw, limits.MAX_KEY_BYTES) is None
        limits.check_key(raw, what="envelope replay_key", replay_key=raw if storable else None)
        for field in ("kind", "name"):
            limits.check_key(
                data.get(field),
                what=f"{field} of envelope {raw!r}",
                limit=limits.MAX_NAME_BYTES,
                replay_key=raw,
            )
        value = normalize_json(data.get("input"), what=f"input of envelope {raw!r}", replay_key=raw)
        return {**data, "input": value}

    @classmethod
    def _grouped(
        cls, replay_key: str, kind: str, name: str, value: JsonValue, text: str, membership: Any
    ) -> EffectEnvelope:
        """A grouped envelope from parts the caller checked: keys and names within the
        key limits, ``value`` what :func:`_plain` returned and ``text`` its canonical
        JSON. Its canonical bytes are composed from ``text``, not encoded again."""
        envelope = _build(
            cls,
            {
                "replay_key": replay_key,
                "kind": kind,
                "name": name,
                "input": value,
                "membership": membership,
            },
        )
        data = _compose(text, kind, name, replay_key, membership)
        _set_size(envelope, len(data))
        _set_hash(envelope, hashlib.sha256(data).digest())
        return envelope

    def canonical_dict(self) -> dict[str, JsonValue]:
        """The dict whose canonical JSON is :meth:`canonical_bytes`."""
        doc: dict[str, JsonValue] = {
            "input": self.input,
            "kind": self.kind,
            "name": self.name,
            "replay_key": self.replay_key,
        }
        m = self.membership
        if m is not None:
            doc["membership"] = {
                "disposition": m.disposition.value,
                "group_key": m.group_key,
                "position": m.position,
                "wake": m.wake.value,
            }
        return doc

    def canonical_bytes(self) -> bytes:
        """Canonical encoding; membership omitted when absent (G-01)."""
        try:
            return _compose(
                _plain_text(self.input), self.kind, self.name, self.replay_key, self.membership
            )
        except Exception:  # e.g. built with ``model_construct``: the general encoder decides
            return _encode_canonical(self.canonical_dict())

    def _remember(self) -> tuple[int, bytes]:
        data = self.canonical_bytes()
        size, digest = len(data), hashlib.sha256(data).digest()
        _set_size(self, size)
        _set_hash(self, digest)
        return size, digest

    def canonical_size(self) -> int:
        """``len(self.canonical_bytes())``."""
        try:
            return _get_size(self)  # type: ignore[no-any-return]
        except AttributeError:
            return self._remember()[0]

    def envelope_hash(self) -> str:
        """``sha256`` hex of :meth:`canonical_bytes`: the replay fence (G-01, G-02)."""
        try:
            digest: bytes = _get_hash(self)
        except AttributeError:
            digest = self._remember()[1]
        return digest.hex()

    def with_membership(self, membership: GroupMembership | None) -> EffectEnvelope:
        """A copy with ``membership`` replaced."""
        return self.model_copy(update={"membership": membership})

    def _stamped(self, membership: GroupMembership) -> EffectEnvelope:
        """:meth:`with_membership` for a group's constructor: the input's text is
        encoded once for the stamped copy's canonical bytes."""
        fields = self.__dict__
        try:
            text = _plain_text(self.input)
        except Exception:  # built with ``model_construct``: the general path
            return self.with_membership(membership)
        return EffectEnvelope._grouped(
            fields["replay_key"], fields["kind"], fields["name"], fields["input"], text, membership
        )


_get_size = EffectEnvelope.__dict__["_size"].__get__
_set_size = EffectEnvelope.__dict__["_size"].__set__
_get_hash = EffectEnvelope.__dict__["_hash"].__get__
_set_hash = EffectEnvelope.__dict__["_hash"].__set__


def _compose(text: str, kind: str, name: str, replay_key: str, membership: Any) -> bytes:
    """The envelope's canonical JSON from its input's canonical ``text``: the keys in
    sorted order (``input``, ``kind``, ``membership``, ``name``, ``replay_key``), exactly
    what encoding :meth:`EffectEnvelope.canonical_dict` gives."""
    if membership is None:
        grouped = ""
    else:
        position = membership.position
        if type(position) is not int:
            raise TypeError("position")
        grouped = (
            f',"membership":{{"disposition":{_text_of_string(membership.disposition.value)},'
            f'"group_key":{_text_of_string(membership.group_key)},"position":{position},'
            f'"wake":{_text_of_string(membership.wake.value)}}}'
        )
    return (
        f'{{"input":{text},"kind":{_text_of_string(kind)}{grouped},'
        f'"name":{_text_of_string(name)},"replay_key":{_text_of_string(replay_key)}}}'
    ).encode()


class EffectGroup(_Model):
    """N child envelopes opened together. This is the one constructor (G-03).

    Children without membership are stamped from their index; a child whose membership
    names another group key, position, wake or disposition is refused. Hosts read group
    identity from the group, never from ``children[0]``.

    Raises:
        EmptyGroup: no children (G-04).
        MembershipConflict: a child's membership disagrees with the group (G-03).
        DuplicateReplayKey: two children share a replay key.
        InvalidEnvelope: the key is empty or over the limits, ``children`` is not a list or
            tuple of envelopes (or mappings), a child is not a valid envelope, more than
            ``MAX_CHILDREN`` children, a field is unknown (R-8); ``PayloadTooLarge`` (a
            subclass) when the children encode to more than ``MAX_GROUP_BYTES``.
    """

    model_config = _FROZEN

    key: str
    wake: WakePolicy
    disposition: LoserPolicy
    children: tuple[EffectEnvelope, ...]

    @model_validator(mode="before")
    @classmethod
    def _stamp(cls, data: Any) -> Any:
        if isinstance(data, EffectGroup):
            return data
        if not isinstance(data, Mapping):
            raise InvalidEnvelope("a group is built from a mapping of its fields")
        key = limits.check_key(data.get("key"), what="group key")
        try:
            wake = WakePolicy(data.get("wake"))  # type: ignore[arg-type]
            disposition = LoserPolicy(data.get("disposition"))  # type: ignore[arg-type]
        except (ValueError, TypeError):
            raise InvalidEnvelope(
                f"group {key!r} needs a wake policy and a loser policy", group_key=key
            ) from None
        raw = data.get("children", ())
        if not isinstance(raw, list | tuple):
            raise InvalidEnvelope(
                f"children of group {key!r} must be a list or tuple of envelopes", group_key=key
            )
        if len(raw) == 0:
            raise EmptyGroup(f"group {key!r} has no children", group_key=key)
        if len(raw) > limits.MAX_CHILDREN:
            raise InvalidEnvelope(
                f"group {key!r} has {len(raw)} children, over the limit of {limits.MAX_CHILDREN}",
                group_key=key,
            )
        stamped: list[EffectEnvelope] = []
        seen: set[str] = set()
        size = 0
        for index, child in enumerate(raw):
            envelope = _child(key, index, child)
            got = envelope.membership
            if got is None:
                envelope = envelope._stamped(_membership(key, index, wake, disposition))
            elif not (
                type(got) is GroupMembership
                and got.position == index
                and got.group_key == key
                and got.wake is wake
                and got.disposition is disposition
            ) and got != (expected := _membership(key, index, wake, disposition)):
                fields = [
                    name
                    for name in ("group_key", "position", "wake", "disposition")
                    if getattr(got, name) != getattr(expected, name)
                ]
                raise MembershipConflict(
                    f"child {envelope.replay_key!r} at position {index} of group {key!r} "
                    f"disagrees on {', '.join(fields)}",
                    group_key=key,
                    replay_key=envelope.replay_key,
                    position=index,
                )
            if envelope.replay_key in seen:
                raise DuplicateReplayKey(
                    f"replay key {envelope.replay_key!r} appears twice in group {key!r}",
                    group_key=key,
                    replay_key=envelope.replay_key,
                    position=index,
                )
            seen.add(envelope.replay_key)
            size += envelope.canonical_size()
            if size > limits.MAX_GROUP_BYTES:
                raise PayloadTooLarge(
                    f"children of group {key!r} up to position {index} encode to {size} "
                    f"bytes, over the limit of {limits.MAX_GROUP_BYTES}",
                    group_key=key,
                    replay_key=envelope.replay_key,
                    position=index,
                )
            stamped.append(envelope)
        return {**data, "wake": wake, "disposition": disposition, "children": tuple(stamped)}

    @property
    def child_count(self) -> int:
        return len(self.children)

    def handle(self) -> GroupHandle:
        """A fresh cursor (``consumed = 0``) whose child count comes from this group (G-20)."""
        return GroupHandle(
            group_key=self.key,
            child_count=self.child_count,
            consumed=0,
            wake=self.wake,
            disposition=self.disposition,
        )


def _membership(
    key: str, position: int, wake: WakePolicy, disposition: LoserPolicy
) -> GroupMembership:
    """Child ``position``'s membership of a group whose key and policies are checked."""
    return _build(
        GroupMembership,
        {"group_key": key, "position": position, "wake": wake, "disposition": disposition},
    )


def _child(key: str, index: int, child: Any) -> EffectEnvelope:
    """Child ``index`` of group ``key`` as an envelope; its refusal names the group."""
    if isinstance(child, EffectEnvelope):
        return child
    if not isinstance(child, Mapping):
        raise InvalidEnvelope(
            f"child at position {index} of group {key!r} is not an envelope",
            group_key=key,
            position=index,
        )
    if not all(isinstance(name, str) for name in child):
        raise InvalidEnvelope(
            f"child at position {index} of group {key!r} has a field name that is not text",
            group_key=key,
            position=index,
        )
    try:
        return EffectEnvelope(**child)
    except EffectHostError as exc:
        if exc.group_key is None:
            exc.group_key = key
        if exc.position is None:
            exc.position = index
        raise


class GroupHandle(_Model):
    """The caller's cursor over one group; the only cursor of record (G-18).

    Mutable on purpose: :meth:`EffectController.await_next_settlement` advances
    ``consumed`` by exactly one on each settlement it returns, and by nothing when it
    raises or is cancelled. Save it with :meth:`to_json` in the caller's continuation.

    Strict: the counts are integers (not ``"2"``, ``2.0`` or ``true``), ``1 <= child_count
    <= MAX_CHILDREN`` and ``0 <= consumed <= child_count``; anything else, at construction,
    decoding or assignment, is :class:`MalformedHandle` and a refused assignment leaves the
    handle as it was.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    _refusal: ClassVar[type[EffectHostError]] = MalformedHandle

    group_key: _GroupKey
    child_count: int = Field(strict=True, ge=1, le=limits.MAX_CHILDREN)
    consumed: int = Field(strict=True, ge=0, le=limits.MAX_CHILDREN)
    wake: WakePolicy
    disposition: LoserPolicy

    @model_validator(mode="after")
    def _consumed_in_range(self) -> GroupHandle:
        if self.consumed > self.child_count:
            raise ValueError("consumed exceeds child_count")
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        fields = self.__dict__
        if name == "consumed" and type(value) is int:
            count = fields.get("child_count")
            if type(count) is int and 0 <= value <= count <= limits.MAX_CHILDREN:
                # what validate_assignment accepts, without its copy of every field
                fields["consumed"] = value
                return
        before = dict(fields)
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            # pydantic has replaced the fields before the range check refused them
            object.__setattr__(self, "__dict__", before)
            raise self._refused(exc) from None

    @property
    def remaining(self) -> int:
        return self.child_count - self.consumed

    @property
    def exhausted(self) -> bool:
        return self.consumed >= self.child_count

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> GroupHandle:
        """Decode a saved handle.

        Raises:
            MalformedHandle: not a handle, a count that is not an integer, or impossible
                values (consumed > child_count, child_count over ``MAX_CHILDREN``), a
                repeated key, over :data:`MAX_HANDLE_BYTES`.
        """
        document = saved_object(text, "group handle", MalformedHandle, MAX_HANDLE_BYTES)
        try:
            return cls.model_validate(document)
        except ValidationError as exc:
            raise cls._refused(exc) from None
        except (RecursionError, TypeError, ValueError):
            raise MalformedHandle("cannot decode group handle") from None

    def copy_cursor(self) -> GroupHandle:
        """An independent copy (what a restored continuation holds)."""
        return self.model_copy()


MAX_HANDLE_BYTES = 16 * 1024
"""Largest saved handle: its key (at most ``MAX_KEY_BYTES``, each character escaped at
most six bytes) and four short fields."""


class _Repeated(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _Repeated
    return document


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def saved_object(
    text: Any, what: str, refusal: type[EffectHostError], limit: int
) -> dict[str, Any]:
    """The JSON object a caller saved (``to_json``), decoded strictly: text of at most
    ``limit`` bytes, no repeated key, no ``NaN``/``Infinity``, an object. What a
    ``from_json`` calls before its own checks.

    Raises:
        EffectHostError: ``refusal``, naming ``what`` and never the text.
    """
    if not isinstance(text, str | bytes | bytearray):
        raise refusal(f"a saved {what} is text")
    if len(text) > limit:  # a character is at least one byte
        raise refusal(f"a saved {what} is over the limit of {limit} bytes")
    if isinstance(text, str):
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise refusal(f"a saved {what} is not valid Unicode") from None
        if size > limit:
            raise refusal(f"a saved {what} is over the limit of {limit} bytes")
    try:
        document = json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)
    except _Repeated:
        raise refusal(f"a saved {what} repeats a key") from None
    except (ValueError, RecursionError, TypeError):
        raise refusal(f"cannot decode the saved {what}") from None
    if not isinstance(document, dict):
        raise refusal(f"a saved {what} is a JSON object")
    return document


def require_handle(handle: Any) -> GroupHandle:
    """``handle`` if it is a handle that passed its own checks; what a host calls before
    it reads anything (R-2).

    Raises:
        MalformedHandle: not a :class:`GroupHandle`, or values its constructor refuses (a
            handle built with ``model_construct``).
    """
    if not isinstance(handle, GroupHandle):
        raise MalformedHandle("not a GroupHandle")
    fields = handle.__dict__
    count, consumed = fields.get("child_count"), fields.get("consumed")
    if (
        type(count) is not int
        or type(consumed) is not int
        or not 0 <= consumed <= count
        or not 1 <= count <= limits.MAX_CHILDREN
        or not isinstance(fields.get("wake"), WakePolicy)
        or not isinstance(fields.get("disposition"), LoserPolicy)
        or not isinstance(fields.get("group_key"), str)
        or limits._text_problem(fields["group_key"], limits.MAX_KEY_BYTES) is not None
    ):
        raise MalformedHandle("handle values out of range")
    return handle


def require_group(group: Any) -> EffectGroup:
    """``group`` if it is an :class:`EffectGroup`; what a host calls before it reads one,
    so a wrong type is a typed refusal, not an ``AttributeError`` (R-2).

    Raises:
        InvalidEnvelope: not an :class:`EffectGroup`; nothing is recorded.
    """
    if not isinstance(group, EffectGroup):
        raise InvalidEnvelope("open_effect_group takes an EffectGroup")
    return group


def coerce_disposition(group_key: str, disposition: Any) -> LoserPolicy | None:
    """The close disposition as a :class:`LoserPolicy`: ``None``, a member, or one of the
    enum's string values (``"cancel"``, ``"run_to_completion"``). Every host's close
    calls this, so a plain string means the same on every tier (G-26).

    Raises:
        InvalidEnvelope: anything else; nothing is recorded.
    """
    if disposition is None or isinstance(disposition, LoserPolicy):
        return disposition
    if isinstance(disposition, str):
        for member in LoserPolicy:
            if disposition == member.value:
                return member
    raise InvalidEnvelope(
        f"close of group {group_key!r}: the disposition is not one of "
        f"{', '.join(m.value for m in LoserPolicy)}",
        group_key=group_key,
    )


class ErrorInfo(_Model):
    """A child's failure as recorded: type, message, optional JSON data and code.

    Within the limits (R-8): the type at most ``MAX_NAME_BYTES``, the message a string every
    tier stores, the data a JSON value within the limits, and message and data together at
    most ``MAX_JSON_BYTES`` once encoded.
    """

    model_config = _FROZEN

    type: str
    message: str
    data: JsonValue = None
    code: int | None = Field(default=None, strict=True, ge=limits.MIN_INT, le=limits.MAX_INT)

    @model_validator(mode="after")
    def _within_limits(self) -> ErrorInfo:
        _as_value_error(_check_failure, self.type, self.message, self.data)
        return self


def _check_failure(type: Any, message: Any, data: JsonValue) -> None:
    """Raises: InvalidEnvelope (``PayloadTooLarge`` for a size) when a failure's fields
    are over the limits (R-8)."""
    limits.check_text(type, what="failure type", limit=limits.MAX_NAME_BYTES)
    limits.check_text(message, what="failure message")
    limits.check_json(data, what="failure data")
    size = len(_encode_canonical(message))
    if data is not None:
        size += len(_encode_canonical(data))
    if size > limits.MAX_JSON_BYTES:
        raise PayloadTooLarge(
            f"failure message and data encode to {size} bytes, over the limit of "
            f"{limits.MAX_JSON_BYTES}"
        )


def _as_value_error(check: Any, *args: Any) -> None:
    """Run a limits check inside a validator: its refusal as the ``ValueError`` pydantic
    expects (the constructor turns it back into the typed error)."""
    try:
        check(*args)
    except InvalidEnvelope as exc:
        raise ValueError(str(exc).removeprefix(f"[{exc.code.value}] ")) from None


_BOUND = "_size_bound"
"""Where an outcome built by :meth:`Outcome.success` keeps an upper bound of its canonical
size: a ``__dict__`` entry that is no field (pydantic's equality, hash, dump and repr read
the fields only)."""
_SUCCESS_FRAME = len('{"error":null,"status":"success","value":}')


class Outcome(_Model):
    """How a child ended: a success value, an error, or cancelled. Its value is a JSON
    value within the limits (R-8)."""

    model_config = _FROZEN

    status: Literal["success", "error", "cancelled"]
    value: JsonValue = None
    error: ErrorInfo | None = None

    @model_validator(mode="after")
    def _within_limits(self) -> Outcome:
        if self.value is not None:
            _as_value_error(lambda v: limits.check_json(v, what="outcome value"), self.value)
        return self

    @classmethod
    def success(cls, value: JsonValue = None) -> Outcome:
        """Raises: InvalidEnvelope when ``value`` is not strict JSON within the limits."""
        if cls is Outcome:
            size = [0]
            try:
                plain = _plain(value, 0, size)
            except (_Unusual, RecursionError):
                pass
            else:
                if size[0] <= limits.MAX_JSON_BYTES:
                    outcome = _build(cls, {"status": "success", "value": plain, "error": None})
                    outcome.__dict__[_BOUND] = size[0] + _SUCCESS_FRAME
                    return outcome
        value = normalize_json(value, what="outcome value")
        if cls is not Outcome:
            return cls(status="success", value=value)
        # normalize_json applied exactly the limits the validator would check again
        return _build(cls, {"status": "success", "value": value, "error": None})

    @classmethod
    def failure(
        cls, type: str, message: str, data: JsonValue = None, code: int | None = None
    ) -> Outcome:
        """Raises: InvalidEnvelope when a field is over the limits (R-8)."""
        data = normalize_json(data, what="failure data")
        _check_failure(type, message, data)
        error = ErrorInfo(type=type, message=message, data=data, code=code)
        if cls is not Outcome:
            return cls(status="error", error=error)
        return _build(cls, {"status": "error", "value": None, "error": error})

    @classmethod
    def cancelled(cls) -> Outcome:
        if cls is not Outcome:
            return cls(status="cancelled")
        return _build(cls, {"status": "cancelled", "value": None, "error": None})

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def _size_within(self, limit: int) -> bool:
        """Whether :meth:`canonical_size` is at most ``limit``; without encoding when the
        bound :meth:`success` noted while checking the value already says so."""
        bound = self.__dict__.get(_BOUND)
        if bound is not None and bound <= limit:
            return True
        return self.canonical_size() <= limit

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """As pydantic's, without the size bound of the original."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop(_BOUND, None)
        return copied

    def canonical_size(self) -> int:
        """``len(canonical_json(self.model_dump(mode="json")))``: what a host bounds an
        outcome by; without the dump when the outcome holds plain JSON."""
        error = self.error
        try:
            if type(self) is not Outcome or type(self.status) is not str:
                raise TypeError
            if error is not None:
                if type(error) is not ErrorInfo or error.code.__class__ not in (int, type(None)):
                    raise TypeError
                dumped: Any = {
                    "code": error.code,
                    "data": error.data,
                    "message": error.message,
                    "type": error.type,
                }
            else:
                dumped = None
            text = _plain_text({"error": dumped, "status": self.status, "value": self.value})
            return len(text.encode())
        except (TypeError, ValueError, RecursionError):
            return len(canonical_json(self.model_dump(mode="json")))


class Settlement(_Model):
    """Rank ``rank`` of a group: which child settled ``rank``-th and how (G-15)."""

    model_config = _FROZEN

    rank: int = Field(ge=1)
    position: int = Field(ge=0)
    replay_key: str
    outcome: Outcome

    @classmethod
    def recorded(cls, rank: int, position: int, replay_key: str, outcome: Outcome) -> Settlement:
        """A settlement of values a host recorded and checked itself (an ``int`` rank of
        at least 1, position, the child's replay key, an :class:`Outcome`): built
        without validating them again. Anything else is refused as the constructor
        refuses it."""
        if (
            cls is Settlement
            and type(rank) is int
            and rank >= 1
            and type(position) is int
            and position >= 0
            and type(replay_key) is str
            and type(outcome) is Outcome
        ):
            return _build(
                cls,
                {"rank": rank, "position": position, "replay_key": replay_key, "outcome": outcome},
            )
        return cls(rank=rank, position=position, replay_key=replay_key, outcome=outcome)
