// Timeline holds one dialog's messages, each exactly once, ordered by seq,
// and closes gaps over REST (docs/realtime-protocol.md, "Reconnect and
// reconcile"):
//
//   known  the highest seq held with nothing missing between floor and it;
//   floor  the seq below which history was not loaded (older pages load on
//          demand and never move known).
//
// A realtime message with seq known+1 extends known; one further ahead is
// held (and shown in seq order) while a grace timer runs: publishes after
// concurrent commits can arrive out of order. If the gap is still open when
// the timer fires, reconcile() fetches afterSeq=known to the end. REST
// answers are authoritative: everything up to the last seq a complete
// reconciliation returned is known.

export const GAP_GRACE_MS = 500;
const PAGE = 100;

export class Timeline {
  // fetchAfter(afterSeq, limit) → {items, nextCursor}; onAdd(messages) is
  // called with every batch of newly held messages.
  constructor({ fetchAfter, onAdd = () => {}, onError = () => {}, graceMs = GAP_GRACE_MS }) {
    this.fetchAfter = fetchAfter;
    this.onAdd = onAdd;
    this.onError = onError;
    this.graceMs = graceMs;
    this.known = 0;
    this.floor = 0;
    this.bySeq = new Map();
    this.ids = new Set();
    this.gapTimer = null;
    this.running = null; // the reconciliation in flight
    this.again = false; // another one was asked for meanwhile
    this.loaded = false;
  }

  // messages are the held messages in seq order.
  messages() {
    return Array.from(this.bySeq.values()).sort((a, b) => a.seq - b.seq);
  }

  // lastSeq is the highest seq held (known, or a held message past a gap).
  get lastSeq() {
    let m = this.known;
    for (const s of this.bySeq.keys()) if (s > m) m = s;
    return m;
  }

  get hasGap() { return this.lastSeq > this.known; }

  // start loads the latest page: history below lastSeq - pageSize stays
  // behind "load earlier".
  async start(lastSeq, pageSize = 50) {
    this.floor = Math.max(0, (Number(lastSeq) || 0) - pageSize);
    if (this.known < this.floor) this.known = this.floor;
    await this.reconcile();
    this.loaded = true;
  }

  // apply takes a message from a realtime event; false when it was a
  // duplicate (or below the loaded window).
  apply(m) {
    const added = this.#hold(m);
    if (!added) return false;
    this.#advance();
    this.onAdd([m]);
    this.#checkGap();
    return true;
  }

  #hold(m) {
    if (!m || !Number.isInteger(m.seq) || m.seq <= this.floor) return false;
    if (this.bySeq.has(m.seq) || this.ids.has(m.id)) return false;
    this.bySeq.set(m.seq, m);
    this.ids.add(m.id);
    return true;
  }

  #advance() {
    while (this.bySeq.has(this.known + 1)) this.known++;
  }

  #checkGap() {
    if (!this.hasGap) {
      clearTimeout(this.gapTimer);
      this.gapTimer = null;
      return;
    }
    if (this.gapTimer) return;
    this.gapTimer = setTimeout(() => {
      this.gapTimer = null;
      if (this.hasGap) this.reconcile();
    }, this.graceMs);
  }

  // reconcile fetches everything after known, page by page, until
  // nextCursor is null. Calls made while one runs coalesce into one more
  // run after it — also when the running one fails, so a reconcile asked
  // for after a reconnect is never swallowed by a failing earlier one.
  reconcile() {
    if (this.running) {
      this.again = true;
      return this.running;
    }
    const run = (async () => {
      let failed = null;
      try {
        do {
          this.again = false;
          await this.#fetchToEnd();
        } while (this.again);
      } catch (e) {
        failed = e;
      }
      this.running = null;
      if (failed) {
        this.onError(failed);
        if (this.again) {
          this.again = false;
          return this.reconcile();
        }
      }
      this.#checkGap();
      return undefined;
    })();
    this.running = run;
    return run;
  }

  async #fetchToEnd() {
    for (let guard = 0; guard < 1000; guard++) {
      const page = await this.fetchAfter(this.known, PAGE);
      const added = [];
      for (const m of page.items || []) {
        if (this.#hold(m)) added.push(m);
        // The server returned every message after known: nothing is
        // missing up to this one.
        if (m.seq > this.known) this.known = m.seq;
      }
      this.#advance();
      if (added.length) this.onAdd(added);
      if (page.nextCursor == null) return;
    }
  }

  // loadOlder loads up to n messages below floor; false when there are none.
  async loadOlder(n = 50) {
    if (this.floor <= 0) return false;
    const from = Math.max(0, this.floor - n);
    const page = await this.fetchAfter(from, this.floor - from);
    const added = [];
    for (const m of page.items || []) {
      if (m.seq > this.floor || this.bySeq.has(m.seq) || this.ids.has(m.id)) continue;
      this.bySeq.set(m.seq, m);
      this.ids.add(m.id);
      added.push(m);
    }
    this.floor = from;
    if (added.length) this.onAdd(added);
    return true;
  }

  dispose() {
    clearTimeout(this.gapTimer);
    this.gapTimer = null;
  }
}
