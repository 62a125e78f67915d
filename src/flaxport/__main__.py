from flaxport.cli import main

raise SystemExit(main())
