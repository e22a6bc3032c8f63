"""Device side: randomizing clients, the report codec, the Kafka publisher, the fleet simulator."""
