"""The validated job spec: ``JobSpec`` built from a YAML file and/or flags, with every problem reported at once.

Precedence: option defaults < the YAML file < command-line flags. Unknown keys are errors that list every valid key
with its default (torchx's "unknown configs are ignored" is the habit we avoid). A value is checked by its
option's kind (``nuro.jobspec.fields``); cross-field rules (a stop warning shorter than the time limit, allow_dirty
only for HEAD) are checked after. Example spec::

    name: resnet50-ddp
    team: perception
    nodes: 2
    gpus_per_node: 8
    time_limit: "4:00:00"
    dataset: imagenet@sha256:3f5a...          # or imagenet@v3, resolved to its digest at submit
    code:
      repo: /shared/alice/vision
      commit: 9c1e2d4                         # optional: default HEAD (must be clean unless allow_dirty)
    entrypoint:
      script: train.py
      args: [--epochs, 90]
    env: {NCCL_DEBUG: WARN}
    checkpoint: {interval_s: 1800, keep: 3}
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nuro.console import problem_list
from nuro.jobspec.fields import FieldError, show
from nuro.jobspec.options import GROUPS, OPTIONS_BY_NAME, SPEC_OPTIONS, valid_keys_text
from nuro.protocol.contract import DEFAULT_CKPT_KEEP

#: A spec file larger than this is refused before YAML parsing (YAML aliases can expand small files a lot).
MAX_SPEC_BYTES = 64 * 1024


class SpecError(ValueError):
    """The job spec is invalid. ``problems`` holds one 'field: what is wrong' line per problem."""

    def __init__(self, problems: list[str], source: str = "job spec") -> None:
        self.problems = problems
        self.source = source
        super().__init__(problem_list(source, problems))


@dataclass(frozen=True)
class JobSpec:
    """A checked job spec. Every string here matched its allow-list pattern (see ``SPEC_OPTIONS``).

    Units: ``time_limit_s``, ``ckpt_interval_s``, ``stop_warning_s`` in seconds. None means "not given": ``tier``
    → the team's guaranteed QOS, ``code_commit`` → HEAD, ``run_root`` → the CLI fills ``~/nuro-runs``.
    """

    name: str
    team: str
    dataset: str
    code_repo: str
    script: str
    tier: str | None = None
    nodes: int = 1
    spare_nodes: int = 0
    gpus_per_node: int = 8
    time_limit_s: int = 3600
    code_commit: str | None = None
    allow_dirty: bool = False
    args: tuple[str, ...] = ()
    deepspeed_config: str | None = None
    #: ``deepspeed`` when a DeepSpeed config is given and no launcher is, else ``torchrun``
    launcher: str = "torchrun"
    python: str = "python3"
    env: tuple[tuple[str, str], ...] = ()
    ckpt_interval_s: int = 1800
    snapshot_interval_s: int = 0
    ckpt_keep: int = DEFAULT_CKPT_KEEP
    resume_from: str | None = None
    max_requeues: int = 3
    data_seed: int = 0
    stop_warning_s: int = 120
    run_root: str | None = None

    @property
    def alloc_nodes(self) -> int:
        """Nodes Slurm allocates: the training nodes plus the hot spares (both count in the quota)."""
        return self.nodes + self.spare_nodes

    @property
    def total_gpus(self) -> int:
        return self.alloc_nodes * self.gpus_per_node

    @property
    def world_size(self) -> int:
        """Training processes: one per GPU of the training nodes (one per node without GPUs); spares excluded."""
        return self.nodes * max(self.gpus_per_node, 1)


def flatten(data: Any, source: str = "job spec") -> dict[str, Any]:
    """YAML content → ``{option name: raw value}``; unknown keys and wrong shapes are SpecErrors."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SpecError([f"the spec must be a mapping of keys to values, got {type(data).__name__}"], source)
    flat: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in data.items():
        if not isinstance(key, str):
            problems.append(f"key {show(key)} is not a string")
        elif key in GROUPS:
            if not isinstance(value, Mapping):
                problems.append(f"{key}: must be a mapping (e.g. {key}: {{...}}), got {show(value)}")
                continue
            for sub, sub_value in value.items():
                name = f"{key}.{sub}" if isinstance(sub, str) else f"{key}.{show(sub)}"
                if name not in OPTIONS_BY_NAME:
                    valid = ", ".join(o.name for o in SPEC_OPTIONS if o.name.startswith(key + "."))
                    problems.append(f"unknown key {show(name)}; valid keys under {key}: {valid}")
                else:
                    flat[name] = sub_value
        elif key in OPTIONS_BY_NAME:
            flat[key] = value
        else:
            problems.append(f"unknown key {show(key)}; valid keys: {valid_keys_text()}")
    if problems:
        raise SpecError(problems, source)
    return flat


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML spec file into raw option values (not yet checked; see ``build_spec``).

    Raises:
        SpecError: unreadable, too large, not YAML, not a mapping, or unknown keys.
    """
    import yaml  # lazy: ~75 ms; only spec files need it (nuro-sbatch reads flags, training ranks read tables)

    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError([f"cannot read the spec file: {exc.strerror}"], source) from exc
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError([f"the spec file is {len(raw)} bytes, at most {MAX_SPEC_BYTES} allowed"], source)
    try:
        stream = io.StringIO(raw.decode("utf-8"))
        stream.name = source  # a YAML error then says '"spec.yaml", line 3', not '"<unicode string>"'
        data = yaml.safe_load(stream)
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError([f"not valid UTF-8 YAML: {exc}"], source) from exc
    return flatten(data, source)


def split_code_flag(value: str, cwd: str | None = None) -> dict[str, str]:
    """``--code REPO[@COMMIT]`` → ``{"code.repo": ..., "code.commit": ...}``.

    REPO may be relative to ``cwd`` (the current directory) on the command line, but without '..' components: the
    spec records the absolute path the nodes will read. Path characters are checked afterwards by the option kind.
    """
    repo, sep, commit = value.partition("@")
    out: dict[str, str] = {}
    if repo and not repo.startswith("/"):
        if ".." in repo.split("/"):
            problem = f"code.repo: a relative path must not contain '..'; give an absolute path; got {show(repo)}"
            raise SpecError([problem])
        repo = os.path.normpath(os.path.join(cwd or os.getcwd(), repo))
    out["code.repo"] = repo
    if sep:
        out["code.commit"] = commit
    return out


def build_spec(*layers: Mapping[str, Any], source: str = "job spec") -> JobSpec:
    """Merge raw option layers (later wins), check every value, return the JobSpec.

    Args:
        layers: ``{option name: raw value}`` mappings, e.g. ``load_spec_file(path)`` then the flags.

    Raises:
        SpecError: every problem at once, each line naming its field.
    """
    merged: dict[str, Any] = {}
    problems: list[str] = []
    for layer in layers:
        for name, value in layer.items():
            if name not in OPTIONS_BY_NAME:
                problems.append(f"unknown key {show(name)}; valid keys: {valid_keys_text()}")
            else:
                merged[name] = value
    values: dict[str, Any] = {}
    for opt in SPEC_OPTIONS:
        if opt.name not in merged or merged[opt.name] is None:
            if opt.required:
                problems.append(f"{opt.name}: is required ({opt.help}) — set it in the spec or with {opt.flag}")
            elif opt.default is not None:
                values[opt.attr] = opt.default
            continue
        try:
            values[opt.attr] = opt.parse(merged[opt.name])
        except FieldError as exc:
            problems.append(f"{opt.name}: {exc}")
    if "launcher" not in values:
        values["launcher"] = "deepspeed" if values.get("deepspeed_config") else "torchrun"
    if not problems:
        problems.extend(_cross_checks(values))
    if problems:
        raise SpecError(problems, source)
    return JobSpec(**values)


def _cross_checks(v: dict[str, Any]) -> list[str]:
    problems = []
    if v["stop_warning_s"] >= v["time_limit_s"]:
        problems.append(
            f"stop_warning_s: {v['stop_warning_s']} s must be shorter than time_limit ({v['time_limit_s']} s)"
        )
    if v.get("allow_dirty") and v.get("code_commit"):
        problems.append(
            "code.allow_dirty: only applies to HEAD (the uncommitted changes are a diff against HEAD); "
            "drop code.commit or allow_dirty"
        )
    if v["launcher"] == "deepspeed" and not v.get("deepspeed_config"):
        problems.append(
            "entrypoint.launcher: deepspeed needs entrypoint.deepspeed_config (--deepspeed-config PATH): the "
            "engine's config, checked at submit against the installed DeepSpeed"
        )
    if v["launcher"] == "torchrun" and v.get("deepspeed_config"):
        problems.append(
            "entrypoint.deepspeed_config: given with launcher torchrun; set launcher: deepspeed (or drop the config)"
        )
    for field in ("script", "deepspeed_config"):
        path = v.get(field)
        if path and re.search(r"(^|/)\.git(/|$)", path):
            problems.append(f"entrypoint.{field}: must not point into .git; got {show(path)}")
    return problems


__all__ = ["MAX_SPEC_BYTES", "JobSpec", "SpecError", "build_spec", "flatten", "load_spec_file", "split_code_flag"]
