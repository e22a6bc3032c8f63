#!/usr/bin/env bash
# Apache Kafka in docker-compose.yml and docker-compose.cluster.yml (apache/kafka image, mounted
# read-only at /ldp/compose-kafka.sh; docs/security.md "Kafka: TLS, SASL and ACLs"):
#
#   start               format the storage with the SCRAM-SHA-512 users admin, worker, device and
#                       bridge (the bridge's only where SASL_BRIDGE_PASSWORD is set)
#                       (first start only: SCRAM users live in the metadata log; later starts find
#                       it formatted and keep them), then run the image's own start, which writes
#                       every KAFKA_* variable into server.properties and runs the broker
#   client-properties   print the admin's client settings (SASL_SSL, SCRAM-SHA-512, the CA of
#                       /certs/ca.pem, host names verified)
#   healthcheck         ask the local broker for its API versions as admin
#
# Passwords come from SASL_ADMIN_PASSWORD, SASL_WORKER_PASSWORD, SASL_DEVICE_PASSWORD and
# SASL_BRIDGE_PASSWORD (not KAFKA_*:
# the image would write those into server.properties); they may not contain `,` `]` or `"`.
set -euo pipefail
kafka_home=${COMPOSE_KAFKA_HOME:-/opt/kafka}
# the image's own start (tests/test_compose_kafka_boot.py runs the same steps from the jars)
docker_run=${COMPOSE_KAFKA_RUN:-/etc/kafka/docker/run}
ca=${COMPOSE_KAFKA_CA:-/certs/ca.pem}
scram=SCRAM-SHA-512

client_properties() {
  printf '%s\n' "security.protocol=SASL_SSL" "sasl.mechanism=$scram" \
    "ssl.truststore.type=PEM" "ssl.truststore.location=$ca" \
    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"$SASL_ADMIN_PASSWORD\";"
}

case "${1:-}" in
  start)
    for v in SASL_ADMIN_PASSWORD SASL_WORKER_PASSWORD SASL_DEVICE_PASSWORD; do
      case "${!v:-}" in
        "") echo "compose-kafka: $v is not set" >&2; exit 2 ;;
        *[,\]\"]*) echo "compose-kafka: $v may not contain , ] or \"" >&2; exit 2 ;;
      esac
    done
    # what formatting reads (the broker's own settings are rendered later by the image)
    printf '%s\n' "process.roles=$KAFKA_PROCESS_ROLES" "node.id=$KAFKA_NODE_ID" \
      "controller.quorum.voters=$KAFKA_CONTROLLER_QUORUM_VOTERS" \
      "controller.listener.names=$KAFKA_CONTROLLER_LISTENER_NAMES" \
      "listeners=$KAFKA_LISTENERS" "advertised.listeners=$KAFKA_ADVERTISED_LISTENERS" \
      "listener.security.protocol.map=$KAFKA_LISTENER_SECURITY_PROTOCOL_MAP" \
      "inter.broker.listener.name=$KAFKA_INTER_BROKER_LISTENER_NAME" \
      "sasl.enabled.mechanisms=$KAFKA_SASL_ENABLED_MECHANISMS" \
      "sasl.mechanism.inter.broker.protocol=$KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL" \
      "sasl.mechanism.controller.protocol=$KAFKA_SASL_MECHANISM_CONTROLLER_PROTOCOL" \
      "listener.name.controller.sasl.enabled.mechanisms=$KAFKA_LISTENER_NAME_CONTROLLER_SASL_ENABLED_MECHANISMS" \
      "log.dirs=$KAFKA_LOG_DIRS" > "${TMPDIR:-/tmp}/format.properties"
    "$kafka_home/bin/kafka-storage.sh" format --ignore-formatted --cluster-id="$CLUSTER_ID" \
      -c "${TMPDIR:-/tmp}/format.properties" \
      --add-scram "$scram=[name=admin,password=$SASL_ADMIN_PASSWORD]" \
      --add-scram "$scram=[name=worker,password=$SASL_WORKER_PASSWORD]" \
      --add-scram "$scram=[name=device,password=$SASL_DEVICE_PASSWORD]" \
      ${SASL_BRIDGE_PASSWORD:+--add-scram "$scram=[name=bridge,password=$SASL_BRIDGE_PASSWORD]"}
    exec "$docker_run" ;;
  client-properties)
    client_properties ;;
  healthcheck)
    client_properties > "${TMPDIR:-/tmp}/hc.properties"
    exec "$kafka_home/bin/kafka-broker-api-versions.sh" --bootstrap-server localhost:19092 \
      --command-config "${TMPDIR:-/tmp}/hc.properties" > /dev/null 2>&1 ;;
  *)
    echo "usage: compose-kafka.sh start | client-properties | healthcheck" >&2; exit 2 ;;
esac
