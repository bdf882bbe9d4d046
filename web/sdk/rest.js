// REST access to the API (docs/api.md): bearer token from a getToken hook,
// stable error codes, retries that honour Retry-After and keep the same
// Idempotency-Key, history paging.
import { ApiError, CLIENT_CODES } from "./errors.js";

/**
 * @typedef {"initial" | "expiring" | "refused" | "expired" | "unauthorized"} TokenReason
 * why the SDK asks for a token: the first one, the connection's credential
 * expires soon, the server refused the last refresh, the connection was
 * closed with 4001 token_expired, or REST answered 401.
 */

/**
 * @callback GetToken
 * @param {{reason: TokenReason, expiresAt: number, signal: AbortSignal}} info
 *   expiresAt: the current credential's expiry (epoch ms) when known, else 0;
 *   signal: aborted when the SDK gives this call up (TOKEN_TIMEOUT_MS), so a
 *   hook that fetches its token can pass it on and stop waiting too
 * @returns {Promise<string | null> | string | null} a user JWT, or null to give up
 */

/**
 * @typedef {{id: string, filename: string, contentType: string, sizeBytes: number}} Attachment
 * @typedef {{id: string, dialogId: string, seq: number, senderId: string, body: string,
 *   createdAt: number, attachments: Attachment[]}} Message
 * @typedef {{id: string, title: string, memberIds: string[], lastSeq: number, createdAt: number}} Dialog
 * @typedef {Dialog & {lastMessage: Message | null}} ListedDialog a dialog as the listing shows it,
 *   with its newest message (null when it has none)
 * @typedef {{online: boolean, connections: number, lastSeenAt: number | null}} Presence
 */

/**
 * A listing page: nextCursor is the cursor of the next page, null on the last.
 * @template T
 * @typedef {{items: T[], nextCursor: string | null}} Page
 */

/**
 * @typedef {object} RetryOptions
 * @property {number} [attempts] tries in all (default 5)
 * @property {AbortSignal} [signal]
 * @property {(err: ApiError, delayMs: number, attempt: number) => void} [onRetry]
 */

const MAX_RETRY_WAIT_MS = 60000;
/**
 * One try of a request (its answer and body included) that has not ended
 * within this long is given up as a network_error (status 0, retryable):
 * the server answers well within it (its database work is bounded at a few
 * seconds, a response it writes at 15 s plus its size at 64 KiB/s), so a
 * try still running is hung on a dead path (a connection black-holed after
 * a network switch). The retries of send and createDialog repeat it with
 * the same Idempotency-Key.
 */
export const REQUEST_TIMEOUT_MS = 30000;

/**
 * sleep resolves after ms, or rejects when signal aborts.
 * @param {number} ms
 * @param {AbortSignal} [signal]
 * @returns {Promise<void>}
 */
export function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A wait the server advised with Retry-After is followed by up to this much
 * more, at random: the clients a busy server answered alike at the same
 * moment (a 503 `dialog_busy` with Retry-After: 1) come back spread over a
 * second rather than all at the same instant.
 */
export const RETRY_AFTER_JITTER_MS = 1000;

/**
 * retryDelay is the wait before try attempt+1: the server's Retry-After when
 * it gave one (at most 60 s) plus 0–RETRY_AFTER_JITTER_MS, else exponential
 * backoff (400 ms doubling, capped at 8 s) with half of it jittered.
 * @param {ApiError} err
 * @param {number} attempt 1 for the first failure
 * @param {() => number} [rnd]
 */
export function retryDelay(err, attempt, rnd = Math.random) {
  if (err.retryAfterMs > 0) return Math.min(err.retryAfterMs, MAX_RETRY_WAIT_MS) + Math.round(rnd() * RETRY_AFTER_JITTER_MS);
  const base = Math.min(8000, 400 * 2 ** (attempt - 1));
  return Math.round(base / 2 + rnd() * base / 2);
}

/**
 * newIdempotencyKey: a random key (UUID v4), 36 printable ASCII characters.
 * @returns {string}
 */
export function newIdempotencyKey() {
  return globalThis.crypto.randomUUID();
}

/**
 * A getToken call that has not answered within this long is given up: the
 * callers waiting for it get an ApiError `token_timeout` (status 0,
 * retryable), and the next renew asks the hook again instead of waiting for
 * that same call. It is the bound of a connection attempt's step
 * (CONNECT_TIMEOUT_MS), so a hook that never settles costs one attempt, not
 * every attempt after it.
 */
export const TOKEN_TIMEOUT_MS = 15000;

/**
 * Tokens holds the current user token and asks the getToken hook for new
 * ones, one call at a time, each within TOKEN_TIMEOUT_MS.
 */
export class Tokens {
  /** @type {string} */
  #token = "";
  /** @type {Promise<string | null> | null} */
  #pending = null;
  /** calls of the hook (and set()) so far; each answer knows its number */
  #asked = 0;
  /** the number of the call (or set()) that gave the current token */
  #tokenFrom = 0;
  #getToken;
  expiresAt = 0;

  /** @param {GetToken} getToken */
  constructor(getToken) {
    this.#getToken = getToken;
  }

  /**
   * @returns {Promise<string>} the current token, asking for the first one;
   *   rejects with ApiError `unauthorized` (401) when getToken gave none, or
   *   `token_timeout` (status 0) when it did not answer in time
   */
  async current() {
    if (this.#token) return this.#token;
    const t = await this.renew("initial");
    if (!t) throw new ApiError("unauthorized", 401);
    return t;
  }

  /** @param {string} t */
  set(t) {
    this.#token = t;
    this.#tokenFrom = ++this.#asked;
  }

  /**
   * renew asks the hook for a new token; concurrent callers share one call.
   * A call not answered within TOKEN_TIMEOUT_MS rejects its callers with
   * ApiError `token_timeout` and is no longer shared: the next renew asks
   * the hook again, and the call's signal is aborted (a hook that passed it
   * to its fetch ends that request). Should the abandoned call answer after
   * all, its token is kept only if no later call (or set()) has given one
   * since.
   * @param {TokenReason} reason
   * @returns {Promise<string | null>} the new token, or null when the hook gave none
   */
  renew(reason) {
    if (this.#pending) return this.#pending;
    const n = ++this.#asked;
    const abort = new AbortController();
    const call = (async () => {
      const t = await this.#getToken({ reason, expiresAt: this.expiresAt, signal: abort.signal });
      if (typeof t !== "string" || !t) return null;
      if (n > this.#tokenFrom) {
        this.#token = t;
        this.#tokenFrom = n;
      }
      return t;
    })().catch(() => null);
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    const deadline = new Promise((_, reject) => {
      timer = setTimeout(() => {
        reject(new ApiError(CLIENT_CODES.tokenTimeout, 0));
        abort.abort(new ApiError(CLIENT_CODES.tokenTimeout, 0));
      }, TOKEN_TIMEOUT_MS);
    });
    /** @type {Promise<string | null>} */
    const pending = Promise.race([call, deadline]).finally(() => {
      clearTimeout(timer);
      if (this.#pending === pending) this.#pending = null;
    });
    this.#pending = pending;
    return pending;
  }
}

/** Rest calls the API under /v1 with the user's bearer token. */
export class Rest {
  #base;
  #tokens;
  #fetch;

  /**
   * @param {string} baseUrl e.g. "https://chat.example.com" (no trailing /v1)
   * @param {Tokens} tokens
   * @param {typeof fetch} [fetchImpl]
   */
  constructor(baseUrl, tokens, fetchImpl) {
    this.#base = baseUrl.replace(/\/+$/, "");
    this.#tokens = tokens;
    this.#fetch = fetchImpl || globalThis.fetch.bind(globalThis);
  }

  /**
   * request sends one request with the bearer token; a 401 asks getToken for
   * a new token once and repeats. Resolves the JSON body; rejects with ApiError.
   * @param {string} method
   * @param {string} path starting with /
   * @param {{body?: unknown, headers?: Record<string, string>, signal?: AbortSignal}} [opts]
   * @returns {Promise<{status: number, data: any, headers: Headers}>}
   */
  async request(method, path, opts = {}) {
    try {
      return await this.#once(method, path, await this.#tokens.current(), opts);
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 401) throw e;
      const t = await this.#tokens.renew("unauthorized");
      if (!t) throw e;
      return this.#once(method, path, t, opts);
    }
  }

  /**
   * @param {string} method
   * @param {string} path
   * @param {string} token
   * @param {{body?: unknown, headers?: Record<string, string>, signal?: AbortSignal}} opts
   */
  async #once(method, path, token, { body, headers, signal }) {
    /** @type {Record<string, string>} */
    const hdrs = { ...headers, Authorization: `Bearer ${token}` };
    if (body !== undefined) hdrs["Content-Type"] = "application/json";
    // Ended by the caller's signal or after REQUEST_TIMEOUT_MS (AbortSignal.any
    // is missing on some runtimes the SDK supports). The try is raced
    // against it as well, for a fetch that does not honour its signal.
    const ac = new AbortController();
    const abort = () => ac.abort(signal?.reason);
    if (signal?.aborted) abort();
    else signal?.addEventListener("abort", abort, { once: true });
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    const ended = new Promise((_, reject) => {
      timer = setTimeout(() => ac.abort(new DOMException("request timed out", "TimeoutError")), REQUEST_TIMEOUT_MS);
      ac.signal.addEventListener("abort", () => reject(ac.signal.reason), { once: true });
      if (ac.signal.aborted) reject(ac.signal.reason);
    });
    ended.catch(() => { /* raced below */ });
    let res;
    let text;
    try {
      const attempt = (async () => {
        const r = await this.#fetch(this.#base + path, {
          method, headers: hdrs, body: body === undefined ? undefined : JSON.stringify(body), signal: ac.signal,
          cache: "no-store", credentials: "omit",
        });
        return { r, t: await r.text() };
      })();
      attempt.catch(() => { /* a try given up may fail later */ });
      ({ r: res, t: text } = await Promise.race([attempt, ended]));
    } catch (e) {
      if (signal?.aborted) throw signal.reason ?? e;
      // No answer, or it broke off, or none in time: the outcome is unknown.
      throw new ApiError(CLIENT_CODES.network, 0);
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", abort);
    }
    let data;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = undefined;
    }
    if (!res.ok) {
      const code = data && typeof data.error === "string" ? data.error : `http_${res.status}`;
      const ra = Number.parseInt(res.headers.get("Retry-After") || "0", 10);
      throw new ApiError(code, res.status, Number.isFinite(ra) && ra > 0 ? ra * 1000 : 0);
    }
    if (data === undefined) throw new ApiError(CLIENT_CODES.invalidResponse, res.status);
    return { status: res.status, data, headers: res.headers };
  }

  /**
   * retrying repeats fn while it fails with a retryable ApiError.
   * @template T
   * @param {() => Promise<T>} fn
   * @param {RetryOptions} [opts]
   * @returns {Promise<T>}
   */
  async retrying(fn, { attempts = 5, signal, onRetry } = {}) {
    for (let i = 1; ; i++) {
      try {
        return await fn();
      } catch (e) {
        if (!(e instanceof ApiError) || !e.retryable || i >= attempts || signal?.aborted) throw e;
        const delay = retryDelay(e, i);
        onRetry?.(e, delay, i);
        await sleep(delay, signal);
      }
    }
  }

  /** @returns {Promise<{id: string}>} */
  async me() {
    return (await this.request("GET", "/v1/me")).data;
  }

  /**
   * @param {string[]} memberIds
   * @param {{title?: string, idempotencyKey?: string} & RetryOptions} [opts]
   * @returns {Promise<Dialog>}
   */
  async createDialog(memberIds, opts = {}) {
    const key = opts.idempotencyKey || newIdempotencyKey();
    /** @type {Record<string, unknown>} */
    const body = { memberIds };
    if (opts.title !== undefined) body.title = opts.title;
    return withKey(key, this.retrying(async () => (await this.request("POST", "/v1/dialogs",
      { body, headers: { "Idempotency-Key": key }, signal: opts.signal })).data, opts));
  }

  /**
   * @param {{limit?: number, cursor?: string}} [q]
   * @returns {Promise<Page<ListedDialog>>}
   */
  async dialogs(q = {}) {
    return (await this.request("GET", `/v1/dialogs${query(q)}`)).data;
  }

  /**
   * send posts a message with an Idempotency-Key (generated unless given) and
   * retries retryable failures with that same key, so a retry after a lost
   * answer yields the message once. `replayed` is true when the server
   * answered a repeat of a request it had already done. A send that fails
   * rejects with an ApiError naming its key (idempotencyKey): sending the
   * message again with it writes it at most once.
   * @param {string} dialogId
   * @param {string} body
   * @param {{idempotencyKey?: string, clientMessageId?: string, attachmentIds?: string[]} & RetryOptions} [opts]
   * @returns {Promise<{message: Message, idempotencyKey: string, replayed: boolean}>}
   */
  async send(dialogId, body, opts = {}) {
    const key = opts.idempotencyKey || newIdempotencyKey();
    /** @type {Record<string, unknown>} */
    const payload = { body };
    if (opts.clientMessageId !== undefined) payload.clientMessageId = opts.clientMessageId;
    if (opts.attachmentIds !== undefined) payload.attachmentIds = opts.attachmentIds;
    const res = await withKey(key, this.retrying(() => this.request("POST", `/v1/dialogs/${encodeURIComponent(dialogId)}/messages`,
      { body: payload, headers: { "Idempotency-Key": key }, signal: opts.signal }), opts));
    return { message: res.data, idempotencyKey: key, replayed: res.headers.get("Idempotent-Replayed") === "true" };
  }

  /**
   * history reads one page of a dialog's messages with seq > afterSeq, ascending.
   * @param {string} dialogId
   * @param {{afterSeq?: number | string, limit?: number, signal?: AbortSignal}} [q]
   * @returns {Promise<Page<Message>>}
   */
  async history(dialogId, q = {}) {
    const { signal, ...rest } = q;
    return (await this.request("GET", `/v1/dialogs/${encodeURIComponent(dialogId)}/messages${query(rest)}`,
      { signal })).data;
  }

  /**
   * historyPages yields every page after afterSeq, following nextCursor until
   * it is null. A page without a cursor, or with the one just read, ends it
   * too: a broken answer must not turn into an endless loop of reads.
   * Retryable failures are retried (reads are safe to repeat).
   * @param {string} dialogId
   * @param {{afterSeq?: number, limit?: number} & RetryOptions} [opts]
   * @returns {AsyncGenerator<Message[], void, void>}
   */
  async *historyPages(dialogId, opts = {}) {
    /** @type {number | string} */
    let after = opts.afterSeq || 0;
    for (;;) {
      const page = await this.retrying(() => this.history(dialogId,
        { afterSeq: after, limit: opts.limit || 100, signal: opts.signal }), opts);
      yield page.items;
      const next = page.nextCursor;
      if (next === null || next === undefined || next === "" || next === after || page.items.length === 0) return;
      after = next;
    }
  }

  /**
   * @param {string} userId
   * @returns {Promise<Presence>}
   */
  async presence(userId) {
    return (await this.request("GET", `/v1/users/${encodeURIComponent(userId)}/presence`)).data;
  }

  /**
   * @param {{signal?: AbortSignal}} [opts]
   * @returns {Promise<{ticket: string, expiresAt: number}>} a one-use WebSocket ticket (30 s)
   */
  async ticket(opts = {}) {
    return (await this.request("POST", "/v1/realtime/tickets", { signal: opts.signal })).data;
  }
}

/**
 * withKey names the Idempotency-Key of a request in the ApiError it fails
 * with, so the caller can send it again with the same key.
 * @template T
 * @param {string} key
 * @param {Promise<T>} p
 * @returns {Promise<T>}
 */
async function withKey(key, p) {
  try {
    return await p;
  } catch (e) {
    if (e instanceof ApiError) e.idempotencyKey = key;
    throw e;
  }
}

/**
 * @param {Record<string, string | number | undefined>} q
 * @returns {string}
 */
function query(q) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) if (v !== undefined && v !== "") p.set(k, String(v));
  const s = p.toString();
  return s ? `?${s}` : "";
}
