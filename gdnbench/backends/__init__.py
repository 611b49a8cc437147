"""Backend registry.

Every backend, built-in or not, is found through the ``gdnbench.backends`` entry-point group
(pyproject.toml lists the built-ins there), so a third-party package adds one without editing
gdnbench. A suite or ``--backends`` may also name ``module.path:attribute`` directly.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from functools import cache

from gdnbench.backends.base import Backend, Outputs, Prepared, backend
from gdnbench.suite import did_you_mean

__all__ = ["Backend", "Outputs", "Prepared", "backend", "registry", "get_backend", "UnknownBackend"]

GROUP = "gdnbench.backends"


class UnknownBackend(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@cache
def registry() -> dict[str, Backend]:
    """All registered backends by name. A plugin that fails to load becomes an unavailable backend."""
    found: dict[str, Backend] = {}
    for ep in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
            if not isinstance(obj, Backend):
                raise TypeError(f"{ep.value} is a {type(obj).__name__}, not a gdnbench Backend")
            if obj.name != ep.name:
                raise ValueError(f"{ep.value} is named {obj.name!r} but registered as {ep.name!r}")
            found[ep.name] = obj
        except Exception as e:  # a broken plugin must not take the harness down
            found[ep.name] = _broken(ep.name, f"{ep.value} failed to load: {type(e).__name__}: {e}")
    if not found:
        raise RuntimeError("no gdnbench backends are registered: install gdnbench (`make install`)")
    return found


def get_backend(name: str) -> Backend:
    """A registered backend, or ``module.path:attribute`` naming a Backend object."""
    if name in registry():
        return registry()[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise UnknownBackend(f"cannot load backend {name!r}: {e}") from None
        if not isinstance(obj, Backend):
            raise UnknownBackend(f"{name!r} is a {type(obj).__name__}, not a gdnbench Backend")
        return obj
    raise UnknownBackend(f"no backend named {name!r}{did_you_mean(name, registry())} "
                         f"(`gdnbench list` shows the {len(registry())} registered)")


def _broken(name: str, reason: str) -> Backend:
    def prepare(_problem):  # never called: unavailable() says why first
        raise RuntimeError(reason)

    return Backend(name=name, prepare=prepare, ops=frozenset(), load_error=reason)
