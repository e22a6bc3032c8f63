// Unit tests of the TypeScript SDK: the ledger and the batch sequence survive a restart
// through the file storage, a failed send is retried byte for byte, the budget refuses,
// malformed descriptions name the field, the OS generator draws.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Device, FileStorage, IndexedDbStorage, Ledger, MemoryStorage, OsRandom, Program,
         ProgramError, SplitMix64, Transport, Trust, uniform } from "../src/index.js";

const DIR = new URL("../../../conformance/", import.meta.url);
const vectors = JSON.parse(readFileSync(new URL("randomize.json", DIR), "utf8"));
const publicKey = JSON.parse(readFileSync(new URL("states.json", DIR), "utf8")).public_key;
const device0 = vectors.cases[0].device;

test("ledger and sequence survive a restart", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ldp-ts-"));
  try {
    const a = await Ledger.open(2, 100, new FileStorage(dir));
    assert.equal(a.refusal(1.5, 10), null);
    await a.charge(1.5, 10);
    assert.equal(await a.takeSequence(), 0n);
    assert.equal(await a.takeSequence(), 1n);
    const b = await Ledger.open(2, 100, new FileStorage(dir));  // a restarted device
    assert.match(b.refusal(1, 20) ?? "", /budget exceeded/);
    assert.equal(await b.takeSequence(), 2n);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

class Flaky implements Transport {
  fail = true;
  sent: string[] = [];
  async fetchState(): Promise<string> {
    throw new Error("not used");
  }
  async send(_c: string, batch: Uint8Array): Promise<void> {
    if (this.fail) {
      this.fail = false;
      throw new Error("connection reset");
    }
    this.sent.push(Buffer.from(batch).toString("hex"));
  }
}

test("a failed batch is sent again with the same key; the budget refuses", async () => {
  const t = new Flaky();
  const ledger = await Ledger.open(5, 3600);
  const program = new Program(device0);
  const d = new Device({ collection: "c", deviceId: 9n, trust: new Trust(publicKey), ledger,
                         transport: t, batchSize: 1, rng: new SplitMix64(1n), clock: () => 50 });
  d.state = { collection: "c", version: 1, issuedAt: 0, expiresAt: Infinity, mechanism: "rr-ind",
              program };
  const rec = vectors.cases[0].records[0];
  await assert.rejects(d.report(rec), /connection reset/);
  await d.flush();
  assert.equal(t.sent.length, 1);
  assert.equal((await d.report(rec)).status, "refused");  // 2 x 3.0 > 5
  assert.equal(t.sent.length, 1);
});

test("the daily cap holds over more spends than the ledger keeps", async () => {
  // 512 spends of 2^-7 make 4.0: those out of the window are summed, none lost
  for (const [budget, windowS] of [[0, 0], [1000, 10]]) {
    const storage = new MemoryStorage();
    const ledger = await Ledger.open(budget, windowS, storage);
    const day = 20000 * 86_400, cost = 1 / 128;
    let accepted = 0;
    for (let i = 0; i < 600; i++) {
      const now = day + 60 * i;
      if (ledger.refusal(cost, now, 4) === null) {
        await ledger.charge(cost, now, 4);
        accepted++;
      }
    }
    assert.equal(accepted, 512);
    assert.ok(JSON.parse(storage.data.get("ledger")!).spends.length <= 256);
    assert.equal(ledger.spentToday(day + 36_000), 4);
    assert.equal(ledger.refusal(4, day + 86_400, 4), null);
  }
});

test("malformed descriptions name the field", () => {
  for (const [patch, field] of [[{ v: 2 }, "device.v"], [{ width: 0 }, "device.width"],
                                [{ steps: [{ op: "oue" }] }, "device.steps[0].op"]] as const) {
    assert.throws(() => new Program({ ...device0, ...patch }),
                  (e: unknown) => e instanceof ProgramError && e.field === field);
  }
});

test("the OS generator draws", () => {
  const r = new OsRandom();
  assert.notEqual(r.nextU64(), r.nextU64());
  for (let i = 0; i < 1000; i++) assert.ok(uniform(r, 3) < 3);
});

test("memoized responses survive a restart", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ldp-ts-memo-"));
  const memo = JSON.parse(readFileSync(new URL("memo.json", DIR), "utf8"));
  const program = new Program(memo.device);
  const make = async (t: number) => {
    const d = new Device({ collection: "m", deviceId: 1n, trust: new Trust(publicKey),
                           ledger: await Ledger.open(0, 0, new FileStorage(dir)),
                           transport: new Flaky(), batchSize: 100, rng: new SplitMix64(4n),
                           clock: () => t, resendEveryS: 0.5 });
    d.state = { collection: "m", version: 5, issuedAt: 0, expiresAt: Infinity,
                mechanism: "rr-ind", program };
    return d;
  };
  try {
    const rec = memo.events[0].record;
    const first = await (await make(1000)).report(rec);
    assert.equal(first.status, "queued");
    assert.equal((await (await make(1000.1)).report(rec)).status, "duplicate");  // restarted
    const again = await (await make(1001)).report(rec);  // resent from the memo, free
    assert.equal(again.status, "queued");
    assert.equal(again.epsilon, 0);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("the IndexedDB storage keeps the ledger across a restart", async () => {
  const { IDBFactory } = await import("fake-indexeddb");
  const factory = new IDBFactory();
  const a = await Ledger.open(2, 100, new IndexedDbStorage(factory));
  await a.charge(1.5, 10);
  assert.equal(await a.takeSequence(), 0n);
  const b = await Ledger.open(2, 100, new IndexedDbStorage(factory));  // a reloaded page
  assert.match(b.refusal(1, 20) ?? "", /budget exceeded/);
  assert.equal(await b.takeSequence(), 1n);
});

test("a round step: points as cells afterwards, one word always, up with its fraction", () => {
  const prog = new Program({
    v: 1, family: "t", attrs: ["a", "x"], labels: [["p", "q"], { min: 0, max: 10, grid: 11 }],
    width: 2, steps: [{ op: "round", in: [1], points: [0, 5, 10] },
                      { op: "grr", in: [0, 1], out: [0, 1], p: 1.0 }],
  });
  const rng = new SplitMix64(9n), twin = new SplitMix64(9n);
  const x = [1, 5];
  assert.deepEqual(prog.randomize(x, rng), [1, 1]);   // a point stays itself
  assert.deepEqual(x, [1, 5]);                         // the record is not changed
  twin.nextU64();
  twin.nextU64();
  assert.equal(rng.nextU64(), twin.nextU64());         // two words: the round's and the grr's
  let up = 0;
  const n = 20000;
  for (let i = 0; i < n; i++) up += prog.randomize([0, 3], rng)[1];
  assert.ok(Math.abs(up / n - 0.6) < 5 * Math.sqrt(0.24 / n), `${up / n}`);
  assert.throws(() => new Program({
    v: 1, family: "t", attrs: ["x"], labels: [{ min: 0, max: 10, grid: 11 }], width: 1,
    steps: [{ op: "round", in: [0], points: [0, 10] }, { op: "round", in: [0], points: [0, 10] }],
  }), (e: unknown) => e instanceof ProgramError && e.field === "device.steps[1].in");
});
