"""Write the demo's synthetic regression dataset: one file per sample, ``rows/<i>.f32`` (17 little-endian float32:
16 features and a target), so the job reads it sample by sample through ``SnapshotDataset``.

Deterministic (fixed seed), so every snapshot of it has the same digest: ``nuro-train dataset snapshot DIR
--name demo-synth --tag v1`` twice writes nothing new the second time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

FEATURES = 16


def make(out_dir: Path, samples: int = 8192, seed: int = 1234) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, FEATURES), dtype=np.float32)
    w = rng.standard_normal(FEATURES).astype(np.float32)
    y = np.tanh(x @ w / 4) + 0.05 * rng.standard_normal(samples).astype(np.float32)
    rows = np.concatenate([x, y[:, None]], axis=1).astype("<f4")
    path = out_dir / "rows"
    path.mkdir(parents=True, exist_ok=True)
    for i, row in enumerate(rows):
        (path / f"{i:05d}.f32").write_bytes(row.tobytes())
    return path


if __name__ == "__main__":
    print(make(Path(sys.argv[1] if len(sys.argv) > 1 else "demo-synth")))
