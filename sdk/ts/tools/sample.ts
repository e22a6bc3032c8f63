// Sampling tools over the cases of randomize.json, with the production generator
// (crypto.getRandomValues):
//   node dist/tools/sample.js audit randomize.json SAMPLES   k x k counts of every grr/matrix/
//       keep step with at most 32 cells, the 1s per (value, bit) of every bloom step, the first
//       slot of every small partition table, the G x cells counts of every wave on at most 65
//       grid points, one JSON line each (tests/test_sdk_audit.py)
//   node dist/tools/sample.js bench randomize.json SECONDS   reports randomized per second on
//       one core, one JSON line per case (ldpstream bench sdk)
//   node dist/tools/sample.js memo-audit memo.json SAMPLES   per memoized case and memo unit
//       (attribute, cluster, partition table of slot 0 with at most 36 cells and 400 codes): the
//       counts of (true cell, reported cell or code), every report in a new rotation period
//       (tests/test_sdk_memo_audit.py)
import { readFileSync } from "node:fs";

import { OsRandom, Program } from "../src/index.js";
import { memoAudit } from "./memo_audit.js";
import { argsOrUsage } from "./records.js";

const USAGE = `usage: node dist/tools/sample.js MODE CASES_JSON N

  audit randomize.json SAMPLES       counts of every small step, one JSON line each
  bench randomize.json SECONDS       reports randomized per second on one core, per case
  memo-audit memo.json SAMPLES       per memoized case and memo unit, counts of (true, reported)

CASES_JSON is a conformance file of sdk/conformance/. Run from sdk/ts after npm run build.`;
const [mode, file, arg] = argsOrUsage(USAGE, 3);
if (!["audit", "bench", "memo-audit"].includes(mode) || !(Number(arg) > 0)) {
  console.error(USAGE);
  process.exit(2);
}
const rng = new OsRandom();
const doc = JSON.parse(readFileSync(file, "utf8"));
if (mode === "memo-audit") {
  const cases: [string, unknown][] = [["memo", doc.device],
    ...Object.entries(doc).filter(([, v]) => (v as { device?: unknown })?.device)
      .map(([k, v]) => [k, (v as { device: unknown }).device] as [string, unknown])];
  for (const [name, device] of cases)
    for (const line of memoAudit(new Program(device), Number(arg), rng))
      console.log(JSON.stringify({ case: name, ...line }));
}
for (const c of mode === "memo-audit" ? [] : doc.cases) {
  const program = new Program(c.device);
  if (mode === "audit") {
    const samples = Number(arg);
    for (const line of program.auditPartition(samples, rng))
      console.log(JSON.stringify({ case: c.name, ...line }));
    for (const line of program.auditPosts(samples, rng))
      console.log(JSON.stringify({ case: c.name, ...line }));
    for (const { step, grid, cells } of program.waveSteps()) {  // G x cells of each small wave
      if (grid > 65 || cells > 1024) continue;
      const counts = Array.from({ length: grid }, () => new Array<number>(cells).fill(0));
      for (let i = 0; i < grid; i++)
        for (let t = 0; t < Math.floor(samples / grid); t++) counts[i][program.waveCell(step, i, rng)]++;
      console.log(JSON.stringify({ case: c.name, step, counts }));
    }
    for (const { index, cells } of program.leafSteps()) {
      if (cells > 32) continue;
      const counts = Array.from({ length: cells }, () => new Array<number>(cells).fill(0));
      for (let x = 0; x < cells; x++)
        for (let t = 0; t < Math.floor(samples / cells); t++)
          counts[x][program.stepApply(index, x, rng)]++;
      console.log(JSON.stringify({ case: c.name, step: index, counts }));
    }
  } else {
    const xs = c.records.slice(0, 64).map((r: Record<string, string>) => program.encode(r));
    const report = new Array<number>(program.width);
    let done = 0, sink = 0;
    const t0 = performance.now();
    let t = t0;
    do {
      for (let i = 0; i < 10000; i++) {
        program.randomize(xs[done % xs.length], rng, report);
        sink += report[0];
        done++;
      }
    } while ((t = performance.now()) - t0 < Number(arg) * 1000);
    console.log(JSON.stringify({ case: c.name, reports_per_s: Math.round(done / ((t - t0) / 1000)),
                                 sink: sink % 2 }));
  }
}
