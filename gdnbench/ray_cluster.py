"""Cases as Ray tasks (``gdnbench run SUITE --ray ADDRESS``): a cluster runs them, the driver writes the run.

Each case is one task that needs one GPU (one CPU for a CPU run), so Ray places it on a free device of any node
and sets its CUDA_VISIBLE_DEVICES; the task builds the case's inputs and reference and runs every backend
(``runner.run_case``) in Ray's worker process. Rows come back to the driver as each task finishes and go into
the run directory at once, so ``--resume`` works as for one GPU. A task whose worker dies (a crash, a lost
node) gives its case's backends CRASH rows with Ray's reason; Ray does not retry it (a retried crash would
crash again). The nodes need gdnbench and the backends' libraries installed as on the driver.
Ray is an optional extra: ``pip install gdnbench[ray]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from gdnbench.backends import get_backend
from gdnbench.results import Row, Status
from gdnbench.runner import RunOptions, run_case, status_rows
from gdnbench.shards import estimated_s
from gdnbench.suite import Case, Suite

LOCAL = "local"  # --ray local: start a Ray instance on this machine for the run


class RayUnavailable(RuntimeError):
    """Ray is not installed, or its cluster cannot be reached."""


def run_on_ray(address: str, cases: Sequence[Case], specs: dict[str, str], suite: Suite, opts: RunOptions,
               on_done: Callable[[Case, list[Row], list[dict], str | None, str], None]) -> None:
    """Run every case as a Ray task, largest first; ``on_done(case, rows, samples, None, where)`` as each ends."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray, which is not installed: pip install gdnbench[ray]") from None
    started_here = not ray.is_initialized()
    try:
        ray.init(address=None if address == LOCAL else address, ignore_reinit_error=True,
                 log_to_driver=False, include_dashboard=False)
    except Exception as e:
        raise RayUnavailable(f"--ray {address}: cannot reach a Ray cluster ({type(e).__name__}: {e})") from None
    gpu = opts.device.type == "cuda"
    task = ray.remote(num_gpus=1 if gpu else 0, num_cpus=1, max_retries=0)(run_task)
    pending = {task.remote(case, list(specs.values()), suite, opts): case
               for case in sorted(cases, key=lambda c: (-estimated_s(c), c.id))}
    try:
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            case = pending.pop(ref)
            try:
                rows, samples, where = ray.get(ref)
            except Exception as e:  # the task's worker died, or the node was lost
                reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                rows = status_rows(case, list(specs), suite, opts.device, Status.CRASH,
                                   f"the Ray task failed: {type(e).__name__}: {reason}")
                samples, where = [], "a Ray task"
            on_done(case, rows, samples, None, where)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def run_task(case: Case, specs: list[str], suite: Suite, opts: RunOptions) -> tuple[list[Row], list[dict], str]:
    """One case in a Ray worker: on the GPU Ray gave it (device 0 of its CUDA_VISIBLE_DEVICES)."""
    import ray

    if opts.device.type == "cuda":
        opts = replace(opts, device=torch.device("cuda", 0))
        torch.cuda.set_device(opts.device)
    rows, samples = run_case(case, [get_backend(s) for s in specs], suite, opts)
    node = ray.get_runtime_context().get_node_id()[:8]
    return rows, samples, f"Ray node {node}"
