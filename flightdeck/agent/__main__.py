"""`python -m flightdeck.agent`: the launcher (`flightdeck.agent.launcher.main`)."""

from flightdeck.agent.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
