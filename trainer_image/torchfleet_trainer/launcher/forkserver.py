"""What the launcher's forkserver imports once, before it forks any worker.

The launcher starts a multiprocessing forkserver with this module preloaded
(``launch.start_forkserver``) as it starts, and its elastic agent forks every
worker from it (start method "forkserver", ``worker.run``). A worker then
starts with torch and the trainer already imported: about 3.5 s of CPU per
process on a 2-core machine that every worker of every in-place or elastic
round paid again, all at once, before this.

Only imports: the server must stay a single thread with no CUDA context, or
forking it would be unsafe. ``torch._dynamo`` (with inductor and triton) is
imported by the first step anyway; it is imported here so that a restarted
worker does not pay for it either.

The server takes a session of its own, as the agent gives every process it
spawns: a signal for the launcher's process group (a terminal's, a
supervisor's) reaches neither the workers nor the server the launcher needs
to see its workers exit. Python's forkserver ignores an ImportError here: a
worker then imports what it needs itself, slower but the same.
"""

from __future__ import annotations

import contextlib
import os

import torch._dynamo  # noqa: F401

import torchfleet_trainer.launcher.worker
import torchfleet_trainer.train  # noqa: F401

with contextlib.suppress(PermissionError):  # already a group leader: keep it
    os.setsid()
