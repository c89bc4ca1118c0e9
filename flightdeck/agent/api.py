"""The process-wide agent: `start()` (the one line a training script adds) and `stop()`."""

from __future__ import annotations

import logging
import os
import threading

from flightdeck.agent.core import Agent
from flightdeck.agent.settings import AgentConfig

logger = logging.getLogger("flightdeck.agent")

_agent: Agent | None = None
_agent_lock = threading.Lock()


def start(
    *,
    spool_dir: str | os.PathLike[str] | None = None,
    interval_s: float | None = None,
    stall_after_s: float | None = None,
    job: str | None = None,
) -> Agent | None:
    """Start the agent for this process (idempotent); keyword arguments override the environment.

    Call it after `init_process_group`. Returns the running agent, or None when disabled
    (FLIGHTDECK_AGENT_ENABLED=0) or misconfigured (logged; the job goes on).
    """
    global _agent
    with _agent_lock:
        if _agent is not None:
            return _agent
        try:
            cfg = AgentConfig.from_env(
                spool_dir=spool_dir, interval_s=interval_s, stall_after_s=stall_after_s, job=job
            )
        except ValueError:
            logger.warning("flightdeck agent: bad configuration; agent not started", exc_info=True)
            return None
        if not cfg.enabled:
            return None
        _agent = Agent(cfg)
        _agent.start()
        return _agent


def stop(*, final: bool = False) -> None:
    """Stop the process-wide agent started by `start()` (for tests)."""
    global _agent
    with _agent_lock:
        if _agent is not None:
            _agent.stop(final=final)
            _agent = None
