/** The randomization description: parse, epsilon, labels -> indices, randomize
 * (docs/device-protocol.md, "Randomization description"). */
import { DrawSource, categorical, uniform } from "./rng.js";
import { Memo, Rounding, makeMemo, memoKind } from "./memo.js";
import { Leaf, M64, MAX_ATTRS, MAX_CELLS, MAX_GRID, MAX_LABEL_BYTES, MAX_LABELS,
         MAX_MATRIX_ENTRIES, MAX_ROUND_POINTS, MAX_STEPS, MAX_TABLES, MAX_WIDTH, NUMBER_TEXT,
         Round, bloomHamming, round,
         cellCount, utf8Length, PROGRAM_VERSION, Partition, Post, ProgramError, SchemaError,
         Select, Step, Table, Wave, apply, cumulative, grrEpsilon, isInt, isObj, ints, isPost,
         matrixEpsilon, mix64, partition, post, quantizeValue, run, wave, waveCell,
         waveEpsilon } from "./steps.js";

export { Memo } from "./memo.js";
export { MAX_ATTRS, MAX_GRID, MAX_LABEL_BYTES, MAX_LABELS, MAX_MATRIX_ENTRIES, MAX_STEPS,
         MAX_TABLES, MAX_WIDTH, PROGRAM_VERSION, ProgramError, SchemaError, mix64 } from "./steps.js";

/** A record: labels, and numbers (or their text) for numeric attributes. */
export type RecordValues = Record<string, string | number>;

/** The label caps, in the order the C SDK fills its buffers (each name, then its labels):
 * MAX_LABELS labels and MAX_LABEL_BYTES UTF-8 bytes, one more per string. */
function checkText(attrs: string[], labels: string[][]): void {
  let nLabels = 0, nBytes = 0;
  attrs.forEach((name, j) => {
    nBytes += utf8Length(name) + 1;
    if (nBytes > MAX_LABEL_BYTES)
      throw new ProgramError("device.attrs", `at most ${MAX_LABEL_BYTES} bytes of names and labels`);
    nLabels += labels[j].length;
    if (nLabels > MAX_LABELS)
      throw new ProgramError(`device.labels[${j}]`, `at most ${MAX_LABELS} labels in all`);
    for (const lab of labels[j]) nBytes += utf8Length(lab) + 1;
    if (nBytes > MAX_LABEL_BYTES)
      throw new ProgramError(`device.labels[${j}]`, `at most ${MAX_LABEL_BYTES} bytes of names ` +
                             "and labels");
  });
}

/** A numeric attribute's {min, max, grid}: finite min < max, grid an integer in [2, MAX_GRID]. */
function numericAttr(d: Record<string, unknown>, j: number): [number, number, number] {
  const lo = d.min, hi = d.max, g = d.grid;
  if (typeof lo !== "number" || typeof hi !== "number" || !Number.isFinite(lo) ||
      !Number.isFinite(hi) || !(lo < hi) || !isInt(g) || g < 2 || g > MAX_GRID)
    throw new ProgramError(`device.labels[${j}]`, "a numeric attribute is {min, max, grid}: " +
                           `finite min < max, grid an integer in [2, ${MAX_GRID}]`);
  return [lo, hi, g];
}

/** A checked randomization description (state.device). */
export class Program {
  readonly family: string;
  readonly attrs: string[];
  readonly labels: string[][];
  /** per attribute: its labels, or a numeric attribute's grid points (what a record holds) */
  readonly shape: number[];
  /** per attribute: its cells as the steps see them (a rounded attribute's points) */
  private readonly sizes: number[];
  /** per attribute: a round step rounds it */
  private readonly rounded: boolean[];
  private memoized = false;
  /** per attribute: [min, max, grid] of a numeric one, null for a categorical one */
  readonly ranges: ([number, number, number] | null)[];
  readonly width: number;
  readonly epsilon: number;
  readonly memo: Memo | null;
  private readonly steps: Step[];
  private readonly index: Map<string, number>[];
  private nSteps = 0;
  private matrixEntries = 0;
  private nTables = 0;

  constructor(d: unknown) {
    if (!isObj(d)) throw new ProgramError("device", "must be an object");
    if (d.v !== PROGRAM_VERSION)
      throw new ProgramError("device.v", `unsupported version ${JSON.stringify(d.v)} (this SDK ` +
                             `runs ${PROGRAM_VERSION})`);
    this.family = String(d.family);
    const { attrs, labels, width } = d;
    if (!Array.isArray(attrs) || attrs.length < 1 || attrs.length > MAX_ATTRS ||
        !attrs.every((a) => typeof a === "string"))
      throw new ProgramError("device.attrs", `must be 1..${MAX_ATTRS} attribute names`);
    if (!Array.isArray(labels) || labels.length !== attrs.length)
      throw new ProgramError("device.labels", "must hold >= 2 string labels per attribute");
    labels.forEach((lab, j) => {
      if (!isObj(lab) &&
          (!Array.isArray(lab) || lab.length < 2 || !lab.every((s) => typeof s === "string")))
        throw new ProgramError(`device.labels[${j}]`, "must hold >= 2 string labels (a numeric " +
                               "attribute: {min, max, grid})");
    });
    if (!isInt(width) || width < 1 || width > MAX_WIDTH)
      throw new ProgramError("device.width", `must be an integer in [1, ${MAX_WIDTH}]`);
    this.ranges = labels.map((lab, j) => (isObj(lab) ? numericAttr(lab, j) : null));
    const text = labels.map((lab) => (isObj(lab) ? [] : lab)) as string[][];
    checkText(attrs as string[], text);
    this.attrs = attrs as string[];
    this.labels = text;
    this.shape = this.labels.map((l, j) => this.ranges[j]?.[2] ?? l.length);
    this.sizes = [...this.shape];
    this.rounded = this.shape.map(() => false);
    this.width = width;
    const memo = d.memoize ?? null;
    this.memoized = memo !== null;
    this.steps = memo !== null && Array.isArray(d.steps) && d.steps.length === 0 ? []
      : this.parseSteps(d.steps, "device.steps", 0);
    this.memo = memo === null ? null : this.parseMemo(memo);
    this.epsilon = this.memo ? this.memo.epsilon : this.steps.reduce((e, s) => e + s.eps, 0);
    this.index = this.labels.map((l) => new Map(l.map((s, i) => [s, i])));
  }

  private parseMemo(m: unknown): Memo {
    if (!isObj(m)) throw new ProgramError("device.memoize", "must be an object");
    const kind = memoKind(m);
    const rot = m.rotation_s ?? null;
    if (rot !== null && !(typeof rot === "number" && Number.isFinite(rot) && rot > 0))
      throw new ProgramError("device.memoize.rotation_s", "must be a number > 0 or null");
    if (kind !== "attribute" && kind !== "partition" && m.round !== undefined && m.round !== null)
      throw new ProgramError("device.memoize.round", "only with kind attribute or partition");
    const round = this.parseRound(m.round);
    const perm = this.parseSteps(m.permanent, "device.memoize.permanent",
                                 kind === "cluster" ? 1 : 0, kind === "partition"
                                 ) as (Leaf | Partition | Select | Wave | Round)[];
    return makeMemo(m, kind, rot, perm, this.attrs.length, this.width, round);
  }

  /** round: null, or per attribute null or a numeric one's {points, seed}: grid indices from 0
   * to the last, increasing (each a matrix entry), the alpha seed a u64 as a decimal string. */
  private parseRound(r: unknown): (Rounding | null)[] | null {
    if (r === undefined || r === null) return null;
    if (!Array.isArray(r) || r.length !== this.attrs.length)
      throw new ProgramError("device.memoize.round", `must be null or ${this.attrs.length} ` +
                             "entries, one per attribute");
    return r.map((e, j) => {
      const f = `device.memoize.round[${j}]`;
      if (e === null) return null;
      const range = this.ranges[j];
      if (!isObj(e) || range === null || !Array.isArray(e.points))
        throw new ProgramError(f, "must be null or, for a numeric attribute, {points, seed}");
      const pts = e.points;
      this.matrixEntries += pts.length;
      if (this.matrixEntries > MAX_MATRIX_ENTRIES || pts.length < 2 ||
          !pts.every((v, i) => isInt(v) && (i === 0 ? v === 0 : v > pts[i - 1])) ||
          pts[pts.length - 1] !== range[2] - 1)
        throw new ProgramError(`${f}.points`, "must be increasing grid indices from 0 to " +
                               `${range[2] - 1} (each counts against the ${MAX_MATRIX_ENTRIES} ` +
                               "matrix entries in all)");
      const seed = e.seed;
      if (typeof seed !== "string" || !/^[0-9]{1,20}$/.test(seed) || BigInt(seed) > M64)
        throw new ProgramError(`${f}.seed`, "must be a u64 as a decimal string");
      return { points: pts as number[], seed: mix64(BigInt(seed)) };
    });
  }

  /** False for a memoized description whose reports are the permanent responses. */
  get hasSteps(): boolean {
    return this.steps.length > 0;
  }

  /** `rounds`: the list may start with round steps (the top level of a description without
   * memoize, or a partition memo's permanent steps). */
  private parseSteps(v: unknown, field: string, depth: number,
                     rounds: boolean = !this.memoized): Step[] {
    if (!Array.isArray(v) || v.length < 1 || v.length > MAX_STEPS)
      throw new ProgramError(field, `must be a list of 1..${MAX_STEPS} steps`);
    const out: Step[] = [];
    v.forEach((s, i) => {
      const f = `${field}[${i}]`;
      if (isObj(s) && s.op === "round") {
        if (depth > 0 || !rounds || this.nSteps !== out.length ||
            out.some((t) => t.op !== "round"))
          throw new ProgramError(`${f}.op`, "round steps come first, at the top level of a " +
                                 "description without memoize or of a partition memo's " +
                                 "permanent steps");
        out.push(this.parseRoundStep(s, f));
      } else out.push(this.parseStep(s, f, depth));
    });
    return out;
  }

  /** A round step: `in` one numeric attribute not rounded yet, `points` 2..64 grid indices
   * strictly increasing from 0 to the grid's last (each a matrix entry); the attribute then
   * has that many cells for every later step. */
  private parseRoundStep(d: Record<string, unknown>, field: string): Round {
    if (++this.nSteps > MAX_STEPS) throw new ProgramError(field, `more than ${MAX_STEPS} steps`);
    const cin = d.in;
    if (!Array.isArray(cin) || cin.length !== 1 || !isInt(cin[0]) || cin[0] < 0 ||
        cin[0] >= this.attrs.length || this.ranges[cin[0]] === null || this.rounded[cin[0]])
      throw new ProgramError(`${field}.in`, "must be [j], j a numeric attribute not rounded yet");
    const col = cin[0] as number, grid = this.shape[col], pts = d.points;
    const ok = Array.isArray(pts) && pts.length >= 2 && pts.length <= MAX_ROUND_POINTS &&
      this.matrixEntries + pts.length <= MAX_MATRIX_ENTRIES &&
      pts.every((v, i) => isInt(v) && (i === 0 ? v === 0 : v > pts[i - 1])) &&
      pts[pts.length - 1] === grid - 1;
    if (!ok)
      throw new ProgramError(`${field}.points`, `must be 2..${MAX_ROUND_POINTS} grid indices ` +
                             `strictly increasing from 0 to ${grid - 1} (each counts against ` +
                             `the ${MAX_MATRIX_ENTRIES} matrix entries in all)`);
    this.matrixEntries += pts.length;
    this.rounded[col] = true;
    this.sizes[col] = pts.length;
    return { op: "round", col, points: pts as number[], eps: 0 };
  }

  private parseStep(d: unknown, field: string, depth: number): Step {
    if (!isObj(d)) throw new ProgramError(field, "must be an object");
    if (++this.nSteps > MAX_STEPS) throw new ProgramError(field, `more than ${MAX_STEPS} steps`);
    if (d.op === "select") {
      const out = d.out ?? null;
      if (out !== null && (!isInt(out) || out < 0 || out >= this.width))
        throw new ProgramError(`${field}.out`, `must be null or an integer in [0, ${this.width})`);
      const br = d.branches;
      if (depth > 0 || !Array.isArray(br) || br.length < 1 || br.length > MAX_STEPS)
        throw new ProgramError(`${field}.branches`, "must be 1..64 lists of steps (not nested)");
      const weights = this.parseWeights(d.weights, br.length, `${field}.weights`);
      const branches = br.map((b, i) =>
        this.parseSteps(b, `${field}.branches[${i}]`, depth + 1) as (Leaf | Post | Wave)[]);
      const eps = Math.max(0, ...branches.map((b) => b.reduce((e, s) => e + s.eps, 0)));
      return { op: "select", out, branches, weights, eps };
    }
    if (d.op === "wave") return this.parseWave(d, field);
    if (d.op === "partition" && depth === 0) return this.parsePartition(d, field);
    if (d.op === "const" || d.op === "copy" || d.op === "keep" || d.op === "bloom")
      return this.parsePost(d, field);
    if (d.op !== "grr" && d.op !== "matrix" && d.op !== "uniform")
      throw new ProgramError(`${field}.op`, `unknown op ${JSON.stringify(d.op)} (known: grr, ` +
                             "matrix, uniform, copy, const, keep, bloom, wave, round, select, " +
                             "partition)");
    const cols = ints(d.in, `${field}.in`, this.attrs.length);
    const out = ints(d.out, `${field}.out`, this.width);
    if (out.length !== cols.length)
      throw new ProgramError(`${field}.out`, "must have as many columns as in");
    const sizes = cols.map((c) => this.sizes[c]);
    const cells = cellCount(sizes, `${field}.in`);
    if (d.op === "uniform")
      return { op: "uniform", cols, sizes, out, cells, p: 0, cum: new Float64Array(0), eps: 0 };
    if (d.op === "grr") {
      const p = d.p;
      if (typeof p !== "number" || !(p >= 0 && p <= 1))
        throw new ProgramError(`${field}.p`, "must be a number in [0, 1]");
      return { op: "grr", cols, sizes, out, cells, p, cum: new Float64Array(0),
               eps: grrEpsilon(p, cells) };
    }
    const rows = d.rows;
    this.matrixEntries += cells * cells;
    if (!Array.isArray(rows) || rows.length !== cells || this.matrixEntries > MAX_MATRIX_ENTRIES ||
        !rows.every((r) => Array.isArray(r) && r.length === cells))
      throw new ProgramError(`${field}.rows`, `must be ${cells}x${cells} (at most ` +
                             `${MAX_MATRIX_ENTRIES} matrix entries in all)`);
    return { op: "matrix", cols, sizes, out, cells, p: 0, cum: cumulative(rows, field),
             eps: matrixEpsilon(rows) };
  }

  /** A select's weights (absent or null: uniform): one number > 0 per branch summing to 1
   * within 1e-9, as cumulative sums (one matrix entry each). */
  private parseWeights(w: unknown, n: number, field: string): Float64Array | null {
    if (w === undefined || w === null) return null;
    if (!Array.isArray(w) || w.length !== n || this.matrixEntries + n > MAX_MATRIX_ENTRIES ||
        !w.every((x) => typeof x === "number" && x > 0))
      throw new ProgramError(field, `must be null or ${n} numbers > 0 (one per branch)`);
    this.matrixEntries += n;
    const cum = new Float64Array(n);
    let acc = 0;
    w.forEach((x, i) => { acc += x as number; cum[i] = acc; });
    if (!(Math.abs(acc - 1) <= 1e-9)) throw new ProgramError(field, `sums to ${acc}, not 1`);
    return cum;
  }

  /** A wave step (docs/device-protocol.md, "Numeric attributes"); its 5 numbers count as
   * matrix entries. */
  private parseWave(d: Record<string, unknown>, field: string): Wave {
    const fin = (v: unknown, f: string): number => {
      if (typeof v !== "number" || !Number.isFinite(v))
        throw new ProgramError(f, "must be a finite number");
      return v;
    };
    const cin = d.in;
    if (!Array.isArray(cin) || cin.length !== 1 || !isInt(cin[0]) || cin[0] < 0 ||
        cin[0] >= this.attrs.length || this.ranges[cin[0]] === null || this.rounded[cin[0]])
      throw new ProgramError(`${field}.in`, "must be [j], j a numeric attribute not rounded by " +
                             "a round step");
    const col = cin[0] as number;
    const out = d.out;
    if (!isInt(out) || out < 0 || out >= this.width)
      throw new ProgramError(`${field}.out`, `must be a non-empty list of integers in [0, ${this.width})`);
    if (typeof d.round !== "boolean") throw new ProgramError(`${field}.round`, "must be true or false");
    const rounded = d.round, cells = d.cells, offset = d.offset;
    if (!isInt(cells) || cells < (rounded ? 2 : 1) || cells > MAX_CELLS)
      throw new ProgramError(`${field}.cells`, `must be an integer in [${rounded ? 2 : 1}, ${MAX_CELLS}]`);
    if (!isInt(offset) || offset < 0 || offset + cells > MAX_CELLS)
      throw new ProgramError(`${field}.offset`, `must be an integer >= 0 with offset + cells <= ${MAX_CELLS}`);
    const range = d.range, at = d.at;
    if (!Array.isArray(range) || range.length !== 2)
      throw new ProgramError(`${field}.range`, "must be [lo, hi], finite, lo < hi");
    const lo = fin(range[0], `${field}.range`), hi = fin(range[1], `${field}.range`);
    if (!(lo < hi)) throw new ProgramError(`${field}.range`, "must be [lo, hi], finite, lo < hi");
    if (!Array.isArray(at) || at.length !== 2)
      throw new ProgramError(`${field}.at`, "must be [a, b], finite");
    const a = fin(at[0], `${field}.at`), b = fin(at[1], `${field}.at`);
    const width = fin(d.width, `${field}.width`);
    const p = d.p;
    if (typeof p !== "number" || !(p >= 0 && p <= 1))
      throw new ProgramError(`${field}.p`, "must be a number in [0, 1]");
    if (width < 0 || (width === 0 && p !== 1))
      throw new ProgramError(`${field}.width`, "must be >= 0 (0: a point, with p 1)");
    const tol = 1e-9 * (hi - lo);
    for (const z of [0, 1]) {
      const left = a * z + b;
      if (!(left >= lo - tol && left + width <= hi + tol))
        throw new ProgramError(`${field}.at`, `the window at z = ${z} must lie inside the range`);
    }
    this.matrixEntries += 5;
    if (this.matrixEntries > MAX_MATRIX_ENTRIES)
      throw new ProgramError(`${field}.range`, "beyond the matrix entries in all (a wave holds 5)");
    const w = [lo, hi, a, b, width];
    return { op: "wave", col, grid: this.shape[col], out, offset, cells, wave: w, p, rounded,
             eps: waveEpsilon(w, p, cells, rounded) };
  }

  private parsePost(d: Record<string, unknown>, field: string): Post {
    const out = d.out;
    if (!isInt(out) || out < 0 || out >= this.width)
      throw new ProgramError(`${field}.out`, `must be an integer in [0, ${this.width})`);
    const none = { cols: [], sizes: [], p: 0, from: 0, rows: 0, rowLen: 0, filters: [] };
    if (d.op === "bloom") return { ...none, ...this.parseBloom(d, field, out) };
    if (d.op === "const") {
      if (!isInt(d.value) || d.value < 0 || d.value >= MAX_CELLS)
        throw new ProgramError(`${field}.value`, `must be an integer in [0, ${MAX_CELLS})`);
      return { ...none, op: "const", out, value: d.value, cum: new Float64Array(0), eps: 0 };
    }
    if (d.op === "keep") {
      const cols = ints(d.in, `${field}.in`, this.attrs.length);
      const sizes = cols.map((c) => this.sizes[c]);
      const cells = cellCount(sizes, `${field}.in`);
      const p = d.p, fake = d.fake;
      if (typeof p !== "number" || !(p >= 0 && p <= 1))
        throw new ProgramError(`${field}.p`, "must be a number in [0, 1]");
      if (!Array.isArray(fake) || fake.length !== cells)
        throw new ProgramError(`${field}.fake`, `must hold ${cells} probabilities`);
      this.matrixEntries += cells;
      if (this.matrixEntries > MAX_MATRIX_ENTRIES)
        throw new ProgramError(`${field}.fake`, `at most ${MAX_MATRIX_ENTRIES} matrix entries ` +
                               "in all");
      const lo = Math.min(...(fake as number[]));
      const eps = p === 0 ? 0 : p >= 1 || !(lo > 0) ? Infinity : Math.log1p(p / ((1 - p) * lo));
      return { ...none, op: "keep", out, value: 0, cols, sizes, p, rowLen: cells,
               cum: cumulative([fake], `${field}.fake`), eps };
    }
    if (!isInt(d.from) || d.from < 0 || d.from >= this.width)
      throw new ProgramError(`${field}.from`, `must be an integer in [0, ${this.width})`);
    const rows = d.rows;
    const len = Array.isArray(rows) && Array.isArray(rows[0]) ? rows[0].length : 0;
    this.matrixEntries += Array.isArray(rows) ? rows.length * len : 0;
    if (!Array.isArray(rows) || rows.length < 1 || len < 1 ||
        this.matrixEntries > MAX_MATRIX_ENTRIES ||
        !rows.every((r) => Array.isArray(r) && r.length === len))
      throw new ProgramError(`${field}.rows`, `must be ${Array.isArray(rows) ? rows.length : 0}` +
                             `xL (at most ${MAX_MATRIX_ENTRIES} matrix entries in all)`);
    return { ...none, op: "copy", out, value: 0, from: d.from, rows: rows.length, rowLen: len,
             cum: cumulative(rows, field), eps: 0 };
  }

  private parseBloom(d: Record<string, unknown>, field: string, out: number) {
    const cols = ints(d.in, `${field}.in`, this.attrs.length);
    const bits = d.bits, f = d.f, filters = d.filters;
    if (!isInt(bits) || bits < 1 || out + bits > this.width)
      throw new ProgramError(`${field}.bits`, "out and bits must place the filter inside the " +
                             `${this.width} report columns`);
    if (typeof f !== "number" || !(f >= 0 && f <= 1))
      throw new ProgramError(`${field}.f`, "must be a number in [0, 1]");
    const dv = this.sizes[cols[0]];
    const ok = cols.length === 1 && Array.isArray(filters) && filters.length === dv &&
      filters.every((v) => Array.isArray(v) && v.every((b) => isInt(b) && b >= 0 && b < bits));
    this.matrixEntries += ok ? dv + 1 + (filters as number[][]).reduce((a, v) => a + v.length, 0)
      : 0;
    if (!ok || this.matrixEntries > MAX_MATRIX_ENTRIES)
      throw new ProgramError(`${field}.filters`, "must list, per value of one attribute, bit " +
                             `positions below ${bits} (values + 1 + positions count against ` +
                             `the ${MAX_MATRIX_ENTRIES} matrix entries in all)`);
    const ham = bloomHamming(filters as number[][], bits);
    const eps = ham === 0 ? 0 : f <= 0 ? Infinity : Math.log((2 - f) / f) * ham;
    return { op: "bloom" as const, out, value: 0, cols, p: f, rowLen: bits,
             filters: filters as number[][], cum: new Float64Array(0), eps };
  }

  private parsePartition(d: Record<string, unknown>, field: string): Partition {
    const seed = d.seed;
    if (typeof seed !== "string" || !/^[0-9]{1,20}$/.test(seed) || BigInt(seed) > M64)
      throw new ProgramError(`${field}.seed`, "must be a u64 as a decimal string");
    const out = ints(d.out, `${field}.out`, this.width);
    const tabs = d.tables;
    this.nTables += Array.isArray(tabs) ? tabs.length : 0;
    if (!Array.isArray(tabs) || tabs.length < 1 || this.nTables > MAX_TABLES)
      throw new ProgramError(`${field}.tables`, `must be a list of 1..${MAX_TABLES} tables (in all)`);
    if (out.length > tabs.length) throw new ProgramError(`${field}.out`, "more slots than tables");
    const tables = tabs.map((t: unknown, i): Table => {
      const f = `${field}.tables[${i}]`;
      if (!isObj(t) || (t.oracle !== "grr" && t.oracle !== "olh"))
        throw new ProgramError(`${f}.oracle`, "must be grr or olh");
      const cols = ints(t.in, `${f}.in`, this.attrs.length);
      const sizes = cols.map((c) => this.sizes[c]);
      const cells = cellCount(sizes, `${f}.in`);
      const offset = t.offset;
      if (!isInt(offset) || offset < 0 || offset >= MAX_CELLS)
        throw new ProgramError(`${f}.offset`, `must be an integer in [0, ${MAX_CELLS})`);
      const p = t.p;
      if (typeof p !== "number" || !(p >= 0 && p <= 1))
        throw new ProgramError(`${f}.p`, "must be a number in [0, 1]");
      let g = 0, r = 0, codes = cells;
      if (t.oracle === "olh") {
        if (!isInt(t.g) || !isInt(t.r) || t.g < 2 || t.r < 1 || t.g ** t.r > MAX_CELLS ||
            t.g ** t.r < cells)
          throw new ProgramError(`${f}.g`, "g >= 2 and r >= 1 with cells <= g^r <= 2^32");
        g = t.g;
        r = t.r;
        codes = g ** (r + 1);
      }
      if (offset + codes > MAX_CELLS) throw new ProgramError(`${f}.offset`, "codes beyond 2^32");
      return { cols, sizes, cells, offset, p, g, r };
    });
    const worst = Math.max(...tables.map((t) => grrEpsilon(t.p, t.g || t.cells)));
    return { op: "partition", seed: mix64(BigInt(seed)), out, tables, eps: out.length * worst };
  }

  /** Labels (and numeric values) -> indices; a SchemaError names a missing or unknown
   * attribute or category, or a numeric attribute's value that is not a number. */
  encode(record: RecordValues): number[] {
    return this.encodeClipped(record).x;
  }

  /** encode, and the numeric attributes whose value was clipped into its range. */
  encodeClipped(record: RecordValues): { x: number[]; clipped: string[] } {
    for (const a of Object.keys(record))
      if (!this.attrs.includes(a))
        throw new SchemaError(a, `unknown attribute '${a}' (known: ${this.attrs.join(", ")})`);
    const clipped: string[] = [];
    const x = this.attrs.map((a, j) => {
      if (!(a in record)) throw new SchemaError(a, `missing attribute '${a}'`);
      const r = this.ranges[j];
      if (r !== null) {
        const v = record[a];
        const num = typeof v === "number" ? v : typeof v === "string" && NUMBER_TEXT.test(v)
          ? Number(v) : NaN;
        if (Number.isNaN(num))
          throw new SchemaError(a, `attribute '${a}': ${JSON.stringify(v)} is not a number`);
        const [k, was] = quantizeValue(num, r[0], r[1], r[2]);
        if (was) clipped.push(a);
        return k;
      }
      const i = this.index[j].get(String(record[a]));
      if (i === undefined)
        throw new SchemaError(a, `attribute '${a}': unknown category '${record[a]}' (allowed: ` +
                              `${this.labels[j].join(", ")})`);
      return i;
    });
    return { x, clipped };
  }

  /** One report of the record of indices x (into `report` when given). */
  randomize(x: ArrayLike<number>, rng: DrawSource,
            report: number[] = new Array<number>(this.width), deviceId = 0n): number[] {
    report.fill(0, 0, this.width);
    let xr = x;   // the record after its round steps (they come first)
    for (const s of this.steps) {
      if (s.op === "round") {
        if (xr === x) xr = Array.from(x);
        round(s, xr as number[], rng);
        continue;
      }
      if (s.op === "partition") { partition(s, xr, rng, report, deviceId); continue; }
      if (isPost(s)) { post(s, xr, rng, report); continue; }
      if (s.op === "wave") { wave(s, xr, rng, report); continue; }
      if (s.op !== "select") { run(s, xr, rng, report); continue; }
      const b = s.weights ? categorical(rng, s.weights) : uniform(rng, s.branches.length);
      if (s.out !== null) report[s.out] = b;
      for (const t of s.branches[b])
        if (isPost(t)) post(t, xr, rng, report);
        else if (t.op === "wave") wave(t, xr, rng, report);
        else run(t, xr, rng, report);
    }
    return report;
  }

  /** The grr/matrix steps at the top level with their cell counts (privacy audits). */
  leafSteps(): { index: number; cells: number }[] {
    return this.steps.flatMap((s, index) => s.op !== "grr" && s.op !== "matrix" ? []
      : [{ index, cells: s.cells }]);
  }

  /** Privacy audit of partition steps: per table with at most 36 cells and 400 codes (and at
   * most 64,000 input rows x codes), a device assigned to it reports `samples`/rows times each
   * input row, a record's values of the table's attributes (a numeric one's grid indices, which
   * the round steps round first; other attributes 0); the rows x codes counts of its first
   * slot. */
  auditPartition(samples: number, rng: DrawSource
                 ): { step: number; table: number; counts: number[][] }[] {
    const out: { step: number; table: number; counts: number[][] }[] = [];
    this.steps.forEach((s, step) => {
      if (s.op !== "partition") return;
      s.tables.forEach((t, table) => {
        const codes = t.g ? t.g ** (t.r + 1) : t.cells;
        const inputs = t.cols.map((c) => this.shape[c]);
        const rows = inputs.reduce((a, b) => a * b, 1);
        if (codes > 400 || t.cells > 36 || rows * codes > 64000) return;
        let dev = 0n;
        while (mix64(dev ^ s.seed) % BigInt(s.tables.length) !== BigInt(table)) dev++;
        const counts = Array.from({ length: rows }, () => new Array<number>(codes).fill(0));
        const report = new Array<number>(this.width);
        for (let c = 0; c < rows; c++) {
          const x = new Array<number>(this.attrs.length).fill(0);
          let rest = c;
          for (let i = t.cols.length - 1; i >= 0; i--) {
            x[t.cols[i]] = rest % inputs[i];
            rest = Math.floor(rest / inputs[i]);
          }
          for (let n = 0; n < Math.floor(samples / rows); n++)
            counts[c][this.randomize(x, rng, report, dev)[s.out[0]] - t.offset]++;
        }
        out.push({ step, table, counts });
      });
    });
    return out;
  }

  /** Privacy audit of keep and bloom steps, at the top level or in a select's branch (`step`
   * indexes the steps with every select followed by its branches' steps), run by `post`: a keep
   * step with at most 32 cells, `samples`/cells reports of every cell, its k x k counts; a bloom
   * step, `samples`/values reports of every value, the 1s of every (value, bit). */
  auditPosts(samples: number, rng: DrawSource
             ): ({ step: number; counts: number[][] }
                 | { step: number; draws: number[]; ones: number[][] })[] {
    const out: ({ step: number; counts: number[][] }
                | { step: number; draws: number[]; ones: number[][] })[] = [];
    const flat: Step[] = [];
    for (const s of this.steps) {
      flat.push(s);
      if (s.op === "select") for (const b of s.branches) flat.push(...b);
    }
    const report = new Array<number>(this.width).fill(0);
    flat.forEach((s, step) => {
      if (!isPost(s)) return;
      const x = new Array<number>(this.attrs.length).fill(0);
      if (s.op === "keep") {
        const k = s.rowLen;
        if (k > 32) return;
        const counts = Array.from({ length: k }, () => new Array<number>(k).fill(0));
        for (let c = 0; c < k; c++) {
          let rest = c;
          for (let i = s.cols.length - 1; i >= 0; i--) {
            x[s.cols[i]] = rest % s.sizes[i];
            rest = Math.floor(rest / s.sizes[i]);
          }
          for (let n = 0; n < Math.floor(samples / k); n++) {
            post(s, x, rng, report);
            counts[c][report[s.out]]++;
          }
        }
        out.push({ step, counts });
      } else if (s.op === "bloom") {
        const values = s.filters.length, per = Math.floor(samples / values);
        const ones = Array.from({ length: values }, () => new Array<number>(s.rowLen).fill(0));
        for (let v = 0; v < values; v++) {
          x[s.cols[0]] = v;
          for (let n = 0; n < per; n++) {
            post(s, x, rng, report);
            for (let b = 0; b < s.rowLen; b++) ones[v][b] += report[s.out + b];
          }
        }
        out.push({ step, draws: new Array<number>(values).fill(per), ones });
      }
    });
    return out;
  }

  /** The wave steps, at the top level or in a select's branch (`step` indexes the steps with
   * every select followed by its branches' steps, as auditPosts), with their grid points. */
  waveSteps(): { step: number; grid: number; cells: number; offset: number }[] {
    return this.flatSteps().flatMap((s, step) => s.op !== "wave" ? []
      : [{ step, grid: s.grid, cells: s.cells, offset: s.offset }]);
  }

  /** A wave step's cell (no offset) for grid index i (privacy audits). */
  waveCell(step: number, i: number, rng: DrawSource): number {
    return waveCell(this.flatSteps()[step] as Wave, i, rng);
  }

  private flat: Step[] | null = null;

  private flatSteps(): Step[] {
    if (this.flat === null) {
      this.flat = [];
      for (const s of this.steps) {
        this.flat.push(s);
        if (s.op === "select") for (const b of s.branches) this.flat.push(...b);
      }
    }
    return this.flat;
  }

  /** One top-level grr/matrix step on an input cell: the output cell. */
  stepApply(index: number, cell: number, rng: DrawSource): number {
    return apply(this.steps[index] as Leaf, cell, rng);
  }
}

