#define _POSIX_C_SOURCE 200809L
/* A Linux device posting to the HTTP gateway (ldpstream gateway) with libcurl.
 *
 *   ldp_post URL TOKEN COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH] < records
 *
 * Fetches the collection's signed state (GET /v1/collections/<id>/config), verifies it against
 * the pinned key, then reads one record per line ("attr=label,attr=label") from stdin,
 * randomizes it with the OS CSPRNG, charges the ledger kept in STATE_DIR and POSTs batches of
 * BATCH reports (default 100) with their batch key. Prints {"sent":..,"batches":..} at the end.
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
  if (data) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)len);
  }
  long status = 0;
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(h);
  return status;
}

static ldp_state state, scratch;
static uint32_t reports[1000 * LDP_MAX_WIDTH];
static uint64_t ids[1000];
static uint8_t batch[1 << 20];

static int post(CURL *c, const char *url, const char *token, ldp_device *d, long *batches) {
  int r;
  size_t len = ldp_device_flush(d, wall(), batch, sizeof batch, &r);
  if (r != LDP_OK) return fprintf(stderr, "flush: %s\n", ldp_reason(r)), -1;
  if (!len) return 0;
  body ans = {NULL, 0};
  long status = request(c, url, token, batch, len, &ans);
  if (status < 200 || status >= 300) {
    fprintf(stderr, "gateway answered %ld: %s\n", status, ans.data ? ans.data : "");
    free(ans.data);
    return -1;
  }
  free(ans.data);
  (*batches)++;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: ldp_post URL TOKEN COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR "
            "[BATCH] < records\n");
    return 2;
  }
  const char *base = argv[1], *token = argv[2], *cid = argv[3];
  uint32_t cap = argc > 7 ? (uint32_t)atoi(argv[7]) : 100;
  char url[2048], detail[512], err[256], line[4096];
  ldp_trust trust;
  if (cap < 1 || cap > 1000 || ldp_trust_init(&trust, argv[4]) != LDP_OK)
    return fprintf(stderr, "bad batch size or public key\n"), 2;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL *c = curl_easy_init();
  body cfg = {NULL, 0};
  snprintf(url, sizeof url, "%s/v1/collections/%s/config", base, cid);
  long status = request(c, url, token, NULL, 0, &cfg);
  if (status != 200) return fprintf(stderr, "GET %s: %ld\n", url, status), 1;
  int r = ldp_state_accept(&state, &scratch, &trust, cid, cfg.data, cfg.len, wall(), detail,
                           sizeof detail);
  free(cfg.data);
  if (r != LDP_OK) return fprintf(stderr, "state refused: %s\n", detail), 1;
  ldp_storage storage;
  ldp_ledger ledger;
  ldp_file_storage(&storage, argv[6]);
  if (ldp_ledger_open(&ledger, 0.0, 0.0, &storage) != LDP_OK)
    return fprintf(stderr, "cannot read the ledger in %s\n", argv[6]), 1;
  ldp_os_rng os = {{0}, 0};
  ldp_device d = {&state, &ledger, {ldp_os_rng_next, &os}, strtoull(argv[5], NULL, 10),
                  reports, ids, cap, 0, 0, 0, 0.0};
  snprintf(url, sizeof url, "%s/v1/collections/%s/reports", base, cid);
  long sent = 0, batches = 0;
  while (fgets(line, sizeof line, stdin)) {
    const char *names[LDP_MAX_ATTRS], *labels[LDP_MAX_ATTRS];
    size_t n;
    if (ldp_parse_record(line, names, labels, &n)) return 1;
    double cost;
    r = ldp_device_report(&d, names, labels, n, wall(), &cost, err, sizeof err);
    if (r == LDP_E_FULL) {
      if (post(c, url, token, &d, &batches)) return 1;
      r = ldp_device_report(&d, names, labels, n, wall(), &cost, err, sizeof err);
    }
    if (r != LDP_OK) return fprintf(stderr, "record %ld: %s\n", sent, err), 1;
    sent++;
  }
  if (post(c, url, token, &d, &batches)) return 1;
  printf("{\"sent\":%ld,\"batches\":%ld}\n", sent, batches);
  curl_easy_cleanup(c);
  curl_global_cleanup();
  return 0;
}
