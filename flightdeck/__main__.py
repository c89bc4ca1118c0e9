"""`python -m flightdeck` is the `flightdeck` command."""

from flightdeck.cli import main

raise SystemExit(main())
