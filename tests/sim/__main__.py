from tests.sim.cli import main

raise SystemExit(main())
