"""What runs inside one process: its event loop (``loop``), a service run until a signal
(``serve``), its supervised background tasks (``supervisor``), a component's own entry point
(``entry``), and the garbage collector paused for batch work (``collector``)."""
