// The HAN JavaScript SDK: ES modules, no build step (docs/sdk.md).
export { HanClient } from "./client.js";
export { Rest, Tokens, TOKEN_TIMEOUT_MS, RETRY_AFTER_JITTER_MS, newIdempotencyKey, retryDelay, sleep } from "./rest.js";
export { Realtime, PresenceOrder, FrameBudget, SUBPROTOCOL, REFRESH_AHEAD_MS, REFRESH_MIN_GAP_MS, CONNECT_TIMEOUT_MS, SUBSCRIBE_BURST, SUBSCRIBE_PER_SEC,
  advisedDelay, backoffDelay, refreshDelay, serverClockOffset, MAX_CLOCK_OFFSET_MS } from "./realtime.js";
export { DialogState, GAP_GRACE_MS, MAX_AHEAD } from "./dialog.js";
export { ApiError, CloseError, FrameError, CLIENT_CODES } from "./errors.js";
