// HTTP access to the API calls the SDK does not cover (the project
// console, attachments, sign-in checks): bearer token, stable error codes,
// safe retries. Errors and retry timing are the SDK's (ApiError,
// retryDelay), so both report failures alike.
import { ApiError, retryDelay, sleep } from "../sdk/index.js";

export { ApiError };

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
    const err = new ApiError(code, res.status, Number.isFinite(ra) && ra > 0 ? ra * 1000 : 0);
    if (res.status === 401 && auth && authLost) authLost(err);
    throw err;
  }
  if (data === undefined) throw new ApiError("invalid_response", res.status);
  return { status: res.status, data, headers: res.headers };
}

export const get = async (path, opts) => (await request("GET", path, opts)).data;

// blobURL is the address of an attachment's bytes taken from an upload or
// download-url answer, when it is this origin's own
// /v1/attachments/<id>/blob; null for anything else (another origin or
// path, javascript:, data:), so a broken or hostile answer can neither
// send the browser elsewhere nor have a file uploaded there.
export function blobURL(url, id, origin = location.origin) {
  try {
    const u = new URL(String(url), origin);
    if (u.origin !== origin || u.username || u.password) return null;
    return u.pathname === `/v1/attachments/${encodeURIComponent(id)}/blob` ? u.href : null;
  } catch {
    return null; // not a URL, or an id that cannot be encoded
  }
}

// realtimeURL is the WebSocket URL the client connects to: the realtimeUrl
// of /v1/public/config when it is a ws: or wss: URL without credentials
// (only wss: for a page served over https: the browser blocks a plain ws:
// there as mixed content, and tokens go over the socket), else this
// origin's /v1/realtime, which the gateway serving the page answers. A
// broken or hostile answer (a number, javascript:, http:) thus cannot keep
// the client offline; the page's CSP decides which other origins it may
// reach.
export function realtimeURL(value, origin = location.origin) {
  const page = new URL(origin);
  const own = `${page.protocol === "https:" ? "wss" : "ws"}://${page.host}/v1/realtime`;
  if (typeof value !== "string") return own;
  try {
    const u = new URL(value);
    const ok = (u.protocol === "wss:" || (u.protocol === "ws:" && page.protocol !== "https:")) && !u.username && !u.password;
    return ok ? u.href : own;
  } catch {
    return own; // not a URL
  }
}

// retrying repeats fn while it fails with a retryable error, up to attempts
// times, waiting the SDK's retryDelay: Retry-After when the server gave one
// plus 0–1 s at random, else exponential backoff with jitter.
// onWait(err, delayMs, attempt) reports each wait.
export async function retrying(fn, { attempts = 5, onWait, signal } = {}) {
  for (let i = 1; ; i++) {
    try {
      return await fn();
    } catch (e) {
      if (!(e instanceof ApiError) || !e.retryable || i >= attempts) throw e;
      const delay = retryDelay(e, i);
      onWait?.(e, delay, i);
      await sleep(delay, signal);
    }
  }
}
