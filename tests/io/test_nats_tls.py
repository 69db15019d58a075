"""NATS over TLS: a real ``nats-server --tls`` with a certificate from a certificate authority
made here. The wire client reads and writes through ``tls://`` URLs (the source's tasks too, and
core subscriptions); a server that requires TLS refuses ``nats://`` with a clear error, and a
certificate the client does not trust is an error naming it, not an outage to retry."""

from __future__ import annotations

import datetime
import ipaddress
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from eddyline.api.sources import SourceSpec
from eddyline.io.jetstream import NatsSource
from eddyline.io.local import LocalNats
from eddyline.io.natswire import NatsConnection, NatsError, Subscription, ensure_stream


def _certificate_authority(directory: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = directory / f"{name}-ca.pem", directory / f"{name}-server.pem", directory / f"{name}-server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    directory = tmp_path_factory.mktemp("tls")
    ca, cert, key = _certificate_authority(directory, "ours")
    other_ca, _, _ = _certificate_authority(directory, "theirs")
    server = LocalNats(tls=(str(cert), str(key))).start()
    yield server, ca, other_ca
    server.stop()


def test_a_tls_url_reads_and_writes_and_plain_or_untrusted_connections_are_refused_clearly(tls_server) -> None:
    server, ca, other_ca = tls_server
    url = f"{server.url}?ca={ca}"
    assert url.startswith("tls://")
    with NatsConnection(url) as conn:
        ensure_stream(conn, "TLS", ["tls.in"])
        assert conn.publish([("tls.in", f"m{i}", json.dumps({"i": i}).encode()) for i in range(5)]) == [False] * 5
        assert conn.publish([("tls.in", "m0", b"again")]) == [True]  # de-duplicated, as over plain NATS
        (seqs, payloads), = list(conn.read_range("TLS", 1, 6))
    assert seqs == [1, 2, 3, 4, 5] and [json.loads(p)["i"] for p in payloads] == [0, 1, 2, 3, 4]

    with Subscription(url, "tls.core") as sub, NatsConnection(url) as pub:
        pub._send(b"".join(b"PUB tls.core %d\r\n%s\r\n" % (len(p), p) for p in (b"a", b"b" * 70_000, b"c")))
        got: list[bytes] = []
        for _ in range(20):
            got += sub.receive(0.5)
            if len(got) == 3:
                break
    assert got == [b"a", b"b" * 70_000, b"c"]

    plain = server.url.replace("tls://", "nats://")
    with pytest.raises(NatsError, match="the server requires TLS: use a tls:// URL"):
        NatsConnection(plain)
    with pytest.raises(NatsError, match="TLS: .*certificate") as untrusted:
        NatsConnection(f"{server.url}?ca={other_ca}")
    assert type(untrusted.value) is NatsError  # not NatsUnreachable: waiting would not help
    with pytest.raises(NatsError, match=r"unknown TLS option\(s\) \['cafile'\]"):
        NatsConnection(f"{server.url}?cafile={ca}")


def test_the_source_reads_over_tls_in_spark_tasks_and_a_bad_tls_option_is_refused_in_the_spec(
    spark, tls_server
) -> None:
    server, ca, _ = tls_server
    url = f"{server.url}?ca={ca}"
    with NatsConnection(url) as conn:
        ensure_stream(conn, "TLSRC", ["tls.src"])
        conn.publish([("tls.src", None, json.dumps({"k": i % 3, "v": i}).encode()) for i in range(300)]
                     + [("tls.src", None, b"not json")])
    source = NatsSource(SourceSpec.model_validate(
        {"name": "s", "nats": {"url": url, "stream": "TLSRC", "schema": "k long, v long"}}))
    source.min_per_task = 100  # several tasks, each with its own TLS connection
    planned = {"start": 0, "end": source.available(0.0)}
    frames = source.frames(spark, planned, 2)
    assert sorted(r.v for r in frames.data.collect()) == list(range(300))
    assert [r.line for r in frames.dead_letters.collect()] == [301]

    with pytest.raises(ValidationError, match="key= without cert="):
        SourceSpec.model_validate({"name": "s", "nats": {"url": f"{server.url}?key=/x", "stream": "S", "schema": "k long"}})
    with pytest.raises(ValidationError, match="need a tls:// URL"):
        SourceSpec.model_validate({"name": "s", "nats": {"url": f"nats://127.0.0.1:1?ca={ca}", "stream": "S",
                                                         "schema": "k long"}})
