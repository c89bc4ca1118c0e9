"""`python -m flightdeck.dashboards`: same as `flightdeck dashboards build`."""

from flightdeck.dashboards.cmd import main

raise SystemExit(main())
