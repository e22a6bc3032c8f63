// Counts of a memoized description's units (select: of the reports carrying that branch) over
// reports of device 1 that each start a new rotation period (a new memo; a numeric unit: grid
// index x column value): tools/sample.ts memo-audit,
// tests/test_sdk_memo_audit.py.
import { DrawSource, Program } from "../src/index.js";
import { memoDraw, memoKeys, memoRecord, memoRound } from "../src/memo.js";
import { ravel } from "../src/steps.js";

export function memoAudit(program: Program, samples: number, rng: DrawSource
                          ): { unit: number; counts: number[][] }[] {
  const memo = program.memo!;
  const part = memo.partition;
  // a partition table's rows: its attributes' cells as the device reads them (a rounded
  // attribute's grid indices, the table counting its points)
  const input = (cols: number[]) => cols.map((c) => program.shape[c]);
  const units = part ? part.tables.map((t) => ({
    cols: t.cols, sizes: input(t.cols), rows: input(t.cols).reduce((a, b) => a * b, 1),
    out: [] as number[], offset: t.offset, codes: t.g ? t.g ** (t.r + 1) : t.cells }))
    : memo.permanent.map((s) => ({ cols: s.cols, sizes: s.sizes, rows: s.cells, out: s.out,
                                   offset: 0, codes: s.op === "numeric" ? s.codes : s.cells }));
  const counts = units.map((u) => Array.from({ length: u.rows },
                                             () => new Array<number>(u.codes).fill(0)));
  const nRec = program.shape.reduce((a, b) => a * b, 1);
  let period = 0;
  for (let r = 0; r < nRec; r++) {
    const x = new Array<number>(program.shape.length);
    let rest = r;
    for (let j = x.length - 1; j >= 0; j--) {
      x[j] = rest % program.shape[j];
      rest = Math.floor(rest / program.shape[j]);
    }
    for (let n = 0; n < Math.floor(samples / nRec); n++) {
      const keys = memoKeys(memo, memoRound(memo, x, 1n), 1n, period++);
      const rec = memoRecord(memo, keys, keys.map(([u, c]) => memoDraw(memo, u, c, rng)),
                             program.width, rng);
      const report = part || !program.hasSteps ? rec : program.randomize(rec, rng);
      units.forEach((u, i) => {
        if (u.rows > 36 || u.codes > 400) return;
        if (memo.select && report[memo.select.out] !== i) return;   // another branch's report
        const cell = ravel(x, u.cols, u.sizes);
        if (part) {
          const code = report[part.out[0]] - u.offset;
          if (code >= 0 && code < u.codes) counts[i][cell][code]++;
        } else if (memo.permanent[i]?.op === "numeric") {   // the column's value
          counts[i][cell][report[u.cols[0]]]++;
        } else {
          counts[i][cell][ravel(report, u.out, u.sizes)]++;
        }
      });
    }
  }
  return units.flatMap((u, i) => (u.rows > 36 || u.codes > 400 ? []
    : [{ unit: i, counts: counts[i] }]));
}
