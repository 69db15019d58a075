"""Eddyline: adaptive stream processing on Apache Spark.

Build a network in Python or load it from YAML, then run it in epochs on Spark::

    import eddyline
    net = eddyline.Network("hot-auctions")
    bids = net.source("bids", eddyline.Nexmark(stream="bid", rate=50_000))
    (bids.filter("price > 100")
         .window_aggregate(key="auction", time="date_time", window=eddyline.sliding("10s", "2s"),
                           aggregates={"bids": "count(*)", "top": "max(price)"}, watermark_delay="4s")
         .to(eddyline.Files("out/hot", format="parquet")))
    net.run(checkpoint="ckpt/", epochs=20)
"""

# The built-in source, step and sink kinds register themselves when imported; the spec layer
# finds them in its registries (STEPS in eddyline.api.steps, SOURCES, SINKS) without importing them.
from eddyline import io, kinds  # noqa: F401  (registers the built-in kinds)
from eddyline.api.builder import Stream, sliding, tumbling
from eddyline.api.network import NetworkSpec
from eddyline.api.units import Files, Window
from eddyline.api.validate import load_spec
from eddyline.errors import CheckpointError, EddylineError, SpecError
from eddyline.facade import Network, validate
from eddyline.io.console import Console
from eddyline.io.discard import Discard
from eddyline.io.generator import Generator, Phase
from eddyline.io.memory import Memory
from eddyline.io.nexmark import Nexmark

__all__ = [
    "CheckpointError",
    "Console",
    "Discard",
    "EddylineError",
    "Files",
    "Generator",
    "Memory",
    "Network",
    "NetworkSpec",
    "Nexmark",
    "Phase",
    "SpecError",
    "Stream",
    "Window",
    "load_spec",
    "sliding",
    "tumbling",
    "validate",
]
__version__ = "0.1.0"
