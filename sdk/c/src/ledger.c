#define _POSIX_C_SOURCE 200809L
/* The epsilon ledger and the batch sequence, persisted through a storage callback
   (docs/device-protocol.md, "Ledger"). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define LEDGER_KEY "ledger"

/* saved form: u64 next_sequence, u32 n, then n pairs of f64 (at, eps), native byte order */
static int save(const ldp_ledger *l) {
  uint8_t buf[12 + 16 * LDP_LEDGER_CAP];
  if (!l->storage) return LDP_OK;
  memcpy(buf, &l->next_sequence, 8);
  memcpy(buf + 8, &l->n, 4);
  for (uint32_t i = 0; i < l->n; i++) {
    memcpy(buf + 12 + 16 * i, &l->at[i], 8);
    memcpy(buf + 20 + 16 * i, &l->eps[i], 8);
  }
  return l->storage->save(l->storage->ctx, LEDGER_KEY, buf, 12 + 16 * (size_t)l->n) == 0
             ? LDP_OK : LDP_E_STORAGE;
}

int ldp_ledger_open(ldp_ledger *l, double budget, double window_s, const ldp_storage *s) {
  uint8_t buf[12 + 16 * LDP_LEDGER_CAP];
  size_t len = 0;
  memset(l, 0, sizeof *l);
  l->budget = budget;
  l->window_s = window_s;
  l->storage = s;
  if (!s) return LDP_OK;
  int r = s->load(s->ctx, LEDGER_KEY, buf, sizeof buf, &len);
  if (r == 1) return LDP_OK;
  if (r != 0 || len < 12) return LDP_E_STORAGE;
  memcpy(&l->next_sequence, buf, 8);
  memcpy(&l->n, buf + 8, 4);
  if (l->n > LDP_LEDGER_CAP || len != 12 + 16 * (size_t)l->n) return LDP_E_STORAGE;
  for (uint32_t i = 0; i < l->n; i++) {
    memcpy(&l->at[i], buf + 12 + 16 * i, 8);
    memcpy(&l->eps[i], buf + 20 + 16 * i, 8);
  }
  return LDP_OK;
}

/* spends stamped after now - window (later ones too: a clock stepped back frees nothing) */
static double spent(const ldp_ledger *l, double now) {
  double s = 0.0;
  for (uint32_t i = 0; i < l->n; i++)
    if (l->at[i] > now - l->window_s) s += l->eps[i];
  return s;
}

int ldp_ledger_charge(ldp_ledger *l, double cost, double now) {
  if (l->budget <= 0.0 || cost <= 0.0) return LDP_OK;
  if (spent(l, now) + cost > l->budget * (1 + 1e-12)) return LDP_E_BUDGET;
  if (l->n == LDP_LEDGER_CAP) { /* drop spends that left the window */
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->n; i++)
      if (l->at[i] > now - l->window_s) {
        l->at[k] = l->at[i];
        l->eps[k++] = l->eps[i];
      }
    l->n = k;
    if (k == LDP_LEDGER_CAP) return LDP_E_BUDGET;
  }
  l->at[l->n] = now;
  l->eps[l->n++] = cost;
  return save(l);
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

static int file_load(void *ctx, const char *key, uint8_t *buf, size_t cap, size_t *len) {
  char path[4096];
  if (path_of(path, sizeof path, (const char *)ctx, key)) return -1;
  FILE *f = fopen(path, "rb");
  if (!f) return 1;
  *len = fread(buf, 1, cap, f);
  int bad = ferror(f) || (*len == cap && fgetc(f) != EOF);
  fclose(f);
  return bad ? -1 : 0;
}

static int file_save(void *ctx, const char *key, const uint8_t *buf, size_t len) {
  char path[4096], tmp[4100];
  if (path_of(path, sizeof path, (const char *)ctx, key)) return -1;
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return -1;
  int bad = fwrite(buf, 1, len, f) != len;
  bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  return bad || rename(tmp, path) != 0 ? -1 : 0;
}

void ldp_file_storage(ldp_storage *s, const char *dir) {
  s->load = file_load;
  s->save = file_save;
  s->ctx = (void *)dir;
}
