"""A DeepSpeed config checked at submit, before it costs an allocation (issue 17).

What DeepSpeed itself would reject when the engine starts, minutes later on every rank, is reported now: JSON
(hjson, as DeepSpeed reads it) that does not parse, batch sizes that do not add up at the job's world size, and what
the installed DeepSpeed's own config classes refuse (its pydantic sections forbid unknown keys: a typo inside
``zero_optimization`` fails the engine, so it fails the submit). Top-level keys DeepSpeed does not know are only
noted: DeepSpeed ignores them (a typo like ``zero_optimisation`` silently trains without ZeRO), and scripts often
keep their own settings in the same file.

The batch rule is DeepSpeed's ``_configure_train_batch_size``: ``train_batch_size = micro batch per GPU ×
gradient accumulation steps × data-parallel world size``, any two of the three given. DeepSpeed's own check runs with
a world size of 1 (it has no process group at submit), so the batch keys are checked here with the job's.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: A DeepSpeed config is a small JSON file; anything larger is not one.
MAX_CONFIG_BYTES = 1024 * 1024
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
#: modules whose UPPER_CASE string constants name DeepSpeed's config keys (the engine reads some top-level keys,
#: e.g. ``optimizer``, outside ``DeepSpeedConfig``); with the keys ``DeepSpeedConfig`` is seen to read, they are
#: the keys the installed DeepSpeed knows
_KEY_MODULES = (
    "deepspeed.runtime.constants",
    "deepspeed.runtime.zero.config",
    "deepspeed.runtime.activation_checkpointing.config",
    "deepspeed.runtime.swap_tensor.constants",
    "deepspeed.runtime.data_pipeline.constants",
    "deepspeed.profiling.constants",
    "deepspeed.autotuning.constants",
    "deepspeed.elasticity.constants",
    "deepspeed.compression.constants",
    "deepspeed.checkpoint.constants",
    "deepspeed.comm.constants",
    "deepspeed.monitor.config",
)


@dataclass
class ConfigCheck:
    """``problems`` stop the submit (each says what to change); ``notes`` are printed and the job goes ahead."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    deepspeed_version: str | None = None


def parse_config(data: bytes) -> dict[str, Any]:
    """The config as DeepSpeed reads it (hjson when installed, a superset of JSON); ValueError saying why not."""
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        import hjson  # lazy: DeepSpeed's own reader, only where DeepSpeed is installed

        cfg = hjson.loads(text)
    except ImportError:
        cfg = json.loads(text)
    if not isinstance(cfg, Mapping):
        raise ValueError(f"must be a JSON object, got {type(cfg).__name__}")
    return dict(cfg)


def batch_problems(cfg: Mapping[str, Any], world: int) -> list[str]:
    """Why the batch keys cannot hold at data-parallel world size ``world`` ([] when they can)."""
    given = {k: cfg[k] for k in _BATCH_KEYS if cfg.get(k) is not None}
    for key, value in given.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return [f"{key} must be a whole number of at least 1, got {value!r}"]
    t, m, g = (given.get(k) for k in _BATCH_KEYS)
    if t is None and m is None:
        return ["give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed needs one of them)"]
    if t is not None and m is not None and g is not None and t != m * g * world:
        return [f"train_batch_size {t} != train_micro_batch_size_per_gpu {m} × gradient_accumulation_steps {g} × "
                f"{world} ranks (= {m * g * world}): set it to {m * g * world}, or drop one of the three and let "
                "DeepSpeed derive it"]  # fmt: skip
    if t is not None and g is None and (t % ((m or 1) * world) or t < (m or 1) * world):
        per = (m or 1) * world
        micro = f"train_micro_batch_size_per_gpu {m} × " if m else ""
        return [f"train_batch_size {t} is not a multiple of {micro}{world} ranks (= {per}): use a multiple of {per}"]
    if t is not None and m is None and g is not None and (t % (g * world) or t < g * world):
        return [f"train_batch_size {t} is not a multiple of gradient_accumulation_steps {g} × {world} ranks "
                f"(= {g * world}): use a multiple of {g * world}"]  # fmt: skip
    return []


def _for_world_one(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config with batch keys that DeepSpeed's world-size-1 check accepts (checked here at the real size)."""
    out = dict(cfg)
    t, m, g = (out.get(k) for k in _BATCH_KEYS)
    if t is not None and (m is not None or g is not None):
        out.pop("train_batch_size")
    elif t is not None:
        out["train_micro_batch_size_per_gpu"] = 1
        out.pop("train_batch_size")
    return out


class _Recorder(dict):  # type: ignore[type-arg]
    """A dict that remembers which keys were looked up (the keys ``DeepSpeedConfig`` reads)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self.seen: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.seen.add(str(key))
        return super().__contains__(key)

    def __copy__(self) -> _Recorder:
        return self  # DeepSpeedConfig copies the dict before reading it: keep recording


def _constants(module: str) -> set[str]:
    try:
        mod = importlib.import_module(module)
    except Exception:  # a module a future DeepSpeed moved: fewer known keys, more notes
        return set()
    return {v for k, v in vars(mod).items() if k.isupper() and isinstance(v, str)}


def unknown_key_notes(cfg: Mapping[str, Any], known: set[str]) -> list[str]:
    """One note per top-level key DeepSpeed does not read, with the nearest key it does read."""
    notes = []
    for key in cfg:
        if key in known:
            continue
        near = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        notes.append(f"DeepSpeed ignores the top-level key {key!r}{hint}")
    return notes


def _deepspeed_problems(cfg: Mapping[str, Any]) -> tuple[list[str], list[str], str]:
    """What the installed DeepSpeed's config classes refuse, the notes on unknown keys, and its version.
    ImportError when DeepSpeed is not installed."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # a login node has no GPU: do not let DeepSpeed probe for one
    import deepspeed  # lazy: ~1-3 s with torch; only a DeepSpeed submit pays it
    from deepspeed.runtime.config import DeepSpeedConfig

    rec = _Recorder(_for_world_one(cfg))
    problems: list[str] = []
    try:
        DeepSpeedConfig(rec)
    except Exception as exc:  # pydantic ValidationError, AssertionError, ValueError, KeyError: all are refusals
        errors = getattr(exc, "errors", None)
        if callable(errors):
            title = getattr(exc, "title", "config")
            for err in errors()[:5]:
                where = ".".join(str(p) for p in err.get("loc", ()))
                problems.append(f"DeepSpeed {deepspeed.__version__} rejects {title} {where}: {err.get('msg')}")
        else:
            text = " ".join(str(exc).split()) or type(exc).__name__
            problems.append(f"DeepSpeed {deepspeed.__version__} rejects it: {text[:400]}")
    known = set(rec.seen)
    for module in _KEY_MODULES:
        known |= _constants(module)
    notes = unknown_key_notes(cfg, known) if not problems else []
    return problems, notes, deepspeed.__version__


def check_config(data: bytes, *, world: int) -> ConfigCheck:
    """Check a DeepSpeed config file's bytes for a job of ``world`` data-parallel ranks."""
    out = ConfigCheck()
    if len(data) > MAX_CONFIG_BYTES:
        out.problems.append(f"is {len(data)} bytes; a DeepSpeed config is at most {MAX_CONFIG_BYTES}")
        return out
    try:
        cfg = parse_config(data)
    except ValueError as exc:
        out.problems.append(f"is not valid JSON: {exc}")
        return out
    out.problems += batch_problems(cfg, world)
    try:
        problems, notes, out.deepspeed_version = _deepspeed_problems(cfg)
    except ImportError:
        out.notes.append("DeepSpeed is not installed here: only the JSON and the batch sizes were checked")
        return out
    out.problems += problems
    out.notes += notes
    return out


__all__ = ["MAX_CONFIG_BYTES", "ConfigCheck", "batch_problems", "check_config", "parse_config", "unknown_key_notes"]
