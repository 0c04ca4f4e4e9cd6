"""python -m edgespec.engines.rowop setup | info (edgespec.engines.rowop.main)."""

from edgespec.engines.rowop import main

raise SystemExit(main())
