/* The randomization description, parse layer: JSON -> ldp_program, each step's epsilon
   (docs/device-protocol.md, "Randomization description"); the partition step is parsed in
   parse_partition.c, rows and the const, copy, keep and bloom steps in parse_rows.c, the memoize
   object in parse_memo.c. run_program.c runs the result. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

static int put_text(parser *ps, const char *s, uint32_t *at) {
  size_t n = strlen(s) + 1;
  if (ps->text_used + n > LDP_LABEL_BYTES) return -1;
  memcpy(ps->p->text + ps->text_used, s, n);
  *at = ps->text_used;
  ps->text_used += (uint32_t)n;
  return 0;
}

int ldp_int_list(parser *ps, json_t *v, const char *field, uint32_t below, uint16_t *out,
                    uint8_t *n) {
  size_t i, len = json_is_array(v) ? json_array_size(v) : 0;
  if (len == 0 || len > LDP_MAX_ATTRS) goto bad;
  for (i = 0; i < len; i++) {
    json_t *c = json_array_get(v, i);
    if (!json_is_integer(c) || json_integer_value(c) < 0 ||
        (uint64_t)json_integer_value(c) >= below)
      goto bad;
    out[i] = (uint16_t)json_integer_value(c);
  }
  *n = (uint8_t)len;
  return 0;
bad:
  ldp_errf(ps->err, ps->errlen, "%s: must be a non-empty list of integers in [0, %u)", field,
           below);
  return -1;
}

int ldp_cells(parser *ps, const uint16_t *in, uint8_t n, const char *field, uint64_t *cells) {
  uint64_t k = 1;
  for (uint8_t i = 0; i < n; i++) { /* each size <= 2^16 (labels, a numeric grid) and k <=
                                        2^32: k * size never wraps */
    k *= ps->p->size[in[i]];
    if (k > LDP_MAX_CELLS) {
      ldp_errf(ps->err, ps->errlen, "%s: more than 2^32 cells", field);
      return -1;
    }
  }
  *cells = k;
  return 0;
}

/* max over columns of ln(max/min) of the column (inf: a zero beside a positive entry) */
static double matrix_epsilon(json_t *rows, uint64_t k) {
  double best = 0.0;
  for (uint64_t j = 0; j < k; j++) {
    double lo = INFINITY, hi = 0.0;
    for (uint64_t i = 0; i < k; i++) {
      double x = json_number_value(json_array_get(json_array_get(rows, i), j));
      if (x < lo) lo = x;
      if (x > hi) hi = x;
    }
    if (hi > 0.0) {
      if (lo <= 0.0) return INFINITY;
      if (log(hi / lo) > best) best = log(hi / lo);
    }
  }
  return best;
}

static int parse_step(parser *ps, json_t *d, const char *field, int depth) {
  ldp_program *p = ps->p;
  char f[160];
  if (!json_is_object(d)) {
    ldp_errf(ps->err, ps->errlen, "%s: must be an object", field);
    return -1;
  }
  if (p->n_steps >= LDP_MAX_STEPS) {
    ldp_errf(ps->err, ps->errlen, "%s: more than %d steps", field, LDP_MAX_STEPS);
    return -1;
  }
  ldp_step *s = &p->steps[p->n_steps];
  memset(s, 0, sizeof *s);
  const char *op = json_string_value(json_object_get(d, "op"));
  if (op && strcmp(op, "select") == 0) {
    json_t *out = json_object_get(d, "out"), *br = json_object_get(d, "branches");
    int hidden = !out || json_is_null(out);
    if (!hidden && (!json_is_integer(out) || json_integer_value(out) < 0 ||
                    json_integer_value(out) >= (json_int_t)p->width)) {
      ldp_errf(ps->err, ps->errlen, "%s.out: must be null or an integer in [0, %u)", field,
               p->width);
      return -1;
    }
    size_t nb = json_is_array(br) ? json_array_size(br) : 0;
    if (depth > 0 || nb < 1 || nb > LDP_MAX_STEPS) {
      ldp_errf(ps->err, ps->errlen, "%s.branches: must be 1..64 lists of steps (not nested)",
               field);
      return -1;
    }
    s->op = LDP_OP_SELECT;
    s->n_out = hidden ? 0 : 1;
    s->out[0] = hidden ? 0 : (uint16_t)json_integer_value(out);
    /* its branches' starts and their end: after those of every select before it (each
       select and branch is a step, so they fit in branch_start) */
    s->first = (uint16_t)(ps->branches_used + ps->selects++);
    s->count = (uint16_t)nb;
    ldp_errf(f, sizeof f, "%s.weights", field);
    if (ldp_parse_weights(ps, json_object_get(d, "weights"), nb, f, s)) return -1;
    if (ps->branches_used + nb > LDP_MAX_STEPS) {
      ldp_errf(ps->err, ps->errlen, "%s.branches: more than %d branches in all", field,
               LDP_MAX_STEPS);
      return -1;
    }
    ps->branches_used += (uint32_t)nb;
    p->n_steps++;
    double best = 0.0;
    for (size_t b = 0; b < nb; b++) {
      uint16_t bf, bc;
      ldp_errf(f, sizeof f, "%s.branches[%zu]", field, b);
      p->branch_start[s->first + b] = (uint16_t)p->n_steps;
      if (ldp_parse_steps(ps, json_array_get(br, b), f, depth + 1, &bf, &bc)) return -1;
      double e = 0.0;
      for (uint16_t i = bf; i < bf + bc; i++) e += p->steps[i].eps;
      if (e > best) best = e;
    }
    p->branch_start[s->first + nb] = (uint16_t)p->n_steps;
    s->eps = best;
    return 0;
  }
  if (op && strcmp(op, "partition") == 0 && depth == 0) return ldp_parse_partition(ps, d, field, s);
  if (op && (strcmp(op, "const") == 0 || strcmp(op, "copy") == 0 || strcmp(op, "keep") == 0 ||
             strcmp(op, "bloom") == 0))
    return ldp_parse_post(ps, d, field, s, op);
  if (op && strcmp(op, "wave") == 0) return ldp_parse_wave(ps, d, field, s);
  if (op && strcmp(op, "round") == 0) return ldp_parse_round(ps, d, field, s, depth);
  if (!op || (strcmp(op, "grr") && strcmp(op, "matrix") && strcmp(op, "uniform"))) {
    ldp_errf(ps->err, ps->errlen, "%s.op: unknown op '%s' (known: grr, matrix, uniform, copy, "
             "const, keep, bloom, wave, round, select, partition)", field, op ? op : "");
    return -1;
  }
  uint8_t n_out;
  ldp_errf(f, sizeof f, "%s.in", field);
  if (ldp_int_list(ps, json_object_get(d, "in"), f, p->n_attrs, s->in, &s->n_in)) return -1;
  ldp_errf(f, sizeof f, "%s.out", field);
  if (ldp_int_list(ps, json_object_get(d, "out"), f, p->width, s->out, &n_out)) return -1;
  if (n_out != s->n_in) {
    ldp_errf(ps->err, ps->errlen, "%s.out: must have as many columns as in", field);
    return -1;
  }
  ldp_errf(f, sizeof f, "%s.in", field);
  if (ldp_cells(ps, s->in, s->n_in, f, &s->cells)) return -1;
  if (strcmp(op, "uniform") == 0) {
    s->op = LDP_OP_UNIFORM;
    s->eps = 0.0;
  } else if (strcmp(op, "grr") == 0) {
    json_t *pv = json_object_get(d, "p");
    double pr = json_number_value(pv);
    if (!json_is_number(pv) || !(pr >= 0.0 && pr <= 1.0)) {
      ldp_errf(ps->err, ps->errlen, "%s.p: must be a number in [0, 1]", field);
      return -1;
    }
    s->op = LDP_OP_GRR;
    s->p = pr;
    s->eps = ldp_grr_epsilon(pr, s->cells);
  } else {
    json_t *rows = json_object_get(d, "rows");
    uint64_t k = s->cells;
    s->op = LDP_OP_MATRIX;
    if (ldp_parse_rows(ps, rows, field, k, s)) return -1;
    if (s->value != k) {
      ldp_errf(ps->err, ps->errlen, "%s.rows: must be %llux%llu (at most %d matrix entries in "
               "all)", field, (unsigned long long)k, (unsigned long long)k, LDP_MAX_MATRIX);
      return -1;
    }
    s->eps = matrix_epsilon(rows, k);
  }
  p->n_steps++;
  return 0;
}

int ldp_parse_steps(parser *ps, json_t *arr, const char *field, int depth, uint16_t *first,
                    uint16_t *count) {
  size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
  char f[160];
  if (n < 1 || n > LDP_MAX_STEPS) {
    ldp_errf(ps->err, ps->errlen, "%s: must be a list of 1..%d steps", field, LDP_MAX_STEPS);
    return -1;
  }
  *first = (uint16_t)ps->p->n_steps;
  *count = 0;
  for (size_t i = 0; i < n; i++) {
    ldp_errf(f, sizeof f, "%s[%zu]", field, i);
    if (parse_step(ps, json_array_get(arr, i), f, depth)) return -1;
    (*count)++;
  }
  return 0;
}

static int parse_doc(parser *ps, json_t *d) {
  ldp_program *p = ps->p;
  if (!json_is_object(d)) {
    ldp_errf(ps->err, ps->errlen, "device: must be an object");
    return -1;
  }
  json_t *v = json_object_get(d, "v");
  if (!json_is_integer(v) || json_integer_value(v) != LDP_PROGRAM_VERSION) {
    ldp_errf(ps->err, ps->errlen, "device.v: unsupported version (this SDK runs %d)",
             LDP_PROGRAM_VERSION);
    return -1;
  }
  const char *fam = json_string_value(json_object_get(d, "family"));
  snprintf(p->family, sizeof p->family, "%s", fam ? fam : "?");
  json_t *attrs = json_object_get(d, "attrs"), *labels = json_object_get(d, "labels");
  json_t *width = json_object_get(d, "width");
  size_t m = json_is_array(attrs) ? json_array_size(attrs) : 0;
  if (m < 1 || m > LDP_MAX_ATTRS) {
    ldp_errf(ps->err, ps->errlen, "device.attrs: must be 1..%d attribute names", LDP_MAX_ATTRS);
    return -1;
  }
  if (!json_is_array(labels) || json_array_size(labels) != m) {
    ldp_errf(ps->err, ps->errlen, "device.labels: must hold >= 2 string labels per attribute");
    return -1;
  }
  if (!json_is_integer(width) || json_integer_value(width) < 1 ||
      json_integer_value(width) > LDP_MAX_WIDTH) {
    ldp_errf(ps->err, ps->errlen, "device.width: must be an integer in [1, %d]", LDP_MAX_WIDTH);
    return -1;
  }
  p->n_attrs = (uint32_t)m;
  p->width = (uint32_t)json_integer_value(width);
  for (size_t j = 0; j < m; j++) {
    const char *name = json_string_value(json_array_get(attrs, j));
    json_t *labs = json_array_get(labels, j);
    size_t d_j = json_is_array(labs) ? json_array_size(labs) : 0;
    if (!name || put_text(ps, name, &p->name_at[j])) {
      ldp_errf(ps->err, ps->errlen, "device.attrs: must be 1..%d attribute names (at most %d "
               "bytes of text)", LDP_MAX_ATTRS, LDP_LABEL_BYTES);
      return -1;
    }
    if (json_is_object(labs)) { /* a numeric attribute: {min, max, grid} */
      if (ldp_parse_numeric_attr(ps, labs, j)) return -1;
      continue;
    }
    if (d_j < 2 || ps->labels_used + d_j > LDP_MAX_LABELS) {
      ldp_errf(ps->err, ps->errlen, "device.labels[%zu]: must hold >= 2 string labels (at most "
               "%d in all)", j, LDP_MAX_LABELS);
      return -1;
    }
    p->size[j] = (uint32_t)d_j;
    p->label0[j] = ps->labels_used;
    for (size_t i = 0; i < d_j; i++) {
      const char *lab = json_string_value(json_array_get(labs, i));
      if (!lab || put_text(ps, lab, &p->label_at[ps->labels_used])) {
        ldp_errf(ps->err, ps->errlen, "device.labels[%zu]: must hold strings (at most %d bytes "
                 "of text)", j, LDP_LABEL_BYTES);
        return -1;
      }
      ps->labels_used++;
    }
  }
  uint16_t first, count;
  json_t *memo = json_object_get(d, "memoize"), *steps = json_object_get(d, "steps");
  if (memo && json_is_null(memo)) memo = NULL;
  ps->memo = memo != NULL;
  if (!(memo && json_is_array(steps) && json_array_size(steps) == 0) &&
      ldp_parse_steps(ps, steps, "device.steps", 0, &first, &count))
    return -1;
  p->n_top = p->n_steps;
  p->epsilon = 0.0;
  for (uint32_t i = 0; i < p->n_top; i = ldp_after(p, i)) p->epsilon += p->steps[i].eps;
  return memo ? ldp_parse_memo(ps, memo) : 0;
}

int ldp_program_from_json(ldp_program *prog, void *json, char *err, size_t errlen) {
  parser ps = {.p = prog, .err = err, .errlen = errlen};
  memset(prog, 0, offsetof(ldp_program, text));
  prog->n_steps = 0;
  prog->n_tables = 0;
  return parse_doc(&ps, (json_t *)json) ? LDP_UNUSABLE : LDP_OK;
}

int ldp_program_parse(ldp_program *prog, const char *json, size_t len, char *err,
                      size_t errlen) {
  json_error_t je;
  json_t *d = json_loadb(json, len, 0, &je);
  if (!d) {
    ldp_errf(err, errlen, "device: not JSON: %s", je.text);
    return LDP_MALFORMED;
  }
  int r = ldp_program_from_json(prog, d, err, errlen);
  json_decref(d);
  return r;
}

