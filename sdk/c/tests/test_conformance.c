/* The C side of the conformance suite (the JSON files of sdk/conformance,
   docs/device-protocol.md): the same draws, reports, batch bytes, state decisions, budget and
   memo decisions as Python. */
#define _POSIX_C_SOURCE 200809L
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "ldp.h"

static int failures = 0;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      failures++;                                                 \
      fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);             \
      fprintf(stderr, __VA_ARGS__);                               \
      fputc('\n', stderr);                                        \
    }                                                             \
  } while (0)

static json_t *load(const char *dir, const char *name) {
  char path[1024];
  json_error_t je;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  json_t *d = json_load_file(path, 0, &je);
  if (!d) {
    fprintf(stderr, "%s: %s\n", path, je.text);
    exit(2);
  }
  return d;
}

static uint64_t u64(json_t *s) { return strtoull(json_string_value(s), NULL, 10); }

/* A build with limits below the protocol's (ldp_limits.h, the firmware profile) refuses, as
   unusable, the descriptions beyond them: such a case is skipped, said so, unless it is one of
   the typical programs every build must run (rr-ind, partitioned, memoized). */
static int beyond_limits(const char *name, int r, const char *err) {
#ifdef LDP_PROFILE_FIRMWARE
  static const char *const typical[] = {"rr-ind", "partitioned-olh", "partitioned-2",
                                        "partitioned-num", "partitioned-num-olh", "sw-hm",
                                        "sw-hm-duchi", "sw-hm-points", "memo",
                                        "memoized partition", "memoized partition (olh)",
                                        "memoized cluster", "memoized select",
                                        "memoized across midnight", "memoized numeric"};
  if (r != LDP_UNUSABLE) return 0;
  for (size_t i = 0; i < sizeof typical / sizeof typical[0]; i++)
    if (strcmp(name, typical[i]) == 0) return 0;
  printf("skipped %s: beyond this build's limits (%s)\n", name, err);
  return 1;
#else
  (void)name, (void)r, (void)err;
  return 0;
#endif
}

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void rng_vectors(json_t *v) {
  size_t i, j;
  json_t *c;
  json_array_foreach(json_object_get(v, "words"), i, c) {
    uint64_t s = u64(json_object_get(c, "seed"));
    json_t *w;
    json_array_foreach(json_object_get(c, "words"), j, w)
      CHECK(ldp_splitmix64_next(&s) == u64(w), "splitmix64 word %zu of case %zu", j, i);
  }
  json_array_foreach(json_object_get(v, "uniform"), i, c) {
    uint64_t s = u64(json_object_get(c, "seed"));
    ldp_rng r = {ldp_splitmix64_next, &s};
    uint64_t k = (uint64_t)json_integer_value(json_object_get(c, "k"));
    json_t *w;
    json_array_foreach(json_object_get(c, "draws"), j, w)
      CHECK(ldp_uniform(&r, k) == (uint64_t)json_integer_value(w), "uniform case %zu draw %zu",
            i, j);
  }
  json_array_foreach(json_object_get(v, "bernoulli"), i, c) {
    uint64_t s = u64(json_object_get(c, "seed"));
    ldp_rng r = {ldp_splitmix64_next, &s};
    double p = json_number_value(json_object_get(c, "p"));
    json_t *w;
    json_array_foreach(json_object_get(c, "draws"), j, w)
      CHECK(ldp_bernoulli(&r, p) == json_is_true(w), "bernoulli case %zu draw %zu", i, j);
  }
  json_array_foreach(json_object_get(v, "categorical"), i, c) {
    uint64_t s = u64(json_object_get(c, "seed"));
    ldp_rng r = {ldp_splitmix64_next, &s};
    double cum[64], acc = 0.0;
    json_t *row = json_object_get(c, "row"), *w;
    uint32_t k = (uint32_t)json_array_size(row);
    for (uint32_t t = 0; t < k; t++) cum[t] = acc += json_number_value(json_array_get(row, t));
    json_array_foreach(json_object_get(c, "draws"), j, w)
      CHECK(ldp_categorical(&r, cum, k) == (uint32_t)json_integer_value(w),
            "categorical draw %zu", j);
  }
}

static ldp_state state;       /* large: static */
static ldp_state scratch;
static uint32_t buf_reports[256 * LDP_MAX_WIDTH];
static uint64_t buf_ids[256];
static uint8_t out[65536];

static int record_pairs(json_t *rec, const char **names, const char **labels) {
  const char *k;
  json_t *v;
  int n = 0;
  json_object_foreach(rec, k, v) {
    names[n] = k;
    labels[n++] = json_string_value(v);
  }
  return n;
}

static void randomize_case(json_t *c) {
  const char *name = json_string_value(json_object_get(c, "name"));
  char err[256], hex[2 * sizeof out + 1];
  char *dev = json_dumps(json_object_get(c, "device"), JSON_COMPACT);
  memset(&state, 0, sizeof state);
  int r = ldp_program_parse(&state.program, dev, strlen(dev), err, sizeof err);
  free(dev);
  if (beyond_limits(name, r, err)) return;
  CHECK(r == LDP_OK, "%s: %s", name, err);
  if (r != LDP_OK) return;
  double eps = json_number_value(json_object_get(c, "epsilon"));
  CHECK(fabs(state.program.epsilon - eps) <= 1e-12 * eps, "%s: epsilon %.17g != %.17g", name,
        state.program.epsilon, eps);
  /* through a device: the reports and the exact batch bytes */
  json_t *b = json_object_get(c, "batch");
  state.present = 1;
  snprintf(state.collection, sizeof state.collection, "%s",
           json_string_value(json_object_get(b, "collection")));
  state.version = (uint32_t)json_integer_value(json_object_get(c, "version"));
  uint64_t seed = u64(json_object_get(c, "seed"));
  ldp_ledger ledger;
  ldp_ledger_open(&ledger, 0.0, 0.0, NULL);
  ledger.next_sequence = u64(json_object_get(b, "sequence"));
  ldp_device d = {&state, &ledger, {ldp_splitmix64_next, &seed}, u64(json_object_get(b,
                  "device_id")), buf_reports, buf_ids, 256, 0, 0, 0, 0.0};
  size_t i;
  json_t *rec;
  json_array_foreach(json_object_get(c, "records"), i, rec) {
    const char *names[LDP_MAX_ATTRS], *labels[LDP_MAX_ATTRS];
    int n = record_pairs(rec, names, labels);
    double cost;
    uint8_t clipped[LDP_MAX_ATTRS];
    r = ldp_device_report_clip(&d, names, labels, (size_t)n, 0.0, &cost, clipped, err,
                               sizeof err);
    CHECK(r == LDP_OK, "%s record %zu: %s", name, i, err);
    json_t *clip = json_array_get(json_object_get(c, "clipped"), i), *a;
    size_t k, n_clip = 0;
    for (uint32_t j = 0; j < state.program.n_attrs; j++) n_clip += clipped[j];
    CHECK(n_clip == json_array_size(clip), "%s record %zu: %zu values clipped", name, i, n_clip);
    json_array_foreach(clip, k, a) {  /* the attributes clipped, by name */
      uint32_t j = 0;
      while (j < state.program.n_attrs &&
             strcmp(state.program.text + state.program.name_at[j], json_string_value(a)))
        j++;
      CHECK(j < state.program.n_attrs && clipped[j], "%s record %zu: %s not clipped", name, i,
            json_string_value(a));
    }
    json_t *want = json_array_get(json_object_get(c, "reports"), i);
    for (uint32_t j = 0; j < state.program.width; j++)
      CHECK(buf_reports[i * state.program.width + j] ==
                (uint32_t)json_integer_value(json_array_get(want, j)),
            "%s: report %zu column %u", name, i, j);
  }
  size_t len = ldp_device_flush(&d, json_number_value(json_object_get(b, "sent_at")), out,
                                sizeof out, &r);
  for (size_t k = 0; k < len; k++) snprintf(hex + 2 * k, 3, "%02x", out[k]);
  hex[2 * len] = 0;
  CHECK(r == LDP_OK && strcmp(hex, json_string_value(json_object_get(b, "hex"))) == 0,
        "%s: batch bytes differ", name);
  CHECK(ledger.next_sequence == u64(json_object_get(b, "sequence")) + 1, "%s: sequence", name);
}

/* records that must raise a schema error naming the attribute (numeric: not a number's text) */
static void schema_errors(json_t *se) {
  size_t i;
  json_t *e;
  char *dev = json_dumps(json_object_get(se, "device"), JSON_COMPACT), err[256];
  CHECK(ldp_program_parse(&state.program, dev, strlen(dev), err, sizeof err) == LDP_OK, "%s", err);
  free(dev);
  json_array_foreach(json_object_get(se, "errors"), i, e) {
    const char *names[LDP_MAX_ATTRS], *labels[LDP_MAX_ATTRS];
    uint32_t x[LDP_MAX_ATTRS];
    int n = record_pairs(json_object_get(e, "record"), names, labels);
    const char *attr = json_string_value(json_object_get(e, "attribute"));
    char quoted[128];
    snprintf(quoted, sizeof quoted, "'%s'", attr);
    CHECK(ldp_program_encode(&state.program, names, labels, (size_t)n, x, err, sizeof err) ==
              LDP_E_SCHEMA && strstr(err, quoted), "schema error %zu: %s", i, err);
  }
}

static void randomize_vectors(json_t *v) {
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(v, "cases"), i, c) randomize_case(c);
  schema_errors(json_object_get(v, "schema_errors"));
  schema_errors(json_object_get(v, "numeric_errors"));
}

static void state_steps(json_t *steps, const ldp_trust *t, double now) {
  size_t i;
  json_t *s;
  json_array_foreach(steps, i, s) {
    const char *rec = json_string_value(json_object_get(s, "record"));
    char detail[512] = "";
    int r = ldp_state_accept(&state, &scratch, t, json_string_value(json_object_get(s,
                             "collection")), rec, strlen(rec), now, detail, sizeof detail);
    const char *want = json_string_value(json_object_get(s, "expect"));
    const char *got = r == LDP_OK ? "accept" : ldp_reason(r);
    CHECK(strcmp(got, want) == 0, "state '%s': got %s (%s), expected %s",
          json_string_value(json_object_get(s, "name")), got, detail, want);
    json_t *day = json_object_get(s, "max_epsilon_per_day");  /* the state now in force */
    CHECK(r != LDP_OK || !day || json_number_value(day) == state.max_epsilon_per_day,
          "state '%s': max_epsilon_per_day %g", json_string_value(json_object_get(s, "name")),
          state.max_epsilon_per_day);
  }
}

/* every prefix and 64 seeded byte flips of each record: a decision, never a crash (ASan) */
static void mangled_states(json_t *steps, const ldp_trust *t, double now) {
  static char buf[1 << 16];
  uint64_t seed = 7;
  size_t i;
  json_t *s;
  json_array_foreach(steps, i, s) {
    const char *rec = json_string_value(json_object_get(s, "record"));
    size_t len = strlen(rec);
    if (len > sizeof buf) continue;
    for (size_t cut = 0; cut < len; cut += 1 + len / 64) {
      memcpy(buf, rec, cut);
      int r = ldp_state_accept(&state, &scratch, t, "app", buf, cut, now, NULL, 0);
      CHECK(r != LDP_OK, "a truncated record (%zu of %zu bytes) was accepted", cut, len);
    }
    for (int k = 0; k < 64; k++) {
      memcpy(buf, rec, len);
      buf[ldp_splitmix64_next(&seed) % len] ^= (char)(1 + ldp_splitmix64_next(&seed) % 255);
      int r = ldp_state_accept(&state, &scratch, t, "app", buf, len, now, NULL, 0);
      CHECK(r >= LDP_OK && r <= LDP_UNUSABLE, "flipped record: result %d", r);
    }
  }
}

static void state_vectors(json_t *v) {
  ldp_trust t;
  CHECK(ldp_trust_init(&t, json_string_value(json_object_get(v, "public_key"))) == LDP_OK,
        "public key");
  t.ceiling = json_number_value(json_object_get(v, "ceiling"));
  double now = json_number_value(json_object_get(v, "now"));
  memset(&state, 0, sizeof state);
  state_steps(json_object_get(v, "steps"), &t, now);
  state_steps(json_object_get(v, "sdk_only_steps"), &t, now);
  mangled_states(json_object_get(v, "steps"), &t, now);
}

/* ledger decisions; under "daily" also the collection's max_epsilon_per_day across a UTC
   midnight and which limit refused ("reason") */
static void ledger_vectors(json_t *v, const char *what) {
  json_t *b = json_object_get(v, "budget"), *e;
  ldp_ledger l;
  size_t i;
  ldp_ledger_open(&l, json_number_value(json_object_get(b, "epsilon")),
                  json_number_value(json_object_get(b, "window_s")), NULL);
  l.max_epsilon_per_day = json_number_value(json_object_get(v, "max_epsilon_per_day"));
  json_array_foreach(json_object_get(v, "events"), i, e) {
    double cost = json_number_value(json_object_get(e, "cost"));
    double now = json_number_value(json_object_get(e, "now"));
    int window = ldp_ledger_spent_window(&l, now) + cost > l.budget * (1 + 1e-12);
    int r = ldp_ledger_charge(&l, cost, now);
    const char *got = r == LDP_OK ? "accept" : "refuse", *why = window ? "budget" : "over_budget";
    json_t *reason = json_object_get(e, "reason");
    CHECK(strcmp(got, json_string_value(json_object_get(e, "expect"))) == 0 &&
              (r == LDP_OK || !reason || strcmp(why, json_string_value(reason)) == 0),
          "%s event %zu: %s", what, i, got);
  }
}

/* memoized reports of one description (memo.json and its partition case) */
static void memo_replay(json_t *v, const char *what) {
  char err[256], *dev = json_dumps(json_object_get(v, "device"), JSON_COMPACT);
  memset(&state, 0, sizeof state);
  int r = ldp_program_parse(&state.program, dev, strlen(dev), err, sizeof err);
  free(dev);
  if (beyond_limits(what, r, err)) return;
  CHECK(r == LDP_OK && state.program.memoized, "%s description: %s", what, err);
  char fp[17];
  for (int i = 0; i < 8; i++) snprintf(fp + 2 * i, 3, "%02x", state.program.fingerprint[i]);
  CHECK(strcmp(fp, json_string_value(json_object_get(v, "fingerprint"))) == 0,
        "%s fingerprint %s", what, fp);
  state.present = 1;
  state.max_epsilon_per_day = json_number_value(json_object_get(v, "max_epsilon_per_day"));
  strcpy(state.collection, "memo");
  json_t *b = json_object_get(v, "budget"), *e, *id = json_object_get(v, "device_id");
  ldp_ledger ledger;
  ldp_ledger_open(&ledger, json_number_value(json_object_get(b, "epsilon")),
                  json_number_value(json_object_get(b, "window_s")), NULL);
  uint64_t seed = u64(json_object_get(v, "seed"));
  ldp_device d = {&state, &ledger, {ldp_splitmix64_next, &seed}, id ? u64(id) : 1, buf_reports,
                  buf_ids, 256, 0, 0, 0, json_number_value(json_object_get(v, "resend_every_s"))};
  size_t i;
  json_array_foreach(json_object_get(v, "events"), i, e) {
    const char *names[LDP_MAX_ATTRS], *labels[LDP_MAX_ATTRS];
    int n = record_pairs(json_object_get(e, "record"), names, labels);
    double cost, want_cost = json_number_value(json_object_get(e, "cost"));
    uint32_t before = d.n;
    r = ldp_device_report(&d, names, labels, (size_t)n, json_number_value(json_object_get(e,
                          "now")), &cost, err, sizeof err);
    const char *status = r == LDP_OK ? "queued" : r == LDP_DUPLICATE ? "duplicate"
                         : r == LDP_E_BUDGET ? "refused" : ldp_reason(r);
    CHECK(strcmp(status, json_string_value(json_object_get(e, "status"))) == 0,
          "%s event %zu: %s (%s)", what, i, status, err);
    CHECK(fabs(cost - want_cost) <= 1e-12 * want_cost, "%s event %zu: cost %.17g", what, i,
          cost);
    /* the daily case's window budget never binds: its refusals are the cap's */
    CHECK(r != LDP_E_BUDGET || state.max_epsilon_per_day <= 0.0 ||
              strncmp(err, "over_budget:", 12) == 0, "%s event %zu: %s", what, i, err);
    json_t *want = json_object_get(e, "report");
    for (uint32_t j = 0; r == LDP_OK && j < json_array_size(want); j++)
      CHECK(buf_reports[before * state.program.width + j] ==
                (uint32_t)json_integer_value(json_array_get(want, j)),
            "%s event %zu column %u", what, i, j);
  }
}

/* the memoized numeric case's alpha of each device id and its rounding of every grid index */
static void alpha_vectors(json_t *v) {
  char err[256], *dev = json_dumps(json_object_get(v, "device"), JSON_COMPACT);
  static ldp_program prog;
  int r = ldp_program_parse(&prog, dev, strlen(dev), err, sizeof err);
  free(dev);
  if (beyond_limits("memoized numeric", r, err)) return;
  size_t i, k;
  json_t *e, *want;
  json_array_foreach(json_object_get(v, "alpha"), i, e) {
    uint64_t id = u64(json_object_get(e, "device_id"));
    uint32_t j = (uint32_t)json_integer_value(json_object_get(e, "attribute"));
    double a = ldp_alpha(&prog, j, id);
    CHECK(a == json_number_value(json_object_get(e, "alpha")), "alpha %zu: %.17g", i, a);
    json_array_foreach(json_object_get(e, "rounded"), k, want) {
      uint32_t x[LDP_MAX_ATTRS] = {0}, got[LDP_MAX_ATTRS];
      x[j] = (uint32_t)k;
      ldp_memo_round(&prog, x, id, got);
      CHECK(got[j] == (uint32_t)json_integer_value(want), "alpha %zu: %zu rounds to %u", i, k,
            got[j]);
    }
  }
}

static void memo_vectors(json_t *v) {
  memo_replay(v, "memo");
  memo_replay(json_object_get(v, "partition"), "memoized partition");
  memo_replay(json_object_get(v, "partition_olh"), "memoized partition (olh)");
  memo_replay(json_object_get(v, "cluster"), "memoized cluster");
  memo_replay(json_object_get(v, "select"), "memoized select");
  memo_replay(json_object_get(v, "daily"), "memoized across midnight");
  memo_replay(json_object_get(v, "numeric"), "memoized numeric");
  memo_replay(json_object_get(v, "partition_numeric"), "memoized partition (numeric)");
  alpha_vectors(json_object_get(v, "numeric"));
}

static void hex_of(const uint8_t *b, size_t n, char *out) {
  for (size_t k = 0; k < n; k++) snprintf(out + 2 * k, 3, "%02x", b[k]);
  out[2 * n] = 0;
}

/* a batch case's credential: its fleet, device id and hex key */
static void credential_of(json_t *c, ldp_credential *out) {
  size_t len = 0;
  const char *kh = json_string_value(json_object_get(c, "key"));
  snprintf(out->fleet, sizeof out->fleet, "%s", json_string_value(json_object_get(c, "fleet")));
  out->device_id = u64(json_object_get(c, "device_id"));
  sodium_hex2bin(out->key, sizeof out->key, kh, strlen(kh), NULL, &len, NULL);
}

/* identity.json: device keys, the provisioned credential, authenticated batches (through a
   device with that credential) */
static void identity_vectors(json_t *v) {
  size_t i;
  json_t *c;
  char hex[2 * 4096 + 1], err[256];
  json_array_foreach(json_object_get(v, "derive"), i, c) {
    uint8_t secret[256];
    size_t len = 0;
    const char *sh = json_string_value(json_object_get(c, "fleet_secret"));
    sodium_hex2bin(secret, sizeof secret, sh, strlen(sh), NULL, &len, NULL);
    ldp_credential cred;
    int r = ldp_credential_derive(&cred, secret, len,
                                  json_string_value(json_object_get(c, "fleet")),
                                  u64(json_object_get(c, "device_id")));
    hex_of(cred.key, 32, hex);
    CHECK(r == LDP_OK && strcmp(hex, json_string_value(json_object_get(c, "key"))) == 0,
          "derive %zu: key differs", i);
  }
  json_t *cj = json_object_get(v, "credential");
  ldp_credential cred;
  int r = ldp_credential_parse(&cred, json_string_value(json_object_get(cj, "json")), err,
                               sizeof err);
  hex_of(cred.key, 32, hex);
  CHECK(r == LDP_OK && cred.device_id == u64(json_object_get(cj, "device_id")) &&
            strcmp(cred.fleet, json_string_value(json_object_get(cj, "fleet"))) == 0 &&
            strcmp(hex, json_string_value(json_object_get(cj, "key"))) == 0,
        "credential: %s", err);
  CHECK(ldp_credential_parse(&cred, "{\"fleet\": \"f\", \"device_id\": 1, \"key\": \"00\"}",
                             err, sizeof err) == LDP_MALFORMED, "credential: short key accepted");
  json_array_foreach(json_object_get(v, "batches"), i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    ldp_credential bc;
    credential_of(c, &bc);
    json_t *rows = json_object_get(c, "reports"), *row;
    uint32_t n = (uint32_t)json_array_size(rows), width = 0;
    uint32_t reports[64];
    uint64_t ids[16], key[2] = {bc.device_id, u64(json_object_get(c, "sequence"))};
    size_t j;
    json_array_foreach(rows, j, row) {
      width = (uint32_t)json_array_size(row);
      for (uint32_t k = 0; k < width; k++)
        reports[j * width + k] = (uint32_t)json_integer_value(json_array_get(row, k));
      ids[j] = bc.device_id;
    }
    uint8_t out[4096];
    size_t len = ldp_batch_encode(out, sizeof out, json_string_value(json_object_get(c,
                                  "collection")), (uint32_t)json_integer_value(json_object_get(
                                  c, "version")), json_number_value(json_object_get(c,
                                  "sent_at")), reports, n, (uint16_t)width, ids, key);
    len = ldp_batch_authenticate(out, len, sizeof out, &bc);
    hex_of(out, len, hex);
    CHECK(len && strcmp(hex, json_string_value(json_object_get(c, "hex"))) == 0,
          "%s: authenticated batch bytes differ", name);
    CHECK(ldp_batch_authenticate(out, len, sizeof out, &bc) == 0, "%s: authenticated twice",
          name);
  }
  /* through a device holding the credential: the first batch's bytes */
  c = json_array_get(json_object_get(v, "batches"), 0);
  ldp_credential dc;
  credential_of(c, &dc);
  static ldp_state st;
  ldp_ledger ledger;
  uint32_t reports[LDP_MAX_WIDTH];
  uint64_t ids[1], seed = 0;
  memset(&st, 0, sizeof st);
  st.present = 1;
  snprintf(st.collection, sizeof st.collection, "app");
  ldp_ledger_open(&ledger, 0.0, 0.0, NULL);
  ledger.next_sequence = u64(json_object_get(c, "sequence"));
  ldp_device d = {&st, &ledger, {ldp_splitmix64_next, &seed}, dc.device_id, reports, ids, 1, 0,
                  0, 0, 0.0};
  json_t *row = json_array_get(json_object_get(c, "reports"), 0);
  d.width = (uint32_t)json_array_size(row);
  d.version = (uint32_t)json_integer_value(json_object_get(c, "version"));
  for (uint32_t k = 0; k < d.width; k++)
    reports[k] = (uint32_t)json_integer_value(json_array_get(row, k));
  ids[0] = dc.device_id;
  d.n = 1;
  uint8_t out[512];
  size_t len = ldp_device_flush_auth(&d, &dc, json_number_value(json_object_get(c, "sent_at")),
                                     out, sizeof out, &r);
  hex_of(out, len, hex);
  CHECK(r == LDP_OK && strcmp(hex, json_string_value(json_object_get(c, "hex"))) == 0,
        "device flush: authenticated batch bytes differ");
}

/* limits.json: descriptions beyond the limits refused (unusable, naming the field), those at
   them parsed to their epsilon, each within max_parse_s */
static void limits_vectors(json_t *v) {
  double budget = json_number_value(json_object_get(v, "max_parse_s"));
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(v, "cases"), i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *expect = json_string_value(json_object_get(c, "expect"));
    char err[256] = "", *dev = json_dumps(json_object_get(c, "device"), JSON_COMPACT);
    double t0 = seconds();
    int r = ldp_program_parse(&state.program, dev, strlen(dev), err, sizeof err);
    double took = seconds() - t0;
    free(dev);
    CHECK(took <= budget, "%s: parsed in %.3f s (> %g s)", name, took, budget);
    if (strcmp(expect, "accept") == 0) {
      if (beyond_limits(name, r, err)) continue;
      double eps = json_number_value(json_object_get(c, "epsilon"));
      CHECK(r == LDP_OK, "%s: refused: %s", name, err);
      CHECK(r != LDP_OK || fabs(state.program.epsilon - eps) <= 1e-12 * eps,
            "%s: epsilon %.17g != %.17g", name, state.program.epsilon, eps);
      continue;
    }
    const char *field = json_string_value(json_object_get(c, "field"));
    CHECK(r == LDP_UNUSABLE, "%s: %s, not unusable", name, ldp_reason(r));
#ifndef LDP_PROFILE_FIRMWARE /* smaller limits may refuse a case earlier, at another field */
    CHECK(strncmp(err, field, strlen(field)) == 0, "%s: '%s' does not name %s", name, err,
          field);
#else
    (void)field;
#endif
  }
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "../conformance";
  json_t *v;
  rng_vectors(v = load(dir, "rng.json"));
  json_decref(v);
  randomize_vectors(v = load(dir, "randomize.json"));
  json_decref(v);
  state_vectors(v = load(dir, "states.json"));
  json_decref(v);
  ledger_vectors(v = load(dir, "ledger.json"), "ledger");
  ledger_vectors(json_object_get(v, "daily"), "daily ledger");
  json_decref(v);
  memo_vectors(v = load(dir, "memo.json"));
  json_decref(v);
  identity_vectors(v = load(dir, "identity.json"));
  json_decref(v);
  limits_vectors(v = load(dir, "limits.json"));
  json_decref(v);
  if (failures) fprintf(stderr, "%d conformance checks failed\n", failures);
  else printf("conformance: all vectors pass\n");
  return failures ? 1 : 0;
}
