"""One epoch as a sequence of stages, one module each: :mod:`.plan`, (log: the checkpoint),
:mod:`.execute`, :mod:`.publish`, :mod:`.fold`, :mod:`.observe`, :mod:`.commit`, :mod:`.report`.
:mod:`.records` holds what they hand each other. :mod:`eddyline.runtime.engine` plans and logs an
epoch, and :mod:`.stages` runs the rest of it in order."""
