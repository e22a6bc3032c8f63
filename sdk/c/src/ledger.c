#define _POSIX_C_SOURCE 200809L
/* The epsilon ledger and the batch sequence, persisted through a storage callback
   (docs/device-protocol.md, "Ledger"). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "run.h"

#define LEDGER_KEY "ledger"

/* saved form (native byte order): u64 next_sequence, u32 n, n pairs of f64 (at, eps), i64
   period, u32 n_memo, n_memo ldp_memo, u32 n_sent, n_sent pairs (u64 key, f64 at) */
#define SAVED_MAX (12 + 16 * LDP_LEDGER_CAP + 16 + sizeof(ldp_memo) * LDP_MEMO_CAP + \
                   16 * LDP_MEMO_CAP)
static uint8_t saved[SAVED_MAX];

static uint8_t *put(uint8_t *p, const void *v, size_t n) {
  memcpy(p, v, n);
  return p + n;
}

static int save(const ldp_ledger *l) {
  uint8_t *p = saved;
  if (!l->storage) return LDP_OK;
  p = put(p, &l->next_sequence, 8);
  p = put(p, &l->n, 4);
  for (uint32_t i = 0; i < l->n; i++) {
    p = put(p, &l->at[i], 8);
    p = put(p, &l->eps[i], 8);
  }
  p = put(p, &l->period, 8);
  p = put(p, &l->n_memo, 4);
  p = put(p, l->memo, sizeof(ldp_memo) * l->n_memo);
  p = put(p, &l->n_sent, 4);
  for (uint32_t i = 0; i < l->n_sent; i++) {
    p = put(p, &l->sent_key[i], 8);
    p = put(p, &l->sent_at[i], 8);
  }
  return l->storage->save(l->storage->ctx, LEDGER_KEY, saved, (size_t)(p - saved)) == 0
             ? LDP_OK : LDP_E_STORAGE;
}

static int get(const uint8_t **p, const uint8_t *end, void *v, size_t n) {
  if ((size_t)(end - *p) < n) return -1;
  memcpy(v, *p, n);
  *p += n;
  return 0;
}

int ldp_ledger_open(ldp_ledger *l, double budget, double window_s, const ldp_storage *s) {
  size_t len = 0;
  memset(l, 0, sizeof *l);
  l->budget = budget;
  l->window_s = window_s;
  l->storage = s;
  l->period = -1;
  if (!s) return LDP_OK;
  int r = s->load(s->ctx, LEDGER_KEY, saved, sizeof saved, &len);
  if (r == 1) return LDP_OK;
  if (r != 0) return LDP_E_STORAGE;
  const uint8_t *p = saved, *end = saved + len;
  int bad = get(&p, end, &l->next_sequence, 8) || get(&p, end, &l->n, 4) ||
            l->n > LDP_LEDGER_CAP;
  for (uint32_t i = 0; !bad && i < l->n; i++)
    bad = get(&p, end, &l->at[i], 8) || get(&p, end, &l->eps[i], 8);
  bad = bad || get(&p, end, &l->period, 8) || get(&p, end, &l->n_memo, 4) ||
        l->n_memo > LDP_MEMO_CAP || get(&p, end, l->memo, sizeof(ldp_memo) * l->n_memo) ||
        get(&p, end, &l->n_sent, 4) || l->n_sent > LDP_MEMO_CAP;
  for (uint32_t i = 0; !bad && i < l->n_sent; i++)
    bad = get(&p, end, &l->sent_key[i], 8) || get(&p, end, &l->sent_at[i], 8);
  if (bad || p != end) {
    memset(l, 0, sizeof *l);
    return LDP_E_STORAGE;
  }
  l->budget = budget;
  l->window_s = window_s;
  l->storage = s;
  return LDP_OK;
}

/* the ledger's time: never before its newest spend, so a clock stepped back does not move the
   budget window back (spends are stamped with it, so the newest is the last) */
static double ledger_now(const ldp_ledger *l, double now) {
  return l->n > 0 && l->at[l->n - 1] > now ? l->at[l->n - 1] : now;
}

/* spends in the window up to the ledger's time (later ones too) */
double ldp_ledger_spent_window(const ldp_ledger *l, double now) {
  double s = 0.0, t = ledger_now(l, now);
  for (uint32_t i = 0; i < l->n; i++)
    if (l->at[i] > t - l->window_s) s += l->eps[i];
  return s;
}

/* the start of the budget day of t: its UTC calendar day (docs/privacy-over-time.md) */
static double day_start(double t) { return floor(t / LDP_DAY_S) * LDP_DAY_S; }

double ldp_ledger_spent_today(const ldp_ledger *l, double now) {
  double s = 0.0, start = day_start(ledger_now(l, now));
  for (uint32_t i = 0; i < l->n; i++)
    if (l->at[i] >= start) s += l->eps[i];
  return s;
}

/* the window budget first, then the collection's max_epsilon_per_day */
static int refused(const ldp_ledger *l, double cost, double now) {
  if (cost <= 0.0) return 0;
  if (l->budget > 0.0 && ldp_ledger_spent_window(l, now) + cost > l->budget * (1 + 1e-12))
    return 1;
  return l->max_epsilon_per_day > 0.0 &&
         ldp_ledger_spent_today(l, now) + cost > l->max_epsilon_per_day * (1 + 1e-12);
}

/* record a spend (without saving), stamped with the ledger's time; a full ledger drops the
   spends no limit counts any more and sums those only the budget day counts (out of the window:
   a prefix, the ledger's time never goes back) into one, stamped with the newest of them */
static int spend(ldp_ledger *l, double cost, double now) {
  if (cost <= 0.0) return LDP_OK;
  now = ledger_now(l, now);
  if (l->n == LDP_LEDGER_CAP) {
    uint32_t k = 0;
    double start = day_start(now), day_at = 0.0, day_eps = 0.0;
    for (uint32_t i = 0; i < l->n; i++) {
      if (l->budget > 0.0 && l->at[i] > now - l->window_s) {
        if (day_eps > 0.0) {
          l->at[k] = day_at;
          l->eps[k++] = day_eps;
          day_eps = 0.0;
        }
        l->at[k] = l->at[i];
        l->eps[k++] = l->eps[i];
      } else if (l->max_epsilon_per_day > 0.0 && l->at[i] >= start) {
        day_at = l->at[i];
        day_eps += l->eps[i];
      }
    }
    if (day_eps > 0.0) {
      l->at[k] = day_at;
      l->eps[k++] = day_eps;
    }
    l->n = k;
    if (k == LDP_LEDGER_CAP) return LDP_E_BUDGET;
  }
  l->at[l->n] = now;
  l->eps[l->n++] = cost;
  return LDP_OK;
}

int ldp_ledger_charge(ldp_ledger *l, double cost, double now) {
  if (refused(l, cost, now)) return LDP_E_BUDGET;
  int r = spend(l, cost, now);
  return r == LDP_OK ? save(l) : r;
}

static uint64_t record_key(const ldp_program *p, const uint32_t *x) {
  uint8_t buf[4 * LDP_MAX_ATTRS], out[8];
  crypto_generichash_state h;
  crypto_generichash_init(&h, NULL, 0, sizeof out);
  crypto_generichash_update(&h, p->fingerprint, sizeof p->fingerprint);
  for (uint32_t j = 0; j < p->n_attrs; j++) ldp_le(buf + 4 * j, x[j], 4);
  crypto_generichash_update(&h, buf, 4 * (size_t)p->n_attrs);
  crypto_generichash_final(&h, out, sizeof out);
  uint64_t k;
  memcpy(&k, out, 8);
  return k;
}

static int find_memo(const ldp_ledger *l, const ldp_program *p, uint32_t j, uint32_t v) {
  for (uint32_t i = 0; i < l->n_memo; i++)
    if (l->memo[i].attribute == j && l->memo[i].value == v &&
        memcmp(l->memo[i].fingerprint, p->fingerprint, sizeof p->fingerprint) == 0)
      return (int)i;
  return -1;
}

int ldp_memo_report(ldp_ledger *l, const ldp_program *p, const uint32_t *x, uint64_t device_id,
                    double now, double resend_every_s, ldp_rng *rng, uint32_t *report,
                    double *cost) {
  uint32_t unit[LDP_MAX_ATTRS], cell[LDP_MAX_ATTRS], y[LDP_MAX_ATTRS], xr[LDP_MAX_ATTRS];
  int have[LDP_MAX_ATTRS];
  ldp_memo_round(p, x, device_id, xr); /* the record the memos are keyed by */
  x = xr;
  int64_t period = p->rotation_s > 0 ? (int64_t)floor(now / p->rotation_s) : 0;
  *cost = 0.0;
  if (period < l->period) period = l->period; /* a clock stepped back keeps the newest period */
  int newer = period > l->period;
  uint64_t key = record_key(p, x);
  for (uint32_t i = 0; !newer && i < l->n_sent; i++)
    if (l->sent_key[i] == key &&
        (resend_every_s <= 0.0 || now - l->sent_at[i] < resend_every_s))
      return LDP_DUPLICATE;
  uint32_t n = ldp_memo_keys(p, x, device_id, period, unit, cell), missing = 0;
  for (uint32_t u = 0; u < n; u++) {
    have[u] = newer ? -1 : find_memo(l, p, unit[u], cell[u]);
    if (have[u] < 0) {
      *cost += ldp_memo_unit_eps(p, unit[u]);
      missing++;
    }
  }
  uint32_t kept_memo = newer ? 0 : l->n_memo, kept_sent = newer ? 0 : l->n_sent;
  if (kept_memo + missing > LDP_MEMO_CAP || kept_sent + 1 > LDP_MEMO_CAP) {
    *cost = 0.0;
    return LDP_E_FULL;
  }
  if (refused(l, *cost, now)) return LDP_E_BUDGET; /* *cost: what it would have cost */
  for (uint32_t u = 0; u < n; u++)
    y[u] = have[u] >= 0 ? l->memo[have[u]].response : ldp_memo_draw(p, unit[u], cell[u], rng);
  ldp_memo_emit(p, unit, y, n, rng, report);
  if (newer) {  /* past periods are never reused */
    l->n_memo = l->n_sent = 0;
    l->period = period;
  }
  for (uint32_t u = 0; u < n; u++)
    if (have[u] < 0) {
      ldp_memo *m = &l->memo[l->n_memo++];
      memcpy(m->fingerprint, p->fingerprint, sizeof m->fingerprint);
      m->attribute = unit[u];
      m->value = cell[u];
      m->response = y[u];
    }
  uint32_t i = 0;
  while (i < l->n_sent && l->sent_key[i] != key) i++;
  if (i == l->n_sent) l->n_sent++;
  l->sent_key[i] = key;
  l->sent_at[i] = now;
  int r = spend(l, *cost, now);
  return r == LDP_OK ? save(l) : r;
}

int ldp_ledger_take_sequence(ldp_ledger *l, uint64_t *seq) {
  *seq = l->next_sequence++;
  return save(l);
}

/* --- file storage ------------------------------------------------------------------------- */
static int path_of(char *out, size_t cap, const char *dir, const char *key) {
  int n = snprintf(out, cap, "%s/%s", dir, key);
  return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* plain POSIX calls (no stdio buffers): the report path allocates nothing */
static int file_load(void *ctx, const char *key, uint8_t *buf, size_t cap, size_t *len) {
  char path[4096];
  if (path_of(path, sizeof path, (const char *)ctx, key)) return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? 1 : -1;
  size_t got = 0;
  for (;;) {
    ssize_t k = read(fd, buf + got, cap - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      close(fd);
      if (k < 0) return -1;
      break;
    }
    got += (size_t)k;
    if (got == cap) { /* full: the file must end here */
      uint8_t extra;
      ssize_t more = read(fd, &extra, 1);
      close(fd);
      if (more != 0) return -1;
      break;
    }
  }
  *len = got;
  return 0;
}

static int file_save(void *ctx, const char *key, const uint8_t *buf, size_t len) {
  char path[4096], tmp[4100];
  if (path_of(path, sizeof path, (const char *)ctx, key)) return -1;
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  size_t done = 0;
  while (done < len) {
    ssize_t k = write(fd, buf + done, len - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    done += (size_t)k;
  }
  int bad = done != len || fsync(fd) != 0;
  bad |= close(fd) != 0;
  return bad || rename(tmp, path) != 0 ? -1 : 0;
}

void ldp_file_storage(ldp_storage *s, const char *dir) {
  s->load = file_load;
  s->save = file_save;
  s->ctx = (void *)dir;
}
