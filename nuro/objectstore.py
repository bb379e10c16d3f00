"""The one S3 adapter: every object nuro stores or reads (dataset snapshots, checkpoints) goes through here.

Why one adapter: the rules that make S3 the system of record for snapshots and checkpoints live in one place —
explicit timeouts (a hung endpoint must not hang a prolog), bounded retries, conditional writes (``If-None-Match: *``
to never overwrite, ``If-Match: <etag>`` to move a ref only from the state we read), multipart for big objects with
the condition on the *complete* call, and errors typed by what the caller can do about them, carrying S3's own
message.

Configuration (``StoreConfig.from_env``): ``NURO_S3_ENDPOINT`` (unset = AWS's default endpoint), ``NURO_S3_BUCKET``
(default ``nuro``), ``NURO_S3_REGION`` (default ``us-east-1``), credentials from, in this order:
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``; else ``NURO_S3_CREDENTIALS``, a team's credentials file or a
directory of them (``<team>.env``, each readable only by that team's Unix group; from a directory the file of
``NURO_TEAM`` is used, or without it the one file this user can read); else boto3's usual chain. Each team's key
reaches only its own prefixes (docs/security.md), so a member's shell and jobs carry no key but their team's.
``nuro-admin devcluster env`` exports the dev cluster's SeaweedFS endpoint, its admin key (for root) and the
directory of team files.

Retries and conditions: botocore retries 5xx, throttling and dropped connections (``mode=standard``). A conditional
write whose response was lost is retried and then answers 412 although it succeeded; callers of content-addressed
keys treat "already there" as success for that reason, and ref movers re-read the ref after a 412.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
)
from botocore.exceptions import (
    ConnectTimeoutError as BotoConnectTimeout,
)
from botocore.exceptions import (
    ReadTimeoutError as BotoReadTimeout,
)

from nuro import names
from nuro.protocol.envnames import NURO_S3_BUCKET, NURO_S3_CREDENTIALS, NURO_S3_ENDPOINT, NURO_S3_REGION, NURO_TEAM
from nuro.safeio import credfile

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * 1024
DEFAULT_BUCKET = "nuro"

# -- read caps ------------------------------------------------------------------------------------------------------
# The one list of how much of an object a team can write any reader takes in (``ObjectStore.get(key, max_bytes=)``).
# Root daemons (the prolog, the node agent, the MLflow bridge, the controller) read manifests and records from each
# team's own prefix, which that team writes at will: without a cap one multi-GiB ``manifest.json`` would cost the
# daemon GiBs of memory (and every job it serves). Each cap is a few times what a real record needs, so no genuine
# record comes near it; an object over its cap is refused (``ObjectTooLarge``) as that object's fault.
#: A checkpoint manifest: ~150 bytes per file (path, size, 64-hex sha256). A DCP checkpoint has one file per rank plus
#: ``.metadata``, a DeepSpeed one ~3 per rank: 16,384 ranks × 3 files ≈ 7 MiB; 32 MiB leaves room for ~200k files.
CHECKPOINT_MANIFEST_MAX_BYTES = 32 * MiB
#: One node's part record of a step (its own files: a few per GPU, ~150 bytes each): 4 MiB is ~25k files.
CHECKPOINT_PART_MAX_BYTES = 4 * MiB
#: ``incomplete.json`` (a reason of at most 2,000 characters, the missing part numbers: ≤ 100,000 × ~7 bytes).
CHECKPOINT_INCOMPLETE_MAX_BYTES = 1 * MiB
#: A checkpoint or dataset tag (a few short fields).
TAG_MAX_BYTES = 64 * KiB
#: A dataset manifest: ~250 bytes per file (path, shard, offset, length, sha256, mode). ImageNet-1k's 1.28M files are
#: ~320 MiB; 512 MiB is ~2M files. ``nuro-dataset snapshot`` refuses to write a bigger one (pack many small files
#: into archives first: docs/datasets.md), so only a forged manifest is ever refused here.
DATASET_MANIFEST_MAX_BYTES = 512 * MiB
#: One run event (``nuro.lifecycle.run_events``: a few fields; a ``checkpoint_skipped`` lists steps and reasons).
RUN_EVENT_MAX_BYTES = 1 * MiB
#: How much of a capped object is read per socket read (the body never sits in memory past the cap + one chunk).
_CAPPED_CHUNK_BYTES = 1 * MiB
Progress = Callable[[int], None]
"""Called with a number of bytes each time a part or a whole object has been stored."""


class ObjectStoreError(RuntimeError):
    """An S3 call failed. ``code``/``status`` are S3's; the message says which call, which key, and S3's words."""

    def __init__(self, message: str, *, key: str | None = None, code: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.key = key
        self.code = code
        self.status = status


class PreconditionFailed(ObjectStoreError):
    """A conditional write was refused (412): the object is not in the state the caller based its write on."""


class ObjectExists(PreconditionFailed):
    """``If-None-Match: *`` was refused: the key already holds an object, which was left untouched."""


class NotFound(ObjectStoreError):
    """The key (or the bucket) does not exist."""


class AccessDenied(ObjectStoreError):
    """Credentials missing, unknown or not allowed (403)."""


class StoreUnavailable(ObjectStoreError):
    """The endpoint did not answer, timed out, or kept failing with 5xx after the retries."""


class ObjectTooLarge(ObjectStoreError):
    """A capped read (``get(key, max_bytes=...)``) met an object larger than the cap: nothing past the cap was read.

    Why a type of its own: the objects root daemons read are written by teams, and a reader must refuse an oversized
    one as that object's fault (skip it, refuse that job) and go on with everyone else's, never take it as the
    store being down."""

    def __init__(self, message: str, *, key: str, max_bytes: int, size: int | None = None) -> None:
        super().__init__(message, key=key, code="ObjectTooLarge")
        self.max_bytes = max_bytes
        self.size = size


_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidToken"}
_MISSING = {"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchUpload"}
_UNAVAILABLE_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout"}
_NETWORK_ERRORS = (EndpointConnectionError, BotoConnectTimeout, BotoReadTimeout, ConnectionClosedError)


ENV_CREDENTIALS = NURO_S3_CREDENTIALS


class CredentialsError(AccessDenied):
    """``NURO_S3_CREDENTIALS`` names no file this user can use; the message says which file and why."""


def read_credentials_file(path: str | Path) -> tuple[str, str]:
    """(access key, secret key) from a team's credentials file (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``;
    ``nuro.safeio.credfile`` reads it)."""
    try:
        values = credfile.read_env_file(path, "S3 credentials")
    except credfile.CredentialFileError as exc:
        raise CredentialsError(str(exc)) from None
    access, secret = values.get("AWS_ACCESS_KEY_ID"), values.get("AWS_SECRET_ACCESS_KEY")
    if not access or not secret:
        raise CredentialsError(f"S3 credentials {path} lacks AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY")
    return access, secret


def pick_credentials_file(spec: str | Path, team: str | None = None) -> tuple[Path, str | None]:
    """The credentials file ``NURO_S3_CREDENTIALS`` means, and its team (``nuro.safeio.credfile.pick_team_file``)."""
    try:
        return credfile.pick_team_file(spec, team, "S3 credentials")
    except credfile.CredentialFileError as exc:
        raise CredentialsError(str(exc)) from None


@dataclass(frozen=True)
class StoreConfig:
    """Where and how to reach the store. Sizes in bytes, times in seconds.

    ``endpoint_url`` None means AWS itself; ``access_key``/``secret_key`` None means boto3's credential chain.
    ``team`` is the team whose credentials file was used (None: keys given directly or boto3's chain).
    """

    endpoint_url: str | None = None
    bucket: str = DEFAULT_BUCKET
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    max_attempts: int = 5
    multipart_threshold_bytes: int = 32 * MiB
    part_size_bytes: int = 16 * MiB
    #: ``NURO_S3_UPLOAD_CONCURRENCY``: parts of one multipart upload in flight at once.
    max_concurrency: int = 8
    team: str | None = None
    #: ``NURO_S3_MAX_UPLOAD_MIBPS``: this process's uploads average at most this many bytes per second (None: no
    #: bound). On a node the agent does the uploads, so it bounds the node: 500 nodes committing at once must not
    #: take the store's (or the fabric's) whole bandwidth from data loading and from each other.
    max_upload_bytes_per_s: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> StoreConfig:
        """Read ``NURO_S3_*`` and ``AWS_*`` from ``env`` (default ``os.environ``); keyword overrides win."""
        env = os.environ if env is None else env
        access, secret, team = env.get("AWS_ACCESS_KEY_ID") or None, env.get("AWS_SECRET_ACCESS_KEY") or None, None
        if access is None and env.get(ENV_CREDENTIALS):
            path, team = pick_credentials_file(env[ENV_CREDENTIALS], env.get(NURO_TEAM) or None)
            access, secret = read_credentials_file(path)
        cfg = cls(
            endpoint_url=env.get(NURO_S3_ENDPOINT) or None,
            bucket=env.get(NURO_S3_BUCKET) or DEFAULT_BUCKET,
            access_key=access,
            secret_key=secret,
            region=env.get(NURO_S3_REGION) or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            team=team,
            max_upload_bytes_per_s=_mib_per_s(env, "NURO_S3_MAX_UPLOAD_MIBPS"),
            max_concurrency=_positive_int(env, "NURO_S3_UPLOAD_CONCURRENCY", cls.max_concurrency),
        )
        return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not (names.is_decimal(raw) and 0 < int(raw) <= 64):
        raise ValueError(f"{name}={raw!r}: give a whole number from 1 to 64 (default {default})")
    return int(raw)


def _mib_per_s(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"{name}={raw!r}: give a positive number of MiB/s, or leave it unset for no bound")
    return value * MiB


class RateLimit:
    """Paces sends to ``bytes_per_s`` on average (virtual scheduling: each send of n bytes may start n/rate after
    the previous one; one part may go at once). Shared by every upload thread of the process (``rate_limit``)."""

    def __init__(
        self,
        bytes_per_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.bytes_per_s = bytes_per_s
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._next = 0.0

    def take(self, n: int) -> float:
        """Wait until ``n`` more bytes may go; returns the seconds waited."""
        with self._lock:
            now = self.clock()
            start = max(now, self._next)
            self._next = start + n / self.bytes_per_s
        delay = start - now
        if delay > 0:
            self.sleep(delay)
        return delay


_LIMITS: dict[float, RateLimit] = {}
_LIMITS_LOCK = threading.Lock()


def rate_limit(bytes_per_s: float | None) -> RateLimit | None:
    """The process's one limiter for this rate (every store object built with it shares it), or None."""
    if bytes_per_s is None:
        return None
    with _LIMITS_LOCK:
        return _LIMITS.setdefault(bytes_per_s, RateLimit(bytes_per_s))


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: datetime | None = None


_SESSION: Any = None
_SESSION_LOCK = threading.Lock()


def _reset_session_lock() -> None:
    global _SESSION_LOCK
    _SESSION_LOCK = threading.Lock()  # a fork (DataLoader worker) may happen while another thread holds it


os.register_at_fork(after_in_child=_reset_session_lock)


def _new_client(**kwargs: Any) -> Any:
    """An S3 client from this process's one boto3 session.

    Why shared: each new session parses botocore's service model again (~0.1 s of CPU per client here, more under
    load), and a training process makes several stores at start (data, checkpoints, run events) right on the resume
    path; from one session the next clients cost ~5 ms. Sessions are not thread-safe, hence the lock; clients are,
    and each store keeps its own (its own connection pool: forked workers never share a connection).
    """
    global _SESSION
    import boto3  # lazy: see ObjectStore.client

    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = boto3.session.Session()
        return _SESSION.client("s3", **kwargs)


class ObjectStore:
    """boto3 client for one bucket. Thread-safe (boto3 clients are); methods raise the typed errors above."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.bucket = config.bucket
        self.upload_limit = rate_limit(config.max_upload_bytes_per_s)
        self._client: Any = None
        self._client_lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The boto3 S3 client, built on first use.

        Why not in ``__init__``: boto3 costs ~0.7 s of CPU to import and a client ~0.1 s more, and many stores are
        never used: the epilog builds one for every job to flush its uploads, while most jobs have none (``make
        test``: the epilog took 0.44 s of CPU per job, half of it a client it never used; eight jobs ending on a
        2-core box wait on each other's). A store first used on a daemon thread at exit builds its client then:
        ``run_events.record_later`` waits for its events at exit for that reason.
        """
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._new_client()
        return self._client

    @client.setter
    def client(self, value: Any) -> None:  # a test's fake S3
        self._client = value

    def _new_client(self) -> Any:
        from botocore.config import Config  # lazy: boto3 and botocore are imported only by a store that is used

        config = self.config
        boto_cfg = Config(
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
            retries={"total_max_attempts": config.max_attempts, "mode": "standard"},  # first try included
            s3={"addressing_style": "path"},  # SeaweedFS and MinIO serve buckets as paths, not subdomains
            max_pool_connections=max(10, 2 * config.max_concurrency),
        )
        return _new_client(
            endpoint_url=config.endpoint_url,
            aws_access_key_id=config.access_key,
            aws_secret_access_key=config.secret_key,
            region_name=config.region,
            config=boto_cfg,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> ObjectStore:
        return cls(StoreConfig.from_env(env, **overrides))

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    # -- errors -----------------------------------------------------------------------------------------------
    def _error(self, exc: Exception, op: str, key: str | None, if_none_match: bool = False) -> ObjectStoreError:
        """Translate a botocore exception into the typed error the caller can act on, keeping S3's message."""
        where = f"{op} {self.url(key or '')}"
        endpoint = self.config.endpoint_url or "AWS S3"
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            msg = f"{where}: {code or status} (HTTP {status}): {err.get('Message') or 'no message'}"
            if status == 412 or code == "PreconditionFailed":
                cls = ObjectExists if if_none_match else PreconditionFailed
                return cls(msg, key=key, code=code, status=status)
            if status == 409 and code == "ConditionalRequestConflict":
                return PreconditionFailed(msg, key=key, code=code, status=status)
            if status == 404 or code in _MISSING:
                return NotFound(msg, key=key, code=code, status=status)
            if status == 403 or code in _DENIED:
                hint = " (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; dev cluster: nuro-admin devcluster env)"
                return AccessDenied(msg + hint, key=key, code=code, status=status)
            if status >= 500 or code in _UNAVAILABLE_CODES:
                return StoreUnavailable(msg, key=key, code=code, status=status)
            return ObjectStoreError(msg, key=key, code=code, status=status)
        if isinstance(exc, NoCredentialsError):
            return AccessDenied(f"{where}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", key=key)
        if isinstance(exc, _NETWORK_ERRORS):
            return StoreUnavailable(
                f"{where}: {endpoint} did not answer ({exc}); is the store up? "
                "(dev cluster: nuro-admin devcluster status)",
                key=key,
            )
        return ObjectStoreError(f"{where}: {exc}", key=key)

    def _call(self, op: str, key: str | None, fn: Callable[..., Any], if_none_match: bool = False, **kw: Any) -> Any:
        try:
            return fn(Bucket=self.bucket, **kw)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, op, key, if_none_match) from exc

    # -- writes -----------------------------------------------------------------------------------------------
    @staticmethod
    def _conditions(if_none_match: bool, if_match: str | None) -> dict[str, str]:
        if if_none_match and if_match:
            raise ValueError("use either if_none_match or if_match, not both")
        if if_none_match:
            return {"IfNoneMatch": "*"}
        return {"IfMatch": if_match} if if_match else {}

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Store ``data`` at ``key``; returns the new ETag. Multipart above ``multipart_threshold_bytes``.

        Raises ``ObjectExists`` (if_none_match and the key exists) or ``PreconditionFailed`` (if_match is stale).
        """
        cond = self._conditions(if_none_match, if_match)
        if len(data) > self.config.multipart_threshold_bytes:
            step = self.config.part_size_bytes
            view = memoryview(data)
            return self._multipart(key, (view[i : i + step] for i in range(0, len(data), step)), cond, progress)
        if self.upload_limit is not None:
            self.upload_limit.take(len(data))
        res = self._call("PUT", key, self.client.put_object, if_none_match, Key=key, Body=data, **cond)
        if progress:
            progress(len(data))
        return str(res["ETag"])

    def put_if_absent(self, key: str, data: bytes, progress: Progress | None = None) -> bool:
        """Create ``key`` only if nothing is there. False (nothing written) when it exists."""
        try:
            self.put(key, data, if_none_match=True, progress=progress)
        except ObjectExists:
            return False
        return True

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` only if it still has ``etag``; returns the new ETag, raises ``PreconditionFailed``."""
        return self.put(key, data, if_match=etag)

    def put_file(
        self,
        key: str,
        path: Path,
        *,
        if_none_match: bool = False,
        expected_sha256: str | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Stream a file into ``key`` (multipart when big) without holding it in memory; returns the ETag.

        With ``expected_sha256`` the bytes sent are hashed on the way and the upload is aborted, never completed,
        if they differ (the file changed since it was hashed): a content-addressed key never gets other content.
        """
        cond = self._conditions(if_none_match, None)
        digest = hashlib.sha256()
        step = self.config.part_size_bytes

        def parts(fh: BinaryIO) -> Iterator[bytes]:
            while chunk := fh.read(step):
                digest.update(chunk)
                yield chunk

        def check() -> None:
            if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
                raise ObjectStoreError(
                    f"PUT {self.url(key)}: {path} changed while it was uploaded (sha256 {digest.hexdigest()}, "
                    f"expected {expected_sha256}); nothing was stored. Re-run once the file is stable.",
                    key=key,
                )

        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size <= self.config.multipart_threshold_bytes:
                data = fh.read()
                digest.update(data)
                check()
                return self.put(key, data, if_none_match=if_none_match, progress=progress)
            return self._multipart(key, parts(fh), cond, progress, before_complete=check)

    def _multipart(
        self,
        key: str,
        chunks: Iterator[bytes | memoryview],
        cond: dict[str, str],
        progress: Progress | None,
        before_complete: Callable[[], None] | None = None,
    ) -> str:
        """Upload parts concurrently (at most ``max_concurrency`` in memory), then complete under ``cond``.

        The condition sits on CompleteMultipartUpload, so a refused write stores nothing. Any failure aborts the
        upload so no half-upload lingers (a killed process does leave one; the store's lifecycle rules clean those).
        """
        upload_id = self._call("CREATE-MULTIPART", key, self.client.create_multipart_upload, Key=key)["UploadId"]
        log.debug("multipart key=%s upload_id=%s", key, upload_id)

        def send(number: int, body: bytes | memoryview) -> dict[str, Any]:
            if self.upload_limit is not None:
                self.upload_limit.take(len(body))
            res = self._call(
                "UPLOAD-PART", key, self.client.upload_part, Key=key, UploadId=upload_id, PartNumber=number,
                Body=bytes(body),
            )  # fmt: skip
            if progress:
                progress(len(body))
            return {"PartNumber": number, "ETag": res["ETag"]}

        try:
            with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
                # a window of max_concurrency parts in flight: the next part is read (and hashed) as soon as *any*
                # part is done, not the oldest one, so one slow part never idles the other connections
                pending: set[Future[dict[str, Any]]] = set()
                done: list[dict[str, Any]] = []
                for number, chunk in enumerate(chunks, start=1):
                    pending.add(pool.submit(send, number, chunk))
                    if len(pending) >= self.config.max_concurrency:
                        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                        done.extend(f.result() for f in finished)
                done.extend(f.result() for f in pending)
                done.sort(key=lambda part: part["PartNumber"])  # CompleteMultipartUpload wants them in order
            if before_complete:
                before_complete()
            res = self._call(
                "COMPLETE-MULTIPART", key, self.client.complete_multipart_upload, bool(cond.get("IfNoneMatch")),
                Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}, **cond,
            )  # fmt: skip
            return str(res["ETag"])
        except BaseException:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except (ClientError, BotoCoreError) as exc:  # the original error matters more; the upload just lingers
                log.warning("could not abort multipart upload key=%s upload_id=%s: %s", key, upload_id, exc)
            raise

    # -- reads ------------------------------------------------------------------------------------------------
    def get(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """The object's bytes and its ETag (the ETag is what ``put_if_match`` needs to move it).

        ``max_bytes``: the capped read every reader of an object a team can write uses (the caps above): the
        object's ``ContentLength`` is checked first, then the body is read in chunks and the read stops as soon as
        it passes the cap (a store or proxy may answer without a length, or with a wrong one), raising
        ``ObjectTooLarge`` naming the key and the cap. None: no cap (objects the caller wrote itself).
        """
        res = self._call("GET", key, self.client.get_object, Key=key)
        body = res["Body"]
        try:
            if max_bytes is None:
                return body.read(), str(res["ETag"])
            return self._read_capped(key, res, max_bytes), str(res["ETag"])
        except (BotoCoreError, OSError) as exc:
            raise self._error(exc, "GET", key) from exc
        finally:
            body.close()  # a refused body is not drained: closing drops the connection instead

    def _read_capped(self, key: str, res: Mapping[str, Any], max_bytes: int) -> bytes:
        length = res.get("ContentLength")
        if isinstance(length, int) and length > max_bytes:
            raise ObjectTooLarge(
                f"GET {self.url(key)}: {length} bytes, more than the {max_bytes} bytes this record may have; "
                "refused unread (the object is not a record nuro wrote)",
                key=key, max_bytes=max_bytes, size=length,
            )  # fmt: skip
        buf = bytearray()
        while chunk := res["Body"].read(min(_CAPPED_CHUNK_BYTES, max_bytes + 1 - len(buf))):
            buf += chunk
            if len(buf) > max_bytes:
                raise ObjectTooLarge(
                    f"GET {self.url(key)}: more than the {max_bytes} bytes this record may have (the store said "
                    f"{length!r}); refused after {len(buf)} bytes (the object is not a record nuro wrote)",
                    key=key, max_bytes=max_bytes,
                )  # fmt: skip
        return bytes(buf)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (one ranged GET: a file packed inside a big shard costs only its bytes)."""
        if length <= 0:
            return b""
        res = self._call("GET", key, self.client.get_object, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
        try:
            return res["Body"].read()
        except (BotoCoreError, OSError) as exc:
            raise self._error(exc, "GET", key) from exc

    def iter_chunks(self, key: str, chunk_bytes: int = 4 * MiB) -> Iterator[bytes]:
        """Stream an object without holding it in memory."""
        body = self._call("GET", key, self.client.get_object, Key=key)["Body"]
        try:
            yield from body.iter_chunks(chunk_bytes)
        except (BotoCoreError, OSError) as exc:
            raise self._error(exc, "GET", key) from exc
        finally:
            body.close()

    def head(self, key: str) -> ObjectInfo:
        res = self._call("HEAD", key, self.client.head_object, Key=key)
        return ObjectInfo(key, int(res["ContentLength"]), str(res["ETag"]), res.get("LastModified"))

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except NotFound:
            return False
        return True

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` (all pages), in key order."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    yield ObjectInfo(obj["Key"], int(obj["Size"]), str(obj["ETag"]), obj.get("LastModified"))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "LIST", prefix) from exc

    def list_prefixes(self, prefix: str) -> list[str]:
        """The "directories" one level under ``prefix`` (``Delimiter='/'``), e.g. dataset names."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/")
        try:
            return [p["Prefix"] for page in pages for p in page.get("CommonPrefixes", [])]
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "LIST", prefix) from exc

    def delete(self, key: str) -> None:
        self._call("DELETE", key, self.client.delete_object, Key=key)

    def bucket_exists(self) -> bool:
        """True when the bucket answers HEAD with these credentials; False when it does not exist."""
        try:
            self._call("HEAD-BUCKET", None, self.client.head_bucket)
        except NotFound:
            return False
        return True
