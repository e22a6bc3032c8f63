/** The steps of a randomization description: their types, parsing helpers and how each is
 * run (docs/device-protocol.md, "Randomization description"). */

import { DrawSource, bernoulli, categorical, uniform } from "./rng.js";

export const PROGRAM_VERSION = 1;
/* the limits every SDK enforces (docs/device-protocol.md, "Limits") */
export const MAX_ATTRS = 32;
export const MAX_WIDTH = 1024;
export const MAX_STEPS = 64;
export const MAX_MATRIX_ENTRIES = 4096;
export const MAX_CELLS = 2 ** 32;
/** partition tables in all */
export const MAX_TABLES = 64;
/** category labels in all */
export const MAX_LABELS = 1024;
/** UTF-8 bytes of attribute names and labels, one more per string */
export const MAX_LABEL_BYTES = 16384;

/** UTF-8 bytes of a string (a lone surrogate counts as three, as WTF-8) */
export function utf8Length(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c < 0xdc00 && i + 1 < s.length &&
             (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) { n += 4; i++; }
    else n += 3;
  }
  return n;
}

/** The product of the sizes as a cell count; a ProgramError naming field beyond 2^32. */
export function cellCount(sizes: number[], field: string): number {
  const cells = sizes.reduce((a, b) => a * b, 1);
  if (cells > MAX_CELLS) throw new ProgramError(field, `${cells} cells > ${MAX_CELLS}`);
  return cells;
}

/** The largest Hamming distance between two values' filters (sets of bit positions below
 * bits): |A| + |B| - 2|A & B| with one value's bits marked, O(values x positions). */
export function bloomHamming(filters: number[][], bits: number): number {
  const mark = new Uint8Array(bits);
  const sets = filters.map((v) => {
    const u = v.filter((b) => mark[b] === 0 && (mark[b] = 1) === 1);
    for (const b of u) mark[b] = 0;
    return u;
  });
  let ham = 0;
  for (let u = 0; u + 1 < sets.length; u++) {
    for (const b of sets[u]) mark[b] = 1;
    for (let v = u + 1; v < sets.length; v++) {
      let both = 0;
      for (const b of sets[v]) both += mark[b];
      ham = Math.max(ham, sets[u].length + sets[v].length - 2 * both);
    }
    for (const b of sets[u]) mark[b] = 0;
  }
  return ham;
}

/** A description the device cannot run; `field` names the offending part. */
export class ProgramError extends Error {
  constructor(readonly field: string, message: string) {
    super(`${field}: ${message}`);
  }
}

/** A record that does not fit the schema; `attribute` names the offending field. */
export class SchemaError extends Error {
  constructor(readonly attribute: string, message: string) {
    super(message);
  }
}

export interface Leaf {
  op: "grr" | "matrix" | "uniform";
  cols: number[];
  sizes: number[];
  out: number[];
  cells: number;
  p: number;
  cum: Float64Array;
  eps: number;
}

/** const: column `out` = `value`; copy: column `out` drawn from row report[from] of `cum` */
export interface Post {
  op: "const" | "copy" | "keep" | "bloom";
  /** keep: the input attributes, their sizes, p; cum holds the fake distribution */
  cols: number[];
  /** bloom: every value's set bit positions */
  filters: number[][];
  sizes: number[];
  p: number;
  out: number;
  value: number;
  from: number;
  rows: number;
  rowLen: number;
  cum: Float64Array;
  eps: number;
}

export interface Select {
  op: "select";
  out: number | null;
  branches: (Leaf | Post | Wave)[][];
  /** cumulative branch weights (null: uniform) */
  weights: Float64Array | null;
  eps: number;
}

/** A numeric attribute's value through a window (docs/device-protocol.md, "Numeric
 * attributes"): wave = [lo, hi, at0, at1, width]. */
export interface Wave {
  op: "wave";
  col: number;
  grid: number;
  out: number;
  offset: number;
  cells: number;
  wave: number[];
  p: number;
  rounded: boolean;
  eps: number;
}

/** points of a numeric attribute's grid, at most */
export const MAX_GRID = 65536;
/** points of a round step, at most */
export const MAX_ROUND_POINTS = 64;

/** A numeric attribute's grid index rounded without bias to its points (docs/device-protocol.md,
 * "Numeric attributes"): x[col] becomes the index of its point. */
export interface Round {
  op: "round";
  col: number;
  points: number[];
  eps: number;
}

/** The index of the point (of `pts`, increasing grid indices) grid index x rounds to with u:
 * k = the last point <= x, at most the second last; k + 1 when the fraction of the way to the
 * next point exceeds u, else k. */
export function roundIndex(pts: number[], x: number, u: number): number {
  let lo = 0, hi = pts.length - 1;
  while (hi - lo > 1) {
    const mid = lo + Math.floor((hi - lo) / 2);
    if (pts[mid] <= x) lo = mid;
    else hi = mid;
  }
  return (x - pts[lo]) / (pts[lo + 1] - pts[lo]) > u ? lo + 1 : lo;
}

/** A round step: u from one word, always (even on a point). */
export function round(s: Round, x: number[], rng: DrawSource): void {
  x[s.col] = roundIndex(s.points, x[s.col], Number(rng.nextU64() >> 11n) * 2 ** -53);
}

/** The text of a numeric value: [+-] (digits [. digits] | . digits) [exponent]. */
export const NUMBER_TEXT = /^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$/;

/** The nearest integer, ties to the even one. */
function roundHalfEven(v: number): number {
  const f = Math.floor(v), d = v - f;
  return d > 0.5 || (d === 0.5 && f % 2 !== 0) ? f + 1 : f;
}

/** A numeric value -> [its grid index, whether it was clipped into [lo, hi]]. */
export function quantizeValue(v: number, lo: number, hi: number, grid: number): [number, boolean] {
  const clipped = v < lo || v > hi;
  const c = v < lo ? lo : v > hi ? hi : v;
  return [roundHalfEven((c - lo) / (hi - lo) * (grid - 1)), clipped];
}

/** epsilon of a wave (estimators/kernels/device_program.py wave_epsilon, the same operations) */
export function waveEpsilon(w: number[], p: number, cells: number, rounded: boolean): number {
  const [lo, hi, a, b, width] = w;
  if (width > 0) {
    const rest = (hi - lo) - width;
    if (!(p > 0 && p < 1) || rest <= 0) return Infinity;
    return Math.abs(Math.log((p / width) / ((1 - p) / rest)));
  }
  if (!rounded || cells !== 2) return Infinity;
  let y0 = b, y1 = a + b;
  if (y1 < y0) [y0, y1] = [y1, y0];
  if (y0 <= lo || y1 >= hi) return Infinity;
  return Math.log(Math.max((y1 - lo) / (y0 - lo), (hi - y0) / (hi - y1)));
}

/** A wave's cell (no offset) for grid index i: inner = bernoulli(p), u from one word, the
 * point in the window or on the rest of the range, bucketed or rounded without bias. */
export function waveCell(s: Wave, i: number, rng: DrawSource): number {
  const [lo, hi, a, b, width] = s.wave;
  const z = i / (s.grid - 1);
  const leftEdge = a * z + b;
  const inner = bernoulli(rng, s.p);
  const u = Number(rng.nextU64() >> 11n) * 2 ** -53;
  let y: number;
  if (inner) y = leftEdge + u * width;
  else {
    const left = Math.max(leftEdge - lo, 0), right = Math.max(hi - (leftEdge + width), 0);
    const t = u * (left + right);
    y = t < left ? lo + t : (leftEdge + width) + (t - left);
  }
  if (s.rounded) {
    const pos = (y - lo) / (hi - lo) * (s.cells - 1);
    const k = Math.min(Math.max(Math.floor(pos), 0), s.cells - 2);
    return k + (bernoulli(rng, pos - k) ? 1 : 0);
  }
  return Math.min(Math.max(Math.floor((y - lo) / (hi - lo) * s.cells), 0), s.cells - 1);
}

export function wave(s: Wave, x: ArrayLike<number>, rng: DrawSource, report: number[]): void {
  report[s.out] = s.offset + waveCell(s, x[s.col], rng);
}

export interface Table {
  cols: number[];
  sizes: number[];
  cells: number;
  offset: number;
  p: number;
  g: number;   // 0: GRR over the cells
  r: number;
}

export interface Partition {
  op: "partition";
  seed: bigint;   // mix64(assign seed)
  out: number[];
  tables: Table[];
  eps: number;
}

export type Step = Leaf | Select | Partition | Post | Wave | Round;

export const M64 = (1n << 64n) - 1n;
/** The SplitMix64 finalizer: the partition assignment's hash. */
export function mix64(x: bigint): bigint {
  x = ((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
  x = ((x ^ (x >> 27n)) * 0x94d049bb133111ebn) & M64;
  return x ^ (x >> 31n);
}

export const grrEpsilon = (p: number, k: number): number => {
  const q = (1 - p) / (k - 1);
  const lo = Math.min(p, q), hi = Math.max(p, q);
  return lo <= 0 ? Infinity : Math.log(hi / lo);
};

export const isInt = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v);
export const isObj = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);

export function ints(v: unknown, field: string, below: number): number[] {
  if (!Array.isArray(v) || v.length === 0 || v.length > MAX_ATTRS ||
      !v.every((c) => isInt(c) && c >= 0 && c < below))
    throw new ProgramError(field, `must be a non-empty list of integers in [0, ${below})`);
  return v as number[];
}

/** max over columns of ln(max/min) (inf: a zero beside a positive entry) */
/** Cumulative sums of a row-stochastic matrix, row by row. */
export function cumulative(rows: unknown[], field: string): Float64Array {
  const len = (rows[0] as unknown[]).length;
  const cum = new Float64Array(rows.length * len);
  rows.forEach((r, i) => {
    let acc = 0;
    (r as unknown[]).forEach((x, j) => {
      if (typeof x !== "number" || !(x >= 0))
        throw new ProgramError(`${field}.rows[${i}]`, "must hold non-negative numbers");
      acc += x;
      cum[i * len + j] = acc;
    });
    if (!(Math.abs(acc - 1) <= 1e-9))
      throw new ProgramError(`${field}.rows[${i}]`, `sums to ${acc}, not 1`);
  });
  return cum;
}

export function matrixEpsilon(rows: number[][]): number {
  let best = 0;
  for (let j = 0; j < rows.length; j++) {
    let lo = Infinity, hi = 0;
    for (const r of rows) { lo = Math.min(lo, r[j]); hi = Math.max(hi, r[j]); }
    if (hi > 0) {
      if (lo <= 0) return Infinity;
      best = Math.max(best, Math.log(hi / lo));
    }
  }
  return best;
}

export const isPost = (s: Step): s is Post =>
  s.op === "const" || s.op === "copy" || s.op === "keep" || s.op === "bloom";

export function post(s: Post, x: ArrayLike<number>, rng: DrawSource, report: number[]): void {
  if (s.op === "const") { report[s.out] = s.value; return; }
  if (s.op === "bloom") {  // rowLen bits from column out; filters[x] in positions; p = f
    const set = s.filters[x[s.cols[0]]];
    report.fill(0, s.out, s.out + s.rowLen);
    for (const b of set) report[s.out + b] = 1;
    for (let b = 0; b < s.rowLen; b++) {
      const u = Number(rng.nextU64() >> 11n);
      if (u < s.p * 0.5 * 2 ** 53) report[s.out + b] = 1;
      else if (u < s.p * 2 ** 53) report[s.out + b] = 0;
    }
    return;
  }
  if (s.op === "keep") {
    report[s.out] = bernoulli(rng, s.p) ? ravel(x, s.cols, s.sizes)
      : categorical(rng, s.cum, 0, s.rowLen);
    return;
  }
  const row = Math.min(report[s.from], s.rows - 1);
  report[s.out] = categorical(rng, s.cum, row * s.rowLen, s.rowLen);
}

export function ravel(x: ArrayLike<number>, cols: number[], sizes: number[]): number {
  let cell = 0;
  for (let i = 0; i < cols.length; i++) cell = cell * sizes[i] + x[cols[i]];
  return cell;
}

/** Slot i: table (first + i) mod K, first = mix64(device id ^ seed) mod K, its oracle code. */
export function partition(s: Partition, x: ArrayLike<number>, rng: DrawSource, report: number[],
                   deviceId: bigint): void {
  const k = s.tables.length;
  const first = Number(mix64(BigInt.asUintN(64, deviceId) ^ s.seed) % BigInt(k));
  s.out.forEach((col, i) => {
    const t = s.tables[(first + i) % k];
    report[col] = t.offset + tableCode(t, ravel(x, t.cols, t.sizes), rng);
  });
}

/** A table's oracle code of a cell (no offset): GRR on the cell, or OLH: a = uniform(g^r),
 * h = sum of digit_i(a) * digit_i(cell) mod g, code a*g + GRR_g(h). */
export function tableCode(t: Table, cell: number, rng: DrawSource): number {
  if (t.g === 0) return grr(cell, t.cells, t.p, rng);
  const a = uniform(rng, t.g ** t.r);
  let h = 0, aa = a, cc = cell;
  for (let j = 0; j < t.r; j++) {
    h += (aa % t.g) * (cc % t.g);
    aa = Math.floor(aa / t.g);
    cc = Math.floor(cc / t.g);
  }
  return a * t.g + grr(h % t.g, t.g, t.p, rng);
}

export function run(s: Leaf, x: ArrayLike<number>, rng: DrawSource, report: number[]): void {
  let cell = apply(s, ravel(x, s.cols, s.sizes), rng);
  for (let i = s.cols.length - 1; i >= 0; i--) {
    report[s.out[i]] = cell % s.sizes[i];
    cell = Math.floor(cell / s.sizes[i]);
  }
}

export function grr(cell: number, k: number, p: number, rng: DrawSource): number {
  if (bernoulli(rng, p)) return cell;
  const other = uniform(rng, k - 1);
  return other + (other >= cell ? 1 : 0);
}

export function apply(s: Leaf, cell: number, rng: DrawSource): number {
  if (s.op === "grr") return grr(cell, s.cells, s.p, rng);
  if (s.op === "uniform") return uniform(rng, s.cells);
  return categorical(rng, s.cum, cell * s.cells, s.cells);
}

