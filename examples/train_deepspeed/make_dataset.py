"""Write the DeepSpeed example's synthetic multi-agent tracks: one scene per file, ``scenes/<i>.f32``.

A scene is what a Prediction team's model sees around an autonomous vehicle: ``AGENTS`` road users, each with
``PAST`` observed positions and ``FUTURE`` positions to predict, sampled every 0.1 s (little-endian float32,
shape ``(AGENTS, PAST + FUTURE, 2)``, metres). Agents move with their own speed and turn rate and drift toward their
neighbours' mean heading (so the future of one depends on the others: the model must look across agents), plus
measurement noise.

Deterministic (fixed seed): every snapshot of it has the same digest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

AGENTS, PAST, FUTURE = 8, 12, 8
DT = 0.1


def scene(rng: np.random.Generator) -> np.ndarray:
    pos = rng.uniform(-20, 20, (AGENTS, 2))
    heading = rng.uniform(-np.pi, np.pi, AGENTS)
    speed = rng.uniform(2, 12, AGENTS)
    turn = rng.normal(0, 0.15, AGENTS)
    track = np.empty((AGENTS, PAST + FUTURE, 2), dtype=np.float64)
    for t in range(PAST + FUTURE):
        track[:, t] = pos
        mean = np.arctan2(np.sin(heading).mean(), np.cos(heading).mean())
        heading = heading + DT * (turn + 0.5 * np.sin(mean - heading))
        pos = pos + DT * speed[:, None] * np.stack([np.cos(heading), np.sin(heading)], axis=1)
    track += rng.normal(0, 0.05, track.shape)
    return track.astype("<f4")


def make(out_dir: Path, scenes: int = 2048, seed: int = 4321) -> Path:
    rng = np.random.default_rng(seed)
    path = out_dir / "scenes"
    path.mkdir(parents=True, exist_ok=True)
    for i in range(scenes):
        (path / f"{i:05d}.f32").write_bytes(scene(rng).tobytes())
    return path


if __name__ == "__main__":
    print(make(Path(sys.argv[1] if len(sys.argv) > 1 else "demo-tracks")))
