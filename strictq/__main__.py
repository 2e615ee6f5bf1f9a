from strictq.cli import main

raise SystemExit(main())
