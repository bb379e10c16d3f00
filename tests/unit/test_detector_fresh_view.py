"""The detector judges a loss on a node list read when it acts, not on its last poll (up to 2 s old)."""

from __future__ import annotations

from nuro.slurm.models import NodeInfo
from nuro.slurm_plugins.controller.detection import FailureDetector
from nuro.slurm_plugins.controller.liveness import Beat, LivenessConfig, NodeActionKind


class _Receiver:
    def __init__(self) -> None:
        self.queue: list[Beat] = []

    def drain(self) -> list[Beat]:
        out, self.queue = self.queue, []
        return out


class _Backend:
    """Node lists in turn: what Slurm says at each read."""

    def __init__(self, *lists: list[NodeInfo]) -> None:
        self.lists = list(lists)
        self.reads = 0

    def nodes(self) -> list[NodeInfo]:
        self.reads += 1
        return self.lists[min(self.reads, len(self.lists)) - 1]


def test_an_admin_drain_set_after_the_last_poll_is_kept_in_the_loss_reason() -> None:
    idle = NodeInfo(name="gpu007", state="IDLE", flags=frozenset({"IDLE"}))
    drained = NodeInfo(name="gpu007", state="IDLE+DRAIN", flags=frozenset({"IDLE", "DRAIN"}), reason="admin: fan")
    backend, receiver = _Backend([idle], [drained]), _Receiver()
    clock = [10.0]
    det = FailureDetector(
        backend, receiver, LivenessConfig(interval_s=0.25, miss_limit=4), dry_run=True,  # type: ignore[arg-type]
        clock=lambda: 1_000_000.0 + clock[0], monotonic=lambda: clock[0], node_poll_s=2.0,
    )  # fmt: skip
    for seq in range(1, 5):  # the controller's start grace passes while the node beats
        receiver.queue.append(Beat("gpu007", boot=1, seq=seq, sent=clock[0], received=clock[0]))
        det.tick()
        clock[0] += 0.25
    assert backend.reads == 1
    clock[0] += 0.85  # silent 1.1 s > 1 s, the 2 s poll not due: the admin drained the node in between
    done = det.tick()
    down = [a for a, _ in done if a.kind is NodeActionKind.DOWN]
    assert down and down[0].reason.endswith("(admin drain: admin: fan)"), done
    assert backend.reads == 2
