// HTTP access to the API: bearer token, stable error codes, safe retries.
import { sleep } from "./dom.js";

// ApiError carries the stable code of an error body {"error":"<code>"}, or
// network_error (status 0) when no answer arrived.
export class ApiError extends Error {
  constructor(code, status, retryAfterSec = 0) {
    super(code);
    this.code = code;
    this.status = status;
    this.retryAfter = retryAfterSec;
  }

  // retryable: the outcome is unknown or the server asked to come back;
  // repeating the request with the same Idempotency-Key (or the same
  // producer identity) is safe.
  get retryable() {
    return this.status === 0 || this.status === 429 || this.status === 502 || this.status === 503 ||
      this.status === 504 || this.code === "idempotency_in_progress";
  }
}

let token = "";
let authLost = null;

export function setToken(t) { token = t || ""; }
export function getToken() { return token; }
// onAuthLost registers what happens when any request answers 401.
export function onAuthLost(fn) { authLost = fn; }

// request sends one request. body is JSON-encoded; rawBody is sent as is
// (already JSON text). Resolves {status, data, headers}; rejects with ApiError.
export async function request(method, path, { body, rawBody, headers, signal, auth = true } = {}) {
  const hdrs = { ...(headers || {}) };
  if (auth && token) hdrs.Authorization = `Bearer ${token}`;
  let payload;
  if (rawBody !== undefined) payload = rawBody;
  else if (body !== undefined) payload = JSON.stringify(body);
  if (payload !== undefined) hdrs["Content-Type"] = "application/json";
  let res;
  let text;
  try {
    res = await fetch(path, { method, headers: hdrs, body: payload, signal, cache: "no-store", credentials: "omit" });
    text = res.status === 204 ? "" : await res.text();
  } catch (e) {
    if (e && e.name === "AbortError") throw e;
    // No answer, or the answer broke off (a listing aborts its stream on a
    // Redis failure): the outcome is unknown.
    throw new ApiError("network_error", 0);
  }
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = undefined; }
  }
  if (!res.ok) {
    const code = data && typeof data.error === "string" ? data.error : `http_${res.status}`;
    const ra = Number.parseInt(res.headers.get("Retry-After") || "0", 10);
    const err = new ApiError(code, res.status, Number.isFinite(ra) ? ra : 0);
    if (res.status === 401 && auth && authLost) authLost(err);
    throw err;
  }
  if (data === undefined) throw new ApiError("invalid_response", res.status);
  return { status: res.status, data, headers: res.headers };
}

export const get = async (path, opts) => (await request("GET", path, opts)).data;

// retrying repeats fn while it fails with a retryable error, up to attempts
// times, waiting Retry-After when the server gave one, else exponential
// backoff with jitter. onWait(err, delayMs, attempt) reports each wait.
export async function retrying(fn, { attempts = 5, onWait, signal } = {}) {
  for (let i = 1; ; i++) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof ApiError) || !e.retryable || i >= attempts) throw e;
      const base = Math.min(8000, 400 * 2 ** (i - 1));
      const delay = e.retryAfter > 0 ? e.retryAfter * 1000 : Math.round(base / 2 + Math.random() * base / 2);
      onWait?.(e, delay, i);
      await sleep(delay, signal);
    }
  }
}
