"""Payload stores: where outcomes above the inline threshold live (G-47).

A store holds opaque bytes under a :class:`PayloadRef`; it never interprets them (a sealed
outcome is stored as its envelope, so the store sees ciphertext only). Payloads are grouped
by group key, so a group's retirement deletes all of them at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from effecthost.contract import PayloadMissing


class PayloadRef(BaseModel):
    """What a rank record carries instead of a large outcome.

    Attributes:
        group_key, replay_key: the slot the payload was written for (ids only).
        name: the store's name for this one write; fresh on every :meth:`PayloadStore.put`,
            so a late duplicate write never replaces the bytes another reference names.
        size: the stored byte count.
        digest: ``sha256`` hex of the stored bytes (of the envelope when sealed, so it
            says nothing about the plaintext).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    group_key: str = Field(min_length=1)
    replay_key: str = Field(min_length=1)
    name: str = Field(min_length=1, pattern=r"^[0-9a-f]{32}$")
    size: int = Field(ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")


def _missing(ref: PayloadRef, why: str) -> PayloadMissing:
    return PayloadMissing(
        f"payload {ref.name} of child {ref.replay_key!r} in group {ref.group_key!r} {why}",
        group_key=ref.group_key,
        replay_key=ref.replay_key,
    )


def _make_ref(group_key: str, replay_key: str, data: bytes) -> PayloadRef:
    return PayloadRef(
        group_key=group_key,
        replay_key=replay_key,
        name=secrets.token_hex(16),
        size=len(data),
        digest=hashlib.sha256(data).hexdigest(),
    )


def _check(ref: PayloadRef, data: bytes) -> bytes:
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
        raise _missing(ref, "is not the bytes its reference names")
    return data


class PayloadStore(ABC):
    """Bytes by reference, grouped by group key.

    Implementations never return ``None`` for a reference they cannot serve: they raise
    :class:`PayloadMissing`.
    """

    @abstractmethod
    async def put(self, group_key: str, replay_key: str, data: bytes) -> PayloadRef:
        """Store ``data`` for slot (``group_key``, ``replay_key``) under a fresh name and
        return its reference. The write is complete (durable for a durable store) when
        this returns."""

    @abstractmethod
    async def get(self, ref: PayloadRef) -> bytes:
        """The bytes ``ref`` names.

        Raises:
            PayloadMissing: nothing is stored under ``ref`` (never written, deleted with
                its group's retirement, or lost), or the stored bytes do not match the
                reference's size and digest. Names the group key and replay key.
        """

    @abstractmethod
    async def delete_group(self, group_key: str) -> None:
        """Delete every payload written for ``group_key`` (the group retired). Idempotent."""


class MemoryPayloadStore(PayloadStore):
    """A store for the life of the process (tests, the memory tier)."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, bytes]] = {}

    async def put(self, group_key: str, replay_key: str, data: bytes) -> PayloadRef:
        ref = _make_ref(group_key, replay_key, bytes(data))
        self._groups.setdefault(group_key, {})[ref.name] = bytes(data)
        return ref

    async def get(self, ref: PayloadRef) -> bytes:
        """Raises:
        PayloadMissing: no payload under ``ref``, or not the bytes it names.
        """
        data = self._groups.get(ref.group_key, {}).get(ref.name)
        if data is None:
            raise _missing(ref, "is not in the payload store")
        return _check(ref, data)

    async def delete_group(self, group_key: str) -> None:
        self._groups.pop(group_key, None)

    def group_keys(self) -> list[str]:
        """The group keys with stored payloads (for tests and inspection)."""
        return sorted(self._groups)


def group_directory_name(group_key: str) -> str:
    """The directory name a group key maps to: a hash, so any key is a safe name."""
    return hashlib.sha256(group_key.encode("utf-8")).hexdigest()


class FilesystemPayloadStore(PayloadStore):
    """One directory per group key (hashed to a safe name), one file per payload.

    Writes are atomic: a temporary file in the same directory, flushed and synced, then
    renamed into place, so a reader sees the whole payload or none. Blocking file work
    runs in a thread.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _group_dir(self, group_key: str) -> Path:
        return self.directory / group_directory_name(group_key)

    async def put(self, group_key: str, replay_key: str, data: bytes) -> PayloadRef:
        ref = _make_ref(group_key, replay_key, bytes(data))
        await asyncio.to_thread(self._write, self._group_dir(group_key), ref.name, bytes(data))
        return ref

    @staticmethod
    def _write(folder: Path, name: str, data: bytes) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".put-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, folder / f"{name}.payload")
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        _sync_directory(folder)

    async def get(self, ref: PayloadRef) -> bytes:
        """Raises:
        PayloadMissing: no file under ``ref``, or not the bytes it names.
        """
        path = self._group_dir(ref.group_key) / f"{ref.name}.payload"
        data = await asyncio.to_thread(_read_or_none, path)
        if data is None:
            raise _missing(ref, "is not in the payload store")
        return _check(ref, data)

    async def delete_group(self, group_key: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._group_dir(group_key), True)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _sync_directory(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory descriptors
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
