"""Hot spares inside a job's allocation: which nodes the training step runs on, and what replaces a lost one.

A job submitted with ``--spare-nodes K`` holds N+K nodes (sbatch ``--no-kill``) and trains on N. When a training
node is lost, Slurm (told by nuro's detector, which sets the node DOWN) takes that node out of the allocation and
ends the step, but the job keeps running: ``nuro-launch --step`` then starts the step again on the survivors plus a
spare, and the training restores its newest valid checkpoint. No requeue, no new allocation, no prolog: the job's
accounting shows one attempt. Without a spare left, the step's 75 goes to the requeue path as for any job.

Only Slurm decides which node is lost: a node counts as lost once it has left the job's allocation (``squeue -j ID
-O NodeList``), never because the training said so. A node that merely sent no verdict (its launcher killed, a hang)
and is still allocated is not replaced; the requeue path handles it.

Pure functions over node lists (allocation order, which is Slurm's node order: a step's SLURM_NODEID 0 is the first
of its nodes, the batch host, where rank 0 serves the rendezvous), and the decision after each step (``after_step``,
``after_lost``: done, swap a straggler, find a lost node, wait for Slurm's node verdict, requeue), as ``fold`` and
``assess`` decide the verdicts. ``nuro.wrappers.launch.run_step`` is the thin runner that does the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from nuro.protocol.contract import EXIT_REQUEUE, MAX_SPARE_NODES
from nuro.protocol.envnames import NURO_SPARE_NODES
from nuro.wrappers.launch_outcome import Kind, Outcome, awaits_node_loss

#: The job's hot spares, exported by the batch script from the run record (``nuro-train submit --spare-nodes``).
ENV_SPARE_NODES = NURO_SPARE_NODES
#: Which incarnation of the step this is within one attempt (0 first, 1 after the first swap, ...): the nodes write
#: their verdicts to a directory of their own per swap, so a late verdict of a lost step never counts in the next.
ENV_LAUNCH_SWAP = "NURO_LAUNCH_SWAP"
#: The spares not used yet, for the training's step (a move's restart is a swap only while one is left).
ENV_SPARES_LEFT = "NURO_SPARES_LEFT"


class SpareError(ValueError):
    """A malformed spare setting or a step command the spares cannot be applied to; the message says what to fix."""


def spare_count(env: Mapping[str, str]) -> int:
    """``$NURO_SPARE_NODES`` (0 when unset); a malformed value is refused rather than guessed."""
    raw = env.get(ENV_SPARE_NODES, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) > MAX_SPARE_NODES:
        raise SpareError(f"{ENV_SPARE_NODES}={raw!r}: give a whole number of nodes between 0 and {MAX_SPARE_NODES}")
    return int(raw)


def swap_index(env: Mapping[str, str]) -> int:
    """``$NURO_LAUNCH_SWAP`` as the step mode set it (0 when unset or malformed: the first incarnation)."""
    raw = env.get(ENV_LAUNCH_SWAP, "")
    return int(raw) if raw.isdigit() else 0


def training_nodes(allocation: Sequence[str], spares: int) -> list[str]:
    """The first ``len(allocation) - spares`` nodes train, the rest wait as spares.

    Raises:
        SpareError: the allocation has no node left to train on.
    """
    train = len(allocation) - spares
    if train < 1:
        raise SpareError(
            f"{len(allocation)} node(s) allocated and {spares} spare(s): no node left to train on; "
            "allocate the training nodes plus the spares (nuro-train submit --spare-nodes does so)"
        )
    return list(allocation[:train])


def with_nodelist(argv: Sequence[str], nodes: Sequence[str]) -> list[str]:
    """The step command with ``--nodelist=<nodes>`` right after ``srun`` (a later option of the same name wins in
    srun, so a user's own ``--nodelist``/``-w`` is refused instead of silently losing to ours). Words are looked at
    up to a ``--``: a program taking a ``-w`` of its own goes after one (``srun ... python -m nuro.wrappers.launch
    -- train.py -w 4``).

    Raises:
        SpareError: the command is not an srun, or it names its own nodes.
    """
    if not argv or argv[0].rsplit("/", 1)[-1] != "srun":
        raise SpareError(f"spare nodes need the step to be an srun command (nuro-launch --step -- srun ...); got "
                         f"{argv[0] if argv else 'nothing'!r}")  # fmt: skip
    names = set()
    for word in argv[1:]:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        names.add(name[:2] if not name.startswith("--") else name)
        if name in ("--nodelist", "-w") or (word.startswith("-w") and not word.startswith("--")):
            raise SpareError(f"the step's srun names its own nodes ({word}): with spares nuro-launch chooses them; "
                             "drop --nodelist/-w")  # fmt: skip
    # one task per node (nuro-launch's way) unless the command says otherwise: the job's SLURM_NTASKS and
    # SLURM_NNODES, which srun would inherit, count the spares too
    sizes = [] if names & {"--nodes", "-N"} else [f"--nodes={len(nodes)}"]
    sizes += [] if names & {"--ntasks", "-n"} else [f"--ntasks={len(nodes)}"]
    return [argv[0], f"--nodelist={','.join(nodes)}", *sizes, *argv[1:]]


@dataclass
class SpareState:
    """Where the job's nodes stand: the training nodes, the spares left, the lost ones and the swaps so far."""

    active: list[str]
    spares: list[str]
    lost: list[str] = field(default_factory=list)
    swaps: int = 0

    @classmethod
    def start(cls, allocation: Sequence[str], spares: int) -> SpareState:
        active = training_nodes(allocation, spares)
        return cls(active=active, spares=[n for n in allocation if n not in active])

    def gone(self, allocation_now: Sequence[str]) -> list[str]:
        """Training nodes Slurm has taken out of the allocation (lost), in step order."""
        now = set(allocation_now)
        return [n for n in self.active if n not in now]

    def replace(self, lost: Sequence[str], allocation_now: Sequence[str]) -> Swap | None:
        """Swap each lost training node for a spare still allocated; None (state unchanged) when there are not
        enough spares, or nothing to replace. The new training nodes keep allocation order."""
        if not lost:
            return None
        now = set(allocation_now)
        usable = [n for n in self.spares if n in now]
        if len(usable) < len(lost):
            return None
        taken = usable[: len(lost)]
        order = {n: i for i, n in enumerate(allocation_now)}
        active = sorted([*(n for n in self.active if n not in lost), *taken], key=lambda n: order.get(n, len(order)))
        self.active = active
        self.spares = [n for n in usable if n not in taken]
        self.lost += list(lost)
        self.swaps += 1
        return Swap(number=self.swaps, lost=tuple(lost), spares=tuple(taken), spares_left=len(self.spares),
                    nodes=tuple(active))  # fmt: skip


@dataclass(frozen=True)
class Swap:
    """One swap: the lost nodes, the spares that replaced them, how many spares are left, the new training nodes."""

    number: int
    lost: tuple[str, ...]
    spares: tuple[str, ...]
    spares_left: int
    nodes: tuple[str, ...]

    def fields(self) -> dict[str, object]:
        """The ``spare_swap`` run event's fields."""
        return {"swap": self.number, "lost": list(self.lost), "spares": list(self.spares),
                "spares_left": self.spares_left, "nodes": list(self.nodes)}  # fmt: skip


class Next(StrEnum):
    """What the batch step does once a step has ended (``after_step``)."""

    DONE = "done"  # the step's status is the script's
    MOVE = "move"  # the training left a straggler: swap that node for a spare if one is still allocated
    FIND_LOST = "find_lost"  # with spares: ask Slurm which training node left the allocation, swap it for a spare
    AWAIT_LOSS = "await_loss"  # no spares: wait for Slurm's verdict on a node that never reported


@dataclass(frozen=True)
class AfterStep:
    next: Next
    node: str | None = None  # MOVE: the node the training asked to leave


def move_from(found: Sequence[Outcome], state: SpareState) -> str | None:
    """The training node a stop asked to leave (a straggler), if it is one of the step's nodes."""
    wanted = {v.details.get("move_from") for v in found if v.kind in (Kind.REQUEUE, Kind.STOPPED)}
    return next((n for n in state.active if n in wanted), None)


def may_have_lost_a_node(status: int, found: Sequence[Outcome], num_nodes: int, in_job: bool) -> bool:
    """Whether a job with spares looks for a lost training node after its step ended: a restart verdict with a
    node that never reported, or no verdict at all from a step srun ended itself (on a node failure srun kills the
    step's other tasks, which can beat the survivors' verdicts). A node's own failure verdict is the training's
    failure, never swapped away; the allocation says whether a node was really lost."""
    if status == 0 or not in_job or any(v.kind == Kind.FAILURE for v in found):
        return False
    return awaits_node_loss(status, found, num_nodes) or not found


def after_step(
    status: int,
    found: Sequence[Outcome],
    num_nodes: int,
    *,
    state: SpareState | None,
    signalled: bool,
    stopping: bool,
    in_job: bool,
    wait_s: float,
) -> AfterStep:
    """The decision once a step ended with ``status`` (the folded verdicts ``found`` of ``num_nodes`` nodes).
    ``signalled``: the batch step relayed a signal (Slurm or the user is ending the job, or a preemption or time
    limit: leave, never swap); ``stopping``: one of them was TERM/INT; ``in_job``: Slurm can be asked about the job.
    Pure: the runner reads the allocation and Slurm's node verdicts."""
    if state is not None and status == EXIT_REQUEUE and not signalled:
        moving = move_from(found, state)
        if moving is not None:
            return AfterStep(Next.MOVE, moving)
    if state is not None and not signalled and may_have_lost_a_node(status, found, num_nodes, in_job):
        return AfterStep(Next.FIND_LOST)
    lost_one = not stopping and awaits_node_loss(status, found, num_nodes) and in_job
    if wait_s > 0 and lost_one and state is None:
        return AfterStep(Next.AWAIT_LOSS)
    return AfterStep(Next.DONE)


def after_lost(status: int, lost: Sequence[str]) -> int:
    """The script's status when no spare replaced what ``FIND_LOST`` found: a lost node with no spare left is the
    requeue path (Slurm keeps a ``--no-kill`` job running without the node and never requeues it, and the
    training's own status is the lost node's SIGKILL, not its failure); nothing lost: the step's own status."""
    return EXIT_REQUEUE if lost else status


__all__ = [
    "ENV_LAUNCH_SWAP",
    "ENV_SPARES_LEFT",
    "ENV_SPARE_NODES",
    "MAX_SPARE_NODES",
    "SpareError",
    "AfterStep",
    "Next",
    "SpareState",
    "Swap",
    "after_lost",
    "after_step",
    "may_have_lost_a_node",
    "move_from",
    "spare_count",
    "swap_index",
    "training_nodes",
    "with_nodelist",
]
