// Timeline holds one dialog's messages for display, each exactly once and
// ordered by seq. Ordering, gap detection and reconciliation are the SDK's
// (its "message" events arrive per dialog in seq order without gaps); the
// timeline only merges them with what REST paging loaded:
//
//   floor  the seq below which history was not loaded (older pages load on
//          demand with "Load earlier messages").
//
// Duplicates (an event for a message a page or a send's answer already
// brought) are dropped by seq and id.

export class Timeline {
  // pages(afterSeq, attempts) yields the dialog's messages after afterSeq, page by
  // page, to the end; page(afterSeq, limit) reads one page.
  // onAdd(messages) is called with every batch of newly held messages.
  constructor({ pages, page, onAdd = () => {} }) {
    this.pages = pages;
    this.page = page;
    this.onAdd = onAdd;
    this.floor = 0;
    this.bySeq = new Map();
    this.ids = new Set();
    this.loaded = false;
  }

  // messages are the held messages in seq order.
  messages() {
    return Array.from(this.bySeq.values()).sort((a, b) => a.seq - b.seq);
  }

  // lastSeq is the highest seq held.
  get lastSeq() {
    let m = this.floor;
    for (const s of this.bySeq.keys()) if (s > m) m = s;
    return m;
  }

  // heldThrough is the highest seq held with none missing between floor
  // and it; lastSeq can be higher when a send's answer came before the
  // messages below it.
  get heldThrough() {
    let s = this.floor;
    while (this.bySeq.has(s + 1)) s++;
    return s;
  }

  // start loads the latest messages, from pageSize below lastSeq to the
  // end; history below that stays behind "load earlier".
  async start(lastSeq, pageSize = 50) {
    this.floor = Math.max(0, (Number(lastSeq) || 0) - pageSize);
    await this.catchUp(this.floor);
    this.loaded = true;
  }

  // catchUp reads everything after afterSeq over REST; attempts: tries per
  // page (the SDK's default when undefined).
  async catchUp(afterSeq, attempts) {
    for await (const items of this.pages(afterSeq, attempts)) this.add(items);
  }

  // add holds the messages not held yet and reports them.
  add(ms) {
    const added = [];
    for (const m of ms) {
      if (!m || !Number.isInteger(m.seq) || m.seq <= this.floor) continue;
      if (this.bySeq.has(m.seq) || this.ids.has(m.id)) continue;
      this.bySeq.set(m.seq, m);
      this.ids.add(m.id);
      added.push(m);
    }
    if (added.length) this.onAdd(added);
    return added;
  }

  // trim keeps the latest max messages and returns the ones it let go:
  // floor rises to the highest of them, so "load earlier" reads them again
  // and a late duplicate of one is not held again.
  trim(max) {
    if (this.bySeq.size <= max) return [];
    const seqs = Array.from(this.bySeq.keys()).sort((a, b) => a - b).slice(0, this.bySeq.size - max);
    const gone = [];
    for (const s of seqs) {
      const m = this.bySeq.get(s);
      this.bySeq.delete(s);
      this.ids.delete(m.id);
      gone.push(m);
    }
    this.floor = seqs[seqs.length - 1];
    return gone;
  }

  // loadOlder loads up to n messages below floor; false when there are none.
  async loadOlder(n = 50) {
    if (this.floor <= 0) return false;
    const from = Math.max(0, this.floor - n);
    const { items } = await this.page(from, this.floor - from);
    const below = this.floor;
    this.floor = from;
    this.add((items || []).filter((m) => m.seq <= below));
    return true;
  }
}
