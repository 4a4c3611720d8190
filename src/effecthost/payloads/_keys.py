"""Key stores for sealing: 256-bit keys per scope, rotation and destruction (G-48, G-50).

A scope is the unit of erasure (by default the scope id of a group key, the part before
``:group:``). New seals use a scope's newest key; older keys stay for opening what they
sealed until the scope is destroyed. Destroying a scope deletes its keys and keeps a
tombstone of their ids, so the store can tell "this key was destroyed here"
(:class:`~effecthost.contract.PayloadShredded`) apart from "this key was never here"
(:class:`~effecthost.contract.SealedPayloadUnreadable`).

The methods are synchronous: keys are small and a store serves them from memory or a local
file. Key material never appears in an error message or in ``repr``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

KEY_BYTES = 32
"""AES-256 keys."""


def new_key_id() -> str:
    """A fresh random key id (hex, 16 characters)."""
    return secrets.token_hex(8)


class KeyStore(ABC):
    """Keys per scope. Implementations must be safe to share between a sealer and the
    hosts of one process."""

    @abstractmethod
    def current(self, scope: str) -> tuple[str, bytes]:
        """The newest key of ``scope`` as ``(key_id, material)``, created if the scope has
        none (also after a :meth:`destroy`: new data gets a new key)."""

    @abstractmethod
    def lookup(self, scope: str, key_id: str) -> bytes | None:
        """The material of key ``key_id`` of ``scope``, or ``None`` if this store does not
        hold it."""

    @abstractmethod
    def destroyed(self, scope: str, key_id: str) -> bool:
        """True only if this store held key ``key_id`` of ``scope`` and destroyed it."""

    @abstractmethod
    def rotate(self, scope: str) -> str:
        """Add a new newest key to ``scope`` and return its id; older keys still open."""

    @abstractmethod
    def destroy(self, scope: str) -> int:
        """Destroy every key of ``scope`` (crypto-erasure) and return how many were
        destroyed; their ids are kept in a tombstone."""


@dataclass
class _Scope:
    keys: list[tuple[str, bytes]] = field(default_factory=list)  # oldest first
    tombstone: set[str] = field(default_factory=set)


class InMemoryKeyStore(KeyStore):
    """Keys for the life of the process."""

    def __init__(self) -> None:
        self._scopes: dict[str, _Scope] = {}

    def __repr__(self) -> str:
        return f"InMemoryKeyStore(scopes={len(self._scopes)})"

    def _scope(self, scope: str) -> _Scope:
        return self._scopes.setdefault(scope, _Scope())

    def current(self, scope: str) -> tuple[str, bytes]:
        record = self._scope(scope)
        if not record.keys:
            self.rotate(scope)
        return record.keys[-1]

    def lookup(self, scope: str, key_id: str) -> bytes | None:
        record = self._scopes.get(scope)
        if record is None:
            return None
        return next((material for kid, material in record.keys if kid == key_id), None)

    def destroyed(self, scope: str, key_id: str) -> bool:
        record = self._scopes.get(scope)
        return record is not None and key_id in record.tombstone

    def rotate(self, scope: str) -> str:
        key_id = new_key_id()
        self._scope(scope).keys.append((key_id, secrets.token_bytes(KEY_BYTES)))
        return key_id

    def destroy(self, scope: str) -> int:
        record = self._scopes.get(scope)
        if record is None:
            return 0
        count = len(record.keys)
        record.tombstone.update(kid for kid, _ in record.keys)
        record.keys.clear()
        return count

    def add(self, scope: str, key_id: str, material: bytes) -> None:
        """Import a key as the newest of ``scope`` (migration, tests).

        Raises:
            ValueError: ``material`` is not 32 bytes, or ``key_id`` is already in use or
                was destroyed in ``scope``.
        """
        if len(material) != KEY_BYTES:
            raise ValueError(f"a key must be {KEY_BYTES} bytes")
        record = self._scope(scope)
        if key_id in record.tombstone or any(kid == key_id for kid, _ in record.keys):
            raise ValueError(f"key id {key_id!r} is already used in scope {scope!r}")
        record.keys.append((key_id, bytes(material)))


class FileKeyStore(KeyStore):
    """Keys in files: one directory per scope (hashed to a safe name), one file per key.

    Every call reads the directory, so several instances (and processes) on one directory
    see each other's rotations and destructions. Key files are created exclusively with
    mode ``0600``; key creation and destruction of a scope are serialised by an advisory
    lock. Destruction records the key ids in a tombstone first, then overwrites each key
    file with zeros, syncs and unlinks it. Whether overwritten blocks are really gone
    depends on the medium, backups and snapshots: see ``docs/security.md``.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def __repr__(self) -> str:
        return "FileKeyStore(...)"

    def _dir(self, scope: str) -> Path:
        return self.directory / hashlib.sha256(scope.encode("utf-8")).hexdigest()

    @contextlib.contextmanager
    def _locked(self, scope: str) -> Iterator[Path]:
        import fcntl

        folder = self._dir(scope)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield folder
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @staticmethod
    def _key_files(folder: Path) -> list[Path]:
        if not folder.is_dir():
            return []
        return sorted(folder.glob("*.key"))  # names start with a zero-padded creation time

    @staticmethod
    def _key_id(path: Path) -> str:
        return path.stem.split("-", 1)[1]

    def _read_tombstone(self, folder: Path) -> set[str]:
        try:
            data = json.loads((folder / "tombstone.json").read_text("utf-8"))
        except FileNotFoundError:
            return set()
        return set(data.get("destroyed", []))

    def current(self, scope: str) -> tuple[str, bytes]:
        files = self._key_files(self._dir(scope))
        if not files:
            with self._locked(scope) as folder:
                files = self._key_files(folder)
                if not files:
                    self._create(folder)
                    files = self._key_files(folder)
        newest = files[-1]
        return self._key_id(newest), newest.read_bytes()

    def lookup(self, scope: str, key_id: str) -> bytes | None:
        for path in self._key_files(self._dir(scope)):
            if self._key_id(path) == key_id:
                try:
                    return path.read_bytes()
                except FileNotFoundError:
                    return None
        return None

    def destroyed(self, scope: str, key_id: str) -> bool:
        folder = self._dir(scope)
        return folder.is_dir() and key_id in self._read_tombstone(folder)

    def rotate(self, scope: str) -> str:
        with self._locked(scope) as folder:
            return self._create(folder)

    def _create(self, folder: Path) -> str:
        key_id = new_key_id()
        newest = self._key_files(folder)
        stamp = time.time_ns()
        if newest:  # keep creation order even if the clock stepped back
            stamp = max(stamp, int(newest[-1].stem.split("-", 1)[0]) + 1)
        path = folder / f"{stamp:020d}-{key_id}.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        return key_id

    def destroy(self, scope: str) -> int:
        with self._locked(scope) as folder:
            files = self._key_files(folder)
            if not files:
                return 0
            tombstone = self._read_tombstone(folder) | {self._key_id(p) for p in files}
            fd, temp = tempfile.mkstemp(dir=folder, prefix=".tombstone-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"destroyed": sorted(tombstone)}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, folder / "tombstone.json")
            for path in files:
                with path.open("r+b") as handle:
                    handle.write(b"\0" * KEY_BYTES)
                    handle.flush()
                    os.fsync(handle.fileno())
                path.unlink()
            return len(files)
