#define _POSIX_C_SOURCE 200809L
/* The report path allocates nothing: malloc and friends are counted (glibc's __libc_* behind
   them) while every conformance case and the memoized ones report and flush through a device
   whose ledger is saved to files. Accepting the signed states of states.json allocates nothing
   either: in the firmware profile (LDP_PROFILE_FIRMWARE) from its static parse arena, in the
   default one from an arena lent with ldp_parse_arena_lend. The firmware profile skips the
   cases beyond its limits. Built without sanitizers (they replace the allocator). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ldp.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
static int counting;
static long allocations;

void *malloc(size_t n) {
  allocations += counting;
  return __libc_malloc(n);
}
void *calloc(size_t n, size_t m) {
  allocations += counting;
  return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n) {
  allocations += counting;
  return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }

static ldp_state state;
static uint32_t reports[64 * LDP_MAX_WIDTH];
static uint64_t ids[64];
static uint8_t out[1 << 16];

static int run(json_t *device, json_t *records, ldp_storage *st) {
  char err[256], *dev = json_dumps(device, JSON_COMPACT);
  const char *names[64][LDP_MAX_ATTRS], *labels[64][LDP_MAX_ATTRS];
  size_t n[64], i, count = json_array_size(records) < 64 ? json_array_size(records) : 64;
  json_t *rec;
  memset(&state, 0, sizeof state);
  int parsed = ldp_program_parse(&state.program, dev, strlen(dev), err, sizeof err);
  free(dev);
#ifdef LDP_PROFILE_FIRMWARE
  if (parsed == LDP_UNUSABLE) return 0; /* beyond the profile's limits */
#endif
  if (parsed != LDP_OK) return 1;
  state.present = 1;
  strcpy(state.collection, "c");
  json_array_foreach(records, i, rec) {
    const char *k;
    json_t *lab;
    if (i >= count) break;
    n[i] = 0;
    json_object_foreach(rec, k, lab) {
      names[i][n[i]] = k;
      labels[i][n[i]++] = json_string_value(lab);
    }
  }
  ldp_ledger ledger;
  if (ldp_ledger_open(&ledger, 1e9, 3600.0, st) != LDP_OK) return 1;
  ldp_os_rng os = {{0}, 0};
  ldp_device d = {&state, &ledger, {ldp_os_rng_next, &os}, 9, reports, ids, 64, 0, 0, 0, 1.0};
  int r;
  double cost;
  counting = 1;
  for (i = 0; i < count; i++)
    ldp_device_report(&d, names[i], labels[i], n[i], 1000.0 + (double)i, &cost, err,
                      sizeof err);
  size_t len = ldp_device_flush(&d, 2000.0, out, sizeof out, &r);
  counting = 0;
  return r != LDP_OK || (len == 0 && d.n != 0);
}

static ldp_state scratch;
#ifndef LDP_PROFILE_FIRMWARE
static unsigned char lent[32768];
#endif

/* every signed record of states.json through ldp_state_accept, allocations counted */
static int accept_states(const char *dir) {
  char path[1024], detail[256];
  json_error_t je;
  snprintf(path, sizeof path, "%s/states.json", dir);
  json_t *v = json_load_file(path, 0, &je), *step;
  size_t i;
  ldp_trust t;
  if (!v || ldp_trust_init(&t, json_string_value(json_object_get(v, "public_key"))) != LDP_OK)
    return 1;
  memset(&state, 0, sizeof state);
#ifndef LDP_PROFILE_FIRMWARE
  if (ldp_parse_arena_lend(lent, sizeof lent) != LDP_OK) return 1;
#endif
  int accepted = 0;
  double now = json_number_value(json_object_get(v, "now"));
  counting = 1;
  json_array_foreach(json_object_get(v, "steps"), i, step) {
    const char *rec = json_string_value(json_object_get(step, "record"));
    accepted += ldp_state_accept(&state, &scratch, &t,
                                 json_string_value(json_object_get(step, "collection")), rec,
                                 strlen(rec), now, detail, sizeof detail) == LDP_OK;
  }
  counting = 0;
  json_decref(v);
  printf("state acceptance: %d states accepted, %ld allocations, parse arena peak %zu bytes\n",
         accepted, allocations, ldp_parse_arena_peak());
  ldp_parse_arena_lend(NULL, 0);
  return accepted == 0;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "../conformance";
  char path[1024], tmp[] = "/tmp/ldp-noheap-XXXXXX";
  json_error_t je;
  int failed = 0;
  if (!mkdtemp(tmp)) return 2;
  ldp_storage st;
  ldp_file_storage(&st, tmp);
  snprintf(path, sizeof path, "%s/randomize.json", dir);
  json_t *v = json_load_file(path, 0, &je), *c;
  size_t i;
  if (!v) return 2;
  json_array_foreach(json_object_get(v, "cases"), i, c)
    failed |= run(json_object_get(c, "device"), json_object_get(c, "records"), &st);
  json_decref(v);
  snprintf(path, sizeof path, "%s/memo.json", dir);
  v = json_load_file(path, 0, &je);
  if (!v) return 2;
  failed |= accept_states(dir);
  /* the memoized case, then the memoized numeric one (alpha-point rounding) on a new ledger */
  json_t *memo[2] = {v, json_object_get(v, "numeric")};
  for (int m = 0; m < 2; m++) {
    json_t *records = json_array();
    json_array_foreach(json_object_get(memo[m], "events"), i, c)
      json_array_append(records, json_object_get(c, "record"));
    snprintf(path, sizeof path, "%s/ledger", tmp);
    unlink(path);
    failed |= run(json_object_get(memo[m], "device"), records, &st);
    json_decref(records);
  }
  json_decref(v);
  snprintf(path, sizeof path, "%s/ledger", tmp);
  unlink(path);
  rmdir(tmp);
  if (failed || allocations) {
    fprintf(stderr, "report path: %ld allocations (failed=%d)\n", allocations, failed);
    return 1;
  }
  printf("report path: no allocation\n");
  return 0;
}
