// SVG charts drawn from plain numbers: bars (one attribute), heatmaps (two), small multiples
// (three or more), and time series with bands, marks and a threshold.

const NS = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, children = []) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v != null) node.setAttribute(k, String(v));
  for (const c of [].concat(children)) {
    if (c == null) continue;
    node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return node;
}

export const fmt = (v, digits = 4) => (v == null || Number.isNaN(v) ? "–" : Number(v).toFixed(digits));
const title = (text) => svg("title", {}, [text]);
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });

function root(width, height, label) {
  return svg("svg", { viewBox: `0 0 ${width} ${height}`, width, role: "img",
    "aria-label": label, preserveAspectRatio: "xMinYMin meet", class: "chart" }, [title(label)]);
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

const span = (iv) => (iv ? `, 95 % interval ${fmt(iv[0])} to ${fmt(iv[1])}` : "");

/** Horizontal bars with whiskers over each cell's 95 % interval (``intervals[i] = [lo, hi]``,
 * or null when the estimate states none). */
export function bars(labels, values, intervals, label) {
  const rowH = 26, left = Math.min(220, 16 + 7.5 * Math.max(...labels.map((l) => l.length))),
    width = 1000, right = 90, top = 8;
  const height = top + rowH * labels.length + 28;
  const ivs = labels.map((_, i) => (intervals ? intervals[i] : null));
  const lo = Math.min(0, ...values.map((v, i) => (ivs[i] ? Math.min(v, ivs[i][0]) : v)));
  const hi = niceMax(Math.max(...values.map((v, i) => (ivs[i] ? Math.max(v, ivs[i][1]) : v)), 1e-9));
  const x = (v) => left + ((v - lo) / (hi - lo)) * (width - left - right);
  const g = root(width, height, label);
  for (let t = 0; t <= 4; t++) {
    const v = lo + ((hi - lo) * t) / 4;
    g.append(svg("line", { x1: x(v), x2: x(v), y1: top, y2: height - 22, class: "grid" }),
      svg("text", { x: x(v), y: height - 6, class: "tick", "text-anchor": "middle" }, [fmt(v, 2)]));
  }
  labels.forEach((lab, i) => {
    const y = top + i * rowH, v = values[i], iv = ivs[i];
    const cell = svg("g", { class: "bar", "data-cell": lab, "data-value": v,
      "data-low": iv ? iv[0] : null, "data-high": iv ? iv[1] : null });
    cell.append(title(`${lab}: ${fmt(v)}${span(iv)}`),
      svg("text", { x: left - 8, y: y + rowH / 2 + 4, "text-anchor": "end", class: "label" }, [lab]),
      svg("rect", { x: Math.min(x(0), x(v)), y: y + 4, width: Math.abs(x(v) - x(0)),
        height: rowH - 8, rx: 3, class: v < 0 ? "neg" : "pos" }));
    if (iv) {
      const a = x(iv[0]), b = x(iv[1]), cy = y + rowH / 2;
      cell.append(svg("path", { d: `M${a},${cy - 5}v10M${a},${cy}H${b}M${b},${cy - 5}v10`,
        class: "whisker" }));
    }
    cell.append(svg("text", { x: width - right + 8, y: y + rowH / 2 + 4, class: "value" }, [fmt(v)]));
    g.append(cell);
  });
  return g;
}

/** A heatmap of a 2-D table (rows × columns) with the value in every cell and, when the estimate
 * states them (``intervals[i][j] = [lo, hi]``), the cell's 95 % interval under it. */
export function heatmap(rowLabels, colLabels, matrix, intervals, label, vmax) {
  const twoLines = intervals != null && colLabels.length <= 6;  // room for the interval
  const cw = Math.max(twoLines ? 84 : 64, Math.min(150, 760 / colLabels.length));
  const ch = twoLines ? 44 : 30;
  const left = Math.min(200, 14 + 7.2 * Math.max(...rowLabels.map((l) => l.length)));
  const top = 30, width = left + cw * colLabels.length + 8, height = top + ch * rowLabels.length + 6;
  const max = vmax || Math.max(1e-9, ...matrix.flat());
  const g = root(width, height, label);
  const fit = Math.max(4, Math.floor((cw - 6) / 7));  // characters of a column label that fit
  colLabels.forEach((c, j) => g.append(svg("text", { x: left + cw * j + cw / 2, y: top - 10,
    "text-anchor": "middle", class: "label" }, [c.length > fit ? c.slice(0, fit - 1) + "…" : c, title(c)])));
  rowLabels.forEach((r, i) => {
    g.append(svg("text", { x: left - 8, y: top + ch * i + ch / 2 + 4, "text-anchor": "end",
      class: "label" }, [r]));
    colLabels.forEach((c, j) => {
      const v = matrix[i][j], share = Math.max(0, Math.min(1, v / max));
      const iv = intervals ? intervals[i][j] : null;
      const cell = svg("g", { class: "hcell", "data-cell": `${r}|${c}`, "data-value": v,
        "data-low": iv ? iv[0] : null, "data-high": iv ? iv[1] : null });
      const cx = left + cw * j + cw / 2, cy = top + ch * i + ch / 2, light = share > 0.55;
      cell.append(title(`${r}, ${c}: ${fmt(v)}${span(iv)}`),
        svg("rect", { x: left + cw * j + 1, y: top + ch * i + 1, width: cw - 2, height: ch - 2,
          rx: 3, fill: `hsl(217 80% ${96 - 58 * share}%)`, class: v < 0 ? "negcell" : null }),
        svg("text", { x: cx, y: cy + (twoLines ? -1 : 4), "text-anchor": "middle",
          class: light ? "value light" : "value" }, [fmt(v, 3)]));
      if (twoLines && iv) {
        cell.append(svg("text", { x: cx, y: cy + 13, "text-anchor": "middle",
          class: light ? "band-text light" : "band-text" }, [`${fmt(iv[0], 3)}–${fmt(iv[1], 3)}`]));
      }
      g.append(cell);
    });
  });
  return g;
}

/** Time series: lines with bands, optional threshold line, version marks, failures, alarms.
 * ``unit``: the values are shares, so the axis (and every band) is clamped to [0, 1]. */
export function timeSeries({ series, threshold, versions = [], failures = [], alarms = [], label,
  yLabel, unit = false }) {
  const width = 1000, height = 260, left = 56, right = 170, top = 12, bottom = 30;
  const ts = series.flatMap((s) => s.points.map((p) => p.t)).concat(
    threshold ? threshold.map((p) => p.t) : [], failures.map((f) => f.t));
  const g = root(width, height, label);
  if (!ts.length) return g;
  let t0 = Math.min(...ts), t1 = Math.max(...ts);
  if (t1 - t0 < 2) { t0 -= 1; t1 += 1; }
  const ys = series.flatMap((s) => s.points.flatMap((p) => [p.lo ?? p.v, p.hi ?? p.v]))
    .concat(threshold ? threshold.map((p) => p.v) : []).filter((v) => Number.isFinite(v));
  const y0 = unit ? 0 : Math.min(0, ...ys), y1 = unit ? Math.min(1, niceMax(Math.max(1e-9, ...ys)))
    : niceMax(Math.max(1e-9, ...ys));
  const clampY = (v) => Math.max(y0, Math.min(y1, v));
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - right);
  const y = (v) => top + (1 - (clampY(v) - y0) / (y1 - y0)) * (height - top - bottom);
  for (let k = 0; k <= 4; k++) {
    const v = y0 + ((y1 - y0) * k) / 4;
    g.append(svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, [fmt(v, 2)]));
  }
  let shown = null;  // a label only where the clock reads differently from the one before
  for (let k = 0; k <= 3; k++) {
    const t = t0 + ((t1 - t0) * k) / 3, text = clock(t);
    if (text === shown) continue;
    shown = text;
    g.append(svg("text", { x: x(t), y: height - 8, "text-anchor": "middle", class: "tick xtick" },
      [text]));
  }
  if (yLabel) {
    g.append(svg("text", { x: 12, y: (top + height - bottom) / 2, class: "tick", "text-anchor": "middle",
      transform: `rotate(-90 12 ${(top + height - bottom) / 2})` }, [yLabel]));
  }
  const path = (pts, f) => pts.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(f(p)).toFixed(1)}`).join("");
  for (const v of versions) {
    g.append(svg("line", { x1: x(v.t), x2: x(v.t), y1: top, y2: height - bottom, class: "version" },
      [title(v.text)]), svg("text", { x: x(v.t) + 3, y: top + 10, class: "tick version-text" }, [v.short]));
  }
  if (threshold && threshold.length) {
    // held from the first point to the right edge, so even one point draws a line
    const last = threshold[threshold.length - 1];
    const d = `M${left},${y(threshold[0].v).toFixed(1)}` + threshold.map((p) =>
      `H${x(p.t).toFixed(1)}V${y(p.v).toFixed(1)}`).join("") + `H${width - right}`;
    g.append(svg("path", { d, class: "threshold", "data-threshold": last.v }, [title(`threshold ${fmt(last.v, 2)}`)]),
      svg("text", { x: width - right + 6, y: y(last.v) - 4, class: "tick threshold-text" }, ["threshold"]));
  }
  const legends = [];
  series.forEach((s, i) => {
    const pts = s.points.filter((p) => Number.isFinite(p.v));
    if (!pts.length) return;
    const banded = pts.filter((p) => Number.isFinite(p.lo));
    if (banded.length > 1) {
      const d = path(banded, (p) => p.hi) + banded.slice().reverse()
        .map((p) => `L${x(p.t).toFixed(1)},${y(p.lo).toFixed(1)}`).join("") + "Z";
      g.append(svg("path", { d, class: `band c${i % 6}` }));
    }
    g.append(svg("path", { d: path(pts, (p) => p.v), class: `line c${i % 6}` }, [title(s.name)]));
    if (pts.length === 1) g.append(svg("circle", { cx: x(pts[0].t), cy: y(pts[0].v), r: 3, class: `dot c${i % 6}` }));
    legends.push({ i, y: y(pts[pts.length - 1].v) + 4, name: s.name });
  });
  // the labels at the right edge, in the order of their lines, at least one line of text apart
  legends.sort((a, b) => a.y - b.y);
  legends.forEach((l, k) => { if (k) l.y = Math.max(l.y, legends[k - 1].y + 13); });
  const overflow = legends.length ? legends[legends.length - 1].y - (height - bottom) : 0;
  for (const l of legends) {
    g.append(svg("text", { x: width - right + 6, y: l.y - Math.max(0, overflow), class: `legend c${l.i % 6}` },
      [l.name.length > 24 ? l.name.slice(0, 23) + "…" : l.name, title(l.name)]));
  }
  for (const a of alarms) {
    g.append(svg("circle", { cx: x(a.t), cy: y(a.v), r: 5, class: "alarm", "data-alarm": a.t },
      [title(`alarm at ${clock(a.t)}: ${fmt(a.v, 2)}`)]));
  }
  for (const f of failures) {
    const cx = x(f.t), cy = height - bottom - 8;
    g.append(svg("path", { d: `M${cx - 5},${cy - 5}l10,10m0,-10l-10,10`, class: "failure",
      "data-failure": f.t }, [title(`refresh failed at ${clock(f.t)}: ${f.text}`)]));
  }
  return g;
}

/** Digits that show a value of a numeric attribute to about 1/10,000 of its range. */
export const unitDigits = (lo, hi) => Math.max(0, Math.min(6, 4 - Math.ceil(Math.log10(Math.max(1e-12, hi - lo)))));

function unitAxis(g, x, lo, hi, y0, y1, digits) {
  for (let t = 0; t <= 4; t++) {
    const v = lo + ((hi - lo) * t) / 4;
    g.append(svg("line", { x1: x(v), x2: x(v), y1: y0, y2: y1, class: "grid" }),
      svg("text", { x: x(v), y: y1 + 16, class: "tick", "text-anchor": "middle" }, [fmt(v, Math.min(digits, 2))]));
  }
}

/** Rows of a value with its 95 % interval on the attribute's own axis [lo, hi] (a mean, a
 * quantile, one per category): ``rows[i] = {label, v, low, high}`` (low/high may be null). */
export function intervals(rows, lo, hi, label) {
  const rowH = 28, width = 1000, right = 120, top = 8;
  const left = Math.min(240, 16 + 7.5 * Math.max(...rows.map((r) => r.label.length)));
  const height = top + rowH * rows.length + 28, digits = unitDigits(lo, hi);
  const x = (v) => left + ((Math.max(lo, Math.min(hi, v)) - lo) / (hi - lo)) * (width - left - right);
  const g = root(width, height, label);
  unitAxis(g, x, lo, hi, top, height - 22, digits);
  rows.forEach((r, i) => {
    const y = top + i * rowH, cy = y + rowH / 2, has = r.low != null && r.high != null;
    const row = svg("g", { class: "interval", "data-cell": r.label, "data-value": r.v,
      "data-low": has ? r.low : null, "data-high": has ? r.high : null });
    row.append(title(`${r.label}: ${fmt(r.v, digits)}${has ? `, 95 % interval ${fmt(r.low, digits)} to ${fmt(r.high, digits)}` : ""}`),
      svg("text", { x: left - 8, y: cy + 4, "text-anchor": "end", class: "label" }, [r.label]));
    if (has) {
      const a = x(r.low), b = x(r.high);
      row.append(svg("rect", { x: a, y: cy - 6, width: Math.max(1, b - a), height: 12, rx: 3, class: "band c0" }),
        svg("path", { d: `M${a},${cy - 7}v14M${b},${cy - 7}v14`, class: "whisker" }));
    }
    row.append(svg("circle", { cx: x(r.v), cy, r: 5, class: "dot c0" }),
      svg("text", { x: width - right + 8, y: cy + 4, class: "value" }, [fmt(r.v, digits)]));
    g.append(row);
  });
  return g;
}

/** The distribution of a numeric attribute: its CDF with the 95 % pointwise band, the EMS
 * histogram behind it (bars, scaled to the tallest) and the quantiles marked with their
 * intervals. ``cdf = {at, value, low, high}``, ``hist = {bins, mass}``, ``quantiles[p] =
 * {value, low, high}``. */
export function cdfChart({ cdf, hist, quantiles, lo, hi, label }) {
  const width = 1000, height = 300, left = 56, right = 120, top = 14, bottom = 34;
  const digits = unitDigits(lo, hi);
  const x = (v) => left + ((Math.max(lo, Math.min(hi, v)) - lo) / (hi - lo)) * (width - left - right);
  const y = (p) => top + (1 - Math.max(0, Math.min(1, p))) * (height - top - bottom);
  const g = root(width, height, label);
  unitAxis(g, x, lo, hi, top, height - bottom, digits);
  for (const p of [0, 0.5, 1]) {
    g.append(svg("text", { x: left - 6, y: y(p) + 4, "text-anchor": "end", class: "tick" }, [fmt(p, 1)]));
  }
  if (hist && hist.mass && hist.mass.length) {
    const top_ = Math.max(1e-12, ...hist.mass), w = (hi - lo) / hist.mass.length;
    const bars = svg("g", { class: "histogram", "data-bins": hist.mass.length });
    hist.mass.forEach((m, i) => {
      const a = x(lo + i * w), b = x(lo + (i + 1) * w), hgt = (m / top_) * 0.6 * (height - top - bottom);
      bars.append(svg("rect", { x: a, y: height - bottom - hgt, width: Math.max(0.5, b - a), height: hgt, class: "hist" }));
    });
    g.append(bars);
  }
  const pts = cdf.at.map((a, i) => [x(a), cdf.value[i], cdf.low[i], cdf.high[i]]);
  const band = pts.map(([px, , , h], i) => `${i ? "L" : "M"}${px.toFixed(1)},${y(h).toFixed(1)}`).join("")
    + pts.slice().reverse().map(([px, , l]) => `L${px.toFixed(1)},${y(l).toFixed(1)}`).join("") + "Z";
  g.append(svg("path", { d: band, class: "band c0", "data-band": "cdf" }, [title("95 % pointwise band of the CDF")]),
    svg("path", { d: pts.map(([px, v], i) => `${i ? "L" : "M"}${px.toFixed(1)},${y(v).toFixed(1)}`).join(""),
      class: "line c0", "data-line": "cdf" }, [title("CDF")]));
  Object.entries(quantiles || {}).forEach(([p, q], k) => {
    const name = p === "0.5" ? "median" : `p${Math.round(100 * Number(p))}`;
    const qx = x(q.value), py = y(Number(p));
    const mark = svg("g", { class: "quantile", "data-quantile": p, "data-value": q.value,
      "data-low": q.low, "data-high": q.high });
    mark.append(title(`${name}: ${fmt(q.value, digits)}, 95 % interval ${fmt(q.low, digits)} to ${fmt(q.high, digits)}`),
      svg("path", { d: `M${x(q.low)},${py}H${x(q.high)}M${x(q.low)},${py - 5}v10M${x(q.high)},${py - 5}v10`, class: "whisker" }),
      svg("line", { x1: qx, x2: qx, y1: py, y2: height - bottom, class: "qline" }),
      svg("circle", { cx: qx, cy: py, r: 4, class: "dot c1" }),
      svg("text", { x: width - right + 8, y: top + 14 + 14 * k, class: "legend c1" }, [`${name} ${fmt(q.value, digits)}`]));
    g.append(mark);
  });
  return g;
}
