// Typed errors of the SDK. Each carries the API's stable code: the
// `{"error":"<code>"}` of a REST answer (docs/api.md, docs/errors.md), the
// `error` of a realtime error frame, or the close code and reason of the
// socket (docs/realtime-protocol.md).

/** Codes the SDK produces itself when no server code exists. */
export const CLIENT_CODES = Object.freeze({
  network: "network_error", // no answer arrived: the outcome is unknown
  invalidResponse: "invalid_response", // the answer was not the JSON expected
  tokenTimeout: "token_timeout", // the getToken hook did not answer within TOKEN_TIMEOUT_MS
});

/**
 * ApiError is a REST failure: `code` is the body's `error`, or `http_<status>`
 * when the body had none, or `network_error` (status 0) when no answer came,
 * or `token_timeout` (status 0) when the getToken hook did not answer in time
 * (the request was not sent).
 */
export class ApiError extends Error {
  /**
   * @param {string} code
   * @param {number} status
   * @param {number} [retryAfterMs] the Retry-After header in ms, 0 when absent
   */
  constructor(code, status, retryAfterMs = 0) {
    super(`${code} (${status})`);
    this.name = "ApiError";
    this.code = code;
    this.status = status;
    this.retryAfterMs = retryAfterMs;
    /**
     * The Idempotency-Key every try of a failed send or createDialog
     * carried: the request sent again with it is done at most once, also
     * when a try whose answer was lost did it.
     * @type {string | undefined}
     */
    this.idempotencyKey = undefined;
  }

  /**
   * retryable: the outcome is unknown or the server asked to come back later;
   * repeating the request with the same Idempotency-Key is safe.
   * @returns {boolean}
   */
  get retryable() {
    return this.status === 0 || this.status === 429 || this.status === 502 || this.status === 503 ||
      this.status === 504 || this.code === "idempotency_in_progress" || this.code === "upload_in_progress";
  }
}

/**
 * FrameError is a realtime `{"type":"error","error":"<code>"}` frame.
 * `dialogId` is set when the frame answered a subscribe: the error frame
 * names no dialog, the client knows it from the order of the answers.
 */
export class FrameError extends Error {
  /**
   * @param {string} code
   * @param {string} [dialogId] the dialog whose subscribe was refused
   */
  constructor(code, dialogId) {
    super(dialogId === undefined ? code : `${code} (subscribe ${dialogId})`);
    this.name = "FrameError";
    this.code = code;
    this.dialogId = dialogId;
  }
}

/**
 * CloseError describes how the socket ended: the WebSocket close code and
 * reason (1006 when the connection dropped without a close frame).
 */
export class CloseError extends Error {
  /**
   * @param {number} code
   * @param {string} reason
   */
  constructor(code, reason) {
    super(`closed ${code}${reason ? ` ${reason}` : ""}`);
    this.name = "CloseError";
    this.code = code;
    this.reason = reason;
  }

  /**
   * fatal: reconnecting in a loop cannot help (client bug, configuration,
   * wrong session). Not 1008 "frame rate": the SDK paces its own frames, so
   * a burst the application caused (or a slow network bunching frames)
   * passes; the reconnect backs off, and the backoff only resets once a
   * connection stays up, so a client that keeps flooding waits up to 30 s
   * between attempts.
   */
  get fatal() {
    return this.code === 1003 || (this.code === 1008 && this.reason !== "frame rate") || this.code === 4003;
  }

  /** tokenExpired: the credential is dead; only a new token helps. */
  get tokenExpired() {
    return this.code === 4001 && this.reason === "token_expired";
  }
}
