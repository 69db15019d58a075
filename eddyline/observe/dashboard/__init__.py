"""The web dashboard (``eddyline run --ui``, ``eddyline ui CHECKPOINT``): :mod:`.views` draws the
sections from the progress records, :mod:`.app` serves them with ``/metrics`` and the control
API, :mod:`.server` runs it beside the engine."""
