"""The launcher: `python -m flightdeck.agent script.py args...` (or `-m module`), which starts the
agent right after the program's `init_process_group`, with no change to the program."""

from __future__ import annotations

import logging
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from flightdeck.agent.api import start
from flightdeck.agent.settings import AgentConfig

logger = logging.getLogger("flightdeck.agent")


def install_init_hook() -> None:
    """Wrap `torch.distributed.init_process_group` so that the agent starts right after it returns."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group
    if getattr(original, "__flightdeck_wrapped__", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            start()
        except Exception:  # start() guards itself; belt and braces: never fail the user's init
            logger.warning("flightdeck agent: start failed", exc_info=True)
        return result

    init_process_group.__flightdeck_wrapped__ = True  # type: ignore[attr-defined]
    init_process_group.__doc__ = original.__doc__
    init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
    # Modules that imported the function by name before us keep the original; patch those loaded.
    for module in (dist, distributed_c10d, *_modules_binding(original)):
        if getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group


def _modules_binding(fn: object) -> Iterator[Any]:
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.") and getattr(module, "init_process_group", None) is fn:
            yield module


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m flightdeck.agent [-m module | script.py] args...`: run the training program with
    the agent started right after its `init_process_group`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        from flightdeck import agent  # the package's docstring says what the agent is

        print(
            "usage: python -m flightdeck.agent (SCRIPT | -m MODULE) [ARGS...]\n\n"
            + agent.__doc__.split("\n\n")[0]
        )
        return 0 if args else 2
    try:
        enabled = AgentConfig.from_env().enabled
    except ValueError as exc:
        logger.warning("flightdeck agent: bad configuration (%s); running without it", exc)
        enabled = False
    if enabled:
        os.environ["FLIGHTDECK_AGENT_ENABLED"] = "1"  # so child interpreters can tell the agent is wanted
        try:
            install_init_hook()
        except Exception:
            logger.warning("flightdeck agent: could not hook init_process_group", exc_info=True)
    if args[0] == "-m":
        if len(args) < 2:
            print("flightdeck.agent: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        # Like `python script.py`: the script's directory comes first on sys.path.
        sys.path.insert(0, str(Path(args[0]).resolve().parent))
        runpy.run_path(args[0], run_name="__main__")
    return 0
