"""``nuro.runevents``, the name training code used before the move (``from nuro import runevents``).

The module is ``nuro.lifecycle.run_events``. Training code is pinned to a commit and re-run on every requeue and
``nuro-train resume``, so a commit that copied the example's import must keep working: this name is the same module
object, not a copy. New code imports ``nuro.lifecycle.run_events``.
"""

import sys

from nuro.lifecycle import run_events

sys.modules[__name__] = run_events
