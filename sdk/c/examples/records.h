/* What the examples share (docs/device-protocol.md "Example programs"): one record per line of
 * stdin ("attr=label,attr=label", the TypeScript tools' format too) randomized by a device whose
 * ledger lives in a directory, its batches handed to a sender, {"sent":..,"batches":..} printed
 * at the end (with "duplicates":.. when a memoized record was already reported this period, and
 * "clipped":{"attribute":n} when numeric values were clipped into their range). */
#ifndef LDP_EXAMPLES_RECORDS_H
#define LDP_EXAMPLES_RECORDS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ldp.h"

static inline double ldp_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* splits LINE in place into names and labels; 0, or -1 after printing the bad field */
static inline int ldp_parse_record(char *line, const char **names, const char **labels,
                                   size_t *n) {
  *n = 0;
  line[strcspn(line, "\r\n")] = 0;
  for (char *tok = strtok(line, ","); tok && *n < LDP_MAX_ATTRS; tok = strtok(NULL, ",")) {
    char *eq = strchr(tok, '=');
    if (!eq) return fprintf(stderr, "bad record field '%s'\n", tok), -1;
    *eq = 0;
    names[*n] = tok;
    labels[(*n)++] = eq + 1;
  }
  return 0;
}

/* takes "--credential FILE" out of argv (anywhere among the arguments) and loads the JSON that
 * `ldpstream device-credentials` printed into *c (docs/security.md "Per-device identity");
 * *have says whether it was given. 0, or -1 after printing why */
static inline int ldp_take_credential(int *argc, char **argv, ldp_credential *c, int *have) {
  *have = 0;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--credential")) continue;
    if (i + 1 >= *argc) return fprintf(stderr, "--credential needs a FILE\n"), -1;
    const char *path = argv[i + 1];
    char text[4096], err[256];
    FILE *f = fopen(path, "r");
    if (!f) return fprintf(stderr, "cannot read the credential %s\n", path), -1;
    size_t len = fread(text, 1, sizeof text - 1, f);
    int too_long = !feof(f);
    fclose(f);
    if (too_long) return fprintf(stderr, "credential %s: longer than %zu bytes\n", path,
                                 sizeof text - 1), -1;
    text[len] = 0;
    if (ldp_credential_parse(c, text, err, sizeof err) != LDP_OK)
      return fprintf(stderr, "%s: %s\n", path, err), -1;
    for (int j = i; j + 2 <= *argc; j++) argv[j] = argv[j + 2];  /* argv[argc] stays NULL */
    *argc -= 2;
    *have = 1;
    return 0;
  }
  return 0;
}

/* the device's pending batch into out (ldp_device_flush, or ldp_device_flush_auth with a
 * credential); bytes, 0 when nothing is buffered or on error (see *result) */
static inline size_t ldp_flush_batch(ldp_device *d, const ldp_credential *c, uint8_t *out,
                                     size_t cap, int *result) {
  return c ? ldp_device_flush_auth(d, c, ldp_wall(), out, cap, result)
           : ldp_device_flush(d, ldp_wall(), out, cap, result);
}

/* sends the device's pending batch (ldp_device_flush): 1 sent, 0 nothing to send, -1 failed */
typedef int (*ldp_send_fn)(void *ctx, ldp_device *d);

static uint32_t ldp_run_reports[1000 * LDP_MAX_WIDTH];
static uint64_t ldp_run_ids[1000];

/* the device DEVICE_ID of STATE (ledger in STATE_DIR, batches of CAP <= 1000 reports) reports
 * every record of stdin through SEND; 0, or 1 after printing why */
static inline int ldp_run_records(ldp_state *state, const char *state_dir, const char *device_id,
                                  uint32_t cap, ldp_send_fn send, void *ctx) {
  char line[4096], err[256];
  ldp_storage storage;
  ldp_ledger ledger;
  ldp_file_storage(&storage, state_dir);
  if (ldp_ledger_open(&ledger, 0.0, 0.0, &storage) != LDP_OK)
    return fprintf(stderr, "cannot read the ledger in %s\n", state_dir), 1;
  ldp_os_rng os = {{0}, 0};
  ldp_device d = {state, &ledger, {ldp_os_rng_next, &os}, strtoull(device_id, NULL, 10),
                  ldp_run_reports, ldp_run_ids, cap, 0, 0, 0, 0.0};
  long sent = 0, batches = 0, duplicates = 0, clipped[LDP_MAX_ATTRS] = {0}, any_clipped = 0;
  uint8_t clip[LDP_MAX_ATTRS];
  int r;
  while (fgets(line, sizeof line, stdin)) {
    const char *names[LDP_MAX_ATTRS], *labels[LDP_MAX_ATTRS];
    size_t n;
    if (ldp_parse_record(line, names, labels, &n)) return 1;
    double cost;
    r = ldp_device_report_clip(&d, names, labels, n, ldp_wall(), &cost, clip, err, sizeof err);
    if (r == LDP_E_FULL) {
      if ((r = send(ctx, &d)) < 0) return 1;
      batches += r;
      r = ldp_device_report_clip(&d, names, labels, n, ldp_wall(), &cost, clip, err, sizeof err);
    }
    if (r == LDP_OK)  /* numeric values clipped into their range, per attribute */
      for (uint32_t j = 0; j < state->program.n_attrs; j++) {
        clipped[j] += clip[j];
        any_clipped += clip[j];
      }
    if (r == LDP_DUPLICATE) {  /* memoized: nothing sent, nothing spent */
      duplicates++;
      continue;
    }
    if (r != LDP_OK) return fprintf(stderr, "record %ld: %s\n", sent + duplicates, err), 1;
    sent++;
  }
  if ((r = send(ctx, &d)) < 0) return 1;
  printf("{\"sent\":%ld,\"batches\":%ld", sent, batches + r);
  if (duplicates) printf(",\"duplicates\":%ld", duplicates);
  if (any_clipped) {  /* {"clipped":{"attribute":n,...}}: the numeric attributes clipped */
    const char *sep = "";
    printf(",\"clipped\":{");
    for (uint32_t j = 0; j < state->program.n_attrs; j++)
      if (clipped[j]) {
        printf("%s\"", sep);
        for (const char *c = state->program.text + state->program.name_at[j]; *c; c++)
          printf(*c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
        printf("\":%ld", clipped[j]);
        sep = ",";
      }
    printf("}");
  }
  printf("}\n");
  return 0;
}
#endif
