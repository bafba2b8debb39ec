"""``python -m trainscale.doctor [--network] [--workers N] [--json]``: the report from this process (or rank)."""

from trainscale.doctor.main import main

raise SystemExit(main())
