"""Resolve what a spec refers to into immutable pins, at submit: dataset tag → digest, and the code patch's storage.

A job records only digests (docs/datasets.md: tags resolve to a digest at submit). Resolving a tag
needs the snapshot store (``nuro.datasets`` over ``nuro.objectstore``, configured by ``NURO_S3_ENDPOINT``). Without a
store, only ``name@sha256:<64 hex>`` is accepted: it is already immutable, and nothing else could say which snapshot
a tag means *now*. With a store, a digest reference is also checked to exist, so a typo fails at the keyboard.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nuro.jobspec.codepin import CodePin
from nuro.jobspec.fields import is_digest_ref
from nuro.names import validate_team
from nuro.protocol.envnames import NURO_S3_ENDPOINT

log = logging.getLogger(__name__)

#: S3 key prefix of shipped uncommitted-changes patches, content-addressed (``<prefix><hex>.patch``).
DIFF_PREFIX = "code-diffs/"  # + <team>/sha256/<hex>.patch: each team writes (and may delete) only its own


class PinError(ValueError):
    """A reference cannot be pinned; the message says why and what to give instead."""


@dataclass(frozen=True)
class DatasetPin:
    """A dataset snapshot by digest: ``name`` for people, ``digest`` (``sha256:<hex>``) is what the job reads."""

    name: str
    digest: str


def store_configured(env: Mapping[str, str] | None = None) -> bool:
    """True when a snapshot/artifact store is configured for this process (``NURO_S3_ENDPOINT``)."""
    return bool((env if env is not None else os.environ).get(NURO_S3_ENDPOINT))


_STORES: dict[Any, Any] = {}


def _open_store(env: Mapping[str, str] | None) -> Any:
    """One ObjectStore per configuration and process: creating a boto3 client costs ~50 ms, a HEAD request ~2 ms,
    and a burst of submits (or the controller) must not pay the former each time."""
    from nuro.objectstore import ObjectStore, StoreConfig  # lazy: boto3 costs ~0.5 s; only a configured store needs it

    config = StoreConfig.from_env(env)
    if config not in _STORES:
        _STORES[config] = ObjectStore(config)
    return _STORES[config]


def resolve_dataset(ref: str, env: Mapping[str, str] | None = None, store: Any = None) -> DatasetPin:
    """``name@tag`` or ``name@sha256:<hex>`` (already checked by the spec) → a DatasetPin.

    Args:
        ref: the checked reference.
        env: where to read ``NURO_S3_*`` (default ``os.environ``).
        store: an ``nuro.objectstore.ObjectStore`` to use instead of opening one (tests).

    Raises:
        PinError: a tag without a configured store, an unknown tag or snapshot, or an unreachable store.
    """
    name, _, rest = ref.partition("@")
    if store is None and not store_configured(env):
        if is_digest_ref(ref):
            return DatasetPin(name=name, digest=rest)
        raise PinError(
            f"dataset {ref} names a tag, and tags resolve to a digest only through the snapshot store, which is not "
            "configured here (NURO_S3_ENDPOINT is unset). Give the snapshot digest instead: "
            f"{name}@sha256:<64 hex> (`nuro-train dataset show {name}` lists them)"
        )
    try:
        # lazy: the dataset package pulls in boto3 (~0.5 s); a digest reference needs none of it
        from nuro.datasets.errors import DatasetError
        from nuro.datasets.refs import resolve
        from nuro.objectstore import ObjectStoreError
    except ImportError as exc:  # the dataset package is optional at import time
        if is_digest_ref(ref):
            log.warning("dataset %s not checked against the store: %s", ref, exc)
            return DatasetPin(name=name, digest=rest)
        raise PinError(f"dataset {ref} names a tag, but nuro.datasets cannot be imported ({exc})") from exc
    try:
        digest = resolve(store if store is not None else _open_store(env), ref)
    except (DatasetError, ObjectStoreError) as exc:
        raise PinError(f"dataset {ref}: {exc}") from exc
    if not is_digest_ref(f"{name}@{digest}"):
        raise PinError(f"dataset {ref} resolved to {digest!r}, which is not a sha256 digest")
    if digest != rest:
        log.info("dataset tag resolved ref=%s digest=%s", ref, digest)
    return DatasetPin(name=name, digest=digest)


def diff_key(code: CodePin, team: str) -> str:
    """The content-addressed key of the code patch under its team's prefix (``code.diff_sha256`` must be set).

    Per team because S3 write means delete: in one shared prefix any team could delete the patch another team's
    run records as its lineage (docs/security.md)."""
    if not code.diff_sha256:
        raise ValueError("this CodePin carries no patch")
    return f"{DIFF_PREFIX}{validate_team(team)}/sha256/{code.diff_sha256.removeprefix('sha256:')}.patch"


def with_planned_diff_uri(code: CodePin, team: str, env: Mapping[str, str] | None = None) -> CodePin:
    """The pin with the URI its patch will be stored at when a store is configured (known before storing: the key
    is content-addressed), so the plan renders the final run record and apply only stores. Touches no network."""
    if code.diff is None or not store_configured(env):
        return code
    from nuro.objectstore import StoreConfig  # lazy: boto3 (~0.5 s), only with a configured store

    return code.with_diff_uri(f"s3://{StoreConfig.from_env(env).bucket}/{diff_key(code, team)}")


def store_diff(code: CodePin, team: str, env: Mapping[str, str] | None = None, store: Any = None) -> CodePin:
    """Store the code patch as an artifact (once: content-addressed, never overwritten); returns the pin with its URI.

    A no-op for a clean pin. The patch also travels inside the job script, so the job never depends on the store;
    the stored copy is the run's lineage record. A patch already stored (same digest) counts as stored.

    Raises:
        PinError: the store refused or is unreachable.
    """
    if code.diff is None:
        return code
    from nuro.objectstore import ObjectStoreError  # lazy: boto3 (~0.5 s), only with a patch to store

    s = store if store is not None else _open_store(env)
    key = diff_key(code, team)
    try:
        s.put_if_absent(key, code.diff)
    except ObjectStoreError as exc:
        raise PinError(f"cannot store the code patch {code.diff_sha256}: {exc}") from exc
    return code.with_diff_uri(s.url(key))


__all__ = [
    "DIFF_PREFIX",
    "DatasetPin",
    "PinError",
    "diff_key",
    "resolve_dataset",
    "store_configured",
    "store_diff",
    "with_planned_diff_uri",
]
