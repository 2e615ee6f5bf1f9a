"""`python -m spark index|search|errors ...`: the same commands as `strictq`, without the rest."""

from __future__ import annotations

import sys

from spark.submit import main

sys.exit(main())
