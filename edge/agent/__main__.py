"""``python -m edge.agent``: the agent without the ``edgekit`` CLI's imports (see ``edge.agent.main``)."""

from edge.agent.main import main

raise SystemExit(main())
