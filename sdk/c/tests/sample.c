#define _POSIX_C_SOURCE 200809L
/* Sampling tools over the cases of randomize.json, with the production generator (the OS
 * CSPRNG):
 *
 *   ldp_sample audit randomize.json SAMPLES   one JSON line per grr/matrix/keep step with at
 *       most 32 cells: the k x k counts (row: true cell, SAMPLES/k draws each); per bloom step
 *       the 1s of every (value, bit) over SAMPLES/values draws per value; the first slot of
 *       every small partition table (rows: the records' grid indices of a rounded numeric
 *       attribute); per wave step on at most 65 grid points, the G x cells
 *       counts (SAMPLES/G draws per grid point); tests/test_sdk_audit.py
 *   ldp_sample bench randomize.json SECONDS   one JSON line per case: reports randomized per
 *       second on one core; ldpstream bench sdk
 *   ldp_sample memo-audit memo.json SAMPLES    per memoized case and memo unit (attribute,
 *       cluster, or partition table of slot 0 with at most 36 cells and 400 codes; a numeric
 *       attribute's grid index and column value): the counts of (true cell, reported cell or
 *       code) over SAMPLES reports of device 1, each in a new rotation
 *       period (a new memo), every record of the domain in turn; tests/test_sdk_memo_audit.py
 *   ldp_sample sizes                          the bytes of the structures a device keeps
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ldp.h"

static ldp_program prog;
static uint64_t counts[32 * 32];
static uint32_t xs[64][LDP_MAX_ATTRS];

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* a record's values of attribute j: its labels, or a numeric one's grid points (before any
   round step) */
static uint32_t input_size(uint32_t j) { return prog.numeric[j] ? prog.grid[j] : prog.size[j]; }

/* the first slot of a partition step, per table with at most 36 cells and 400 codes (and at
   most 64,000 input rows x codes): a device assigned to it, SAMPLES/rows reports of every
   input row, a record's values of the table's attributes (a numeric one's grid indices, which
   the description's round steps round first; the other attributes 0) */
static void audit_partition(const char *name, uint32_t si, long samples, ldp_rng *rng) {
  const ldp_step *s = &prog.steps[si];
  static uint64_t tc[64000];
  for (uint32_t ti = 0; ti < s->count; ti++) {
    const ldp_table *t = &prog.tables[s->first + ti];
    uint64_t codes = t->cells, dev = 0, rows = 1;
    if (t->g) {
      codes = t->g;
      for (uint32_t k = 0; k < t->r; k++) codes *= t->g;
    }
    for (uint8_t i = 0; i < t->n_in; i++) rows *= input_size(t->in[i]);
    if (codes > 400 || t->cells > 36 || rows * codes > 64000) continue;
    while (mix64(dev ^ s->seed) % s->count != ti) dev++;
    memset(tc, 0, sizeof tc);
    for (uint64_t c = 0; c < rows; c++) {
      uint32_t x[LDP_MAX_ATTRS] = {0}, report[LDP_MAX_WIDTH];
      uint64_t rest = c;
      for (int i = t->n_in - 1; i >= 0; i--) {
        x[t->in[i]] = (uint32_t)(rest % input_size(t->in[i]));
        rest /= input_size(t->in[i]);
      }
      for (long n = 0; n < samples / (long)rows; n++) {
        ldp_program_randomize(&prog, x, dev, rng, report);
        tc[c * codes + (report[s->out[0]] - t->offset)]++;
      }
    }
    printf("{\"case\":\"%s\",\"step\":%u,\"table\":%u,\"counts\":[", name, si, ti);
    for (uint64_t c = 0; c < rows; c++) {
      printf("%s[", c ? "," : "");
      for (uint64_t y = 0; y < codes; y++)
        printf("%s%llu", y ? "," : "", (unsigned long long)tc[c * codes + y]);
      printf("]");
    }
    printf("]}\n");
  }
}

/* a keep (8) or bloom (9) step, wherever it sits (a select's branch too), run by the library's
   own code: a copy of the program whose steps list is that one step */
/* one audit line: the k x k counts of step `step` (tests/test_sdk_audit.py) */
static void print_counts(const char *name, uint32_t step, uint64_t k) {
  printf("{\"case\":\"%s\",\"step\":%u,\"counts\":[", name, step);
  for (uint64_t x = 0; x < k; x++) {
    printf("%s[", x ? "," : "");
    for (uint64_t y = 0; y < k; y++)
      printf("%s%llu", y ? "," : "", (unsigned long long)counts[x * k + y]);
    printf("]");
  }
  printf("]}\n");
}

static void audit_post(const char *name, uint32_t si, long samples, ldp_rng *rng) {
  static ldp_program one;
  const ldp_step *s = &prog.steps[si];
  uint32_t x[LDP_MAX_ATTRS] = {0}, report[LDP_MAX_WIDTH];
  uint64_t k = s->cells;
  one = prog;
  one.steps[0] = *s;
  one.n_top = 1;
  if (s->op == 8) {
    if (k > 32) return;
    memset(counts, 0, sizeof counts);
    for (uint64_t c = 0; c < k; c++) {
      uint64_t rest = c;
      for (int i = s->n_in - 1; i >= 0; i--) {
        x[s->in[i]] = (uint32_t)(rest % prog.size[s->in[i]]);
        rest /= prog.size[s->in[i]];
      }
      for (long n = 0; n < samples / (long)k; n++) {
        ldp_program_randomize(&one, x, 0, rng, report);
        counts[c * k + report[s->out[0]]]++;
      }
    }
    print_counts(name, si, k);
    return;
  }
  /* bloom: s->value bits from column out[0] */
  uint64_t *ones = calloc(k * s->value, sizeof *ones);
  long per = samples / (long)k;
  if (!ones) return;
  for (uint64_t v = 0; v < k; v++) {
    x[s->in[0]] = (uint32_t)v;
    for (long n = 0; n < per; n++) {
      ldp_program_randomize(&one, x, 0, rng, report);
      for (uint32_t b = 0; b < s->value; b++) ones[v * s->value + b] += report[s->out[0] + b];
    }
  }
  printf("{\"case\":\"%s\",\"step\":%u,\"draws\":[", name, si);
  for (uint64_t v = 0; v < k; v++) printf("%s%ld", v ? "," : "", per);
  printf("],\"ones\":[");
  for (uint64_t v = 0; v < k; v++) {
    printf("%s[", v ? "," : "");
    for (uint32_t b = 0; b < s->value; b++)
      printf("%s%llu", b ? "," : "", (unsigned long long)ones[v * s->value + b]);
    printf("]");
  }
  printf("]}\n");
  free(ones);
}

/* a wave (10) on a grid of at most 65 points and at most 1,024 cells, wherever it sits: the
   G x cells counts of ldp_wave_cell, SAMPLES/G draws per grid point */
static void audit_wave(const char *name, uint32_t si, long samples, ldp_rng *rng) {
  static uint64_t wc[65 * 1024];
  const ldp_step *s = &prog.steps[si];
  uint32_t g = prog.size[s->in[0]];
  uint64_t k = s->cells;
  if (g > 65 || k > 1024) return;
  memset(wc, 0, sizeof wc);
  for (uint32_t i = 0; i < g; i++)
    for (long t = 0; t < samples / (long)g; t++) wc[i * k + ldp_wave_cell(&prog, si, i, rng)]++;
  printf("{\"case\":\"%s\",\"step\":%u,\"counts\":[", name, si);
  for (uint32_t i = 0; i < g; i++) {
    printf("%s[", i ? "," : "");
    for (uint64_t y = 0; y < k; y++)
      printf("%s%llu", y ? "," : "", (unsigned long long)wc[i * k + y]);
    printf("]");
  }
  printf("]}\n");
}

static void audit(const char *name, long samples, ldp_rng *rng) {
  for (uint32_t s = 0; s < prog.n_steps; s++) {
    uint64_t k = prog.steps[s].cells;
    if (prog.steps[s].op == 4) audit_partition(name, s, samples, rng);
    if (prog.steps[s].op == 10) audit_wave(name, s, samples, rng);
    if (prog.steps[s].op == 8 || prog.steps[s].op == 9) audit_post(name, s, samples, rng);
    if (prog.steps[s].op >= 3 || k > 32) continue;
    memset(counts, 0, sizeof counts);
    for (uint64_t x = 0; x < k; x++)
      for (long t = 0; t < samples / (long)k; t++)
        counts[x * k + ldp_step_apply(&prog, s, x, rng)]++;
    print_counts(name, s, k);
  }
}

/* memoized reports through ldp_memo_report, a new period each (docs/device-protocol.md,
   "Memoized descriptions"); one line per unit: its cells x outputs counts */
static uint64_t mc[LDP_MAX_STEPS][36 * 400];

/* a numeric memo unit (a wave, or a select over waves): the outputs its column takes (the
   largest offset + cells), else 0 */
static uint64_t numeric_codes(const ldp_step *s) {
  if (s->op == 10) return s->value + s->cells;
  if (s->op != 3) return 0;
  uint64_t top = 0;
  for (uint16_t b = 0; b < s->count; b++) {
    const ldp_step *w = &prog.steps[prog.branch_start[s->first + b]];
    if (w->value + w->cells > top) top = w->value + w->cells;
  }
  return top;
}

/* attribute j's cells as the device reads them (a numeric one: its grid, even when a round
   step makes the tables count its points) */
static uint32_t in_size(uint32_t j) { return prog.numeric[j] ? prog.grid[j] : prog.size[j]; }

static int memo_audit(const char *name, long samples, ldp_rng *rng) {
  static ldp_ledger ledger;
  uint32_t x[LDP_MAX_ATTRS] = {0}, report[LDP_MAX_WIDTH], n_rec = 1;
  const ldp_step *ps = &prog.steps[prog.unit_at[0]]; /* partition, select: the step */
  int part = prog.memo_kind == 2, sel = prog.memo_kind == 3;  /* select: per branch */
  uint32_t units = part || sel ? ps->count : prog.n_units;
  for (uint32_t j = 0; j < prog.n_attrs; j++) n_rec *= in_size(j);
  ldp_ledger_open(&ledger, 0.0, 86400.0, NULL);
  memset(mc, 0, sizeof mc);
  double t = 0.0, cost;
  for (uint32_t r = 0; r < n_rec; r++) {
    uint32_t rest = r;
    for (int j = (int)prog.n_attrs - 1; j >= 0; j--) {
      x[j] = rest % in_size(j);
      rest /= in_size(j);
    }
    for (long n = 0; n < samples / (long)n_rec; n++) {
      t += prog.rotation_s > 0 ? prog.rotation_s : 1.0;
      if (prog.rotation_s <= 0) ledger.n_memo = ledger.n_sent = 0;
      if (ldp_memo_report(&ledger, &prog, x, 1, t, 0.0, rng, report, &cost) != LDP_OK) return 5;
      for (uint32_t u = 0; u < units; u++) {
        if (part) {
          const ldp_table *tb = &prog.tables[ps->first + u];
          uint64_t codes = tb->g ? tb->g : tb->cells;
          for (uint32_t k = 0; tb->g && k < tb->r; k++) codes *= tb->g;
          uint32_t code = report[ps->out[0]];
          uint64_t rows = 1, cell = 0;
          for (uint8_t i = 0; i < tb->n_in; i++) rows *= in_size(tb->in[i]);
          if (rows > 36 || codes > 400 || code < tb->offset || code >= tb->offset + codes)
            continue;
          for (uint8_t i = 0; i < tb->n_in; i++) cell = cell * in_size(tb->in[i]) + x[tb->in[i]];
          mc[u][cell * codes + (code - tb->offset)]++;
        } else {
          const ldp_step *s = &prog.steps[sel ? prog.branch_start[ps->first + u] : prog.unit_at[u]];
          uint64_t cell = 0, out = 0, codes = sel ? 0 : numeric_codes(s);
          if (codes) { /* a numeric unit: (grid index, column value) */
            if (prog.size[s->in[0]] <= 36 && codes <= 400)
              mc[u][x[s->in[0]] * codes + report[s->in[0]]]++;
            continue;
          }
          if (s->cells > 36 || (sel && report[ps->out[0]] != u)) continue;
          for (uint8_t i = 0; i < s->n_in; i++) {
            cell = cell * prog.size[s->in[i]] + x[s->in[i]];
            out = out * prog.size[s->in[i]] + report[s->out[i]];
          }
          mc[u][cell * s->cells + out]++;
        }
      }
    }
  }
  for (uint32_t u = 0; u < units; u++) {
    uint64_t rows, cols;
    if (part) {
      const ldp_table *tb = &prog.tables[ps->first + u];
      rows = 1;
      for (uint8_t i = 0; i < tb->n_in; i++) rows *= in_size(tb->in[i]);
      cols = tb->g ? tb->g : tb->cells;
      for (uint32_t k = 0; tb->g && k < tb->r; k++) cols *= tb->g;
    } else {
      const ldp_step *s = &prog.steps[sel ? prog.branch_start[ps->first + u] : prog.unit_at[u]];
      cols = sel ? 0 : numeric_codes(s);
      rows = cols ? prog.size[s->in[0]] : s->cells;
      if (!cols) cols = s->cells;
    }
    if (rows > 36 || cols > 400) continue;
    printf("{\"case\":\"%s\",\"unit\":%u,\"counts\":[", name, u);
    for (uint64_t c = 0; c < rows; c++) {
      printf("%s[", c ? "," : "");
      for (uint64_t y = 0; y < cols; y++) printf("%s%llu", y ? "," : "",
                                                 (unsigned long long)mc[u][c * cols + y]);
      printf("]");
    }
    printf("]}\n");
  }
  return 0;
}

static int bench(const char *name, json_t *recs, double secs, ldp_rng *rng) {
  char err[256];
  size_t n = json_array_size(recs) < 64 ? json_array_size(recs) : 64;
  for (size_t r = 0; r < n; r++) {
    const char *names[LDP_MAX_ATTRS], *labels[LDP_MAX_ATTRS], *k;
    json_t *lab;
    size_t m = 0;
    json_object_foreach(json_array_get(recs, r), k, lab) {
      names[m] = k;
      labels[m++] = json_string_value(lab);
    }
    if (ldp_program_encode(&prog, names, labels, m, xs[r], err, sizeof err) != LDP_OK) return 4;
  }
  uint32_t report[LDP_MAX_WIDTH];
  unsigned long long done = 0, sink = 0;
  double t0 = now(), t;
  do {
    for (int rep = 0; rep < 10000; rep++) {
      ldp_program_randomize(&prog, xs[done % n], 0, rng, report);
      sink += report[0];
      done++;
    }
  } while ((t = now()) - t0 < secs);
  printf("{\"case\":\"%s\",\"reports_per_s\":%.0f,\"sink\":%llu}\n", name,
         done / (t - t0), sink % 2);
  return 0;
}

int main(int argc, char **argv) {
  json_error_t je;
  if (argc == 2 && strcmp(argv[1], "sizes") == 0) {
    printf("{\"ldp_state\":%zu,\"ldp_trust\":%zu,\"ldp_ledger\":%zu,\"ldp_os_rng\":%zu,"
           "\"ldp_device\":%zu,\"parse_arena\":%d}\n", sizeof(ldp_state), sizeof(ldp_trust),
           sizeof(ldp_ledger), sizeof(ldp_os_rng), sizeof(ldp_device), LDP_PARSE_ARENA);
    return 0;
  }
  if (argc < 4) return 2;
  json_t *v = json_load_file(argv[2], 0, &je), *c;
  ldp_os_rng os = {{0}, 0};
  ldp_rng rng = {ldp_os_rng_next, &os};
  size_t i;
  if (!v) return 2;
  if (strcmp(argv[1], "memo-audit") == 0) {  /* memo.json: the case itself and its kinds */
    const char *key;
    json_t *sub;
    int r = 0;
    json_t *top = json_object();
    json_object_set(top, "memo", v);
    json_object_foreach(v, key, sub) if (json_is_object(sub) && json_object_get(sub, "device"))
      json_object_set(top, key, sub);
    json_object_foreach(top, key, sub) {
      char err[256], *dev = json_dumps(json_object_get(sub, "device"), JSON_COMPACT);
      r = ldp_program_parse(&prog, dev, strlen(dev), err, sizeof err) != LDP_OK ? 3
          : memo_audit(key, atol(argv[3]), &rng);
      free(dev);
      if (r) break;
    }
    json_decref(top);
    json_decref(v);
    return r;
  }
  json_array_foreach(json_object_get(v, "cases"), i, c) {
    char err[256], *dev = json_dumps(json_object_get(c, "device"), JSON_COMPACT);
    const char *name = json_string_value(json_object_get(c, "name"));
    int parsed = ldp_program_parse(&prog, dev, strlen(dev), err, sizeof err);
    free(dev);
#ifdef LDP_PROFILE_FIRMWARE
    if (parsed == LDP_UNUSABLE) continue; /* beyond the profile's limits: no line */
#endif
    if (parsed != LDP_OK) return 3;
    if (strcmp(argv[1], "audit") == 0) audit(name, atol(argv[3]), &rng);
    else if (bench(name, json_object_get(c, "records"), atof(argv[3]), &rng)) return 4;
  }
  json_decref(v);
  return 0;
}
