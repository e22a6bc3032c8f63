/** One device reporting to one collection: signed states, randomization, ledger, batches, and
 * a fetch transport to the HTTP gateway (ldpstream gateway). */
import { encodeBatch } from "./batch.js";
import { Credential, authenticateBatch } from "./identity.js";
import { Ledger } from "./ledger.js";
import { memoDraw, memoEpsilon, memoKeys, memoRecord, memoRound } from "./memo.js";
import { RecordValues } from "./program.js";
import { DrawSource, OsRandom } from "./rng.js";
import { State, StateRejected, Trust, acceptState } from "./state.js";

export type ReportResult =
  | { status: "queued"; epsilon: number; version: number; report: number[];
      /** the numeric attributes whose value was clipped into its range */
      clipped: string[] }
  | { status: "refused" | "duplicate"; epsilon: 0; version: number; reason: string };

/** Where batches go. */
export interface Transport {
  /** the signed ldp.config record of the collection (JSON text) */
  fetchState(collection: string): Promise<string>;
  send(collection: string, batch: Uint8Array<ArrayBuffer>): Promise<void>;
}

/** The HTTP gateway: GET /v1/collections/<id>/config, POST /v1/collections/<id>/reports. */
export class FetchTransport implements Transport {
  constructor(private readonly url: string, private readonly token: string,
              private readonly fetchFn: typeof fetch = globalThis.fetch) {}

  private async call(path: string, init: RequestInit = {}): Promise<Response> {
    const resp = await this.fetchFn(`${this.url.replace(/\/$/, "")}${path}`, {
      ...init, headers: { Authorization: `Bearer ${this.token}`, ...(init.headers ?? {}) } });
    if (resp.status >= 300) {
      let error = "";
      try {
        error = String(((await resp.json()) as { error?: unknown }).error);
      } catch {
        error = "(no JSON error)";
      }
      throw new Error(`gateway answered ${resp.status}: ${error}`);
    }
    return resp;
  }

  async fetchState(collection: string): Promise<string> {
    return (await this.call(`/v1/collections/${encodeURIComponent(collection)}/config`)).text();
  }

  async send(collection: string, batch: Uint8Array<ArrayBuffer>): Promise<void> {
    await this.call(`/v1/collections/${encodeURIComponent(collection)}/reports`, {
      method: "POST", body: batch, headers: { "Content-Type": "application/octet-stream" } });
  }
}

export interface DeviceOptions {
  collection: string;
  deviceId: bigint;
  trust: Trust;
  ledger: Ledger;
  transport: Transport;
  batchSize?: number;
  rng?: DrawSource;
  clock?: () => number;
  /** memoized collections: a record already sent in the period is sent again after this many
   * seconds (absent or <= 0: never) */
  resendEveryS?: number;
  /** this device's own key (`ldpstream device-credentials`): every batch is authenticated;
   * its deviceId must be `deviceId` (docs/security.md "Per-device identity") */
  credential?: Credential;
}

/** A device: `refresh()` adopts the newest signed state, `report()` randomizes and queues a
 * record of labels, batches leave with their batch key (device id, sequence). */
export class Device {
  state: State | null = null;
  readonly refusals: StateRejected[] = [];
  /** per numeric attribute, how many reported values were clipped into its range (the count
   * the server keeps: docs/numeric.md) */
  readonly clipped = new Map<string, number>();
  private buffer: number[][] = [];
  /** an encoded batch whose sending failed: retried first, with the same batch key */
  private pending: Uint8Array<ArrayBuffer> | null = null;
  private bufferVersion = -1;
  private readonly rng: DrawSource;
  private readonly clock: () => number;
  private readonly batchSize: number;

  constructor(private readonly opts: DeviceOptions) {
    this.rng = opts.rng ?? new OsRandom();
    this.clock = opts.clock ?? (() => Date.now() / 1000);
    this.batchSize = opts.batchSize ?? 100;
    if (opts.credential && opts.credential.deviceId !== opts.deviceId)
      throw new Error("deviceId is not the credential's");
  }

  /** Offer one ldp.config record; a refused one is kept in `refusals` and thrown. */
  offer(record: string): State {
    try {
      this.state = acceptState(this.opts.trust, this.opts.collection, record, this.state,
                               this.clock());
      return this.state;
    } catch (e) {
      if (e instanceof StateRejected) this.refusals.push(e);
      throw e;
    }
  }

  async refresh(): Promise<State> {
    return this.offer(await this.opts.transport.fetchState(this.opts.collection));
  }

  async report(record: RecordValues): Promise<ReportResult> {
    const st = this.state;
    if (!st) throw new Error(`collection '${this.opts.collection}' has no accepted state`);
    const { x, clipped } = st.program.encodeClipped(record);
    const now = this.clock();
    const drawn = st.program.memo ? await this.memoized(st, x, now)
      : await this.fresh(st, x, now);
    if (!("cost" in drawn)) return drawn;
    const { report, cost } = drawn;
    if (this.buffer.length && this.bufferVersion !== st.version) await this.flush();
    this.buffer.push(report);
    this.bufferVersion = st.version;
    for (const a of clipped) this.clipped.set(a, (this.clipped.get(a) ?? 0) + 1);
    if (this.buffer.length >= this.batchSize) await this.flush();
    return { status: "queued", epsilon: cost, version: st.version, report, clipped };
  }

  private async fresh(st: State, x: number[], now: number
                      ): Promise<ReportResult | { report: number[]; cost: number }> {
    const cost = st.program.epsilon;
    const reason = this.opts.ledger.refusal(cost, now, st.maxEpsilonPerDay);
    if (reason !== null) return { status: "refused", epsilon: 0, version: st.version, reason };
    await this.opts.ledger.charge(cost, now, st.maxEpsilonPerDay);
    return { report: st.program.randomize(x, this.rng, undefined, this.opts.deviceId), cost };
  }

  /** docs/device-protocol.md, "Ledger": permanent responses once per rotation period (a clock
   * stepped back keeps the newest period), a record once per period unless resendEveryS
   * passed, only new draws charged. */
  private async memoized(st: State, x: number[], now: number
                         ): Promise<ReportResult | { report: number[]; cost: number }> {
    const memo = st.program.memo!;
    const ledger = this.opts.ledger;
    const period = Math.max(memo.rotationS === null ? 0 : Math.floor(now / memo.rotationS),
                            ledger.period);
    const newer = period > ledger.period;
    const xr = memoRound(memo, x, this.opts.deviceId);   // what the memos are keyed by
    const record = `${memo.fingerprint}:${xr.join(",")}`;
    const last = newer ? undefined : ledger.sent.get(record);
    const resend = this.opts.resendEveryS;
    if (last !== undefined && (resend === undefined || resend <= 0 || now - last < resend))
      return { status: "duplicate", epsilon: 0, version: st.version,
               reason: "this record was already reported in this rotation period" };
    const units = memoKeys(memo, xr, this.opts.deviceId, period);
    const keys = units.map(([u, c]) => `${memo.fingerprint}:${u}:${c}`);
    const have = keys.map((k) => (newer ? undefined : ledger.memos.get(k)));
    let cost = 0;
    have.forEach((h, i) => { if (h === undefined) cost += memoEpsilon(memo, units[i][0]); });
    const reason = ledger.refusal(cost, now, st.maxEpsilonPerDay);
    if (reason !== null) return { status: "refused", epsilon: 0, version: st.version, reason };
    const fresh = new Map<string, number>();
    const y = units.map(([u, c], i) => {
      if (have[i] !== undefined) return have[i]!;
      const r = memoDraw(memo, u, c, this.rng);
      fresh.set(keys[i], r);
      return r;
    });
    const rec = memoRecord(memo, units, y, st.program.width, this.rng);
    const report = memo.kind === "partition" || memo.kind === "select" || !st.program.hasSteps
      ? rec : st.program.randomize(rec, this.rng);
    await ledger.commitMemo(period, fresh, record, cost, now, st.maxEpsilonPerDay);
    return { report, cost };
  }

  /** Encode and send what is buffered (one batch); a batch whose sending failed is sent
   * again first, byte for byte (the gateway counts a batch key once). */
  async flush(): Promise<void> {
    if (this.pending) {
      await this.opts.transport.send(this.opts.collection, this.pending);
      this.pending = null;
    }
    if (!this.buffer.length) return;
    const sequence = await this.opts.ledger.takeSequence();
    const plain = encodeBatch({
      collection: this.opts.collection, version: this.bufferVersion, sentAt: this.clock(),
      reports: this.buffer, deviceIds: this.buffer.map(() => this.opts.deviceId),
      key: { sender: this.opts.deviceId, sequence } });
    const cred = this.opts.credential;
    const batch = cred ? authenticateBatch(plain, cred) : plain;
    this.pending = batch;
    this.buffer = [];
    await this.opts.transport.send(this.opts.collection, batch);
    this.pending = null;
  }
}
