// Reads the worker's HTTP API (docs/api.md); every answer, error or not, is JSON.

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.error ? body.error : `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

export async function getJson(path) {
  let resp;
  try {
    resp = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  } catch (exc) {
    throw new ApiError(0, { error: `the worker does not answer (${exc.message})` });
  }
  let body = null;
  try {
    body = await resp.json();
  } catch (exc) {
    body = { error: `HTTP ${resp.status}: not JSON` };
  }
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v != null && v !== "") q.set(k, v);
  return q.toString();
}

export const api = {
  collections: () => getJson("/collections"),
  index: (cid) => getJson(`/estimates/${encodeURIComponent(cid)}`),
  estimate: (cid, p) => getJson(`/estimates/${encodeURIComponent(cid)}?${query(p)}`),
  history: (cid, p) => getJson(`/ui/history/${encodeURIComponent(cid)}?${query(p)}`),
  alerts: () => getJson("/ui/alerts"),
  health: async () => {
    try {
      return await getJson("/healthz");
    } catch (exc) {
      if (exc.status === 503) return exc.body;  // unhealthy: the body names the failing check
      throw exc;
    }
  },
};
