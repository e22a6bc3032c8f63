// The TypeScript side of the conformance suite (sdk/conformance/*.json,
// docs/device-protocol.md): the same draws, reports, batch bytes, state decisions and budget
// decisions as Python and C.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { Device, Ledger, Program, ProgramError, SchemaError, SplitMix64, State, StateRejected,
         Trust, Transport, acceptState, authenticateBatch, bernoulli, categorical,
         deriveCredential, encodeBatch, parseCredential, uniform } from "../src/index.js";

import { alpha, memoRound } from "../src/memo.js";

const DIR = new URL("../../../conformance/", import.meta.url);
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;
const load = (name: string): Json => JSON.parse(readFileSync(new URL(name, DIR), "utf8"));
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

test("rng vectors", () => {
  const v = load("rng.json");
  for (const c of v.words) {
    const g = new SplitMix64(BigInt(c.seed));
    assert.deepEqual(c.words.map(() => String(g.nextU64())), c.words);
  }
  for (const c of v.uniform) {
    const g = new SplitMix64(BigInt(c.seed));
    assert.deepEqual(c.draws.map(() => uniform(g, c.k)), c.draws);
  }
  for (const c of v.bernoulli) {
    const g = new SplitMix64(BigInt(c.seed));
    assert.deepEqual(c.draws.map(() => bernoulli(g, c.p)), c.draws);
  }
  for (const c of v.categorical) {
    const g = new SplitMix64(BigInt(c.seed));
    let acc = 0;
    const cum = c.row.map((x: number) => (acc += x));
    assert.deepEqual(c.draws.map(() => categorical(g, cum)), c.draws);
  }
});

class Recording implements Transport {
  batches: Uint8Array[] = [];
  async fetchState(): Promise<string> {
    throw new Error("not used");
  }
  async send(_c: string, batch: Uint8Array): Promise<void> {
    this.batches.push(batch);
  }
}

for (const c of load("randomize.json").cases) {
  test(`randomize and batch: ${c.name}`, async () => {
    const program = new Program(c.device);
    assert.ok(Math.abs(program.epsilon - c.epsilon) <= 1e-12 * c.epsilon);
    const b = c.batch;
    const ledger = await Ledger.open(0, 0);
    await ledger.resumeSequenceAt(BigInt(b.sequence));
    const sent = new Recording();
    const device = new Device({ collection: b.collection, deviceId: BigInt(b.device_id),
                                trust: new Trust(load("states.json").public_key), ledger,
                                transport: sent, batchSize: 1000,
                                rng: new SplitMix64(BigInt(c.seed)), clock: () => b.sent_at });
    const state: State = { collection: b.collection, version: c.version, issuedAt: 0,
                           expiresAt: Infinity, mechanism: c.family, program };
    device.state = state;
    const reports = [], clipped = [];
    for (const r of c.records) {
      const res = await device.report(r);
      assert.equal(res.status, "queued");
      reports.push(res.status === "queued" ? [...res.report] : []);
      clipped.push(res.status === "queued" ? res.clipped : []);
    }
    assert.deepEqual(reports, c.reports);
    if (c.clipped) {  // numeric values clipped into their range, per record and in all
      assert.deepEqual(clipped, c.clipped);
      const total = new Map<string, number>();
      for (const names of c.clipped as string[][])
        for (const a of names) total.set(a, (total.get(a) ?? 0) + 1);
      assert.deepEqual(device.clipped, total);
    }
    await device.flush();
    assert.equal(sent.batches.length, 1);
    assert.equal(hex(sent.batches[0]), b.hex);
  });
}

for (const which of ["schema_errors", "numeric_errors"])
  test(`schema errors name the attribute (${which})`, () => {
    const v = load("randomize.json")[which];
    const program = new Program(v.device);
    for (const e of v.errors) {
      assert.throws(() => program.encode(e.record), (err: unknown) =>
        err instanceof SchemaError && err.attribute === e.attribute &&
        err.message.includes(`'${e.attribute}'`), JSON.stringify(e.record));
    }
  });

test("state decisions", () => {
  const v = load("states.json");
  const trust = new Trust(v.public_key, v.ceiling);
  let current: State | null = null;
  for (const s of [...v.steps, ...v.sdk_only_steps]) {
    let got = "accept";
    try {
      current = acceptState(trust, s.collection, s.record, current, v.now);
    } catch (e) {
      if (!(e instanceof StateRejected)) throw e;
      got = e.reason;
    }
    assert.equal(got, s.expect, s.name);
    if (got === "accept" && s.max_epsilon_per_day !== undefined)
      assert.equal(current?.maxEpsilonPerDay, s.max_epsilon_per_day ?? undefined, s.name);
  }
});

test("ledger decisions", async () => {
  const v = load("ledger.json");
  const ledger = await Ledger.open(v.budget.epsilon, v.budget.window_s);
  for (const e of v.events) {
    const ok = ledger.refusal(e.cost, e.now) === null;
    if (ok) await ledger.charge(e.cost, e.now);
    assert.equal(ok ? "accept" : "refuse", e.expect, JSON.stringify(e));
  }
});

test("daily budget across a UTC midnight", async () => {
  const v = load("ledger.json").daily;
  const ledger = await Ledger.open(v.budget.epsilon, v.budget.window_s);
  for (const e of v.events) {
    const reason = ledger.refusal(e.cost, e.now, v.max_epsilon_per_day);
    if (reason === null) await ledger.charge(e.cost, e.now, v.max_epsilon_per_day);
    assert.equal(reason === null ? "accept" : "refuse", e.expect, JSON.stringify(e));
    if (reason !== null)
      assert.ok(reason.startsWith(e.reason === "budget" ? "budget exceeded" : "over_budget"),
                `${reason} / ${JSON.stringify(e)}`);
  }
});

async function memoReplay(v: Json, mechanism: string): Promise<void> {
  const program = new Program(v.device);
  assert.equal(program.memo?.fingerprint, v.fingerprint);
  let now = 0;
  const device = new Device({ collection: "memo", deviceId: BigInt(v.device_id ?? 1),
                              trust: new Trust(load("states.json").public_key),
                              ledger: await Ledger.open(v.budget.epsilon, v.budget.window_s),
                              transport: new Recording(), batchSize: 1000,
                              rng: new SplitMix64(BigInt(v.seed)), clock: () => now,
                              resendEveryS: v.resend_every_s ?? undefined });
  device.state = { collection: "memo", version: 5, issuedAt: 0, expiresAt: Infinity,
                   mechanism, program, maxEpsilonPerDay: v.max_epsilon_per_day ?? undefined };
  for (const e of v.events) {
    now = e.now;
    const res = await device.report(e.record);
    assert.equal(res.status, e.status, JSON.stringify(e));
    assert.ok(Math.abs(res.epsilon - e.cost) <= 1e-12 * e.cost, JSON.stringify(e));
    // the daily case's window budget never binds: its refusals are the cap's
    if (res.status === "refused" && v.max_epsilon_per_day !== undefined)
      assert.ok(res.reason.startsWith("over_budget:"), res.reason);
    if (res.status === "queued") assert.deepEqual([...res.report], e.report);
  }
}

test("memoized reports", async () => {
  const v = load("memo.json");
  await memoReplay(v, "rr-ind");
  await memoReplay(v.partition, "partitioned");
  await memoReplay(v.partition_olh, "partitioned");
  await memoReplay(v.cluster, "rr-clusters");
  await memoReplay(v.select, "smp");
  await memoReplay(v.daily, "rr-ind");
  await memoReplay(v.numeric, "sw-hm");
  await memoReplay(v.partition_numeric, "partitioned");
});

test("memoized numeric: each device's alpha and its rounding of every grid index", () => {
  const v = load("memo.json").numeric;
  const memo = new Program(v.device).memo!;
  for (const e of v.alpha) {
    const id = BigInt(e.device_id);
    assert.equal(alpha(memo.round![e.attribute]!, id), e.alpha, e.device_id);
    e.rounded.forEach((want: number, i: number) => {
      const x = [0, 0];
      x[e.attribute] = i;
      assert.equal(memoRound(memo, x, id)[e.attribute], want, `${e.device_id} ${i}`);
    });
  }
});

test("mangled signed records get a decision, never a crash", () => {
  const v = load("states.json");
  const trust = new Trust(v.public_key, v.ceiling);
  const rng = new SplitMix64(7n);
  for (const s of v.steps) {
    const rec: string = s.record;
    for (let cut = 0; cut < rec.length; cut += 1 + Math.floor(rec.length / 64))
      assert.throws(() => acceptState(trust, "app", rec.slice(0, cut), null, v.now),
                    StateRejected, `a record cut at ${cut} was accepted`);
    for (let k = 0; k < 64; k++) {
      const i = Number(rng.nextU64() % BigInt(rec.length));
      const c = String.fromCharCode(32 + Number(rng.nextU64() % 95n));
      const flipped = rec.slice(0, i) + c + rec.slice(i + 1);
      try {
        acceptState(trust, "app", flipped, null, v.now);
      } catch (e) {
        assert.ok(e instanceof StateRejected, `flipped record: ${String(e)}`);
      }
    }
  }
});

test("identity: device keys, the credential, authenticated batches", async () => {
  const v = load("identity.json");
  const unhex = (s: string) => Uint8Array.from(Buffer.from(s, "hex"));
  for (const c of v.derive) {
    const cred = deriveCredential(unhex(c.fleet_secret), c.fleet, BigInt(c.device_id));
    assert.equal(hex(cred.key), c.key, `${c.fleet} ${c.device_id}`);
  }
  const cred = parseCredential(v.credential.json);
  assert.equal(cred.fleet, v.credential.fleet);
  assert.equal(cred.deviceId, BigInt(v.credential.device_id));
  assert.equal(hex(cred.key), v.credential.key);
  assert.throws(() => parseCredential('{"fleet": "f", "device_id": 1, "key": "00"}'));
  for (const b of v.batches) {
    const c = { fleet: b.fleet, deviceId: BigInt(b.device_id), key: unhex(b.key) };
    const plain = encodeBatch({ collection: b.collection, version: b.version, sentAt: b.sent_at,
                                reports: b.reports,
                                deviceIds: b.reports.map(() => c.deviceId),
                                key: { sender: c.deviceId, sequence: BigInt(b.sequence) } });
    const signed = authenticateBatch(plain, c);
    assert.equal(hex(signed), b.hex, b.name);
    assert.throws(() => authenticateBatch(signed, c));
  }
  // a device holding a credential sends its batches authenticated: the first randomize case
  const r = load("randomize.json").cases[0];
  const b = r.batch;
  const dc = { fleet: "phones", deviceId: BigInt(b.device_id), key: unhex(v.batches[0].key) };
  const ledger = await Ledger.open(0, 0);
  await ledger.resumeSequenceAt(BigInt(b.sequence));
  const sent = new Recording();
  const device = new Device({ collection: b.collection, deviceId: dc.deviceId,
                              trust: new Trust(load("states.json").public_key), ledger,
                              transport: sent, batchSize: 1000, credential: dc,
                              rng: new SplitMix64(BigInt(r.seed)), clock: () => b.sent_at });
  device.state = { collection: b.collection, version: r.version, issuedAt: 0,
                   expiresAt: Infinity, mechanism: r.family, program: new Program(r.device) };
  for (const rec of r.records) await device.report(rec);
  await device.flush();
  assert.equal(hex(sent.batches[0]), hex(authenticateBatch(unhex(b.hex), dc)));
});

test("descriptions beyond the limits are refused, those at them parse in time", () => {
  const v = load("limits.json");
  for (const c of v.cases) {
    const t0 = performance.now();
    let err: unknown = null, prog: Program | null = null;
    try {
      prog = new Program(c.device);
    } catch (e) {
      err = e;
    }
    const took = (performance.now() - t0) / 1000;
    assert.ok(took <= v.max_parse_s, `${c.name}: parsed in ${took.toFixed(3)} s`);
    if (c.expect === "accept") {
      assert.ok(prog !== null, `${c.name}: refused: ${String(err)}`);
      assert.ok(Math.abs(prog.epsilon - c.epsilon) <= 1e-12 * c.epsilon, c.name);
    } else {
      assert.ok(err instanceof ProgramError, `${c.name}: not refused`);
      assert.ok(err.field.startsWith(c.field), `${c.name}: ${err.field} is not ${c.field}`);
    }
  }
});
