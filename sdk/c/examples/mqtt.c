#define _POSIX_C_SOURCE 200809L
/* A Linux device publishing over MQTT with libmosquitto (docs/devices.md, "Devices over MQTT").
 *
 *   ldp_mqtt [--credential FILE] MQTT_URL CA_FILE FLEET COLLECTION PUBLIC_KEY_B64 DEVICE_ID
 *            STATE_DIR [BATCH] < records
 *
 * MQTT_URL is mqtts://USER@HOST:PORT (TLS, the broker's certificate checked against CA_FILE and
 * HOST) or mqtt://USER@HOST:PORT (loopback tests only); the password comes from the environment
 * variable LDP_MQTT_PASSWORD (kept out of the process list). The device reads the collection's
 * retained signed state on ldp/FLEET/COLLECTION/config, verifies it against the pinned key, then
 * reads one record per line ("attr=label,attr=label") from stdin, randomizes it with the OS
 * CSPRNG, charges the ledger kept in STATE_DIR and publishes batches of BATCH reports (default
 * 100, each with its batch key) to ldp/FLEET/COLLECTION/reports at QoS 1 (MQTT 5), waiting for
 * each PUBACK: a refused publish (not authorized) stops it with the broker's reason. Prints
 * {"sent":..,"batches":..} at the end. With --credential (what `ldpstream device-credentials`
 * printed) every batch carries the device's MAC (docs/security.md "Per-device identity").
 */
#include <mosquitto.h>
#include <mqtt_protocol.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ldp.h"
#include "records.h"

#define WAIT_S 30.0
#define SESSION_EXPIRY_S 604800  /* the broker keeps a disconnected device's session 7 days */

typedef struct {
  int connected, conn_rc;      /* CONNACK seen, its reason */
  int got_cfg;                 /* the retained config (first message on the config topic) */
  uint8_t *cfg;
  size_t cfg_len;
  int pending_mid, acked, puback_rc;  /* the publish waited for, PUBACK seen, its reason */
} session;

static void on_connect(struct mosquitto *m, void *obj, int rc, int flags,
                       const mosquitto_property *props) {
  (void)m, (void)flags, (void)props;
  session *s = (session *)obj;
  s->connected = 1;
  s->conn_rc = rc;
}

static void on_message(struct mosquitto *m, void *obj, const struct mosquitto_message *msg,
                       const mosquitto_property *props) {
  (void)m, (void)props;
  session *s = (session *)obj;
  if (s->cfg || msg->payloadlen <= 0) return;
  s->cfg = malloc((size_t)msg->payloadlen);
  if (!s->cfg) return;
  memcpy(s->cfg, msg->payload, (size_t)msg->payloadlen);
  s->cfg_len = (size_t)msg->payloadlen;
  s->got_cfg = 1;
}

static void on_publish(struct mosquitto *m, void *obj, int mid, int rc,
                       const mosquitto_property *props) {
  (void)m, (void)props;
  session *s = (session *)obj;
  if (mid == s->pending_mid) s->puback_rc = rc, s->acked = 1;
}

/* the library's errors (e.g. OpenSSL's "certificate verify failed") go to stderr */
static void on_log(struct mosquitto *m, void *obj, int level, const char *text) {
  (void)m, (void)obj;
  if (level & MOSQ_LOG_ERR) fprintf(stderr, "mqtt: %s\n", text);
}

/* runs the network loop until *flag is set (reconnecting after a lost connection: libmosquitto
 * sends an unacknowledged QoS 1 message again); 0, or -1 after WAIT_S seconds or an error */
static int wait_for(struct mosquitto *m, const int *flag, const char *what) {
  double end = ldp_wall() + WAIT_S;
  while (!*flag) {
    if (ldp_wall() > end) return fprintf(stderr, "timed out waiting for %s\n", what), -1;
    int rc = mosquitto_loop(m, 100, 1);
    if (*flag) break;  /* e.g. a refusing CONNACK, the connection closed right after it */
    if (rc == MOSQ_ERR_CONN_LOST || rc == MOSQ_ERR_NO_CONN) {
      struct timespec pause = {0, 200000000};
      nanosleep(&pause, NULL);
      mosquitto_reconnect(m);
    } else if (rc != MOSQ_ERR_SUCCESS) {
      return fprintf(stderr, "mqtt: %s\n", mosquitto_strerror(rc)), -1;
    }
  }
  return 0;
}

static uint8_t batch[1 << 20];

typedef struct {
  struct mosquitto *m;
  session *s;
  const char *topic;
  const ldp_credential *cred;
} target;

static int publish(void *ctx, ldp_device *d) {
  target *t = (target *)ctx;
  struct mosquitto *m = t->m;
  session *s = t->s;
  int r;
  size_t len = ldp_flush_batch(d, t->cred, batch, sizeof batch, &r);
  if (r != LDP_OK) return fprintf(stderr, "flush: %s\n", ldp_reason(r)), -1;
  if (!len) return 0;
  s->acked = 0;
  int rc = mosquitto_publish_v5(m, &s->pending_mid, t->topic, (int)len, batch, 1, false, NULL);
  /* a lost connection keeps the message queued: it goes again after the reconnect below */
  if (rc != MOSQ_ERR_SUCCESS && rc != MOSQ_ERR_CONN_LOST && rc != MOSQ_ERR_NO_CONN)
    return fprintf(stderr, "publish: %s\n", mosquitto_strerror(rc)), -1;
  if (wait_for(m, &s->acked, "the PUBACK")) return -1;
  if (s->puback_rc >= 128)  /* MQTT 5 reason codes >= 0x80 are failures */
    return fprintf(stderr, "broker refused the batch: %s\n", mosquitto_reason_string(s->puback_rc)),
           -1;
  return 1;
}

/* mqtt[s]://USER@HOST:PORT → the parts (in place); 0 or -1 */
static int parse_url(char *url, int *tls, char **user, char **host, int *port) {
  char *rest;
  if (!strncmp(url, "mqtts://", 8)) *tls = 1, rest = url + 8;
  else if (!strncmp(url, "mqtt://", 7)) *tls = 0, rest = url + 7;
  else return -1;
  char *at = strrchr(rest, '@'), *colon;
  if (!at) return -1;
  *at = 0;
  *user = rest;
  *host = at + 1;
  colon = strrchr(*host, ':');
  if (!colon) return -1;
  *colon = 0;
  *port = atoi(colon + 1);
  return *port > 0 && *port < 65536 && **user && **host ? 0 : -1;
}

static ldp_state state, scratch;
static struct mosquitto *conn;  /* closed at exit, on every path */

static void close_conn(void) {
  if (conn) mosquitto_disconnect(conn), mosquitto_destroy(conn);
  mosquitto_lib_cleanup();
}

static const char usage[] =
    "usage: LDP_MQTT_PASSWORD=... ldp_mqtt [--credential FILE] MQTT_URL CA_FILE FLEET COLLECTION\n"
    "                PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH] < records\n"
    "\n"
    "  MQTT_URL        mqtts://USER@HOST:PORT (TLS, the broker's certificate checked against\n"
    "                  CA_FILE and HOST) or mqtt://USER@HOST:PORT (loopback only, make up MQTT=1)\n"
    "  CA_FILE         the broker's CA certificate (PEM); ignored for mqtt:// (pass -)\n"
    "  FLEET           the fleet the user belongs to (topics ldp/FLEET/COLLECTION/...)\n"
    "  COLLECTION      the collection id, e.g. adult\n"
    "  PUBLIC_KEY_B64  the pinned public key that signs the collection's state\n"
    "  DEVICE_ID       this device's id, a whole number (client id FLEET-DEVICE_ID)\n"
    "  STATE_DIR       directory of the device's ledger (an existing directory)\n"
    "  BATCH           reports per batch, 1 to 1000 (default 100)\n"
    "  --credential FILE\n"
    "                  the device's credential, the JSON `ldpstream device-credentials` printed:\n"
    "                  every batch is authenticated with its key (docs/security.md \"Per-device\n"
    "                  identity\"); FLEET and DEVICE_ID must be the credential's\n"
    "\n"
    "The password comes from LDP_MQTT_PASSWORD. Reads one record per line from stdin,\n"
    "attr=label,attr=label (e.g. os=ios,plan=pro), and prints {\"sent\":n,\"batches\":b}.\n";

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))
    return fputs(usage, stdout), 0;
  ldp_credential cred;
  int have_cred;
  if (ldp_take_credential(&argc, argv, &cred, &have_cred)) return 2;
  if (argc < 8) return fputs(usage, stderr), 2;
  if (have_cred && (strcmp(argv[3], cred.fleet) || strtoull(argv[6], NULL, 10) != cred.device_id))
    return fprintf(stderr, "FLEET %s and DEVICE_ID %s are not the credential's %s and %llu\n",
                   argv[3], argv[6], cred.fleet, (unsigned long long)cred.device_id), 2;
  const char *ca = argv[2], *fleet = argv[3], *cid = argv[4];
  char *user, *host;
  int tls, port;
  uint32_t cap = argc > 8 ? (uint32_t)atoi(argv[8]) : 100;
  char topic[512], client_id[128], detail[512];
  ldp_trust trust;
  if (parse_url(argv[1], &tls, &user, &host, &port))
    return fprintf(stderr, "MQTT_URL must be mqtts://USER@HOST:PORT\n"), 2;
  if (cap < 1 || cap > 1000 || ldp_trust_init(&trust, argv[5]) != LDP_OK)
    return fprintf(stderr, "bad batch size or public key\n"), 2;
  session s = {0, 0, 0, NULL, 0, 0, 0, 0};
  mosquitto_lib_init();
  atexit(close_conn);
  snprintf(client_id, sizeof client_id, "%s-%s", fleet, argv[6]);
  /* a persistent session: the broker keeps the device's unacknowledged messages across drops */
  struct mosquitto *m = conn = mosquitto_new(client_id, false, &s);
  if (!m) return fprintf(stderr, "mosquitto_new failed\n"), 1;
  mosquitto_int_option(m, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V5);
  mosquitto_connect_v5_callback_set(m, on_connect);
  mosquitto_message_v5_callback_set(m, on_message);
  mosquitto_publish_v5_callback_set(m, on_publish);
  mosquitto_log_callback_set(m, on_log);
  mosquitto_username_pw_set(m, user, getenv("LDP_MQTT_PASSWORD"));
  /* TLS: the chain is checked against CA_FILE and the host name against the certificate */
  if (tls && mosquitto_tls_set(m, ca, NULL, NULL, NULL, NULL) != MOSQ_ERR_SUCCESS)
    return fprintf(stderr, "cannot read the CA file %s\n", ca), 1;
  mosquitto_property *props = NULL;
  mosquitto_property_add_int32(&props, MQTT_PROP_SESSION_EXPIRY_INTERVAL, SESSION_EXPIRY_S);
  int rc = mosquitto_connect_bind_v5(m, host, port, 30, NULL, props);
  mosquitto_property_free_all(&props);
  if (rc != MOSQ_ERR_SUCCESS) return fprintf(stderr, "connect: %s\n", mosquitto_strerror(rc)), 1;
  if (wait_for(m, &s.connected, "the CONNACK")) return 1;
  if (s.conn_rc) return fprintf(stderr, "broker refused the connection: %s\n",
                                mosquitto_reason_string(s.conn_rc)), 1;
  snprintf(topic, sizeof topic, "ldp/%s/%s/config", fleet, cid);
  mosquitto_subscribe(m, NULL, topic, 1);
  if (wait_for(m, &s.got_cfg, topic)) return fprintf(stderr, "no retained state on %s\n", topic), 1;
  rc = ldp_state_accept(&state, &scratch, &trust, cid, (const char *)s.cfg, s.cfg_len, ldp_wall(),
                        detail, sizeof detail);
  free(s.cfg);
  if (rc != LDP_OK) return fprintf(stderr, "state refused: %s\n", detail), 1;
  mosquitto_unsubscribe(m, NULL, topic);
  snprintf(topic, sizeof topic, "ldp/%s/%s/reports", fleet, cid);
  target t = {m, &s, topic, have_cred ? &cred : NULL};
  if (ldp_run_records(&state, argv[7], argv[6], cap, publish, &t)) return 1;
  return 0;
}
