from memgate.cli import main

raise SystemExit(main())
