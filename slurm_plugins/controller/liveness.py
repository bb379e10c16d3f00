"""The heartbeat failure detector, as a pure function: ``assess(state, beats, slurm_nodes, now, cfg)``.

Why pure (architecture principle 3): every rule below is a few lines of arithmetic on times, and each one is
unit-tested with a fake clock; the runtime (``detection.py``) only receives datagrams, polls Slurm's node list,
applies the returned actions and writes the event log.

Rules (``interval`` = heartbeat interval, ``timeout`` = ``miss_limit`` × ``interval``):

- a node that has beaten before is silent > timeout → DOWN then DRAIN,
  reason ``nuro: no heartbeat for 3.4 s (last seq N)``;
- ... and that is its 3rd loss within 10 min → DOWN then DRAIN,
  reason ``nuro: flapping (3 losses in 600 s), held 30 s until <UTC>``;
- a beat says ``healthy=false`` → DRAIN, reason ``nuro: unhealthy: <the agent's problems>``;
- we drained/downed it, it now beats healthy for ≥ 2 intervals and its hold has passed → RESUME, only if Slurm's
  reason still starts with ``nuro:``;
- its agent's last beat said it was stopping on purpose (``stopping_s``, a clean stop or restart of the agent) → not
  lost while that announced silence lasts (capped at ``MAX_STOP_GRACE_S``); still silent after it → lost as above,
  the reason saying so. Without this an agent restart (an upgrade, ``systemctl restart``: ~1-2 s) downed the node and
  requeued its jobs. A crashed agent announces nothing: that silence is a loss, as a dead host's is;
- a node of a job whose ranks on another node just saw a peer die in-band (that node's beat carries
  ``suspect_jobs``, ``nuro.protocol.peerloss``) is lost after a shorter silence, ``suspect_timeout_s`` (half the
  timeout, at least two intervals), while that report is fresh (``suspect_ttl_s``); reason
  ``nuro: no heartbeat for 0.6 s after job J's ranks on N lost a peer (last seq …)``. A report never takes down a
  node that keeps beating: it only shortens the silence that counts;
- it never sent a beat → nothing (agent not deployed there: Slurm's SlurmdTimeout is the only detector);
- the controller started less than one timeout ago → nothing (soft state is rebuilt from the next beats first);
- more than half of the beating nodes (and ≥ 4) fall silent at once → nothing for them (mass-loss guard: more
  likely the controller's side — paused, partitioned — than half the fleet dying in the same second; SlurmdTimeout
  remains the backstop for a real mass failure).

Why DOWN *and* DRAIN: DOWN makes slurmctld requeue the node's ``--requeue`` jobs at once (that is the point: Slurm
alone waits SlurmdTimeout); DRAIN keeps it out afterwards, because with ``ReturnToService=2`` a DOWN node whose slurmd
re-registers is returned to service by Slurm itself — before we have seen it healthy.

Admin drains are sacred: a node whose Slurm reason does not start with ``nuro:`` is never resumed. A node an admin
drained that then dies is still set DOWN (its jobs must be requeued), with the admin's text kept in the reason as
``(admin drain: <text>)``, and such a reason is never resumed either — the marker lives in Slurm, so it survives a
controller restart.

Flapping: the n-th flap hold (n ≥ 1) lasts ``hold_base_s`` × 2^(n-1), capped at ``hold_max_s`` (30 s, 60 s, … 15 min).
The hold deadline is written into the reason as an ISO time, so a restarted controller still honours it; only the
loss history (and hence the back-off level) is soft state and starts over after a restart.

Clock: ``now`` and every time kept here (beat arrivals, losses, holds, retries) are **monotonic** seconds: silence
is judged on a clock no one can step (an NTP step, an admin's ``date -s``, a VM resumed with a stale clock would
otherwise declare every node dead at once, or none for hours). The wall clock (``wall``) is used only where a time
leaves the process: the hold deadline written into Slurm's reason as an ISO time (so a restarted controller honours
it: read back, it is turned into monotonic time as ``now + (deadline - wall)``) and the times in event records.

Isolation: each node is judged on its own; a record that makes the rules raise (a node state no rule foresaw) costs
only that node's judgement this pass (its name and the error are in ``DetectorState.faults``, which the runtime logs
once), never the other nodes'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType

from nuro.protocol.heartbeat import DEFAULT_INTERVAL_S, DEFAULT_MISS_LIMIT, MAX_STOP_GRACE_S
from nuro.slurm.models import NodeInfo

REASON_PREFIX = "nuro:"
#: A straggler drain's reason (issue 16): its own prefix, so operators (and ``sinfo -R``) tell it from a loss.
STRAGGLER_PREFIX = "nuro-straggler: "
ADMIN_MARK = "(admin drain:"
MAX_REASON = 200  # Slurm keeps long reasons, but sinfo columns and humans do not
_HELD_UNTIL = re.compile(r"until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


class NodeActionKind(StrEnum):
    DOWN = "down"
    DRAIN = "drain"
    RESUME = "resume"


class Cause(StrEnum):
    """Why an action was taken; the runtime turns each into an event-log record."""

    LOST = "lost"
    FLAPPING = "flapping"
    UNHEALTHY = "unhealthy"
    STRAGGLER = "straggler"
    RECOVERED = "recovered"


@dataclass(frozen=True)
class LivenessConfig:
    """Detector settings (seconds). ``__post_init__`` checks that they relate sensibly."""

    interval_s: float = DEFAULT_INTERVAL_S
    miss_limit: int = DEFAULT_MISS_LIMIT
    recover_intervals: int = 2
    flap_window_s: float = 600.0
    flap_losses: int = 3
    hold_base_s: float = 30.0
    hold_max_s: float = 900.0
    retry_s: float = 5.0  # re-issue an action Slurm did not take (a failed scontrol, a lost race)
    # Mass-loss guard: when more than this fraction of the beating nodes (and at least ``mass_loss_min`` of them)
    # fall silent in the same tick, the likelier cause is on our side (controller paused, its network partitioned),
    # so nobody is declared lost; Slurm's SlurmdTimeout still takes truly dead nodes down.
    mass_loss_fraction: float = 0.5
    mass_loss_min: int = 4
    # In-band reports (nuro.protocol.peerloss): how long one keeps a job's nodes under the shorter silence.
    suspect_ttl_s: float = 3.0
    # Straggler drains: a node a job flagged while its own NVML said a slowing clock reason held its GPUs stays
    # drained until its beats have said no such reason for this long (the health check that clears it).
    straggler_clear_s: float = 30.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.miss_limit < 2:
            raise ValueError(
                f"interval_s={self.interval_s}, miss_limit={self.miss_limit}: need interval_s > 0 and miss_limit >= 2 "
                "(one late datagram must not take a node down)"
            )
        if self.hold_base_s > self.hold_max_s:
            raise ValueError(f"hold_base_s={self.hold_base_s} exceeds hold_max_s={self.hold_max_s}")

    @property
    def timeout_s(self) -> float:
        return self.interval_s * self.miss_limit

    @property
    def suspect_timeout_s(self) -> float:
        """The silence that makes a reported node lost: half the timeout, never under two intervals (one late
        datagram is still no loss)."""
        return max(2 * self.interval_s, self.timeout_s / 2)

    def hold_s(self, level: int) -> float:
        """The hold of the ``level``-th flap (1-based): 30, 60, 120, … capped."""
        return min(self.hold_base_s * 2 ** max(level - 1, 0), self.hold_max_s)


@dataclass(frozen=True)
class Beat:
    """One accepted heartbeat as the receiver saw it; ``received`` is monotonic time at arrival, ``received_wall``
    the wall clock then (for records; None: same as ``received``, as in tests with one fake clock)."""

    node: str
    boot: int
    seq: int
    sent: float
    received: float
    healthy: bool = True
    problems: tuple[str, ...] = ()
    received_wall: float | None = None
    stopping_s: float = 0.0
    suspect_jobs: tuple[int, ...] = ()
    throttled: tuple[str, ...] = ()
    stragglers: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class NodeLiveness:
    """Soft state of one node; rebuilt from beats (and Slurm's reasons) after a restart.

    Attributes:
        last_beat: arrival time of the newest beat (monotonic); ``last_beat_wall`` the same on the wall clock.
        healthy_since: start of the current unbroken run of healthy beats (None after an unhealthy one).
        lost_at: when we declared it lost (None while we consider it alive).
        claimed: we have set it DOWN/DRAIN and owe it a RESUME (cause of the claim).
        issued_at: when that claim's actions were last issued (for the retry of a refused action).
        losses: loss times inside the flap window.
        flap_level: how many flap holds in a row (sets the back-off).
        hold_until: do not resume before this.
        quiet_until: its agent announced a clean stop: silence until then is no loss (0: none announced).
        suspected_at: when a report last named it (a peer of one of its jobs saw a peer die; -inf: never), by
            whom (``suspected_by``, the reporting node) and for which job (``suspected_job``).
        throttled: its GPUs a slowing clock reason holds down, as its last beat said (NVML); ``throttled_at``
            when a beat last said any.
        straggler: a confirmed straggler report (a job of this node flagged it, and ``throttled`` agreed): the
            drain reason to set; "" when none.
    """

    last_beat: float
    boot: int = 0
    seq: int = 0
    healthy: bool = True
    problems: tuple[str, ...] = ()
    healthy_since: float | None = None
    lost_at: float | None = None
    claimed: Cause | None = None
    issued_at: float = 0.0
    losses: tuple[float, ...] = ()
    flap_level: int = 0
    hold_until: float = 0.0
    last_beat_wall: float = 0.0
    quiet_until: float = 0.0
    suspected_at: float = float("-inf")
    suspected_by: str = ""
    suspected_job: int = 0
    throttled: tuple[str, ...] = ()
    throttled_at: float = float("-inf")
    straggler: str = ""

    def limit_s(self, now: float, cfg: LivenessConfig) -> float:
        """The silence after which this node is lost now: shorter while a report names it."""
        return cfg.suspect_timeout_s if now - self.suspected_at <= cfg.suspect_ttl_s else cfg.timeout_s


@dataclass(frozen=True)
class DetectorState:
    """All nodes' soft state. ``suppressed`` lists the nodes the mass-loss guard (or ``hold_losses``) kept alive in
    the last call; ``faults`` the nodes whose judgement raised in the last call (node → error text)."""

    started_at: float
    nodes: Mapping[str, NodeLiveness] = field(default_factory=lambda: MappingProxyType({}))
    suppressed: tuple[str, ...] = ()
    faults: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: straggler reports of the last call not believed: (job, node, why), for the runtime's event log
    unconfirmed: tuple[tuple[int, str, str], ...] = ()

    @classmethod
    def fresh(cls, now: float) -> DetectorState:
        """The state of a controller that has just started (it judges nobody for one timeout)."""
        return cls(started_at=now)


@dataclass(frozen=True)
class NodeAction:
    """What to do to a node in Slurm, and why (rendered to scontrol argv by the adapter).

    ``silent_s``/``last_seq``/``last_beat`` describe the evidence, for the event log (``last_beat`` on the wall
    clock).
    """

    node: str
    kind: NodeActionKind
    reason: str
    cause: Cause
    silent_s: float = 0.0
    last_seq: int = 0
    last_beat: float = 0.0
    reported_by: str = ""  # a loss judged on a report: the reporting node, and the job (0: none)
    report_job: int = 0


def is_ours(reason: str | None) -> bool:
    """A reason this controller set (a loss, a flap, an unhealthy agent, a straggler), not an admin's."""
    return bool(reason) and reason.startswith((REASON_PREFIX, STRAGGLER_PREFIX)) and ADMIN_MARK not in reason


def held_until(reason: str | None) -> float:
    """The hold deadline written in a flapping reason (0 when there is none): survives controller restarts."""
    m = _HELD_UNTIL.search(reason or "")
    if not m:
        return 0.0
    return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def _admin_drained(node: NodeInfo | None) -> str | None:
    """The admin's reason when someone other than nuro drained/downed the node, else None."""
    if node is None or not (node.is_drained or "DOWN" in node.flags):
        return None
    if node.reason and not node.reason.startswith((REASON_PREFIX, STRAGGLER_PREFIX)):
        return node.reason
    if node.reason and ADMIN_MARK in node.reason:
        return node.reason
    return None


def _absorb(prev: NodeLiveness | None, beats: list[Beat], cfg: LivenessConfig) -> NodeLiveness:
    """Fold a node's new beats (oldest first) into its soft state."""
    cur = prev
    for b in sorted(beats, key=lambda b: (b.boot, b.seq)):
        wall = b.received if b.received_wall is None else b.received_wall
        if cur is None:
            cur = NodeLiveness(last_beat=b.received, boot=b.boot, seq=b.seq, last_beat_wall=wall)
        # A gap longer than the timeout breaks the healthy streak: the node must prove itself again.
        gap = b.received - cur.last_beat
        streak_start = cur.healthy_since if (cur.healthy_since is not None and gap <= cfg.timeout_s) else None
        cur = replace(
            cur,
            last_beat=max(cur.last_beat, b.received),
            last_beat_wall=max(cur.last_beat_wall, wall),
            boot=b.boot,
            seq=b.seq,
            healthy=b.healthy,
            problems=tuple(b.problems),
            healthy_since=(streak_start if streak_start is not None else b.received) if b.healthy else None,
            # a stopping beat opens a quiet period; any other beat (the restarted agent's first) closes it
            quiet_until=b.received + min(b.stopping_s, MAX_STOP_GRACE_S) if b.stopping_s > 0 else 0.0,
            throttled=tuple(b.throttled),
            throttled_at=b.received if b.throttled else cur.throttled_at,
        )
    if cur is None:
        raise ValueError("_absorb needs a previous state or at least one beat")
    return cur


def assess(
    state: DetectorState,
    beats: Iterable[Beat],
    slurm_nodes: Mapping[str, NodeInfo],
    now: float,
    cfg: LivenessConfig,
    wall: float | None = None,
    hold_losses: bool = False,
    job_nodes: Mapping[int, Iterable[str]] | None = None,
) -> tuple[list[NodeAction], DetectorState]:
    """Fold in the beats received since the last call, judge every node that has ever beaten, return actions.

    Args:
        state: the previous result (``DetectorState.fresh(now)`` at start).
        beats: accepted beats since the last call (authenticated and de-duplicated by the receiver).
        slurm_nodes: node name → Slurm's latest view (state flags, reason); may be a few seconds old.
        now: monotonic seconds (the clock of every time in the state).
        cfg: the detector settings.
        wall: the wall clock now, only for texts and records (None: ``now``, for tests with one fake clock).
        hold_losses: declare nobody newly lost in this call (the receiver saw the kernel drop datagrams: silence is
            no evidence then); the silent nodes are listed in ``suppressed`` like the mass-loss guard's.
        job_nodes: the nodes of each job a beat's ``suspect_jobs`` names (Slurm's word, read by the runtime); a
            job missing here names nobody.

    Returns:
        (actions in the order they must be applied, the next state). Applying an action twice is harmless; an
        action Slurm refused is re-issued after ``cfg.retry_s`` while Slurm still disagrees.
    """
    wall = now if wall is None else wall
    by_node: dict[str, list[Beat]] = {}
    for b in beats:
        by_node.setdefault(b.node, []).append(b)
    nodes = dict(state.nodes)
    faults: dict[str, str] = {}
    for name, node_beats in by_node.items():
        try:
            nodes[name] = _absorb(nodes.get(name), node_beats, cfg)
        except Exception as exc:  # noqa: BLE001 - one node's odd beats must not stop the others' judgement
            faults[name] = f"beats: {type(exc).__name__}: {exc}"
    for b in beats:  # in-band reports: the job's other nodes, as Slurm lists them, are judged on a shorter silence
        for job in b.suspect_jobs:
            for name in (job_nodes or {}).get(job, ()):
                cur = nodes.get(name)
                if name != b.node and cur is not None and b.received >= cur.suspected_at:
                    nodes[name] = replace(cur, suspected_at=b.received, suspected_by=b.node, suspected_job=job)
    unconfirmed: list[tuple[int, str, str]] = []
    for b in beats:  # straggler reports: believed only for a node of the reporting job whose own NVML agrees
        for job, name, slowdown in b.stragglers:
            held = set((job_nodes or {}).get(job, ()))
            cur = nodes.get(name)
            if b.node not in held or name not in held or cur is None:
                unconfirmed.append((job, name, "not a node of that job (Slurm)"))
            elif not cur.throttled:
                unconfirmed.append((job, name, "its GPUs report no slowing clock reason (NVML)"))
            elif not cur.straggler:
                why = f"{STRAGGLER_PREFIX}job {job} ran {slowdown:.2f}x slower here; {'; '.join(cur.throttled)}"
                nodes[name] = replace(cur, straggler=_clip(why))
    actions: list[NodeAction] = []
    suppressed: tuple[str, ...] = ()
    if now - state.started_at >= cfg.timeout_s:  # restart grace: judge nobody before one full timeout
        # nodes whose agent announced a clean stop are neither silent nor alive for the mass-loss guard: a rolling
        # restart of agents must not hide a real loss beside it, nor count as one
        judged = {n: cur for n, cur in nodes.items() if cur.lost_at is None and now >= cur.quiet_until}
        newly_silent = [n for n, cur in judged.items() if now - cur.last_beat > cur.limit_s(now, cfg)]
        alive = list(judged)
        mass = len(newly_silent) >= cfg.mass_loss_min and len(newly_silent) > cfg.mass_loss_fraction * len(alive)
        if newly_silent and (mass or hold_losses):
            suppressed = tuple(sorted(newly_silent))
        for name in sorted(nodes):
            snode = slurm_nodes.get(name)
            if snode is None or name in suppressed:
                continue  # an agent Slurm does not know (renamed node, typo), or held by the mass-loss guard
            try:
                new, acts = _judge(nodes[name], name, snode, now, cfg, wall)
            except Exception as exc:  # noqa: BLE001 - isolate the node: the rest are still judged
                faults[name] = f"{type(exc).__name__}: {exc}"
                continue
            nodes[name] = new
            actions.extend(acts)
    return actions, DetectorState(
        started_at=state.started_at, nodes=MappingProxyType(nodes), suppressed=suppressed,
        faults=MappingProxyType(faults), unconfirmed=tuple(unconfirmed),
    )  # fmt: skip


def _judge(
    cur: NodeLiveness, name: str, snode: NodeInfo, now: float, cfg: LivenessConfig, wall: float | None = None
) -> tuple[NodeLiveness, list[NodeAction]]:
    wall = now if wall is None else wall
    silent = now - cur.last_beat
    limit = cur.limit_s(now, cfg)
    admin = _admin_drained(snode)
    # 0. Quiet: its agent said it was stopping on purpose, and the silence it announced has not run out.
    if silent > limit and cur.lost_at is None and now < cur.quiet_until:
        return cur, []
    # 1. Lost: silent for longer than the timeout (shorter when reported), first time since it was last alive.
    if silent > limit and cur.lost_at is None:
        reported = limit < cfg.timeout_s and silent <= cfg.timeout_s  # the report made the difference
        losses = tuple(t for t in cur.losses if now - t <= cfg.flap_window_s) + (now,)
        flapping = len(losses) >= cfg.flap_losses
        level = cur.flap_level + 1 if flapping else 0  # back-off grows only while it keeps flapping
        hold = cfg.hold_s(level) if flapping else 0.0
        if flapping:
            reason = (
                f"nuro: flapping ({len(losses)} losses in {cfg.flap_window_s:.0f} s), held {hold:.0f} s "
                f"until {_iso(wall + hold)}"
            )
        else:
            said = "; its agent said it was stopping" if cur.quiet_until else ""
            why = f" after job {cur.suspected_job}'s ranks on {cur.suspected_by} lost a peer" if reported else ""
            reason = f"nuro: no heartbeat for {silent:.1f} s{why} (last seq {cur.seq}{said})"
        if admin is not None:
            reason = f"{reason} {ADMIN_MARK} {admin})"
        cause = Cause.FLAPPING if flapping else Cause.LOST
        new = replace(
            cur, lost_at=now, claimed=cause, issued_at=now, losses=losses, flap_level=level,
            hold_until=now + hold if flapping else cur.hold_until, healthy_since=None,
        )  # fmt: skip
        evidence = {"silent_s": silent, "last_seq": cur.seq, "last_beat": cur.last_beat_wall or cur.last_beat}
        if reported:
            evidence.update(reported_by=cur.suspected_by, report_job=cur.suspected_job)
        return new, [
            NodeAction(name, NodeActionKind.DOWN, _clip(reason), cause, **evidence),
            NodeAction(name, NodeActionKind.DRAIN, _clip(reason), cause, **evidence),
        ]
    # 2. Still lost (no beat since): make sure Slurm has it (a refused scontrol, or Slurm's "Not responding").
    if cur.lost_at is not None and cur.last_beat <= cur.lost_at:
        if now - cur.issued_at >= cfg.retry_s and not ("DOWN" in snode.flags and snode.is_drained):
            reason = (
                snode.reason if is_ours(snode.reason) else f"nuro: no heartbeat for {silent:.1f} s (last seq {cur.seq})"
            )
            evidence = {"silent_s": silent, "last_seq": cur.seq, "last_beat": cur.last_beat_wall or cur.last_beat}
            cause = cur.claimed or Cause.LOST
            return replace(cur, issued_at=now), [
                NodeAction(name, NodeActionKind.DOWN, _clip(reason), cause, **evidence),
                NodeAction(name, NodeActionKind.DRAIN, _clip(reason), cause, **evidence),
            ]
        return cur, []
    if cur.lost_at is not None:
        cur = replace(cur, lost_at=None)  # beating again; the claim (and resume) is handled below
    # 3. Unhealthy: the agent's own probe failed. Never overwrite an admin's drain reason.
    if not cur.healthy:
        if admin is not None or (cur.claimed is not None and snode.is_drained and is_ours(snode.reason)):
            return cur, []
        if cur.claimed is None or now - cur.issued_at >= cfg.retry_s:
            problems = "; ".join(cur.problems) or "agent reported unhealthy"
            reason = _clip(f"nuro: unhealthy: {problems}")
            new = replace(cur, claimed=cur.claimed or Cause.UNHEALTHY, issued_at=now)
            return new, [NodeAction(name, NodeActionKind.DRAIN, reason, Cause.UNHEALTHY, last_seq=cur.seq,
                                    last_beat=cur.last_beat_wall or cur.last_beat)]  # fmt: skip
        return cur, []
    # 3b. Straggler: a job flagged it and its own NVML agrees (``assess``). Drained (never over an admin's drain)
    # until its beats have shown no slowing clock reason for ``straggler_clear_s``; step 4 then resumes it.
    if cur.straggler:
        if now - cur.throttled_at >= cfg.straggler_clear_s and not cur.throttled:
            cur = replace(cur, straggler="")  # cleared: a new report may claim it again
        elif admin is not None:
            return cur, []
        elif cur.claimed is None or (
            now - cur.issued_at >= cfg.retry_s and not (snode.is_drained and is_ours(snode.reason))
        ):
            new = replace(cur, claimed=Cause.STRAGGLER, issued_at=now)
            return new, [NodeAction(name, NodeActionKind.DRAIN, cur.straggler, Cause.STRAGGLER, last_seq=cur.seq,
                                    last_beat=cur.last_beat_wall or cur.last_beat)]  # fmt: skip
        else:
            return cur, []
    # 4. Recovered: healthy long enough, hold passed, and the reason in Slurm is still ours.
    ours_in_slurm = (snode.is_drained or "DOWN" in snode.flags) and is_ours(snode.reason)
    if cur.claimed is None and (not ours_in_slurm or now - cur.issued_at < cfg.retry_s):
        return cur, []  # nothing of ours, or a RESUME just issued that the (older) node list does not show yet
    if cur.claimed is not None and not ours_in_slurm and now - cur.issued_at >= cfg.retry_s:
        # Someone else changed the node (an admin resumed it, or drained it with their own reason): let go.
        return replace(cur, claimed=None), []
    in_reason = held_until(snode.reason)  # wall clock, from Slurm: as monotonic time
    hold_until = max(cur.hold_until, now + (in_reason - wall) if in_reason else 0.0)
    streak_ok = cur.healthy_since is not None and now - cur.healthy_since >= cfg.recover_intervals * cfg.interval_s
    if ours_in_slurm and (snode.reason or "").startswith(STRAGGLER_PREFIX) and cur.healthy_since is not None:
        # a straggler drain lifts only after straggler_clear_s of beats without a slowing reason (also when this
        # controller did not see it set: a restart forgot the claim; counted from the first beat heard)
        streak_ok = streak_ok and now - max(cur.throttled_at, cur.healthy_since) >= cfg.straggler_clear_s
    if ours_in_slurm and streak_ok and now >= hold_until:
        resume = NodeAction(name, NodeActionKind.RESUME, snode.reason or "", Cause.RECOVERED, last_seq=cur.seq,
                            last_beat=cur.last_beat_wall or cur.last_beat)  # fmt: skip
        return replace(cur, claimed=None, hold_until=hold_until, issued_at=now), [resume]
    return replace(cur, hold_until=hold_until), []
