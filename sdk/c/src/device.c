/* One device reporting to one collection: randomize, charge, buffer, encode. */
#include <string.h>

#include "run.h"

/* which limit refused a report costing cost: the window budget, or the collection's
   max_epsilon_per_day in the budget day (docs/privacy-over-time.md) */
static void budget_error(const ldp_device *d, double cost, double now, char *err,
                         size_t errlen) {
  const ldp_ledger *l = d->ledger;
  double window = ldp_ledger_spent_window(l, now), today = ldp_ledger_spent_today(l, now);
  if (l->budget > 0.0 && window + cost > l->budget * (1 + 1e-12))
    ldp_errf(err, errlen, "budget exceeded: this report costs epsilon=%g, %g already spent in "
             "the last %g s, budget %g", cost, window, l->window_s, l->budget);
  else
    ldp_errf(err, errlen, "over_budget: this report costs epsilon=%g, %g already spent on '%s' "
             "this UTC day, its max_epsilon_per_day is %g", cost, today, d->state->collection,
             l->max_epsilon_per_day);
}

int ldp_device_report(ldp_device *d, const char *const *names, const char *const *labels,
                      size_t n, double now, double *cost, char *err, size_t errlen) {
  return ldp_device_report_clip(d, names, labels, n, now, cost, NULL, err, errlen);
}

int ldp_device_report_clip(ldp_device *d, const char *const *names, const char *const *labels,
                           size_t n, double now, double *cost, uint8_t *clipped, char *err,
                           size_t errlen) {
  uint32_t x[LDP_MAX_ATTRS];
  *cost = 0.0;
  if (!d->state || !d->state->present) {
    ldp_errf(err, errlen, "no accepted mechanism state");
    return LDP_E_NO_STATE;
  }
  const ldp_program *p = &d->state->program;
  if (d->n > 0 && (d->n == d->capacity || d->version != d->state->version)) {
    ldp_errf(err, errlen, "flush first (buffer full or a new state version)");
    return LDP_E_FULL;
  }
  int r = ldp_program_encode_clip(p, names, labels, n, x, clipped, err, errlen);
  if (r != LDP_OK) return r;
  uint32_t *report = d->reports + (size_t)d->n * p->width;
  double charged = p->epsilon;
  d->ledger->max_epsilon_per_day = d->state->max_epsilon_per_day;
  if (p->memoized) {
    r = ldp_memo_report(d->ledger, p, x, d->device_id, now, d->resend_every_s, &d->rng, report,
                        &charged);
  } else {
    r = ldp_ledger_charge(d->ledger, p->epsilon, now);
    if (r == LDP_OK) ldp_program_randomize(p, x, d->device_id, &d->rng, report);
  }
  if (r == LDP_E_BUDGET) budget_error(d, charged, now, err, errlen);
  if (r == LDP_DUPLICATE) ldp_errf(err, errlen, "this record was already reported in this "
                                   "rotation period");
  if (r == LDP_E_FULL) ldp_errf(err, errlen, "the memo table is full (LDP_MEMO_CAP)");
  if (r != LDP_OK) return r;
  d->ids[d->n] = d->device_id;
  d->version = d->state->version;
  d->width = p->width;
  d->n++;
  *cost = charged;
  return LDP_OK;
}

size_t ldp_device_flush(ldp_device *d, double now, uint8_t *out, size_t cap, int *result) {
  uint64_t key[2] = {d->device_id, 0};
  *result = LDP_OK;
  if (d->n == 0) return 0;
  uint32_t hi = 0;
  for (size_t i = 0; i < (size_t)d->n * d->width; i++)
    if (d->reports[i] > hi) hi = d->reports[i];
  if (ldp_batch_size(strlen(d->state->collection), d->n, (uint16_t)d->width, hi, 1, 1) > cap) {
    *result = LDP_E_ARG;
    return 0;
  }
  if ((*result = ldp_ledger_take_sequence(d->ledger, &key[1])) != LDP_OK) return 0;
  size_t len = ldp_batch_encode(out, cap, d->state->collection, d->version, now, d->reports,
                                d->n, (uint16_t)d->width, d->ids, key);
  if (len == 0) *result = LDP_E_ARG;
  else d->n = 0;
  return len;
}
