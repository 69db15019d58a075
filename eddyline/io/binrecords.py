"""Decoding binary records (Avro, Protobuf) with the writer's schema, in the Python worker that
received them, every record that does not decode kept with the reason. Pure: bytes in, Arrow
out, no Spark. The columns are a flat Spark DDL schema, as for text records
(:mod:`eddyline.io.textrecords`): each names a field of the record, of a type that converts to
the column's without loss (checked when the spec is loaded, by :meth:`Codec.check`).

Framing. A value is either the plain encoding of one record, or Confluent's wire format: a
magic byte 0, the schema's id in the registry (4 bytes, big-endian), then (Protobuf only) the
index of the message type in its file as a list of zig-zag varints, then the record. Which one
is configured, never guessed: a plain Avro record may well start with a zero byte. Records are
decoded with the configured schema whatever id they carry; ``schema_id`` makes records of
another id dead letters, where a topic's producers might move to another schema.

Avro types → columns: ``long``/``int`` → long, ``int`` → int (and short/byte if in range),
``double``/``float`` → double, ``float`` → float, ``string``/``enum`` → string, ``boolean``,
``timestamp-millis``/``-micros`` → timestamp, ``local-timestamp-*`` → timestamp_ntz, ``date``
→ date; a union of ``null`` and one of these is the same, nullable. Protobuf: the integer types
as for Avro (``uint64`` into long if in range), ``double``/``float``, ``string``, ``bool``, an
enum → its name (string) or number (long/int), ``google.protobuf.Timestamp`` → timestamp; a
field with presence (proto2, ``optional``, a message) that is absent is null, one without
presence is its default (0, "") as Protobuf has it.

A dead letter's raw text is the record in base64 (it is binary).

Writing: :func:`avro_schema_of` and :func:`avro_writer` give the Avro schema of rows of an Arrow
schema and plain Avro records of such rows (``eddyline produce --format avro``);
:func:`protobuf_descriptors_of` and :func:`protobuf_writer` a FileDescriptorSet with a message
for such rows and plain Protobuf messages of them (``--format protobuf``).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import pyarrow as pa

from eddyline.io.textrecords import TextSchema, _batch

#: a column's Spark type → the Avro types (after logical types: "timestamp-millis", ...) that fill it
_AVRO_FITS: dict[str, set[str]] = {
    "bigint": {"long", "int"}, "int": {"int"}, "smallint": {"int"}, "tinyint": {"int"},
    "double": {"double", "float", "int", "long"}, "float": {"float"},
    "string": {"string", "enum"}, "boolean": {"boolean"},
    "timestamp": {"timestamp-millis", "timestamp-micros"},
    "timestamp_ntz": {"local-timestamp-millis", "local-timestamp-micros"},
    "date": {"date"},
}
#: the same for Protobuf field types (descriptor type names, lower case; a message by its full name)
_PROTO_FITS: dict[str, set[str]] = {
    "bigint": {"int64", "sint64", "sfixed64", "int32", "sint32", "sfixed32", "uint32", "fixed32", "uint64",
               "fixed64", "enum"},
    "int": {"int32", "sint32", "sfixed32", "enum"}, "smallint": {"int32", "sint32", "sfixed32"},
    "tinyint": {"int32", "sint32", "sfixed32"},
    "double": {"double", "float"}, "float": {"float"},
    "string": {"string", "enum"}, "boolean": {"bool"},
    "timestamp": {"google.protobuf.Timestamp"},
}


class BadRecord(Exception):
    """A value that does not decode; the message is the dead letter's reason."""


def _unframe(payload: bytes, confluent: bool, schema_id: int | None, protobuf: bool) -> bytes:
    """The record's bytes of a value (see the module's Framing)."""
    if not confluent:
        return payload
    if len(payload) < 5 or payload[0] != 0:
        raise BadRecord("not in Confluent's wire format (a zero byte, then a 4-byte schema id)")
    sid = struct.unpack(">I", payload[1:5])[0]
    if schema_id is not None and sid != schema_id:
        raise BadRecord(f"written with schema id {sid}, expected {schema_id}")
    at = 5
    if protobuf:  # the message indexes: a count, then that many (a lone 0 byte: the first message)
        count, at = _zigzag(payload, at)
        for _ in range(count):
            _, at = _zigzag(payload, at)
    return payload[at:]


def _zigzag(data: bytes, at: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        if at >= len(data):
            raise BadRecord("Confluent's message indexes run past the end of the value")
        b = data[at]
        n |= (b & 0x7F) << shift
        at += 1
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), at
        shift += 7


def read_text_or_file(value: str, what: str) -> str:
    """``value`` itself if it looks like inline JSON, otherwise the text of the file it names."""
    if value.lstrip()[:1] in ("{", "[", '"'):
        return value
    try:
        return Path(value).read_text()
    except OSError as e:
        raise ValueError(f"{what}: neither inline Avro JSON nor a readable file: {e}") from e


@dataclass(frozen=True)
class Codec:
    """How the records of one source are decoded; pickled into Spark's tasks (plain data: the
    parsers are made in the task, once per process)."""

    kind: str  # "avro" | "protobuf"
    schema: str  # Avro: the schema's JSON; Protobuf: the FileDescriptorSet, base64
    message: str = ""  # Protobuf: the message type's full name
    confluent: bool = False
    schema_id: int | None = None

    # ------------------------------------------------------------------ checking, in the driver
    def load(self) -> None:
        """ValueError naming the part (``schema``, ``descriptors``, ``message``) that does not parse."""
        self._field_types()

    def check(self, columns: TextSchema) -> None:
        """ValueError naming the field when the schema does not parse or a column does not fit."""
        fields = self._field_types()
        for f, spark in zip(columns.arrow, columns.spark_names, strict=True):
            if f.name not in fields:
                raise ValueError(f"schema: column '{f.name}' is no field of the {self._what()} "
                                 f"(its fields: {sorted(fields)})")
            got, ok = fields[f.name], _AVRO_FITS if self.kind == "avro" else _PROTO_FITS
            if got not in ok.get(spark, set()):
                raise ValueError(f"schema: column '{f.name}' is {spark}, but the {self._what()} has it as {got} "
                                 f"(fits: {sorted(ok.get(spark, set())) or 'none'})")

    def _what(self) -> str:
        return "Avro schema" if self.kind == "avro" else f"Protobuf message {self.message}"

    def _field_types(self) -> dict[str, str]:
        if self.kind == "avro":
            return _avro_field_types(_avro(self.schema))
        return _proto_field_types(_proto_class(self.schema, self.message).DESCRIPTOR)

    # ------------------------------------------------------------------ decoding, in the tasks
    def decoder(self) -> Callable[[bytes], dict[str, Any]]:
        """A function from a value to its record as a dict (field → Python value), or BadRecord."""
        protobuf = self.kind == "protobuf"
        unframe = functools.partial(_unframe, confluent=self.confluent, schema_id=self.schema_id, protobuf=protobuf)
        if not protobuf:
            import fastavro

            parsed = _avro(self.schema)

            def avro(payload: bytes) -> dict[str, Any]:
                data = io.BytesIO(unframe(payload))
                try:
                    record = fastavro.schemaless_reader(data, parsed, None)
                except (EOFError, IndexError, struct.error):  # fastavro's way of running out of bytes
                    raise BadRecord("not an Avro record of the schema (the value ends inside the record)") from None
                except Exception as e:  # noqa: BLE001 (fastavro raises what the bytes make it: all are bad records)
                    raise BadRecord(f"not an Avro record of the schema ({type(e).__name__}: {e})") from None
                left = len(data.getbuffer()) - data.tell()
                if left:
                    raise BadRecord(f"not an Avro record of the schema ({left} byte(s) left over after the record)")
                return record  # type: ignore[return-value]

            return avro
        cls = _proto_class(self.schema, self.message)

        def proto(payload: bytes) -> dict[str, Any]:
            from google.protobuf.message import DecodeError

            msg = cls()
            try:
                msg.ParseFromString(unframe(payload))
            except (DecodeError, RuntimeError, ValueError) as e:
                raise BadRecord(f"not a Protobuf {self.message} ({e})") from None
            return _proto_values(msg)

        return proto


@functools.cache
def _avro(text: str) -> Any:
    import fastavro

    try:
        raw = json.loads(text)
    except ValueError as e:
        raise ValueError(f"schema: not JSON: {e}") from e
    try:
        parsed = fastavro.parse_schema(raw)
    except Exception as e:  # noqa: BLE001 (fastavro's SchemaParseError and the KeyErrors/TypeErrors of odd input)
        raise ValueError(f"schema: not an Avro schema: {type(e).__name__}: {e}") from e
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise ValueError("schema: expected an Avro record schema (type \"record\") at the top")
    return parsed


def _avro_type(t: Any, named: dict[str, Any]) -> str:
    """The name an Avro field's type goes by in :data:`_AVRO_FITS` (a logical type's name if it
    has one; "union", "record", "array", ... for the types no column takes)."""
    if isinstance(t, list):
        rest = [x for x in t if x != "null"]
        return _avro_type(rest[0], named) if len(rest) == 1 else "union"
    if isinstance(t, str):
        return _avro_type(named[t], named) if t in named else t
    if isinstance(t, dict):
        if t.get("type") in ("enum", "record", "fixed", "array", "map"):
            return str(t["type"])
        return str(t.get("logicalType") or _avro_type(t.get("type"), named))
    return "unknown"


def _avro_field_types(parsed: dict[str, Any]) -> dict[str, str]:
    named: dict[str, Any] = {}

    def collect(t: Any) -> None:  # named types defined inside the record, referred to by name later
        if isinstance(t, list):
            for x in t:
                collect(x)
        elif isinstance(t, dict):
            if "name" in t and t.get("type") in ("enum", "record", "fixed"):
                named[t["name"]] = t
                named[t["name"].rsplit(".", 1)[-1]] = t
            for f in t.get("fields", []):
                collect(f["type"])

    collect(parsed)
    return {f["name"]: _avro_type(f["type"], named) for f in parsed["fields"]}


@functools.cache
def _proto_class(descriptors_b64: str, message: str) -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(descriptors_b64))
    except Exception as e:  # noqa: BLE001 (DecodeError, or odd bytes)
        raise ValueError(f"descriptors: not a FileDescriptorSet (protoc --descriptor_set_out): {e}") from e
    pool = descriptor_pool.DescriptorPool()
    names = {f.name for f in files.file}
    if timestamp_pb2.DESCRIPTOR.name not in names:  # the well-known Timestamp, if the set was made without imports
        proto = descriptor_pb2.FileDescriptorProto()
        timestamp_pb2.DESCRIPTOR.CopyToProto(proto)
        pool.Add(proto)
    for f in files.file:
        pool.Add(f)
    try:
        desc = pool.FindMessageTypeByName(message)
    except KeyError:
        known = sorted(m.name if not f.package else f"{f.package}.{m.name}" for f in files.file for m in f.message_type)
        raise ValueError(f"message: no message type {message!r} in the descriptors (top-level ones there: "
                         f"{known[:20]}; imports missing? protoc --include_imports)") from None
    except TypeError as e:  # a file whose imports are not in the set
        raise ValueError(f"descriptors: {e} (made without protoc --include_imports?)") from e
    return message_factory.GetMessageClass(desc)


def _proto_field_types(desc: Any) -> dict[str, str]:
    from google.protobuf.descriptor import FieldDescriptor

    names = {v: k[len("TYPE_"):].lower() for k, v in vars(FieldDescriptor).items() if k.startswith("TYPE_")}
    out = {}
    for f in desc.fields:
        if _repeated(f):
            out[f.name] = "repeated"
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            out[f.name] = f.message_type.full_name
        else:
            out[f.name] = names.get(f.type, "unknown")
    return out


def _repeated(f: Any) -> bool:
    is_repeated = getattr(f, "is_repeated", None)  # newer protobuf; `label` is deprecated there
    return bool(is_repeated) if is_repeated is not None else f.label == f.LABEL_REPEATED


def _proto_values(msg: Any) -> dict[str, Any]:
    from google.protobuf.descriptor import FieldDescriptor

    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        if f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
            continue
        v = getattr(msg, f.name)
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            v = v.ToDatetime(tzinfo=UTC) if f.message_type.full_name == "google.protobuf.Timestamp" else None
        elif f.type == FieldDescriptor.TYPE_ENUM:
            out[f"{f.name}\0enum"] = f.enum_type.values_by_number[v].name if v in f.enum_type.values_by_number else str(v)
        out[f.name] = v
    return out


def _column(values: list[Any], field: pa.Field) -> tuple[pa.Array | None, int | None]:
    """The column of ``values`` as ``field``'s type, or (None, the first row that does not fit)."""
    try:
        return pa.array(values, field.type), None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        for i, v in enumerate(values):
            try:
                pa.array([v], field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                return None, i
        return None, 0


def decoded_binary(
    codec: Codec, where: str, positions: list[int], payloads: list[bytes], schema: TextSchema,
    ship: tuple[str, ...] | None = None, why: Callable[[int, str], str] | None = None,
) -> tuple[pa.RecordBatch, list[int]]:
    """As :func:`eddyline.io.textrecords.decoded_rows`, for binary records: one batch of the
    schema's columns (those in ``ship``) plus ``_file``, ``_line``, ``_raw`` (base64), ``_reason``,
    the records that decode first, then the dead letters; and the payloads' indexes in that order."""
    decode = _decoder(codec)
    records: list[dict[str, Any]] = []
    good: list[int] = []
    bad: list[tuple[int, str]] = []
    for i, payload in enumerate(payloads):
        try:
            records.append(decode(payload))
            good.append(i)
        except BadRecord as e:
            bad.append((i, str(e)))
    enum_names = {f.name for f, s in zip(schema.arrow, schema.spark_names, strict=True) if s == "string"}
    while True:  # a value that does not fit its column (a long into a smallint, say) makes its record a dead letter
        columns: list[pa.Array] = []
        for f, spark in zip(schema.arrow, schema.spark_names, strict=True):
            key = f"{f.name}\0enum" if f.name in enum_names and records and f"{f.name}\0enum" in records[0] else f.name
            column, wrong = _column([r[key] for r in records], f)
            if column is None:
                assert wrong is not None
                value = records[wrong][key]
                bad.append((good[wrong], f"field '{f.name}': expected {spark}, got {str(value)[:80]}"))
                del records[wrong], good[wrong]
                break
            columns.append(column)
        else:
            break
    rows = pa.Table.from_arrays(columns, schema=schema.arrow) if records else schema.arrow.empty_table()
    bad.sort()
    dead = [(positions[i], base64.b64encode(payloads[i]), why(positions[i], r) if why else r) for i, r in bad]
    return _batch(rows, schema, where, dead, ship), good + [i for i, _ in bad]


@functools.cache
def _decoder(codec: Codec) -> Callable[[bytes], dict[str, Any]]:
    return codec.decoder()


def avro_schema_of(schema: pa.Schema, name: str) -> dict[str, Any]:
    """The Avro record schema of rows of ``schema`` (flat, of the types a column takes), each
    field nullable, named after ``name`` (a topic, say: what Avro does not take in a name
    becomes ``_``). Decoding it back gives the same values (timestamps to the microsecond)."""
    fields = []
    for f in schema:
        t = f.type
        avro_type: Any
        if pa.types.is_int64(t):
            avro_type = "long"
        elif pa.types.is_int32(t) or pa.types.is_int16(t) or pa.types.is_int8(t):
            avro_type = "int"
        elif pa.types.is_float64(t):
            avro_type = "double"
        elif pa.types.is_float32(t):
            avro_type = "float"
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            avro_type = "string"
        elif pa.types.is_boolean(t):
            avro_type = "boolean"
        elif pa.types.is_timestamp(t):
            avro_type = {"type": "long", "logicalType": "timestamp-micros" if t.tz else "local-timestamp-micros"}
        elif pa.types.is_date32(t):
            avro_type = {"type": "int", "logicalType": "date"}
        else:
            raise ValueError(f"column '{f.name}': {t} has no Avro type here (flat columns of scalar types only)")
        fields.append({"name": f.name, "type": ["null", avro_type], "default": None})
    return {"type": "record", "name": _identifier(name), "fields": fields}


def avro_writer(schema: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
    """A function from a row (field → value) to its plain Avro record of ``schema``."""
    import fastavro

    parsed = fastavro.parse_schema(schema)

    def write(row: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, row)
        return out.getvalue()

    return write


def protobuf_descriptors_of(schema: pa.Schema, name: str) -> tuple[bytes, str]:
    """A FileDescriptorSet (serialized, with ``google/protobuf/timestamp.proto`` included) holding
    one proto2 message for rows of ``schema`` (flat, of the types a column takes), and the
    message's full name (``eddyline.<name>``, what Protobuf does not take in a name becoming
    ``_``). Every field is ``optional`` (a null is an absent field), numbered in column order; a
    timestamp is a ``google.protobuf.Timestamp``. Decoding it back gives the same values
    (timestamps to the microsecond)."""
    from google.protobuf import descriptor_pb2, timestamp_pb2

    scalar = descriptor_pb2.FieldDescriptorProto
    message = descriptor_pb2.DescriptorProto(name=_identifier(name))
    for number, f in enumerate(schema, start=1):
        t = f.type
        field = message.field.add(name=f.name, number=number, label=scalar.LABEL_OPTIONAL)
        if pa.types.is_int64(t):
            field.type = scalar.TYPE_INT64
        elif pa.types.is_int32(t) or pa.types.is_int16(t) or pa.types.is_int8(t):
            field.type = scalar.TYPE_INT32
        elif pa.types.is_float64(t):
            field.type = scalar.TYPE_DOUBLE
        elif pa.types.is_float32(t):
            field.type = scalar.TYPE_FLOAT
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            field.type = scalar.TYPE_STRING
        elif pa.types.is_boolean(t):
            field.type = scalar.TYPE_BOOL
        elif pa.types.is_timestamp(t) and t.tz:
            field.type, field.type_name = scalar.TYPE_MESSAGE, ".google.protobuf.Timestamp"
        else:
            raise ValueError(f"column '{f.name}': {t} has no Protobuf type here (flat columns of integers, "
                             f"floats, strings, booleans and timestamps with a time zone only)")
    file = descriptor_pb2.FileDescriptorProto(
        name=f"eddyline/{message.name}.proto", package="eddyline", syntax="proto2",
        dependency=[timestamp_pb2.DESCRIPTOR.name], message_type=[message])
    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    files = descriptor_pb2.FileDescriptorSet(file=[timestamp, file])
    return files.SerializeToString(), f"eddyline.{message.name}"


def _identifier(name: str) -> str:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return ident if ident[:1].isalpha() or ident[:1] == "_" else f"_{ident}"


def protobuf_writer(descriptors: bytes, message: str) -> Callable[[dict[str, Any]], bytes]:
    """A function from a row (field → value, None for absent) to its Protobuf ``message`` of the
    FileDescriptorSet ``descriptors`` (as :func:`protobuf_descriptors_of` gives)."""
    from google.protobuf.descriptor import FieldDescriptor

    cls = _proto_class(base64.b64encode(descriptors).decode(), message)
    stamps = {f.name for f in cls.DESCRIPTOR.fields if f.type == FieldDescriptor.TYPE_MESSAGE}

    def write(row: dict[str, Any]) -> bytes:
        msg = cls()
        for key, value in row.items():
            if value is None:
                continue
            if key in stamps:
                getattr(msg, key).FromDatetime(value)
            else:
                setattr(msg, key, value)
        return msg.SerializeToString()

    return write
