"""A pydantic-settings source for the old `FLIGHTDECK_<SETTING>` names (see `flightdeck.env_names`).

Placed after the environment source of the new prefix, so a new name always wins; every old name
found warns, naming the new one.
"""

from __future__ import annotations

from typing import Any

from pydantic_settings import BaseSettings, EnvSettingsSource

from flightdeck.env_names import LEGACY_PREFIX, warn_legacy


class LegacyEnvSource(EnvSettingsSource):
    """The settings of `settings_cls` read from `FLIGHTDECK_<FIELD>` (decoded as the environment
    source decodes: JSON for lists), for the fields whose `<prefix><FIELD>` is unset."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        *,
        prefix: str,
        process: str,
        exclude: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(settings_cls, env_prefix=LEGACY_PREFIX)
        self._prefix = prefix
        self._process = process
        #: Fields never read under the old name (e.g. an old name that now is another setting's).
        self._exclude = exclude

    def __call__(self) -> dict[str, Any]:
        """The old-name values, each warned about; those shadowed by a new name left out."""
        found = super().__call__()
        out: dict[str, Any] = {}
        for field, value in found.items():
            if field in self._exclude:
                continue
            old, new = LEGACY_PREFIX + field.upper(), self._prefix + field.upper()
            if new.lower() in self.env_vars:
                warn_legacy(old, new, process=self._process, ignored=True)
            else:
                warn_legacy(old, new, process=self._process)
                out[field] = value
        return out
