"""The engine the file host runs on: a directory of JSON files and ``flock`` locks.

A stand-in for an engine's client library (it knows nothing of effecthost): one file per
key, replaced atomically; one lock serialising every read-modify-write; and a lock per
incarnation that the kernel releases when its process dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

Record = dict[str, Any]


# [store]
class FileStore:
    """The engine: one JSON file per group key, one lock for every read-modify-write."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / "groups").mkdir(parents=True, exist_ok=True)
        (self.root / "owners").mkdir(exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _path(self, key: str) -> Path:
        return self.root / "groups" / hashlib.sha256(key.encode()).hexdigest()

    def read(self, key: str) -> Record | None:
        with contextlib.suppress(FileNotFoundError):
            return json.loads(self._path(key).read_bytes())  # type: ignore[no-any-return]
        return None

    def write(self, record: Record) -> None:
        temp = self._path(record["key"]).with_suffix(".tmp")
        with open(temp, "w") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, self._path(record["key"]))

    def records(self) -> list[Record]:
        paths = (self.root / "groups").glob("[0-9a-f]*[0-9a-f]")  # not the .tmp files
        return [json.loads(path.read_bytes()) for path in paths]

    def claim_owner(self, owner: str) -> IO[str]:
        """Hold ``owners/OWNER`` locked for the life of this process (R-1)."""
        handle = open(self.root / "owners" / owner, "a")
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return handle

    def owner_alive(self, owner: str) -> bool:
        with open(self.root / "owners" / owner, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False


# [/store]
