"""The state document as the writer sends it: the bytes of `JobState.dumps`, built from each
actor's JSON kept between writes, so a save re-encodes only the actors that changed.

At 16,384 actors the document is ~3.5 MB, nearly all of it the actors, and a recovery writes it
about five times in one pass (each decision is saved before what it starts acts): encoding
every actor each time was most of that pass. Each record keeps its own JSON (`ENCODED`), which
any assignment to it drops; everything else in the document is encoded whole at each write (a
few KB).
"""

from __future__ import annotations

from pydantic import TypeAdapter

from dlu_prime.master.state import ENCODED, ActorRecord, JobState

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
    """Encodes a state document (a class, so a writer could keep more between writes)."""

    def encode(self, state: JobState) -> bytes:
        """The document of `state`, byte for byte `state.dumps()` (a test holds them equal)."""
        parts: list[bytes] = []
        add = parts.append
        for name, record in state.actors.items():  # 16,384 times a write: locals, no calls
            kept = record.__dict__.get(ENCODED)
            if kept is None or (kept[0] is not name and kept[0] != name):
                kept = (name, _key(name) + _RECORD.to_json(record))
                vars(record)[ENCODED] = kept
            add(kept[1])
        head = _STATE.to_json(state, include=_BEFORE)[1:-1]
        tail = _STATE.to_json(state, include=_AFTER)[1:-1]
        opening = b"{" + head + (b"," if head else b"") + b'"actors":{'
        closing = b"}" + (b"," if tail else b"") + tail + b"}"
        if not parts:
            return opening + closing
        # One join makes the document: a copy of megabytes more costs the page faults of a
        # fresh buffer too (at 10,000 actors that made a write grow faster than the actors).
        parts[0] = opening + parts[0]
        parts[-1] += closing
        return b",".join(parts)
