/** The memoized part of a description (docs/device-protocol.md, "Memoized descriptions"): its
 * kinds, fingerprint, the memo units a record needs, their draws and the report made from them.
 * attribute: one permanent step per attribute; cluster: one per cluster of attributes;
 * partition: one partition step, its first table fixed per (device, period), the oracle code
 * memoized, an optional instantaneous GRR per table; select (smp): one select step, its branch
 * fixed per (device, period), each branch one grr/matrix step memoized per cell. Kind attribute
 * may alpha-point round numeric attributes first (round: points and the alpha seed) and
 * memoize a numeric one's wave, or the weighted select over its waves (the task drawn with the
 * response); kind partition may round them too, its partition step led by their round steps. */
import { blake2b } from "@noble/hashes/blake2.js";

import { DrawSource, categorical, uniform } from "./rng.js";
import { Leaf, M64, Partition, ProgramError, Round, Select, Table, Wave, apply, grr, grrEpsilon,
         mix64, ravel, roundIndex, tableCode, waveCell } from "./steps.js";

export type MemoKind = "attribute" | "cluster" | "partition" | "select";

/** A numeric attribute's memo unit: its wave, or the select over its waves; `cells` its grid
 * points, `codes` the values its column takes. */
export interface NumericUnit {
  op: "numeric";
  cols: number[];
  sizes: number[];
  out: number[];
  cells: number;
  codes: number;
  step: Wave | Select;
  eps: number;
}

/** alpha-point rounding of one attribute: its points and mix64 of its alpha seed */
export interface Rounding {
  points: number[];
  seed: bigint;
}

export interface Memo {
  kind: MemoKind;
  rotationS: number | null;
  /** attribute, cluster: one step per unit; select: one per branch */
  permanent: (Leaf | NumericUnit)[];
  /** attribute, partition: per attribute its rounding (null: none), or null */
  round: (Rounding | null)[] | null;
  /** select: the index column and mix64(seed) */
  select: { out: number; seed: bigint } | null;
  /** partition: the step; partition, select: the instantaneous keep per table or branch */
  partition: Partition | null;
  instantaneous: number[] | null;
  /** 16 hex digits of BLAKE2b-64 over the permanent steps */
  fingerprint: string;
  /** ε of the whole permanent part (what one rotation period costs) */
  epsilon: number;
}

/** op byte, cells u32 LE, then p or the matrix entries as f64 LE, for every permanent step; a
 * partition step: per table op byte 3, oracle byte, cells u32, g u32, p f64 (all LE); a select
 * byte 4 (with weights: 6, their count u32 and each f64) then its branches' steps; a wave byte
 * 5, grid, offset and cells u32, round u8, range, at, width and p f64 */
export function fingerprint(steps: (Leaf | Partition | Select | Wave | Round)[], raw: unknown[]
                            ): string {
  const parts: number[] = [];
  const buf = new DataView(new ArrayBuffer(8));
  const push = (n: number) => { for (let i = 0; i < n; i++) parts.push(buf.getUint8(i)); };
  const f64 = (x: number) => { buf.setFloat64(0, x, true); push(8); };
  const wave = (s: Wave) => {   // byte 5, grid, offset, cells u32, round u8, 6 f64
    buf.setUint8(0, 5);
    push(1);
    for (const v of [s.grid, s.offset, s.cells]) { buf.setUint32(0, v, true); push(4); }
    buf.setUint8(0, s.rounded ? 1 : 0);
    push(1);
    [...s.wave, s.p].forEach(f64);
  };
  const leaf = (s: Leaf | Wave, d: unknown) => {
    if (s.op === "wave") { wave(s); return; }
    buf.setUint8(0, s.op === "grr" ? 1 : 2);
    push(1);
    buf.setUint32(0, s.cells, true);
    push(4);
    const values = s.op === "grr" ? [s.p] : ((d as { rows: number[][] }).rows).flat();
    values.forEach(f64);
  };
  steps.forEach((s, j) => {
    if (s.op === "round") return;   // not hashed: the tables after it count its points
    if (s.op === "wave") { wave(s); return; }
    if (s.op === "select") {
      const w = (raw[j] as { weights?: number[] | null }).weights ?? null;
      buf.setUint8(0, w === null ? 4 : 6);
      push(1);
      if (w !== null) {
        buf.setUint32(0, w.length, true);
        push(4);
        w.forEach(f64);
      }
      const branches = (raw[j] as { branches: unknown[][] }).branches;
      s.branches.forEach((b, i) => leaf(b[0] as Leaf | Wave, branches[i][0]));
      return;
    }
    if (s.op === "partition") {
      for (const t of s.tables) {
        buf.setUint8(0, 3);
        buf.setUint8(1, t.g ? 1 : 0);
        push(2);
        buf.setUint32(0, t.cells, true);
        push(4);
        buf.setUint32(0, t.g, true);
        push(4);
        f64(t.p);
      }
      return;
    }
    leaf(s, raw[j]);
  });
  return Array.from(blake2b(Uint8Array.from(parts), { dkLen: 8 }),
                    (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Check the parsed permanent steps of a kind; the Memo. */
function instantaneous(m: Record<string, unknown>, n: number): number[] | null {
  const inst = m.instantaneous_p ?? null;
  if (inst !== null && (!Array.isArray(inst) || inst.length !== n ||
      !inst.every((p) => typeof p === "number" && p >= 0 && p <= 1)))
    throw new ProgramError("device.memoize.instantaneous_p", "must be null or one number in " +
                           "[0, 1] per table or branch");
  return inst as number[] | null;
}

/** A numeric attribute's permanent step as a memo unit: a wave writing its own column, or a
 * select with out null over one such wave per branch (null: neither). */
function numericUnit(s: Leaf | Partition | Select | Wave | Round): NumericUnit | null {
  const own = (w: unknown): w is Wave => (w as Wave).op === "wave" && (w as Wave).out === (w as Wave).col;
  let waves: Wave[];
  if (s.op === "wave") waves = [s];
  else if (s.op === "select" && s.out === null &&
           s.branches.every((b) => b.length === 1 && own(b[0])))
    waves = s.branches.map((b) => b[0] as Wave);
  else return null;
  if (!waves.every((w) => own(w) && w.col === waves[0].col)) return null;
  const w = waves[0];
  return { op: "numeric", cols: [w.col], sizes: [w.grid], out: [w.col], cells: w.grid,
           codes: Math.max(...waves.map((v) => v.offset + v.cells)), step: s as Wave | Select,
           eps: s.eps };
}

export function makeMemo(m: Record<string, unknown>, kind: MemoKind, rotationS: number | null,
                         perm: (Leaf | Partition | Select | Wave | Round)[], nAttrs: number,
                         width: number, round: (Rounding | null)[] | null = null): Memo {
  const raw = m.permanent as unknown[];
  if (kind === "partition") {   // a round step per attribute round rounds, then one partition
    const s = perm[perm.length - 1], rounds = perm.slice(0, -1);
    if (s.op !== "partition" || !rounds.every((r) => r.op === "round"))
      throw new ProgramError("device.memoize.permanent", "kind partition: one partition step, " +
                             "after a round step per attribute memoize.round rounds");
    const by = new Map((rounds as Round[]).map((r) => [r.col, r.points]));
    const same = (a: number[] | undefined, b: number[]) =>
      a !== undefined && a.length === b.length && a.every((v, i) => v === b[i]);
    const want = (round ?? []).flatMap((r, j) => (r ? [[j, r.points] as const] : []));
    if (want.length !== by.size || !want.every(([j, pts]) => same(by.get(j), pts)))
      throw new ProgramError("device.memoize.round", "kind partition: one entry per attribute " +
                             "a permanent round step rounds, with its points");
    return { kind, rotationS, permanent: [], round, select: null, partition: s,
             instantaneous: instantaneous(m, s.tables.length), fingerprint: fingerprint(perm, raw),
             epsilon: s.eps };
  }
  if (kind === "select") {
    const s = perm[0];
    if (perm.length !== 1 || s.op !== "select" || s.out === null || s.weights !== null ||
        !s.branches.every((b) => b.length === 1 && (b[0].op === "grr" || b[0].op === "matrix")))
      throw new ProgramError("device.memoize.permanent", "kind select: one select step with a " +
                             "reported index and no weights, each branch one grr or matrix step");
    const seed = m.seed;
    if (typeof seed !== "string" || !/^[0-9]{1,20}$/.test(seed) || BigInt(seed) > M64)
      throw new ProgramError("device.memoize.seed", "must be a u64 as a decimal string");
    return { kind, rotationS, permanent: s.branches.map((b) => b[0] as Leaf), round: null,
             select: { out: s.out, seed: mix64(BigInt(seed)) }, partition: null,
             instantaneous: instantaneous(m, s.branches.length),
             fingerprint: fingerprint(perm, raw), epsilon: s.eps };
  }
  const units = perm.map((s) => (s.op === "grr" || s.op === "matrix" ? s
    : kind === "attribute" ? numericUnit(s) : null));
  const covered = units.flatMap((s) => s?.cols ?? []);
  const ok = width === nAttrs && covered.length === nAttrs && new Set(covered).size === nAttrs &&
    units.every((s, j) => s !== null && s.cols.every((c, i) => s.out[i] === c) &&
                 (kind === "cluster" || (s.cols.length === 1 && s.cols[0] === j)));
  if (!ok)
    throw new ProgramError("device.memoize.permanent", "must hold one grr or matrix step per " +
                           "attribute j, in and out [j], in order (a numeric one: its wave, or " +
                           "a select with out null over one wave per branch, in [j] and out j; " +
                           "kind cluster: grr or matrix per cluster, the clusters covering " +
                           "every attribute once; width must be the attribute count)");
  const leaves = units as (Leaf | NumericUnit)[];
  return { kind, rotationS, permanent: leaves, round, select: null, partition: null,
           instantaneous: null, fingerprint: fingerprint(perm, raw),
           epsilon: leaves.reduce((e, s) => e + s.eps, 0) };
}

/** A device's alpha in [0, 1) under a rounding: (mix64(id ^ mix64(seed)) >> 11) * 2^-53. */
export function alpha(r: Rounding, deviceId: bigint): number {
  return Number(mix64(BigInt.asUintN(64, deviceId) ^ r.seed) >> 11n) * 2 ** -53;
}

/** The record the memos are keyed by: each rounded attribute's grid index alpha-point rounded
 * with the device's alpha (to the point below it, or the next one when its fraction of the way
 * there exceeds alpha). */
export function memoRound(memo: Memo, x: number[], deviceId: bigint): number[] {
  if (!memo.round) return x;
  return x.map((v, j) => {
    const r = memo.round![j];
    if (!r) return v;
    return r.points[roundIndex(r.points, v, alpha(r, deviceId))];
  });
}

export function memoKind(m: Record<string, unknown>): MemoKind {
  const k = m.kind ?? "attribute";
  if (k !== "attribute" && k !== "cluster" && k !== "partition" && k !== "select")
    throw new ProgramError("device.memoize.kind", "must be attribute, cluster, partition or " +
                           "select");
  return k;
}

/** [unit, cell] of every memo the record x needs in rotation `period`. */
export function memoKeys(memo: Memo, x: ArrayLike<number>, deviceId: bigint,
                         period: number): [number, number][] {
  const first = (seed: bigint, k: number) => Number(
    mix64(mix64(BigInt.asUintN(64, deviceId) ^ seed) ^ (BigInt(period) & M64)) % BigInt(k));
  if (memo.select) {
    const j = first(memo.select.seed, memo.permanent.length);
    const p = memo.permanent[j];
    return [[j, ravel(x, p.cols, p.sizes)]];
  }
  const s = memo.partition;
  if (!s) return memo.permanent.map((p, u) => [u, ravel(x, p.cols, p.sizes)]);
  const k = s.tables.length;
  const slot0 = first(s.seed, k);
  // a rounded value (a point) its point's index, as its round step maps it: no draw
  const y = Array.from(x, (v, j) => (memo.round?.[j] ? roundIndex(memo.round[j]!.points, v, 0)
                                                     : v));
  return s.out.map((_, i) => {
    const unit = (slot0 + i) % k;
    const t = s.tables[unit];
    return [unit, ravel(y, t.cols, t.sizes)];
  });
}

const tableEps = (t: Table): number => grrEpsilon(t.p, t.g || t.cells);

export function memoEpsilon(memo: Memo, unit: number): number {
  return memo.partition ? tableEps(memo.partition.tables[unit]) : memo.permanent[unit].eps;
}

/** A new permanent response of a unit for a cell (partition: the oracle code, no offset). */
export function memoDraw(memo: Memo, unit: number, cell: number, rng: DrawSource): number {
  const u = memo.permanent[unit];
  if (!memo.partition && u.op === "numeric") {   // the task, then its wave: the column's value
    const s = u.step;
    const w = s.op === "wave" ? s : s.branches[s.weights ? categorical(rng, s.weights)
      : uniform(rng, s.branches.length)][0] as Wave;
    return w.offset + waveCell(w, cell, rng);
  }
  if (!memo.partition) return apply(u as Leaf, cell, rng);
  return tableCode(memo.partition.tables[unit], cell, rng);
}

/** Partition: the report of the memoized codes (the instantaneous layer applied); others: the
 * permanent record (each unit's output cell in its columns). */
export function memoRecord(memo: Memo, keys: [number, number][], values: number[], width: number,
                           rng: DrawSource): number[] {
  const out = new Array<number>(width).fill(0);
  const s = memo.partition;
  if (s) {
    keys.forEach(([unit], i) => {
      const t = s.tables[unit];
      let code = values[i];
      const p = memo.instantaneous?.[unit];
      if (p !== undefined && t.g === 0) code = grr(code, t.cells, p, rng);
      else if (p !== undefined) code = Math.floor(code / t.g) * t.g + grr(code % t.g, t.g, p, rng);
      out[s.out[i]] = t.offset + code;
    });
    return out;
  }
  keys.forEach(([unit], i) => {
    const p = memo.permanent[unit];
    let cell = values[i];
    if (p.op === "numeric") { out[p.cols[0]] = cell; return; }
    if (memo.select) {   // the index, then the branch's (re-randomized) output cell
      out[memo.select.out] = unit;
      if (memo.instantaneous) cell = grr(cell, p.cells, memo.instantaneous[unit], rng);
    }
    for (let c = p.cols.length - 1; c >= 0; c--) {
      out[p.out[c]] = cell % p.sizes[c];
      cell = Math.floor(cell / p.sizes[c]);
    }
  });
  return out;
}
