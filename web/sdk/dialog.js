// Per-dialog ordering: keeps `known`, the highest seq held with no gap below
// it, buffers messages that arrive ahead of a gap and reports when REST must
// fill one (docs/realtime-protocol.md, "Reconnect and reconcile").

/** @typedef {import("./rest.js").Message} Message */

/** How long a gap may stay open before REST fills it: concurrent sends may publish out of seq order. */
export const GAP_GRACE_MS = 500;
/**
 * At most this many messages are held behind a gap. While a gap stays open
 * (REST unreachable, or a server announcing seqs that do not exist) live
 * messages would pile up without end; beyond this many the newest are
 * dropped, and the REST read that closes the gap brings them again.
 */
export const MAX_AHEAD = 10000;

export class DialogState {
  /** @type {number | null} null until the first subscribed frame (or sinceSeq) sets it */
  known;
  /** @type {Map<number, Message>} messages ahead of a gap, by seq */
  ahead = new Map();
  /** @type {ReturnType<typeof setTimeout> | null} */
  gapTimer = null;
  /** @type {ReturnType<typeof setTimeout> | null} a failed reconciliation's retry */
  retryTimer = null;
  /** a REST reconciliation is running */
  reconciling = false;
  /** another one was asked for while it ran */
  again = false;
  /** REST reads the gap timer started while the current gap stayed open */
  gapReads = 0;
  /** reconciliations that failed in a row (reset by one that ends well) */
  reconcileFails = 0;
  /** @type {ReturnType<typeof setTimeout> | null} the subscribe sent again after the server was unavailable */
  subscribeTimer = null;
  /** subscribes refused as unavailable in a row (reset by subscribed) */
  subscribeFails = 0;

  /** @param {number | null} sinceSeq */
  constructor(sinceSeq) {
    this.known = sinceSeq;
  }

  /**
   * offer takes one message and returns those now deliverable, in seq order,
   * advancing known. Duplicates (seq ≤ known or already buffered) are dropped.
   * Before known is set everything is buffered (up to MAX_AHEAD).
   * @param {Message} m
   * @returns {Message[]}
   */
  offer(m) {
    if (!Number.isSafeInteger(m.seq)) return [];
    if (this.known !== null && m.seq <= this.known) return [];
    if (this.ahead.size >= MAX_AHEAD && !this.ahead.has(m.seq) && (this.known === null || m.seq !== this.known + 1)) return [];
    this.ahead.set(m.seq, m);
    return this.drain();
  }

  /**
   * drain returns the buffered messages that follow known without a gap,
   * and forgets buffered ones at or below it.
   * @returns {Message[]}
   */
  drain() {
    if (this.known === null) return [];
    const out = [];
    let known = this.known;
    for (const seq of this.ahead.keys()) if (seq <= known) this.ahead.delete(seq);
    for (let m = this.ahead.get(known + 1); m; m = this.ahead.get(known + 1)) {
      this.ahead.delete(m.seq);
      known = m.seq;
      out.push(m);
    }
    this.known = known;
    return out;
  }

  /** @returns {boolean} a message beyond known + 1 waits: there is a gap */
  get hasGap() {
    return this.known !== null && this.ahead.size > 0;
  }

  clearSubscribeTimer() {
    if (this.subscribeTimer) clearTimeout(this.subscribeTimer);
    this.subscribeTimer = null;
  }

  /**
   * forget drops what the client held beyond lastSeq: the server said the
   * dialog ends there (a sinceSeq the dialog never had, from a stale
   * cache), so the next message is lastSeq + 1.
   * @param {number} lastSeq
   */
  forget(lastSeq) {
    this.known = lastSeq;
    this.ahead.clear();
    this.gapReads = 0;
  }

  clearGapTimer() {
    if (this.gapTimer) clearTimeout(this.gapTimer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.gapTimer = null;
    this.retryTimer = null;
  }
}
