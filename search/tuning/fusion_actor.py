"""The Ray actor around a device's fused-array host (:mod:`search.tuning.fusion`).

Defined here, free of PyTorch, so the driver can start it without importing a framework;
the actor's own process imports the host (``trainables/torch/fused_host.py``) by name and
forwards the members' calls to it. What the driver starts::

    ray.remote(HostActor).options(name=..., num_cpus=..., num_gpus=...).remote(
        "trainables.torch.fused_host:Host", "trainables.torch.cnn:build_model",
        defaults, data_ref, members, threads, "cpu")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from search.contract.registry import resolve_function


class HostActor:
    """Builds the host named ``host`` in its process and forwards the members' calls."""

    def __init__(
        self,
        host: str,
        build_model: str,
        defaults: Mapping[str, Any],
        data: Any,
        members: int,
        threads: int,
        device: str,
        micro_batch: int | None = None,
    ) -> None:
        make, build = resolve_function(host), resolve_function(build_model)
        self.host = make(build, data, members, threads, device, defaults, micro_batch)

    def gpu(self) -> str | None:
        """The GPU id Ray gave this host (``None`` on CPUs)."""
        import ray

        ids = ray.get_gpu_ids()
        return str(ids[0]) if ids else None

    def join(self, number: int, config: dict[str, Any], seed: int, max_epochs: int) -> None:
        """A trial takes a slot (:meth:`trainables.torch.fused_host.Host.join`)."""
        self.host.join(number, config, seed, max_epochs)

    def next(self, number: int) -> Any:
        """The trial's next epoch, and whether it was its last."""
        return self.host.next(number)

    def leave(self, number: int) -> None:
        """The trial ended: its slot frees."""
        self.host.leave(number)
