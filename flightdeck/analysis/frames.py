"""Which stack frames are the user's code: the one rule, shared by the diagnosis, the CLI, the web
pages and the agent (which marks the innermost user frame of its main thread in every snapshot).

Imports nothing but the standard library and `flightdeck.records`: the in-job agent uses it.
"""

from __future__ import annotations

from collections.abc import Iterable

from flightdeck.records import Frame

#: The Flightdeck agent's own frames (in a final snapshot, taken from an exit hook on the main
#: thread, and in the main-thread samples it takes from its own thread).
AGENT_MARKER = "/flightdeck/agent"

#: Frames from these paths are plumbing, not the user's code: PyTorch's distributed layers, the
#: threading and process machinery, the agent, and frozen stdlib modules, which Python 3.11
#: names "<frozen runpy>" (hidden in text output, folded on the web pages).
LIBRARY_MARKERS: tuple[str, ...] = (
    "/torch/distributed/",
    "/torch/nn/parallel/",
    "/threading.py",
    "/runpy.py",
    "/multiprocessing/",
    AGENT_MARKER,
    "<frozen ",
)

#: Beyond LIBRARY_MARKERS, where the *innermost user frame* is never found: the rest of PyTorch
#: (`torch.save`, the data loader); Python's own library is told by its path (below). So "rank 0
#: is in save_checkpoint (train.py:88)" names the caller, not `torch/serialization.py`, and a rank
#: blocked in `queue.get` names the line that called it. `typing_extensions.py`: its `deprecated`
#: wrapper sits between the caller and torch's deprecated collectives (`all_gather_into_tensor`
#: in torch 2.13).
_NOT_USER = ("/torch/", "/typing_extensions.py")


def is_library_path(filename: str) -> bool:
    """Whether a frame from `filename` is plumbing by LIBRARY_MARKERS (what the CLI and web hide)."""
    return any(m in filename for m in LIBRARY_MARKERS)


def is_agent_frame(frame: Frame) -> bool:
    """Whether `frame` is the Flightdeck agent's own code."""
    return AGENT_MARKER in frame.filename


def is_user_frame(frame: Frame) -> bool:
    """Whether `frame` is the user's own code: not plumbing, not PyTorch, not Python's standard
    library (`.../lib/python3.X/...` outside `site-packages`), not the Flightdeck agent."""
    fn = frame.filename
    if is_library_path(fn) or any(m in fn for m in _NOT_USER) or fn.startswith("<"):
        return False
    stdlib = "/lib/python3" in fn and "/site-packages/" not in fn and "/dist-packages/" not in fn
    return not stdlib


def innermost_user_frame(frames: Iterable[Frame]) -> Frame | None:
    """The innermost (first) user frame of a stack given innermost first, or None."""
    return next((f for f in frames if is_user_frame(f)), None)


def short_location(frame: Frame) -> str:
    """`name (file.py:line)`, the file without its directory."""
    return f"{frame.name} ({frame.filename.rsplit('/', 1)[-1]}:{frame.line})"
