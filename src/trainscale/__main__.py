from trainscale.cli.main import main

raise SystemExit(main())
