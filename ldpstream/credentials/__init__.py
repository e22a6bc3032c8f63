"""Issuing what deployments authenticate with (docs/credentials.md): a CA and server
certificates for the Kafka brokers (:mod:`.kafka_certs`) and for the device edge, Mosquitto and
the HTTPS gateway (:mod:`.edge_certs`), both built by :mod:`.x509`. Runtime code: the embedded
stack and the tests use it too, never the other way round."""
