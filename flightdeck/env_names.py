"""The environment variable prefixes of Flightdeck's processes, one each, and the old shared one.

    flightdeck server       FLIGHTDECK_SERVER_<SETTING>      (server/settings.py)
    flightdeck collector    FLIGHTDECK_COLLECTOR_<SETTING>   (collector/settings.py)
    the in-job agent        FLIGHTDECK_AGENT_<SETTING>       (flightdeck/agent/settings.py)
    flightdeck up           FLIGHTDECK_UP_<SETTING>          (flightdeck/launch/up.py)

The three processes used to read `FLIGHTDECK_<SETTING>` alike, so one name meant two things:
`FLIGHTDECK_HOST` was the server's bind address and the collector's reported host name,
`FLIGHTDECK_STALL_AFTER_S` was read by the agent and the server. The old names are still read for
one release: each use warns (a `LegacyEnvWarning`, which is a DeprecationWarning, and a log
warning, once per process and name) and names the new variable; when both are set, the new one
wins. Standard library only: the agent and the collector import this.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

#: The prefix all processes shared before; read for one more release.
LEGACY_PREFIX = "FLIGHTDECK_"
SERVER_PREFIX = "FLIGHTDECK_SERVER_"
COLLECTOR_PREFIX = "FLIGHTDECK_COLLECTOR_"
AGENT_PREFIX = "FLIGHTDECK_AGENT_"
#: Not a setting of one process: set (non-empty), the dump reader of every process leaves its C
#: pass unused and reads entries in Python only (the same results; for tests and benches).
READER_PURE_PYTHON = "FLIGHTDECK_READER_PURE_PYTHON"

_logged: set[str] = set()


class LegacyEnvWarning(DeprecationWarning):
    """An old `FLIGHTDECK_<SETTING>` variable was read (or ignored for its new name)."""


def legacy_message(old: str, new: str, *, process: str, ignored: bool) -> str:
    """What the warning about `old` says."""
    if ignored:
        return f"{process}: {old} is ignored because {new} is set (the new name wins); remove {old}"
    return (
        f"{process}: {old} is deprecated, set {new} instead "
        f"({old} is still read in this release, then no more)"
    )


def warn_legacy(old: str, new: str, *, process: str, ignored: bool = False) -> None:
    """Warn that the old variable `old` was used (or, `ignored`, shadowed by `new`)."""
    message = legacy_message(old, new, process=process, ignored=ignored)
    warnings.warn(message, LegacyEnvWarning, stacklevel=3)
    if old not in _logged:
        _logged.add(old)
        # Imported here: `flightdeck analyze` imports this module (the reader's switch) and
        # otherwise logs nothing; `logging` was ~15-20 ms of its start-up.
        import logging

        logging.getLogger("flightdeck.env").warning("%s", message)


def legacy_values(
    env: Mapping[str, str], *, prefix: str, names: Iterable[str], process: str
) -> dict[str, str]:
    """`{name: value}` of the settings `names` (lower case) found only under their old variable
    (`FLIGHTDECK_<NAME>`), not their new one (`<prefix><NAME>`); warns for each old one set."""
    out: dict[str, str] = {}
    for name in names:
        old, new = LEGACY_PREFIX + name.upper(), prefix + name.upper()
        if old not in env or old == new:
            continue
        if new in env:
            warn_legacy(old, new, process=process, ignored=True)
        else:
            warn_legacy(old, new, process=process)
            out[name] = env[old]
    return out
