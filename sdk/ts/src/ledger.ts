/** The epsilon ledger and the batch sequence, persisted through a storage adapter
 * (docs/device-protocol.md, "Ledger"). */

/** Where a device keeps its ledger: string values under string keys. */
export interface Storage {
  load(key: string): Promise<string | null>;
  save(key: string, value: string): Promise<void>;
}

export class MemoryStorage implements Storage {
  readonly data = new Map<string, string>();
  async load(key: string): Promise<string | null> {
    return this.data.get(key) ?? null;
  }
  async save(key: string, value: string): Promise<void> {
    this.data.set(key, value);
  }
}

/** Browsers: window.localStorage (or any object with getItem/setItem). */
export class LocalStorage implements Storage {
  constructor(private readonly store: { getItem(k: string): string | null;
                                        setItem(k: string, v: string): void },
              private readonly prefix = "ldpstream.") {}
  async load(key: string): Promise<string | null> {
    return this.store.getItem(this.prefix + key);
  }
  async save(key: string, value: string): Promise<void> {
    this.store.setItem(this.prefix + key, value);
  }
}

/** Browsers: an IndexedDB object store (default: database "ldpstream", store "ledger"); pass
 * the factory (`indexedDB`) explicitly where it is not global. */
export class IndexedDbStorage implements Storage {
  private db: Promise<IDBDatabase> | null = null;

  constructor(private readonly factory: IDBFactory = globalThis.indexedDB,
              private readonly name = "ldpstream", private readonly store = "ledger") {}

  private open(): Promise<IDBDatabase> {
    this.db ??= new Promise((resolve, reject) => {
      const req = this.factory.open(this.name, 1);
      req.onupgradeneeded = () => req.result.createObjectStore(this.store);
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
    return this.db;
  }

  private async run<T>(mode: IDBTransactionMode, op: (s: IDBObjectStore) => IDBRequest<T>
                       ): Promise<T> {
    const db = await this.open();
    return new Promise((resolve, reject) => {
      const tx = db.transaction(this.store, mode);
      const req = op(tx.objectStore(this.store));
      tx.oncomplete = () => resolve(req.result);
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error);
    });
  }

  async load(key: string): Promise<string | null> {
    const v = await this.run("readonly", (s) => s.get(key));
    return typeof v === "string" ? v : null;
  }

  async save(key: string, value: string): Promise<void> {
    await this.run("readwrite", (s) => s.put(value, key));
  }
}

/** Node: one file per key in a directory, replaced atomically (rename). */
export class FileStorage implements Storage {
  constructor(private readonly dir: string) {}
  async load(key: string): Promise<string | null> {
    const { readFile } = await import("node:fs/promises");
    try {
      return await readFile(`${this.dir}/${key}`, "utf8");
    } catch (e) {
      if ((e as { code?: string }).code === "ENOENT") return null;
      throw e;
    }
  }
  async save(key: string, value: string): Promise<void> {
    const { open, rename } = await import("node:fs/promises");
    const tmp = `${this.dir}/${key}.tmp`;
    const fh = await open(tmp, "w");
    try {
      await fh.writeFile(value, "utf8");
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, `${this.dir}/${key}`);
  }
}

const KEY = "ledger";
/** a budget day: one UTC calendar day (docs/privacy-over-time.md) */
export const DAY_S = 86_400;
const dayStart = (t: number): number => Math.floor(t / DAY_S) * DAY_S;
/** spends kept before those that left the window are dropped (as the C SDK) */
const LEDGER_CAP = 256;

interface Saved {
  next_sequence: string;
  spends: [number, number][];
  period?: number;
  memos?: [string, number][];
  sent?: [string, number][];
}

/** At most `budget` epsilon in any window of `windowS` seconds (budget <= 0: none); the ledger's
 * time never goes back (a clock stepped back never frees budget). */
export class Ledger {
  private spends: [number, number][] = [];
  private nextSequence = 0n;
  /** the newest rotation period committed (-1: none), its memoized responses
   * ("fingerprint:attribute:value" -> response) and sent records ("fingerprint:x" -> time) */
  period = -1;
  memos = new Map<string, number>();
  sent = new Map<string, number>();

  private constructor(readonly budget: number, readonly windowS: number,
                      private readonly storage: Storage | null) {}

  static async open(budget: number, windowS: number, storage: Storage | null = null
                    ): Promise<Ledger> {
    const l = new Ledger(budget, windowS, storage);
    const text = storage ? await storage.load(KEY) : null;
    if (text !== null) {
      const saved = JSON.parse(text) as Saved;
      if (!Array.isArray(saved.spends) || typeof saved.next_sequence !== "string")
        throw new Error("the stored ledger is corrupt");
      l.spends = saved.spends;
      l.nextSequence = BigInt(saved.next_sequence);
      l.period = saved.period ?? -1;
      l.memos = new Map(saved.memos ?? []);
      l.sent = new Map(saved.sent ?? []);
    }
    return l;
  }

  private async persist(): Promise<void> {
    if (this.storage)
      await this.storage.save(KEY, JSON.stringify({
        next_sequence: String(this.nextSequence), spends: this.spends, period: this.period,
        memos: [...this.memos], sent: [...this.sent] } satisfies Saved));
  }

  /** The ledger's time: never before its newest spend (spends are stamped with it). */
  now(clock: number): number {
    const last = this.spends.length ? this.spends[this.spends.length - 1][0] : -Infinity;
    return Math.max(clock, last);
  }

  spent(now: number): number {
    const t = this.now(now);
    let s = 0;
    for (const [at, eps] of this.spends) if (at > t - this.windowS) s += eps;
    return s;
  }

  /** ε spent in the budget day (UTC calendar day) of the ledger's time. */
  spentToday(now: number): number {
    const start = dayStart(this.now(now));
    let s = 0;
    for (const [at, eps] of this.spends) if (at >= start) s += eps;
    return s;
  }

  /** Why a report costing `cost` at `now` would break the budget, or null: the window budget
   * first, then the collection's `maxPerDay` (max_epsilon_per_day of its signed state) in the
   * budget day (docs/privacy-over-time.md). */
  refusal(cost: number, now: number, maxPerDay?: number): string | null {
    if (cost <= 0) return null;
    const spent = this.spent(now);
    if (this.budget > 0 && spent + cost > this.budget * (1 + 1e-12))
      return `budget exceeded: this report costs epsilon=${cost}, ${spent} already spent in ` +
        `the last ${this.windowS} s, budget ${this.budget}`;
    const today = this.spentToday(now);
    return maxPerDay !== undefined && today + cost > maxPerDay * (1 + 1e-12)
      ? `over_budget: this report costs epsilon=${cost}, ${today} already spent this UTC ` +
        `day, the collection's max_epsilon_per_day is ${maxPerDay}`
      : null;
  }

  /** Charge `cost` at `now` (after refusal() said null, with the same `maxPerDay`) and save. */
  async charge(cost: number, now: number, maxPerDay?: number): Promise<void> {
    this.spend(cost, now, maxPerDay);
    await this.persist();
  }

  /** Commit one memoized report: new responses, the record sent, the spend; a newer period
   * drops the older one's memos and records (they are never reused). */
  async commitMemo(period: number, memos: Map<string, number>, record: string, cost: number,
                   now: number, maxPerDay?: number): Promise<void> {
    if (period > this.period) {
      this.period = period;
      this.memos.clear();
      this.sent.clear();
    }
    for (const [k, v] of memos) this.memos.set(k, v);
    this.sent.set(record, now);
    this.spend(cost, now, maxPerDay);
    await this.persist();
  }

  private spend(cost: number, now: number, maxPerDay?: number): void {
    if (cost <= 0) return;
    now = this.now(now);
    if (this.spends.length >= LEDGER_CAP) this.compact(now, maxPerDay);
    this.spends.push([now, cost]);
  }

  /** Drop the spends no limit counts any more; sum those only the budget day counts (out of
   * the window: a prefix, the ledger's time never goes back) into one, stamped with the newest
   * of them (as the C SDK). */
  private compact(now: number, maxPerDay?: number): void {
    const start = dayStart(now), kept: [number, number][] = [];
    let day: [number, number] | null = null;
    for (const [at, eps] of this.spends) {
      if (this.budget > 0 && at > now - this.windowS) {
        if (day) kept.push(day);
        day = null;
        kept.push([at, eps]);
      } else if (maxPerDay !== undefined && at >= start) {
        day = [at, (day?.[1] ?? 0) + eps];
      }
    }
    if (day) kept.push(day);
    this.spends = kept;
  }

  /** The next batch sequence, saved as used before it is returned. */
  async takeSequence(): Promise<bigint> {
    const seq = this.nextSequence;
    this.nextSequence = seq + 1n;
    await this.persist();
    return seq;
  }

  /** Set where the sequence resumes (tests, migrations); never below the current one. */
  async resumeSequenceAt(seq: bigint): Promise<void> {
    if (seq > this.nextSequence) this.nextSequence = seq;
    await this.persist();
  }
}
