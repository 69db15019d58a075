"""The ``kafka`` source (:mod:`.source`) and sink (:mod:`.sink`), on librdkafka (confluent-kafka);
what they share, and why a partition's end is found by reading, is in :mod:`.client`."""

from eddyline.io.kafka.sink import KafkaOut, KafkaSink, KafkaSinkKind
from eddyline.io.kafka.source import KafkaIn, KafkaSource, KafkaSourceKind

__all__ = ["KafkaIn", "KafkaOut", "KafkaSink", "KafkaSinkKind", "KafkaSource", "KafkaSourceKind"]
