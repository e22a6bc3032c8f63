// The live page: collections, one estimate with its band, its history, drift. Polls the API.
import { api } from "./api.js";
import { bars, cdfChart, fmt, heatmap, intervals, timeSeries, unitDigits } from "./charts.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const POLL_MS = Math.max(250, Number(params.get("poll")) || 2000);
const HEALTH_EVERY = 5;          // polls between two /healthz and /estimates index reads
const DEFAULT_CELLS = 3;         // cells followed over time until the reader picks others

const state = { collections: [], health: null, sel: {}, cells: new Set(), cellsFor: null,
  cellsPicked: false, paused: false, polls: 0, timer: null, estimate: null, indexes: null,
  history: null };

function h(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "text") node.textContent = v; else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of [].concat(children)) if (c != null) node.append(c);
  return node;
}
const ago = (t) => {
  if (t == null) return "–";
  const s = Math.max(0, Date.now() / 1000 - t);
  return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
};
const eps = (v) => (v == null ? "–" : Number(v).toPrecision(3));

// --- selection (kept in the URL hash, so a view can be linked) ----------------------------------
function readHash() {
  const q = new URLSearchParams(location.hash.slice(1));
  return { collection: q.get("c"), marginal: q.get("m"), method: q.get("e"), window: q.get("w") };
}
function writeHash() {
  const s = state.sel, q = new URLSearchParams();
  if (s.collection) q.set("c", s.collection);
  if (s.marginal) q.set("m", s.marginal);
  if (s.method) q.set("e", s.method);
  if (s.window) q.set("w", s.window);
  history.replaceState(null, "", `#${q}`);
}
const current = () => state.collections.find((c) => c.id === state.sel.collection);

function marginalChoices(c) {
  const out = c.marginals.map((m) => ({ value: m.join(","), text: m.join(" × ") }));
  const singles = [...new Set(c.marginals.flat())].filter((a) => !out.some((o) => o.value === a));
  for (const a of singles) out.push({ value: a, text: `${a} (summed from a configured marginal)` });
  return out;
}

function fillSelect(select, choices, value) {
  const values = choices.map((ch) => ch.value);
  const chosen = values.includes(value) ? value : values[0];
  // rebuilt only when the choices change: a reader moving through the options keeps its place
  const have = [...select.options].map((o) => `${o.value}\t${o.text}`).join("\n");
  if (have !== choices.map((ch) => `${ch.value}\t${ch.text}`).join("\n")) {
    select.replaceChildren(...choices.map((ch) => h("option", { value: ch.value, text: ch.text })));
  }
  if (select.value !== chosen) select.value = chosen;
  return chosen;
}

function syncControls() {
  const cols = state.collections;
  const s = state.sel;
  s.collection = fillSelect($("collection"), cols.map((c) => ({ value: c.id, text: c.id })), s.collection);
  const c = current();
  if (!c) return;
  s.marginal = fillSelect($("marginal"), marginalChoices(c), s.marginal);
  s.method = fillSelect($("method"), c.estimators.map((e) => ({ value: e, text: e })), s.method);
  s.window = fillSelect($("window"), c.windows.map((w) => ({ value: w, text: w === "all" ? allLabel(c) : `last ${w}` })), s.window);
  writeHash();
}

function allLabel(c) {
  // a collection counted per device holds, in "all", the devices active within its retention
  const ot = c.over_time;
  if (!ot || ot.counted_by !== "device" || !ot.device_retention_s) return "all time";
  return `devices active in the last ${+(ot.device_retention_s / 86400).toFixed(2)} d`;
}

// --- collections table ---------------------------------------------------------------------------
function perDay(c) {
  // at the declared reporting rate when the collection states one (docs/privacy-over-time.md)
  const ot = c.over_time;
  if (ot && ot.epsilon_per_device_day != null) {
    return h("span", { title: `at ${ot.reports_per_day} reports per device per day`, text: eps(ot.epsilon_per_device_day) });
  }
  if (c.epsilon_per_day != null) return eps(c.epsilon_per_day);
  const lon = c.longitudinal;
  if (lon && lon.memoized === false) return h("span", { title: lon.note, text: "no cap: each report adds ε" });
  return "–";
}

function renderCollections(indexes) {
  const body = $("collections").tBodies[0];
  if (!state.collections.length) {
    body.replaceChildren(h("tr", {}, h("td", { colspan: 8, text: "No collections are configured on this worker." })));
    return;
  }
  const refresh = (state.health && state.health.checks && state.health.checks.refresh) || {};
  // the rows are redrawn every poll: the keyboard focus stays on the same collection's button
  const focused = document.activeElement && document.activeElement.closest("tr[data-collection]");
  const keep = focused && body.contains(focused) ? focused.dataset.collection : null;
  body.replaceChildren(...state.collections.map((c) => {
    const idx = indexes[c.id];
    const newest = idx ? Math.max(0, ...idx.estimates.map((e) => e.updated_at || 0)) : 0;
    const failing = idx ? idx.estimates.filter((e) => e.error != null).length : 0;
    const r = refresh[c.id] || {};
    let st = "ok", cls = "ok";
    if (!newest) { st = "no estimate yet"; cls = "idle"; }
    if (failing || r.failing_estimates) { st = `${failing || r.failing_estimates} estimate(s) failing`; cls = "bad"; }
    if (r.failed_at && (!r.last_ok || r.failed_at > r.last_ok)) { st = `refresh failing: ${r.last_error}`; cls = "bad"; }
    const selected = c.id === state.sel.collection;
    const pick = h("button", { type: "button", class: "link", "aria-pressed": String(selected),
      text: c.id });
    pick.addEventListener("click", () => { state.sel.collection = c.id; state.sel.marginal = null; syncControls(); poll(); });
    return h("tr", { class: selected ? "selected" : null, "data-collection": c.id }, [
      h("th", { scope: "row" }, pick),
      h("td", { text: c.mechanism }),
      h("td", { "data-field": "version", text: String(c.version) }),
      h("td", { "data-field": "epsilon_per_record", title: String(c.epsilon_per_record) }, eps(c.epsilon_per_record)),
      h("td", { "data-field": "epsilon_per_day" }, perDay(c)),
      h("td", { "data-field": "n", text: c.n == null ? "Redis unavailable" : c.n.toLocaleString("en") }),
      h("td", { "data-field": "freshness", text: newest ? ago(newest) : "–" }),
      h("td", { "data-field": "state" }, h("span", { class: `pill ${cls}`, title: st,
        text: st.length > 48 ? `${st.slice(0, 47)}…` : st })),
    ]);
  }));
  if (keep) {
    const again = body.querySelector(`tr[data-collection="${CSS.escape(keep)}"] button`);
    if (again) again.focus();
  }
  const c = current(), note = $("privacy-note");
  note.hidden = !(c && c.privacy_note);
  if (c && c.privacy_note) note.textContent = `${c.id}: ${c.privacy_note}`;
}

// --- the estimate ----------------------------------------------------------------------------------
function flatten(cells, labels) {
  const out = [];
  const walk = (node, depth, key) => {
    if (depth === labels.length) { out.push({ key, parts: key.split("|"), v: node }); return; }
    node.forEach((child, i) => walk(child, depth + 1, depth ? `${key}|${labels[depth][i]}` : labels[depth][i]));
  };
  walk(cells, 0, "");
  return out;
}

// [lo, hi] per cell from the API's per-cell 95 % intervals (cells_low, cells_high), nested like cells
const zipCells = (lo, hi) => (Array.isArray(lo) ? lo.map((x, i) => zipCells(x, hi[i])) : [lo, hi]);

// what error_bound is, in the API's words (docs/api.md "Estimates")
function boundMeaning(est) {
  const q = est.error_bound_quantile ? `${Math.round(100 * est.error_bound_quantile)} %` : "95 %";
  const how = est.error_bound_coverage === "calibrated" ? "calibrated"
    : est.error_bound_coverage === "noise only" ? "calibrated for the noise, not the model's bias"
    : "covering at least that";
  const from = est.error_bound_method ? `; ${est.error_bound_method}` : "";
  return `the ${q} upper quantile of the total-variation error of the whole estimate (${how}${from})`;
}

// --- numeric attributes (docs/numeric.md "Live"): summaries, not the input grid's cells -------------
const qName = (p) => (p === "0.5" ? "median" : `p${Math.round(100 * Number(p))}`);

/** The rows a numeric estimate shows (table, chart): per category when it has them. */
function numericRows(num) {
  const rows = [];
  const add = (prefix, r) => {
    if (r.mean && r.mean.value != null) rows.push({ key: `${prefix}mean`, label: `${prefix}mean`, v: r.mean.value, low: r.mean.low ?? null, high: r.mean.high ?? null });
    for (const [p, q] of Object.entries(r.quantiles || {})) {
      rows.push({ key: `${prefix}${p}`, label: `${prefix}${qName(p)}`, v: q.value, low: q.low ?? null, high: q.high ?? null });
    }
    if (r.w1_bound != null) rows.push({ key: `${prefix}w1_bound`, label: `${prefix}W1 error bound`, v: r.w1_bound, low: null, high: null });
  };
  if (num.categories) for (const c of num.categories) add(`${c.category}|`, c); else add("", num);
  return rows;
}

function drawNumeric(est) {
  const num = est.numeric, lo = num.min, hi = num.max, digits = unitDigits(lo, hi);
  const name = `${num.attribute}${num.by ? ` by ${num.by}` : ""} (${est.method}, window ${est.window})`;
  const rows = numericRows(num);
  let chart, caption;
  if (num.cdf) {
    chart = cdfChart({ cdf: num.cdf, hist: num.histogram, quantiles: num.quantiles, lo, hi,
      label: `Estimated distribution of ${name}` });
    caption = `${name}: the CDF with its 95 % pointwise band (shaded), the estimated histogram `
      + `(${num.histogram.bins} bins, grey) and the median, p90 and p99 with their 95 % intervals. `
      + `W1 error bound ${fmt(num.w1_bound, digits)} (${num.w1_bound_coverage}): the Wasserstein-1 `
      + `distance to the true distribution, in ${num.attribute}'s units.`;
  } else {
    chart = intervals(rows.filter((r) => !r.key.endsWith("w1_bound")), lo, hi,
      `Estimated ${est.method === "mean" ? "mean" : "quantiles"} of ${name}`);
    caption = `${name} on its range ${fmt(lo, digits)} to ${fmt(hi, digits)}: each value with its 95 % interval`
      + (num.mean && num.mean.mechanism ? ` (mean mechanism: ${num.mean.mechanism})` : "")
      + (num.categories ? `; per category of ${num.by}.` : ".");
  }
  $("estimate-chart").replaceChildren(chart);
  $("estimate-caption").textContent = caption;
  $("estimate-table").replaceChildren(
    h("thead", {}, h("tr", {}, [h("th", { scope: "col", text: "quantity" }),
      h("th", { scope: "col", text: "estimate" }), h("th", { scope: "col", text: "95 % interval" })])),
    h("tbody", {}, rows.map((r) => h("tr", { "data-cell": r.key, "data-value": String(r.v) },
      [h("td", { text: r.label }), h("td", { class: "num", text: fmt(r.v, digits) }),
        h("td", { class: "num", text: r.low != null ? `${fmt(r.low, digits)} to ${fmt(r.high, digits)}` : "–" })]))));
}

function drawEstimate(est) {
  if (est.numeric) { drawNumeric(est); return; }
  const box = $("estimate-chart"), band = est.error_bound;
  const iv = est.cells_low && est.cells_high ? zipCells(est.cells_low, est.cells_high) : null;
  const name = `${est.attrs.join(" × ")} (${est.method}, window ${est.window})`;
  let chart;
  if (est.attrs.length === 1) {
    chart = bars(est.labels[0], est.cells, iv, `Estimated distribution of ${name}`);
  } else if (est.attrs.length === 2) {
    chart = heatmap(est.labels[0], est.labels[1], est.cells, iv, `Estimated joint distribution of ${name}`);
  } else {
    const rest = est.attrs.slice(2), vmax = Math.max(1e-9, ...flatten(est.cells, est.labels).map((c) => c.v));
    const table = (cells, i) => {
      const sub = flatten(cells[i], est.labels.slice(1)), cols = sub.length / est.labels[1].length;
      return est.labels[1].map((_, r) => sub.slice(r * cols, (r + 1) * cols).map((c) => c.v));
    };
    chart = h("div", { class: "multiples" }, est.labels[0].map((lab, i) => {
      const cols = flatten(est.cells[i][0], est.labels.slice(2)).map((c) => c.key);
      return h("div", { class: "panel" }, [h("h3", { text: `${est.attrs[0]} = ${lab}` }),
        heatmap(est.labels[1], cols, table(est.cells, i), iv ? table(iv, i) : null,
          `${est.attrs[1]} × ${rest.join(" × ")} where ${est.attrs[0]} = ${lab}`, vmax)]);
    }));
  }
  box.replaceChildren(chart);
  const how = est.attrs.length === 1 ? "The whiskers span" : "Each cell shows under its value";
  $("estimate-caption").textContent = (iv
    ? `${name}. ${how} the cell's 95 % interval (cells_low to cells_high). `
    : `${name}: this estimate states no per-cell intervals. `) + (band == null
    ? "This estimator states no error bound."
    : `Error bound ${fmt(band)}: ${boundMeaning(est)}.`);
  const rows = flatten(est.cells, est.labels), ivs = iv ? flatten(iv, est.labels) : null;
  $("estimate-table").replaceChildren(
    h("thead", {}, h("tr", {}, [...est.attrs.map((a) => h("th", { scope: "col", text: a })),
      h("th", { scope: "col", text: "estimate" }), h("th", { scope: "col", text: "95 % interval" })])),
    h("tbody", {}, rows.map((r, k) => h("tr", { "data-cell": r.key, "data-value": String(r.v) },
      [...r.parts.map((p) => h("td", { text: p })), h("td", { class: "num", text: fmt(r.v) }),
        h("td", { class: "num", text: ivs ? `${fmt(ivs[k].v[0])} to ${fmt(ivs[k].v[1])}` : "–" })]))));
}

// ε one device spends in the estimate's window at the declared rate (docs/privacy-over-time.md)
function perWindow(ot, window) {
  const v = ot && ot.epsilon_per_window ? ot.epsilon_per_window[window] : null;
  if (v != null) return eps(v);
  return ot && ot.counted_by === "device" ? "ε per rotation period × periods" : "unbounded (no declared rate)";
}

// a numeric estimate's error: the mean's interval, or the W1 bound of the distribution
function numericBound(num) {
  const d = unitDigits(num.min, num.max);
  if (num.w1_bound != null) return [`W1 error bound (${num.w1_bound_coverage} 95 %)`, fmt(num.w1_bound, d), "w1_bound"];
  if (num.mean && num.mean.low != null) return ["Mean (95 % interval)", `${fmt(num.mean.value, d)} (${fmt(num.mean.low, d)} to ${fmt(num.mean.high, d)})`, "mean"];
  return ["Per category", `${num.categories.length} categories of ${num.by}`, "by"];
}

function summary(est) {
  const ot = (current() || {}).over_time;
  const byDevice = ot && ot.counted_by === "device";
  const items = [[byDevice ? "Devices in window" : "Reports in window", est.n.toLocaleString("en"), "n"],
    ["Updated", `${new Date(est.updated_at * 1000).toLocaleTimeString([], { hour12: false })} (${ago(est.updated_at)})`, "updated_at"],
    est.numeric ? numericBound(est.numeric)
      : [est.error_bound_quantile ? `Error bound (TVD q${100 * est.error_bound_quantile}, ${est.error_bound_coverage})`
        : "Error bound (TVD q95)", fmt(est.error_bound), "error_bound"],
    ["ε per report", eps(est.epsilon_per_record), "epsilon_per_record"],
    ["ε per device per day", est.epsilon_per_day == null ? "no cap" : eps(est.epsilon_per_day), "epsilon_per_day"],
    ["ε per device in this window", perWindow(ot, est.window), "epsilon_per_window"],
    ["Mechanism versions", (est.versions || [est.version]).join(", "), "versions"]];
  if (est.chosen) items.push(["Estimator chosen", est.chosen, "chosen"]);
  if (est.numeric && est.numeric.mean && est.numeric.mean.mechanism) items.push(["Mean mechanism", est.numeric.mean.mechanism, "mean_mechanism"]);
  if (est.marginalized_from) items.push(["Summed from", est.marginalized_from.join(" × "), "marginalized_from"]);
  $("summary").replaceChildren(...items.map(([k, v, f]) => h("div", {}, [h("dt", { text: k }), h("dd", { "data-field": f, text: v })])));
}

function showMessage(text, kind) {
  const m = $("estimate-message");
  m.hidden = !text;
  m.className = `message ${kind || ""}`;
  m.textContent = text || "";
}

async function loadEstimate(c) {
  const s = state.sel, q = { attrs: s.marginal, method: s.method, window: s.window };
  try {
    const est = await api.estimate(c.id, q);
    state.estimate = est;
    showMessage(null);
    $("estimate-figure").hidden = false;
    $("estimate-table-box").hidden = false;
    drawEstimate(est);
    summary(est);
  } catch (exc) {
    state.estimate = null;
    $("estimate-table-box").hidden = true;
    $("estimate-chart").replaceChildren();
    $("estimate-table").replaceChildren();
    $("summary").replaceChildren();
    $("estimate-caption").textContent = "";
    const kind = exc.status === 404 ? "empty" : "failure";
    const lead = exc.status === 404 ? "No estimate to show yet: " : exc.status === 500 ? "The last refresh of this estimate failed: " : "";
    showMessage(lead + exc.message + (exc.body.failed_at ? ` (at ${new Date(exc.body.failed_at * 1000).toLocaleTimeString([], { hour12: false })})` : ""), kind);
  }
}

// --- over time: cells and drift --------------------------------------------------------------------
function cellChoices(keys) {
  const id = `${state.sel.collection}/${state.sel.marginal}`;
  if (state.cellsFor !== id || (!state.cells.size && !state.cellsPicked)) {
    state.cellsFor = id;
    state.cellsPicked = false;
    const top = state.estimate ? flatten(state.estimate.cells, state.estimate.labels).sort((a, b) => b.v - a.v) : [];
    state.cells = new Set((top.length ? top.map((c) => c.key) : keys).slice(0, DEFAULT_CELLS));
  }
  const box = $("cell-choices");
  const inputs = [...box.querySelectorAll("input")];
  if (inputs.map((i) => i.value).join("\n") === keys.join("\n")) {
    for (const i of inputs) i.checked = state.cells.has(i.value);
    return;
  }
  box.replaceChildren(...keys.map((k) => {
    const input = h("input", { type: "checkbox", value: k, checked: state.cells.has(k) });
    input.addEventListener("change", () => {
      state.cellsPicked = true;
      if (input.checked) state.cells.add(k); else state.cells.delete(k);
      poll();
    });
    return h("label", { class: "check" }, [input, ` ${k}`]);
  }));
}

/** Over time, a numeric estimate: its mean (mean estimator) or quantiles (distribution), with
 * their 95 % intervals, per category when it has them. */
function numericSeries(pts) {
  const series = new Map();
  const add = (name, t, q) => {
    if (!q || q.value == null) return;
    if (!series.has(name)) series.set(name, []);
    series.get(name).push({ t, v: q.value, lo: q.low ?? null, hi: q.high ?? null });
  };
  for (const p of pts) {
    if (!p.numeric) continue;
    const rows = p.numeric.categories || [{ category: null, ...p.numeric }];
    for (const r of rows) {
      const pre = r.category == null ? "" : `${r.category}: `;
      if (r.quantiles) for (const [q, iv] of Object.entries(r.quantiles)) add(`${pre}${qName(q)}`, p.updated_at, iv);
      else add(`${pre}mean`, p.updated_at, r.mean);
    }
  }
  return [...series].map(([name, points]) => ({ name, points }));
}

function drawHistory(hist) {
  const pts = hist.points;
  const numeric = !!(state.estimate && state.estimate.numeric) || pts.some((p) => p.numeric);
  $("cells").hidden = numeric;
  const cap = $("history-caption");
  if (cap.dataset.cells == null) cap.dataset.cells = cap.innerHTML;
  if (numeric) cap.textContent = `Each refresh's ${hist.method === "mean" ? "mean" : "median, p90 and p99"} `
    + "of the window with its 95 % interval (shaded), in the attribute's units; dashed lines mark a change of "
    + "the mechanism version, red crosses a refresh that failed.";
  else if (cap.innerHTML !== cap.dataset.cells) cap.innerHTML = cap.dataset.cells;
  const versions = [];
  pts.forEach((p, i) => {
    if (i && p.version !== pts[i - 1].version) versions.push({ t: p.updated_at, short: `v${p.version}`, text: `mechanism version ${pts[i - 1].version} → ${p.version}` });
  });
  const failures = pts.filter((p) => p.error != null).map((p) => ({ t: p.updated_at, text: p.error }));
  let chart;
  if (numeric) {   // the mean or the quantiles with their intervals, in the attribute's units
    chart = () => timeSeries({ series: numericSeries(pts), versions, failures,
      label: `History of ${hist.method === "mean" ? "the mean" : "the quantiles"} of ${hist.attrs.join(" × ")} with their 95 % intervals`,
      yLabel: (state.estimate && state.estimate.numeric && state.estimate.numeric.attribute) || "value" });
  } else {
    const keys = pts.length && pts[pts.length - 1].cells ? flatten(pts[pts.length - 1].cells, hist.labels).map((c) => c.key)
      : state.estimate ? flatten(state.estimate.cells, state.estimate.labels).map((c) => c.key) : [];
    cellChoices(keys);
    const series = [...state.cells].filter((k) => keys.includes(k)).map((k) => ({ name: k, points: pts.filter((p) => p.cells).map((p) => {
      const v = flatten(p.cells, hist.labels).find((c) => c.key === k).v, b = p.error_bound;
      // no cell is off by more than the TVD: ± error_bound holds every cell at once (≥ 95 %)
      return { t: p.updated_at, v, lo: b == null ? null : v - b, hi: b == null ? null : v + b };
    }) }));
    chart = () => timeSeries({ series, versions, failures, label: `History of the chosen cells of ${hist.attrs.join(" × ")}`, yLabel: "share", unit: true });
  }
  const box = $("history-chart");
  if (!pts.length) {
    box.replaceChildren(h("p", { class: "message empty", text: "No history yet: this worker records each refresh of the estimate from the moment it starts." }));
  } else {
    box.replaceChildren(chart());
  }
  drawDrift(hist, versions, failures);
}

function drawDrift(hist, versions, failures) {
  const pts = hist.points.filter((p) => p.drift_statistic != null);
  const st = $("drift-state"), box = $("drift-chart");
  st.className = "";
  if (hist.window === "all") {
    st.textContent = "The all-time window has no drift test (there is no window before it): choose a finite window.";
    box.replaceChildren();
    return;
  }
  if (!pts.length) {
    st.textContent = "No drift measured yet: it needs reports in this window and in the window before it.";
    box.replaceChildren();
    return;
  }
  const last = pts[pts.length - 1];
  const alarms = pts.filter((p) => p.drift_alarm);
  st.setAttribute("data-alarm", String(!!last.drift_alarm));
  // a numeric estimate: the answer itself (the newest refresh) says which mean or quantile moved
  const est = state.estimate && state.estimate.numeric && state.estimate.drift_detail ? state.estimate : null;
  if (est && est.drift_alarm) {
    const d = unitDigits(est.numeric.min, est.numeric.max);
    const moved = est.drift_detail.filter((q) => q.z > est.drift_threshold).map((q) => {
      const who = `${q.category != null ? `${q.category}: ` : ""}${q.quantity === "mean" ? "mean" : qName(q.quantity)}`;
      return q.quantity === "mean" ? `${who} ${fmt(q.previous, d)} → ${fmt(q.current, d)}`
        : `${who} (the share of values below ${fmt(q.at, d)}, the two windows' ${qName(q.quantity)}, went ${fmt(q.previous, 3)} → ${fmt(q.current, 3)})`;
    });
    st.className = "alarm";
    st.setAttribute("data-alarm", "true");
    st.textContent = `Drift alarm: statistic ${fmt(est.drift_statistic, 2)} is above its threshold ${fmt(est.drift_threshold, 2)}; moved: ${moved.join("; ")}.`;
  } else if (last.drift_alarm) {
    st.className = "alarm";
    st.textContent = `Drift alarm: statistic ${fmt(last.drift_statistic, 2)} is above its threshold ${fmt(last.drift_threshold, 2)} (total-variation change ${fmt(last.drift_tvd, 3)}).`;
  } else {
    st.textContent = `No drift: statistic ${fmt(last.drift_statistic, 2)} below its threshold ${fmt(last.drift_threshold, 2)}` +
      (alarms.length ? `; ${alarms.length} alarm(s) earlier in this history.` : ".");
  }
  box.replaceChildren(timeSeries({
    series: [{ name: "statistic", points: pts.map((p) => ({ t: p.updated_at, v: p.drift_statistic })) }],
    threshold: pts.map((p) => ({ t: p.updated_at, v: p.drift_threshold })),
    alarms: alarms.map((p) => ({ t: p.updated_at, v: p.drift_statistic })), versions, failures,
    label: `Drift statistic of ${hist.attrs.join(" × ")} against its threshold`, yLabel: "statistic",
  }));
}

/** The history of the selection: all of it once, then only the points after the last one. */
async function loadHistory(c) {
  const s = state.sel, key = [c.id, s.marginal, s.method, s.window].join("|");
  const had = state.history && state.history.key === key ? state.history : null;
  const last = had && had.points.length ? had.points[had.points.length - 1].updated_at : null;
  const got = await api.history(c.id, { attrs: s.marginal, method: s.method, window: s.window, since: last });
  const points = (had ? had.points : []).concat(got.points).slice(-got.capacity);
  state.history = { ...got, key, points };
  return state.history;
}

// --- the loop ------------------------------------------------------------------------------------
function problem(text) {
  const p = $("problem");
  p.hidden = !text;
  p.textContent = text || "";
}

function renderHealth() {
  const hl = state.health, pill = $("health");
  if (!hl) return;
  pill.textContent = `worker ${hl.status}`;
  pill.className = `pill ${hl.status === "ok" ? "ok" : "bad"}`;
  const failed = Object.entries(hl.checks || {}).filter(([, v]) => v && v.ok === false).map(([k, v]) => `${k}: ${v.detail || v.error || "failing"}`);
  return failed.length ? `This worker is ${hl.status}: ${failed.join("; ")}` : null;
}

// the firing alerts of the Prometheus `up --obs` started (GET /ui/alerts; docs/dashboards.md)
function renderAlerts(ans) {
  const box = $("alerts"), list = $("alert-list");
  const alerts = (ans && ans.alerts) || [];
  box.hidden = !(ans && (ans.prometheus || ans.error));
  box.dataset.firing = String(alerts.length);
  list.replaceChildren(...(ans && ans.error ? [h("li", { class: "message failure", text: ans.error })]
    : alerts.length ? alerts.map((a) => h("li", { class: `alert ${a.severity || ""}`, "data-alert": a.name }, [
      h("strong", { text: `${a.name}` }), ` (${a.severity || "no severity"}): ${a.summary || ""}`,
      a.since ? ` — since ${new Date(a.since).toLocaleTimeString([], { hour12: false })}` : "",
      a.runbook ? h("div", { class: "runbook", text: `Runbook: ${a.runbook}` }) : ""]))
      : [h("li", { class: "message empty", text: `No alert firing (Prometheus ${ans.prometheus}).` })]));
}

async function poll() {
  clearTimeout(state.timer);
  let trouble = null;
  try {
    if (state.polls % HEALTH_EVERY === 0) {
      try { state.health = await api.health(); } catch (exc) { state.health = { status: "unreachable", checks: {} }; }
    }
    if (state.polls % HEALTH_EVERY === 0) {
      try { renderAlerts(await api.alerts()); } catch (exc) { renderAlerts({ prometheus: null, error: exc.message }); }
    }
    trouble = renderHealth();
    state.collections = (await api.collections()).collections;
    syncControls();
    if (state.polls % HEALTH_EVERY === 0 || !state.indexes) {
      const indexes = {};
      await Promise.all(state.collections.map(async (c) => {
        try { indexes[c.id] = await api.index(c.id); } catch (exc) { indexes[c.id] = null; }
      }));
      state.indexes = indexes;
    }
    renderCollections(state.indexes);
    const c = current();
    if (c) {
      await loadEstimate(c);
      drawHistory(await loadHistory(c));
    }
    $("updated").textContent = `updated ${new Date().toLocaleTimeString([], { hour12: false })}`;
    document.body.dataset.polls = String(++state.polls);
  } catch (exc) {
    trouble = `Cannot read this worker's API: ${exc.message}`;
  }
  problem(trouble);
  if (!state.paused) state.timer = setTimeout(poll, POLL_MS);
}

function start() {
  Object.assign(state.sel, readHash());
  for (const id of ["collection", "marginal", "method", "window"]) {
    $(id).addEventListener("change", (ev) => {
      state.sel[id] = ev.target.value;
      if (id === "collection") state.sel.marginal = null;
      syncControls();
      poll();
    });
  }
  $("pause").addEventListener("click", () => {
    state.paused = !state.paused;
    $("pause").setAttribute("aria-pressed", String(state.paused));
    $("pause").textContent = state.paused ? "Resume updates" : "Pause updates";
    if (!state.paused) poll(); else clearTimeout(state.timer);
  });
  window.addEventListener("hashchange", () => {
    Object.assign(state.sel, readHash());
    syncControls();
    poll();
  });
  poll();
}

start();
