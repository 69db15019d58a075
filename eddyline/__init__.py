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

from eddyline.api.builder import Network, Stream, sliding, tumbling
from eddyline.api.spec import Console, Files, Generator, Memory, NetworkSpec, Nexmark, Phase, Window
from eddyline.api.validate import load_spec, validate
from eddyline.errors import CheckpointError, EddylineError, SpecError

__all__ = [
    "CheckpointError",
    "Console",
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
