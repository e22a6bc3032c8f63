#define _POSIX_C_SOURCE 200809L
/* Unit tests of the C SDK: parse errors name the field, the ledger and the batch sequence
   survive a restart through the file storage, the encoder refuses what it cannot write, the OS
   generator draws. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ldp.h"

static int failures = 0;
#define CHECK(cond, what)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      failures++;                                                           \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, what);             \
    }                                                                       \
  } while (0)

static ldp_program prog;

static const char GOOD[] =
    "{\"v\":1,\"family\":\"rr-ind\",\"attrs\":[\"os\",\"plan\"],\"labels\":[[\"a\",\"b\",\"c\"],"
    "[\"free\",\"pro\"]],\"width\":2,\"steps\":[{\"op\":\"grr\",\"in\":[0],\"out\":[0],"
    "\"p\":0.5},{\"op\":\"grr\",\"in\":[1],\"out\":[1],\"p\":0.75}]}";

static void parse_errors(void) {
  char err[256];
  struct { const char *json, *field; } bad[] = {
      {"{\"v\":2}", "device.v"},
      {"[1]", "device"},
      {"{\"v\":1,\"attrs\":[\"a\"],\"labels\":[[\"x\",\"y\"]],\"width\":0}", "device.width"},
      {"{\"v\":1,\"attrs\":[\"a\"],\"labels\":[[\"x\"]],\"width\":1}", "device.labels[0]"},
      {"{\"v\":1,\"attrs\":[\"a\"],\"labels\":[[\"x\",\"y\"]],\"width\":1,\"steps\":[{\"op\":"
       "\"oue\"}]}", "device.steps[0].op"},
      {"{\"v\":1,\"attrs\":[\"a\"],\"labels\":[[\"x\",\"y\"]],\"width\":1,\"steps\":[{\"op\":"
       "\"grr\",\"in\":[0],\"out\":[0],\"p\":1.5}]}", "device.steps[0].p"},
      {"{\"v\":1,\"attrs\":[\"a\"],\"labels\":[[\"x\",\"y\"]],\"width\":1,\"steps\":[{\"op\":"
       "\"matrix\",\"in\":[0],\"out\":[0],\"rows\":[[0.5,0.4],[0.5,0.5]]}]}",
       "device.steps[0].rows[0]"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int r = ldp_program_parse(&prog, bad[i].json, strlen(bad[i].json), err, sizeof err);
    CHECK(r != LDP_OK && strncmp(err, bad[i].field, strlen(bad[i].field)) == 0 &&
              err[strlen(bad[i].field)] == ':', bad[i].field);
  }
  CHECK(ldp_program_parse(&prog, GOOD, strlen(GOOD), err, sizeof err) == LDP_OK, err);
}

static void restart_keeps_ledger_and_sequence(void) {
  char dir[] = "/tmp/ldp-unit-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  ldp_storage st;
  ldp_file_storage(&st, dir);
  ldp_ledger l;
  uint64_t s1, s2, s3;
  CHECK(ldp_ledger_open(&l, 2.0, 100.0, &st) == LDP_OK, "open empty");
  CHECK(ldp_ledger_charge(&l, 1.5, 10.0) == LDP_OK, "first charge");
  CHECK(ldp_ledger_take_sequence(&l, &s1) == LDP_OK && s1 == 0, "first sequence");
  CHECK(ldp_ledger_take_sequence(&l, &s2) == LDP_OK && s2 == 1, "second sequence");
  ldp_ledger again; /* a restarted device */
  CHECK(ldp_ledger_open(&again, 2.0, 100.0, &st) == LDP_OK, "reopen");
  CHECK(ldp_ledger_charge(&again, 1.0, 20.0) == LDP_E_BUDGET, "spend survives a restart");
  CHECK(ldp_ledger_take_sequence(&again, &s3) == LDP_OK && s3 == 2, "sequence never reused");
  char path[64];
  snprintf(path, sizeof path, "%s/ledger", dir);
  FILE *f = fopen(path, "wb");
  fputs("garbage", f);
  fclose(f);
  CHECK(ldp_ledger_open(&again, 2.0, 100.0, &st) == LDP_E_STORAGE, "a corrupt ledger is an error");
  unlink(path);
  rmdir(dir);
}

static const char MEMO[] =
    "{\"v\":1,\"family\":\"rr-ind\",\"attrs\":[\"os\"],\"labels\":[[\"a\",\"b\",\"c\"]],"
    "\"width\":1,\"steps\":[],\"memoize\":{\"rotation_s\":100,\"permanent\":[{\"op\":\"grr\","
    "\"in\":[0],\"out\":[0],\"p\":0.5}]}}";

static void restart_keeps_memos(void) {
  char dir[] = "/tmp/ldp-memo-XXXXXX", err[256];
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  ldp_storage st;
  ldp_file_storage(&st, dir);
  CHECK(ldp_program_parse(&prog, MEMO, strlen(MEMO), err, sizeof err) == LDP_OK, err);
  ldp_ledger l, again;
  uint32_t x = 1, first = 9, report = 9;
  double cost;
  uint64_t seed = 3;
  ldp_rng rng = {ldp_splitmix64_next, &seed};
  ldp_ledger_open(&l, 0, 0, &st);
  CHECK(ldp_memo_report(&l, &prog, &x, 0, 1000.0, 0, &rng, &first, &cost) == LDP_OK && cost > 0,
        "first memoized report");
  ldp_ledger_open(&again, 0, 0, &st);  /* a restarted device */
  CHECK(ldp_memo_report(&again, &prog, &x, 0, 1001.0, 0, &rng, &report, &cost) == LDP_DUPLICATE,
        "a duplicate after a restart");
  CHECK(ldp_memo_report(&again, &prog, &x, 0, 1002.0, 1.0, &rng, &report, &cost) == LDP_OK &&
            cost == 0.0 && report == first, "resent from the memo, free, after a restart");
  char path[64];
  snprintf(path, sizeof path, "%s/ledger", dir);
  unlink(path);
  rmdir(dir);
}

static void batch_refusals(void) {
  uint8_t buf[64];
  uint32_t rep[2] = {1, 70000};
  uint64_t key[2] = {1, 2};
  CHECK(ldp_batch_encode(buf, sizeof buf, "c", 0, 1.0, rep, 1, 2, NULL, key) == 7 + 1 + 19 + 16 + 8,
        "u32 values");
  CHECK(ldp_batch_encode(buf, 10, "c", 0, 1.0, rep, 1, 2, NULL, key) == 0, "cap too small");
  CHECK(ldp_batch_encode(buf, sizeof buf, "", 0, 1.0, rep, 1, 2, NULL, NULL) == 0, "empty id");
  CHECK(ldp_batch_encode(buf, sizeof buf, "c", 0, 1.0 / 0.0, rep, 1, 2, NULL, NULL) == 0,
        "infinite sent_at");
}

static void os_rng_draws(void) {
  ldp_os_rng os = {{0}, 0};
  ldp_rng r = {ldp_os_rng_next, &os};
  uint64_t a = r.next_u64(r.ctx), b = r.next_u64(r.ctx);
  CHECK(a != b, "two OS words differ");
  for (int i = 0; i < 1000; i++) CHECK(ldp_uniform(&r, 3) < 3, "uniform in range");
}

static void device_refuses_without_state(void) {
  ldp_state st;
  memset(&st, 0, sizeof st);
  ldp_ledger l;
  ldp_ledger_open(&l, 0, 0, NULL);
  uint32_t reps[8];
  uint64_t ids[2];
  uint64_t seed = 1;
  ldp_device d = {&st, &l, {ldp_splitmix64_next, &seed}, 5, reps, ids, 2, 0, 0, 0, 0.0};
  const char *names[] = {"os", "plan"}, *labels[] = {"a", "pro"};
  double cost;
  char err[128];
  CHECK(ldp_device_report(&d, names, labels, 2, 0, &cost, err, sizeof err) == LDP_E_NO_STATE,
        "no state");
  st.present = 1;
  char perr[128];
  ldp_program_parse(&st.program, GOOD, strlen(GOOD), perr, sizeof perr);
  strcpy(st.collection, "c");
  CHECK(ldp_device_report(&d, names, labels, 2, 0, &cost, err, sizeof err) == LDP_OK, err);
  CHECK(ldp_device_report(&d, names, labels, 2, 0, &cost, err, sizeof err) == LDP_OK, err);
  CHECK(ldp_device_report(&d, names, labels, 2, 0, &cost, err, sizeof err) == LDP_E_FULL, "full");
  uint8_t out[256];
  int r;
  CHECK(ldp_device_flush(&d, 1.0, out, sizeof out, &r) > 0 && r == LDP_OK && d.n == 0, "flush");
  CHECK(ldp_device_flush(&d, 1.0, out, sizeof out, &r) == 0 && r == LDP_OK, "nothing to flush");
}

/* more spends in a budget day than LDP_LEDGER_CAP: those out of the window are summed, so the
   cap holds exactly (512 spends of 2^-7 make 4.0) with and without a window budget */
static void daily_cap_beyond_ledger_cap(void) {
  const double windows[2][2] = {{0.0, 0.0}, {1000.0, 10.0}};
  for (int w = 0; w < 2; w++) {
    ldp_ledger l;
    ldp_ledger_open(&l, windows[w][0], windows[w][1], NULL);
    l.max_epsilon_per_day = 4.0;
    double day = 20000 * LDP_DAY_S, cost = 1.0 / 128;
    int accepted = 0;
    for (int i = 0; i < 600; i++)
      accepted += ldp_ledger_charge(&l, cost, day + 60.0 * i) == LDP_OK;
    CHECK(accepted == 512 && l.n <= LDP_LEDGER_CAP, "daily cap over many spends");
    CHECK(ldp_ledger_spent_today(&l, day + 60.0 * 600) == 4.0, "the day's spend is kept");
    CHECK(ldp_ledger_charge(&l, 4.0, day + LDP_DAY_S) == LDP_OK, "the next day's cap");
  }
}

/* a round step: the attribute has its points' count of cells afterwards, a value on a point
   stays itself and still draws one word, a value 3/5 of the way to the next point goes there
   with 3/5 (20,000 draws, within 5 standard errors) */
static void round_step(void) {
  static ldp_program prog;
  static const char *desc =
      "{\"v\":1,\"family\":\"t\",\"attrs\":[\"a\",\"x\"],\"labels\":[[\"p\",\"q\"],"
      "{\"min\":0,\"max\":10,\"grid\":11}],\"width\":2,\"steps\":["
      "{\"op\":\"round\",\"in\":[1],\"points\":[0,5,10]},"
      "{\"op\":\"grr\",\"in\":[0,1],\"out\":[0,1],\"p\":1.0}]}";
  char err[256];
  CHECK(ldp_program_parse(&prog, desc, strlen(desc), err, sizeof err) == LDP_OK, err);
  CHECK(prog.size[1] == 3 && prog.grid[1] == 11 && prog.steps[1].cells == 6,
        "a rounded attribute has its points as cells");
  uint64_t seed = 9, start = seed;
  ldp_rng rng = {ldp_splitmix64_next, &seed};
  uint32_t x[2] = {1, 5}, report[2];
  ldp_program_randomize(&prog, x, 0, &rng, report);
  CHECK(report[0] == 1 && report[1] == 1 && x[1] == 5, "a point stays itself, x untouched");
  CHECK(seed == start + 2 * 0x9E3779B97F4A7C15ULL, "round draws one word on a point too");
  long up = 0, n = 20000;
  x[1] = 3;
  for (long i = 0; i < n; i++) {
    ldp_program_randomize(&prog, x, 0, &rng, report);
    up += report[1];
  }
  CHECK(fabs((double)up / n - 0.6) < 5 * sqrt(0.24 / n), "round goes up with its fraction");
}

/* the caller's structs are the library's (ldp_limits.h); other sizes are told apart */
static void abi_check(void) {
  CHECK(LDP_ABI_CHECK() == LDP_OK, "LDP_ABI_CHECK with the library's limits");
  CHECK(ldp_abi_check(sizeof(ldp_state) + 8, sizeof(ldp_ledger)) == LDP_E_ARG,
        "an ldp_state of another size");
}

int main(void) {
  abi_check();
  parse_errors();
  restart_keeps_ledger_and_sequence();
  restart_keeps_memos();
  batch_refusals();
  os_rng_draws();
  device_refuses_without_state();
  daily_cap_beyond_ledger_cap();
  round_step();
  if (failures) fprintf(stderr, "%d unit checks failed\n", failures);
  else printf("unit: all checks pass\n");
  return failures ? 1 : 0;
}
