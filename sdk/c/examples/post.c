#define _POSIX_C_SOURCE 200809L
/* A Linux device posting to the HTTP gateway (ldpstream gateway) with libcurl.
 *
 *   ldp_post [--credential FILE] URL TOKEN COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH]
 *            < records
 *
 * Fetches the collection's signed state (GET /v1/collections/<id>/config), verifies it against
 * the pinned key, then reads one record per line ("attr=label,attr=label") from stdin,
 * randomizes it with the OS CSPRNG, charges the ledger kept in STATE_DIR and POSTs batches of
 * BATCH reports (default 100) with their batch key. Prints {"sent":..,"batches":..} at the end.
 * An https:// URL is verified against the system's CAs, or the PEM file in $LDP_CA_FILE (a
 * private CA such as compose's, docs/security.md "TLS at the device edge"). With --credential
 * (what `ldpstream device-credentials` printed) every batch carries the device's MAC
 * (docs/security.md "Per-device identity").
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ldp.h"
#include "records.h"

typedef struct { char *data; size_t len; } body;

static size_t collect(char *p, size_t size, size_t n, void *ctx) {
  body *b = (body *)ctx;
  char *grown = realloc(b->data, b->len + size * n + 1);
  if (!grown) return 0;
  memcpy(grown + b->len, p, size * n);
  b->data = grown;
  b->len += size * n;
  b->data[b->len] = 0;
  return size * n;
}

static long request(CURL *c, const char *url, const char *token, const uint8_t *data,
                    size_t len, body *out) {
  char auth[512];
  struct curl_slist *h = NULL;
  snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
  h = curl_slist_append(h, auth);
  if (data) h = curl_slist_append(h, "Content-Type: application/octet-stream");
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, url);
  const char *ca = getenv("LDP_CA_FILE");
  if (ca && *ca) curl_easy_setopt(c, CURLOPT_CAINFO, ca);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
  if (data) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)len);
  }
  long status = 0;
  CURLcode rc = curl_easy_perform(c);
  if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  else fprintf(stderr, "%s: %s\n", url, curl_easy_strerror(rc));  /* e.g. a TLS failure */
  curl_slist_free_all(h);
  return status;
}

static ldp_state state, scratch;
static uint8_t batch[1 << 20];

typedef struct { CURL *c; const char *url, *token; const ldp_credential *cred; } target;

static int post(void *ctx, ldp_device *d) {
  target *t = (target *)ctx;
  int r;
  size_t len = ldp_flush_batch(d, t->cred, batch, sizeof batch, &r);
  if (r != LDP_OK) return fprintf(stderr, "flush: %s\n", ldp_reason(r)), -1;
  if (!len) return 0;
  body ans = {NULL, 0};
  long status = request(t->c, t->url, t->token, batch, len, &ans);
  if (status < 200 || status >= 300) {
    fprintf(stderr, "gateway answered %ld: %s\n", status, ans.data ? ans.data : "");
    free(ans.data);
    return -1;
  }
  free(ans.data);
  return 1;
}

static const char usage[] =
    "usage: ldp_post [--credential FILE] URL TOKEN COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR\n"
    "                [BATCH] < records\n"
    "\n"
    "  URL             the gateway, e.g. http://127.0.0.1:8080 (https: $LDP_CA_FILE or the system CAs)\n"
    "  TOKEN           the fleet's bearer token (LDP_GATEWAY_TOKENS of the gateway)\n"
    "  COLLECTION      the collection id, e.g. adult\n"
    "  PUBLIC_KEY_B64  the pinned public key that signs the collection's state\n"
    "  DEVICE_ID       this device's id, a whole number (with --credential: the credential's)\n"
    "  STATE_DIR       directory of the device's ledger (an existing directory)\n"
    "  BATCH           reports per batch, 1 to 1000 (default 100)\n"
    "  --credential FILE\n"
    "                  the device's credential, the JSON `ldpstream device-credentials` printed:\n"
    "                  every batch is authenticated with its key (docs/security.md \"Per-device\n"
    "                  identity\"); without it batches carry no MAC\n"
    "\n"
    "Reads one record per line from stdin, attr=label,attr=label (e.g. os=ios,plan=pro), and\n"
    "prints {\"sent\":n,\"batches\":b} at the end.\n";

static CURL *conn;  /* cleaned up at exit, on every path */

static void close_conn(void) {
  if (conn) curl_easy_cleanup(conn);
  curl_global_cleanup();
}

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")))
    return fputs(usage, stdout), 0;
  ldp_credential cred;
  int have_cred;
  if (ldp_take_credential(&argc, argv, &cred, &have_cred)) return 2;
  if (argc < 7) return fputs(usage, stderr), 2;
  if (have_cred && strtoull(argv[5], NULL, 10) != cred.device_id)
    return fprintf(stderr, "DEVICE_ID %s is not the credential's %llu\n", argv[5],
                   (unsigned long long)cred.device_id), 2;
  const char *base = argv[1], *token = argv[2], *cid = argv[3];
  uint32_t cap = argc > 7 ? (uint32_t)atoi(argv[7]) : 100;
  char url[2048], detail[512];
  ldp_trust trust;
  if (cap < 1 || cap > 1000 || ldp_trust_init(&trust, argv[4]) != LDP_OK)
    return fprintf(stderr, "bad batch size or public key\n"), 2;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  atexit(close_conn);
  CURL *c = conn = curl_easy_init();
  if (!c) return fprintf(stderr, "curl_easy_init failed\n"), 1;
  body cfg = {NULL, 0};
  snprintf(url, sizeof url, "%s/v1/collections/%s/config", base, cid);
  long status = request(c, url, token, NULL, 0, &cfg);
  if (status != 200) {
    fprintf(stderr, "GET %s: %ld %s\n", url, status, cfg.data ? cfg.data : "");
    free(cfg.data);
    return 1;
  }
  int r = ldp_state_accept(&state, &scratch, &trust, cid, cfg.data, cfg.len, ldp_wall(), detail,
                           sizeof detail);
  free(cfg.data);
  if (r != LDP_OK) return fprintf(stderr, "state refused: %s\n", detail), 1;
  snprintf(url, sizeof url, "%s/v1/collections/%s/reports", base, cid);
  target t = {c, url, token, have_cred ? &cred : NULL};
  return ldp_run_records(&state, argv[6], argv[5], cap, post, &t) ? 1 : 0;
}
