"""A DeepSpeed engine's checkpoints through nuro: DeepSpeed's own save/load API, made asynchronous by a writer.

Why DeepSpeed's API and not DCP (docs/deepspeed.md): DCP restores the module's weights but not ZeRO-2's optimizer
state (every rank holds a different-sized slice under the same key: ``dcp.load`` fails "Size mismatch"), while
``engine.save_checkpoint``/``load_checkpoint`` resume bitwise equal, and each rank loads only the model states and its
own shard (``nuro.checkpoint.dsfiles``).

Why a writer of our own (``StagedWriter``): DeepSpeed 0.19.8's asynchronous engines do not work on CPU (the
``fast`` writer pins memory through an accelerator, ``decoupled`` cannot pass tensors that require grad to its
process and then hangs; Nebula is gone). DeepSpeed calls ``checkpoint_engine.save(state, path)`` once per file, so
an engine that copies the state in memory and writes it on a thread makes the save asynchronous without touching
DeepSpeed's format: the training stalls for the copy, as with DCP's stager, and the files are those DeepSpeed
writes itself. ``wait(tag)`` is the durability point the Checkpointer hands to the upload worker after.

Imported only when a Checkpointer is given an engine (DeepSpeed takes ~1 s to import).
"""

from __future__ import annotations

import copy
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from nuro.checkpoint.errors import CheckpointError

log = logging.getLogger(__name__)

#: where ``save`` puts the caller's state among the model-states file's keys
CLIENT_KEY = "nuro_state"


def snapshot(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors no later optimizer step can change (detached, on the CPU), containers
    rebuilt, everything else shared (DeepSpeed's states hold ints, strings, configs and tensors)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps an OrderedDict an OrderedDict
        for key, value in obj.items():
            out[key] = snapshot(value)
        return out
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(snapshot(v) for v in obj)
    return obj


class StagedWriter(TorchCheckpointEngine):
    """DeepSpeed's torch.save engine, writing on a thread: ``save`` returns once the state is copied.

    One thread writes the files in the order DeepSpeed saved them; ``wait(tag)`` blocks until every file of that
    tag is written (and raises the first write error). ``load`` is DeepSpeed's own.
    """

    def __init__(self) -> None:
        super().__init__(None)
        self.name = "NuroStagedWriter"
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nuro-ds-writer")
        self._lock = threading.Lock()
        self._tag: str | None = None
        self._pending: dict[str, list[Future[None]]] = {}
        #: the engine's checkpoint engine before this one (``remove_writer`` puts it back)
        self.previous: Any = None

    def create(self, info: Any) -> None:
        self._tag = str(info.tag)

    def save(self, state_dict: Any, path: str) -> None:
        staged = snapshot(state_dict)
        fut = self._pool.submit(self._write, staged, path)
        with self._lock:
            self._pending.setdefault(self._tag or "", []).append(fut)

    def _write(self, state: Any, path: str) -> None:
        tmp = Path(path).with_name(f".{Path(path).name}.tmp")
        torch.save(state, tmp)
        tmp.replace(path)  # a crash mid-write leaves no file under DeepSpeed's name

    def commit(self, info: Any) -> bool:
        return True  # the Checkpointer waits (``wait``) before it hands the files to the upload worker

    def wait(self, tag: str) -> None:
        """Block until every file saved under ``tag`` is written; CheckpointError naming the first failure."""
        with self._lock:
            futures = self._pending.pop(tag, [])
        for fut in futures:
            try:
                fut.result()
            except Exception as exc:
                raise CheckpointError(f"writing DeepSpeed checkpoint {tag} failed: {exc}") from exc

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def check_engine(engine: Any) -> None:
    """Refuse what nuro's per-rank file split does not cover (``nuro.checkpoint.dsfiles``): model or pipeline
    parallelism, where a file's ``pp_rank``/``mp_rank`` are not the global rank."""
    if getattr(engine, "mpu", None) is not None or type(engine).__name__ == "PipelineEngine":
        raise CheckpointError(
            "Checkpointer(engine=...) covers data-parallel DeepSpeed engines (ZeRO 0-3); this engine uses model or "
            "pipeline parallelism, whose checkpoint files nuro cannot yet split by node"
        )


def install_writer(engine: Any) -> StagedWriter:
    """Make ``engine``'s saves asynchronous (``StagedWriter``); its loads stay DeepSpeed's."""
    writer = StagedWriter()
    writer.previous = engine.checkpoint_engine
    engine.checkpoint_engine = writer
    return writer


def remove_writer(engine: Any, writer: StagedWriter) -> None:
    """Stop ``writer`` (after its files are written) and give ``engine`` back the checkpoint engine it had, so the
    engine's own ``save_checkpoint`` works again after the Checkpointer is closed."""
    writer.close()
    if engine.checkpoint_engine is writer:
        engine.checkpoint_engine = writer.previous


def save(engine: Any, ckpt_root: Path, tag: str, client_state: dict[str, Any]) -> None:
    """``engine.save_checkpoint`` into ``ckpt_root/<tag>/`` (every rank). No ``latest`` file: nuro's manifest says
    which step is committed, and a tag-less load is never used (it silently starts over without ``latest``).
    The client state goes under one key of its own: DeepSpeed returns its own bookkeeping as client state too."""
    engine.save_checkpoint(str(ckpt_root), tag=tag, client_state={CLIENT_KEY: client_state}, save_latest=False)


def load(engine: Any, step_dir: Path) -> dict[str, Any]:
    """``engine.load_checkpoint`` of the step in ``step_dir`` (every rank), always with its tag; the client state
    ``save`` stored.

    Raises:
        CheckpointError: DeepSpeed loaded nothing (it returns ``(None, None)`` rather than raising).
    """
    path, client = engine.load_checkpoint(str(step_dir.parent), tag=step_dir.name)
    if path is None:
        raise CheckpointError(f"DeepSpeed loaded nothing from {step_dir} (see its log above)")
    return dict((client or {}).get(CLIENT_KEY) or {})


__all__ = ["CLIENT_KEY", "StagedWriter", "check_engine", "install_writer", "load", "remove_writer", "save", "snapshot"]
