"""Reading snapshots back: tags, resolution of ``name@ref`` to a digest, manifests, listings.

A tag is the only mutable object of a dataset. It is created with ``If-None-Match: *`` and moved with
``If-Match: <etag of the tag we read>``, so two people moving one tag at once cannot lose a move silently: the
second write is refused and says so. Jobs never carry a tag: ``resolve`` turns it into a digest at submit.

``--force`` semantics: without it, tagging refuses to touch an existing tag that points elsewhere (tags such as
``v1`` are promises; moving one is a decision). With it, the tag moves from whatever it pointed to, still by a
conditional write on the ETag just read. Pointing a tag at the digest it already holds is a no-op either way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from nuro.datasets.errors import DatasetNotFound, IntegrityError, InvalidInput, TagConflict
from nuro.datasets.manifest import (
    PREFIX,
    TEAM_PREFIX,
    Manifest,
    Ref,
    manifest_key,
    manifests_prefix,
    parse_manifest,
    parse_ref,
    sha256_digest,
    tag_key,
    tags_prefix,
    validate_digest,
    validate_name,
)
from nuro.objectstore import (
    DATASET_MANIFEST_MAX_BYTES,
    TAG_MAX_BYTES,
    AccessDenied,
    NotFound,
    ObjectExists,
    ObjectStore,
    ObjectTooLarge,
    PreconditionFailed,
)


@dataclass(frozen=True)
class TagState:
    name: str
    tag: str
    digest: str
    etag: str
    updated: str = ""
    previous: str | None = None


def _tag_body(name: str, tag: str, digest: str, previous: str | None, now: datetime | None) -> bytes:
    body = {
        "name": name,
        "tag": tag,
        "digest": digest,
        "previous": previous,
        "updated": (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def get_tag(store: ObjectStore, name: str, tag: str) -> TagState | None:
    """The tag's current target and ETag, or None if the tag does not exist."""
    try:
        data, etag = store.get(tag_key(name, tag), max_bytes=TAG_MAX_BYTES)
    except NotFound:
        return None
    except ObjectTooLarge as exc:  # a team writes its own tags: one this big is no tag of ours
        raise IntegrityError(f"tag {name}@{tag}: {exc}") from None
    try:
        body = json.loads(data)
        digest = validate_digest(body["digest"])
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"tag {name}@{tag} at {store.url(tag_key(name, tag))} is malformed: {exc}") from exc
    return TagState(name, tag, digest, etag, str(body.get("updated", "")), body.get("previous"))


def check_tag_free(store: ObjectStore, name: str, tag: str) -> None:
    """Refuse early (before a long upload) when ``tag`` exists and moving it would need ``force``."""
    state = get_tag(store, name, tag)
    if state is not None:
        raise TagConflict(
            f"tag {name}@{tag} already points to {state.digest}; pass --force to move it to the new snapshot, "
            "or choose another tag"
        )


def set_tag(
    store: ObjectStore, name: str, tag: str, digest: str, *, force: bool = False, now: datetime | None = None
) -> TagState:
    """Point ``name@tag`` at ``digest`` (whose manifest must exist). See the module docstring for ``force``."""
    validate_digest(digest)
    if not store.exists(manifest_key(name, digest)):
        raise DatasetNotFound(
            f"{name}@{digest}: no such snapshot (no manifest at {store.url(manifest_key(name, digest))})"
        )
    key = tag_key(name, tag)
    current = get_tag(store, name, tag)
    if current is not None and current.digest == digest:
        return current
    if current is not None and not force:
        raise TagConflict(f"tag {name}@{tag} points to {current.digest}; pass --force to move it to {digest}")
    body = _tag_body(name, tag, digest, current.digest if current else None, now)
    try:
        if current is None:
            store.put(key, body, if_none_match=True)
        else:
            store.put_if_match(key, body, current.etag)
    except (ObjectExists, PreconditionFailed) as exc:
        after = get_tag(store, name, tag)
        if after is not None and after.digest == digest:  # our write landed; a retry of it got the 412
            return after
        raise TagConflict(
            f"tag {name}@{tag} was changed by someone else while we moved it (now: "
            f"{after.digest if after else 'deleted'}); nothing was overwritten. Check and re-run."
        ) from exc
    state = get_tag(store, name, tag)
    if state is None:
        raise TagConflict(f"tag {name}@{tag} vanished right after it was written; re-run")
    return state


def resolve(store: ObjectStore, ref: str | Ref) -> str:
    """``name@tag`` or ``name@sha256:<hex>`` → the digest of an existing snapshot (what a job records)."""
    r = parse_ref(ref) if isinstance(ref, str) else ref
    if r.digest is not None:
        if not store.exists(manifest_key(r.name, r.digest)):
            raise DatasetNotFound(f"{r}: no such snapshot (no manifest at {store.url(manifest_key(r.name, r.digest))})")
        return r.digest
    state = get_tag(store, r.name, r.tag or "")
    if state is None:
        tags = list_tags(store, r.name)
        known = f"; its tags: {', '.join(sorted(tags))}" if tags else ""
        raise DatasetNotFound(f"{r}: dataset {r.name} has no tag {r.tag!r}{known}")
    if not store.exists(manifest_key(r.name, state.digest)):
        raise IntegrityError(f"{r} points to {state.digest}, whose manifest is missing from the store")
    return state.digest


def load_manifest(store: ObjectStore, name: str, digest: str) -> tuple[Manifest, bytes]:
    """Fetch a manifest and check that its bytes hash to ``digest`` (a tampered manifest is refused).

    Read capped (``DATASET_MANIFEST_MAX_BYTES``): a team's own prefix holds its manifests, and the root prolog
    verifies them; one over the cap is refused unread (IntegrityError), never held in memory."""
    key = manifest_key(name, digest)
    try:
        data, _etag = store.get(key, max_bytes=DATASET_MANIFEST_MAX_BYTES)
    except NotFound as exc:
        raise DatasetNotFound(f"{name}@{digest}: no such snapshot (no manifest at {store.url(key)})") from exc
    except ObjectTooLarge as exc:
        raise IntegrityError(f"manifest of {name}@{digest}: {exc}") from None
    actual = sha256_digest(data)
    if actual != digest:
        raise IntegrityError(f"manifest {store.url(key)} hashes to {actual}, not {digest}: it was altered")
    return parse_manifest(data, expect_name=name), data


def list_datasets(store: ObjectStore, teams: Iterable[str] | None = None) -> list[str]:
    """Shared datasets and those of ``teams`` (None: every team whose prefix these credentials may list).

    A team's credentials may list only their own team's prefix (docs/security.md), so with ``teams=None`` the
    team prefixes that answer "access denied" are skipped rather than fatal; listing ``teams`` names explicitly
    raises instead, so a missing grant is not silently an empty list.
    """
    names = [p[len(PREFIX) :].rstrip("/") for p in store.list_prefixes(PREFIX)]
    out = {n for n in names if n != "shards"}
    if teams is None:
        try:
            found = [p[len(TEAM_PREFIX) :].rstrip("/") for p in store.list_prefixes(TEAM_PREFIX)]
        except AccessDenied:
            found = []
        teams = found
        skip_denied = True
    else:
        skip_denied = False
    for team in teams:
        prefix = f"{TEAM_PREFIX}{team}/"
        try:
            out.update(p[len(prefix) :].rstrip("/") for p in store.list_prefixes(prefix))
        except AccessDenied:
            if not skip_denied:
                raise
    out.discard("shards")
    return sorted(out)


def list_snapshots(store: ObjectStore, name: str) -> list[tuple[str, datetime | None]]:
    """(digest, stored at) of every snapshot of ``name``, oldest first."""
    prefix = manifests_prefix(name)
    out = []
    for obj in store.list(prefix):
        stem = obj.key[len(prefix) :].removesuffix(".json")
        if stem.startswith("sha256:") and len(stem) == 71:
            out.append((stem, obj.last_modified))
    return sorted(out, key=lambda item: (item[1] is None, item[1] or datetime.min.replace(tzinfo=UTC), item[0]))


def list_tags(store: ObjectStore, name: str) -> dict[str, str]:
    """tag → digest for every tag of ``name``."""
    validate_name(name)
    prefix = tags_prefix(name)
    tags = {}
    for obj in store.list(prefix):
        tag = obj.key[len(prefix) :]
        try:
            state = get_tag(store, name, tag)
        except InvalidInput:  # a key nuro did not write (bad tag name): not a tag
            continue
        if state is not None:
            tags[tag] = state.digest
    return tags
