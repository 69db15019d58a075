"""The fault matrix of issue #22: a network over a sequence-numbered NATS stream, faults applied to
its driver, an executor and its servers, and a verifier that accounts for every sequence number in
every sink. :mod:`.harness` holds the parts (the tests import them), :mod:`.cells` the faults,
:mod:`.matrix` runs every cell as a benchmark."""
