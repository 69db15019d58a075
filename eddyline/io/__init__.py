"""Sources (replayable, with offsets) and sinks (idempotent by epoch), one module per kind.
Importing this package registers the built-in kinds."""

from eddyline.io import (  # noqa: F401  (each registers its kind)
    console,
    corenats,
    discard,
    files,
    generator,
    jetstream,
    kafka,
    memory,
    nexmark,
    postgres,
)
