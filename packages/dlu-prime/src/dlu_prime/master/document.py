"""The state document as the writer sends it: the bytes of `JobState.dumps`, built from each
actor's JSON kept between writes, so a save re-encodes only the actors that changed.

At 16,384 actors the document is ~3.5 MB, nearly all of it the actors, and a recovery writes it
about five times in one pass (each decision is saved before what it starts acts): encoding
every actor each time was most of that pass. An actor's JSON is reused while its record is the
same object at the same version (`ActorRecord` counts its assignments), so a record replaced,
copied or assigned to is encoded again; everything else in the document is encoded whole at
each write (a few KB).
"""

from __future__ import annotations

from pydantic import TypeAdapter

from dlu_prime.master.state import VERSION, ActorRecord, JobState

_KEY = TypeAdapter(str)
_RECORD = ActorRecord.__pydantic_serializer__
_STATE = JobState.__pydantic_serializer__
_FIELDS = list(JobState.model_fields)
_BEFORE = set(_FIELDS[: _FIELDS.index("actors")])
_AFTER = set(_FIELDS[_FIELDS.index("actors") + 1 :])


def _key(name: str) -> bytes:
    """`"name":` as pydantic writes it: a plain name as it stands (nothing in it to escape),
    any other through pydantic itself."""
    if name.isascii() and name.isprintable() and '"' not in name and "\\" not in name:
        return b'"' + name.encode() + b'":'
    return _KEY.dump_json(name) + b":"


class DocumentEncoder:
    def __init__(self) -> None:
        self._actors: dict[str, tuple[ActorRecord, int, bytes]] = {}  # name -> record, version, JSON

    def encode(self, state: JobState) -> bytes:
        """The document of `state`, byte for byte `state.dumps()` (a test holds them equal)."""
        kept = self._actors
        known = kept.get
        parts: list[bytes] = []
        add = parts.append
        for name, record in state.actors.items():  # 16,384 times a write: locals, no calls
            hit = known(name)
            version = record.__dict__.get(VERSION, 0)
            if hit is None or hit[0] is not record or hit[1] != version:
                hit = kept[name] = (record, version, _key(name) + _RECORD.to_json(record))
            add(hit[2])
        if len(kept) > len(parts):  # actors removed since: their JSON is not kept
            self._actors = {name: kept[name] for name in state.actors}
        head = _STATE.to_json(state, include=_BEFORE)[1:-1]
        tail = _STATE.to_json(state, include=_AFTER)[1:-1]
        actors = b",".join(parts)
        return b"".join(
            (
                b"{",
                head,
                b"," if head else b"",
                b'"actors":{',
                actors,
                b"}",
                b"," if tail else b"",
                tail,
                b"}",
            )
        )
