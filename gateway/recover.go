package gateway

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/store"
)

// recoveryReader reads what a subscribe with sinceSeq replays: the
// dialog's last seq and the message.created frames of its newest messages
// after a seq, in one snapshot (store.Store).
type recoveryReader interface {
	RecoverDialog(ctx context.Context, dialogID string, afterSeq int64, window time.Duration, limit, maxBytes int) (store.DialogRecovery, error)
}

var _ recoveryReader = (*store.Store)(nil)

// recoverer serves the recoveries of this instance's subscribes. Per
// dialog one read runs at a time (single flight), from the lowest sinceSeq
// waiting for it. A read keeps serving later subscribes for
// Config.RecoverLinger after it ended: from the moment it starts, the
// dialog's message.created frames dispatched on this instance are kept
// beside it, so a subscriber that joins later (its channel attached before
// it joins) finds every event either in the read, in that buffer, or in
// its own pending queue. A reconnect storm thus costs one read per dialog.
// A subscriber whose sinceSeq is beyond every seq the read it joined knows
// gets a read of its own after it (recover), so it is answered as if it
// had not joined.
//
// A read that no flight of the dialog can serve costs its user one of the
// recovery reads this instance grants them (Config.RecoverReadRate and
// RecoverReadBurst): a socket subscribing and unsubscribing one dialog in
// a loop would otherwise make a PostgreSQL read per cycle (the read stops
// serving joiners when the dialog's channel empties), bounded only by its
// frame rate. Past the user's budget the subscribe is answered with the
// dialog's resync, as when a replay is not possible, and the client
// reconciles over REST, whose reads the REST rate limit bounds.
type recoverer struct {
	cfg   *Config
	read  recoveryReader
	reads *userHandshakes // per user: the reads their subscribes may lead

	readsOK, readErrors atomic.Uint64 // reads made, by result
	recovered, resyncs  atomic.Uint64 // subscribes answered with recovered true / false
	// refused: subscribes answered with the resync because their user had
	// no recovery read left (counted in resyncs too).
	refused atomic.Uint64

	active  atomic.Int64              // len(dialogs): Dispatch's fast path when zero
	mu      sync.Mutex                // guards dialogs and every flight's since, buf, bufBytes, bufLast, bufFull, ended
	dialogs map[string]*dialogFlights // dialog channel → its flights
}

// dialogFlights are a dialog's reads: cur is reading or lingering (and
// buffers dispatched events); next waits for cur's read to end.
type dialogFlights struct{ cur, next *flight }

// flight is one recovery read. res and err are written before done is
// closed and read only after.
type flight struct {
	dialogID string
	since    int64   // the lowest sinceSeq it reads from; fixed once it reads
	prev     *flight // the read it waits for (as next)
	done     chan struct{}
	res      store.DialogRecovery
	err      error
	ended    bool
	buf      []bufferedEvent // message.created frames dispatched since it started reading
	bufBytes int             // the bytes of buf's frames
	bufLast  int64           // the highest seq dispatched since it started reading, kept when buf is let go
	bufFull  bool            // more than RecoverMax, or RecoverBytes of them, were dispatched: no longer joinable
}

type bufferedEvent struct {
	seq int64
	b   []byte
}

// kept is what a subscriber that joined a read finds beside it: the
// events dispatched since the read began (none once full), and the
// highest seq among them, which it still knows when full.
type kept struct {
	events []bufferedEvent
	full   bool
	last   int64
}

// recovery is what one subscribe with sinceSeq gets.
type recovery struct {
	ok      bool     // false: a resync for the dialog, then subscribed recovered=false
	frames  [][]byte // the missed events in seq order (ok only)
	lastSeq int64    // subscribed.lastSeq
	upTo    int64    // pending message.created events with seq ≤ upTo are already covered
}

// errRecoveryBudget: the subscribe needs a recovery read of its own and
// its user has none left on this instance for now.
var errRecoveryBudget = errors.New("gateway: recovery reads spent")

func newRecoverer(cfg *Config, read recoveryReader) *recoverer {
	return &recoverer{cfg: cfg, read: read, dialogs: map[string]*dialogFlights{},
		reads: newUserHandshakes(cfg.RecoverReadRate, cfg.RecoverReadBurst)}
}

// recover serves userID's subscribe to dialogID with sinceSeq since whose
// channel is attached already (its events wait in the subscription's
// pending queue). It fails with errRecoveryBudget when the subscribe needs
// a read the user has no budget for.
func (r *recoverer) recover(userID, dialogID, channel string, since int64) (recovery, error) {
	f, joined, err := r.await(userID, dialogID, channel, since, true)
	if err != nil {
		return recovery{}, err
	}
	if f.err != nil {
		return recovery{}, f.err
	}
	var k kept
	if joined {
		r.mu.Lock()
		k = kept{slices.Clone(f.buf), f.bufFull, f.bufLast}
		r.mu.Unlock()
		if since > knownLastSeq(f.res, k.events) {
			// The read it joined knows no seq as high as since: either
			// the dialog never had it, or its event has not reached this
			// instance yet. A read of its own tells which, so the
			// subscribe gets the answer it would have got without
			// joining.
			if f, _, err = r.await(userID, dialogID, channel, since, false); err != nil {
				return recovery{}, err
			}
			if f.err != nil {
				return recovery{}, f.err
			}
			joined, k = false, kept{}
		}
	}
	return r.outcome(f.res, since, joined, k), nil
}

// count records how a subscribe with sinceSeq was answered: recovered, or
// with the dialog's resync.
func (r *recoverer) count(recovered bool) {
	if recovered {
		r.recovered.Add(1)
	} else {
		r.resyncs.Add(1)
	}
}

// await returns the ended flight that serves since (see join), making its
// read when this caller leads it; joined as join reports it.
func (r *recoverer) await(userID, dialogID, channel string, since int64, mayJoin bool) (f *flight, joined bool, err error) {
	f, leader, joined, err := r.join(userID, dialogID, channel, since, mayJoin)
	if err != nil {
		return nil, false, err
	}
	if leader {
		r.run(channel, f)
	} else {
		<-f.done // bounded: at most two reads of SubscribeTimeout each
	}
	return f, joined, nil
}

// join finds the flight that serves since: the current one when it reads
// from at most since (its buffer covers whatever it read before this
// subscriber attached) and mayJoin, else the next one (lowering its
// since), else a new one this caller leads, paid for with one of
// userID's recovery reads (errRecoveryBudget when none is left).
func (r *recoverer) join(userID, dialogID, channel string, since int64, mayJoin bool) (f *flight, leader, joined bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	df := r.dialogs[channel]
	if df != nil {
		if cur := df.cur; mayJoin && cur != nil && since >= cur.since && !cur.bufFull && (!cur.ended || cur.err == nil) {
			return cur, false, true, nil
		}
		if df.next != nil {
			df.next.since = min(df.next.since, since)
			return df.next, false, false, nil
		}
	}
	if _, ok := r.reads.take(userID); !ok {
		return nil, false, false, errRecoveryBudget
	}
	if df == nil {
		df = &dialogFlights{}
		r.dialogs[channel] = df
		r.active.Add(1)
	}
	f = &flight{dialogID: dialogID, since: since, done: make(chan struct{})}
	if df.cur == nil || df.cur.ended {
		df.cur = f
	} else {
		f.prev, df.next = df.cur, f
	}
	return f, true, false, nil
}

// run makes the read of f (after the one it waits for) and publishes the
// result to its waiters.
func (r *recoverer) run(channel string, f *flight) {
	if f.prev != nil {
		<-f.prev.done
		r.mu.Lock()
		df := r.dialogs[channel] // kept while next is set
		df.cur, df.next = f, nil
		r.mu.Unlock()
	}
	ctx, cancel := opContext(r.cfg.SubscribeTimeout)
	// Bounded as it reads, by count and by bytes: a read that goes past
	// either answers its own subscribers with a resync, and keeps (for
	// the joiners of the linger) only the newest events, within
	// RecoverBytes of frames.
	res, err := r.read.RecoverDialog(ctx, f.dialogID, f.since, r.cfg.RecoverWindow, r.cfg.RecoverMax+1, r.cfg.RecoverBytes)
	cancel()
	if err != nil {
		r.readErrors.Add(1)
	} else {
		r.readsOK.Add(1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f.res, f.err, f.ended = res, err, true
	close(f.done)
	if err != nil {
		r.retireLocked(channel, f)
		return
	}
	time.AfterFunc(r.cfg.RecoverLinger, func() {
		r.mu.Lock()
		r.retireLocked(channel, f)
		r.mu.Unlock()
	})
}

// retireLocked stops f serving joiners (if it is still the current read)
// and forgets the dialog once it has no read.
func (r *recoverer) retireLocked(channel string, f *flight) {
	df := r.dialogs[channel]
	if df == nil || df.cur != f {
		return
	}
	df.cur = nil // its buffer stays for the waiters that joined it
	if df.next == nil {
		delete(r.dialogs, channel)
		r.active.Add(-1)
	}
}

// forget stops the reads of channels serving later subscribes: the
// Pub/Sub link was down, so their buffers may lack events. Subscribes
// already served get the link's resync.
func (r *recoverer) forget(channels []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range channels {
		r.forgetLocked(ch)
	}
}

// forgetChannel is forget for one channel the instance stops listening
// on: its last local subscriber left, so events published until the next
// subscribe never reach the read's buffer. Subscribes already served hold
// their subscription from before; a later one gets a read of its own.
func (r *recoverer) forgetChannel(channel string) {
	if r.active.Load() == 0 {
		return
	}
	r.mu.Lock()
	r.forgetLocked(channel)
	r.mu.Unlock()
}

func (r *recoverer) forgetLocked(ch string) {
	if df := r.dialogs[ch]; df != nil && df.cur != nil {
		if df.cur.ended {
			r.retireLocked(ch, df.cur)
		} else {
			df.cur.bufFull = true // still reading: no new joiner
		}
	}
}

// observe keeps a message.created frame (seq > 0) dispatched on channel
// beside the dialog's current read. Hub.Dispatch calls it for every
// durable frame. Beside a read it keeps at most RecoverMax frames and
// RecoverBytes of them, as much as one replay may carry (a replay that
// needs more is a resync): past either bound it lets go of them all, the
// read serves no later subscribe (the next one gets a read of its own),
// and the subscribes that joined it already get the dialog's resync.
func (r *recoverer) observe(channel string, seq int64, payload []byte) {
	if seq == 0 || r.active.Load() == 0 {
		return
	}
	r.mu.Lock()
	if df := r.dialogs[channel]; df != nil && df.cur != nil && !df.cur.bufFull {
		f := df.cur
		f.bufLast = max(f.bufLast, seq)
		if len(f.buf) >= r.cfg.RecoverMax || f.bufBytes+len(payload) > r.cfg.RecoverBytes {
			f.buf, f.bufBytes, f.bufFull = nil, 0, true
		} else {
			f.buf = append(f.buf, bufferedEvent{seq, payload})
			f.bufBytes += len(payload)
		}
	}
	r.mu.Unlock()
}

// knownLastSeq is the dialog's last seq as a read knows it, with the
// events kept beside it.
func knownLastSeq(res store.DialogRecovery, extra []bufferedEvent) int64 {
	last := res.LastSeq
	for _, e := range extra {
		last = max(last, e.seq)
	}
	return last
}

// outcome decides what a subscriber with sinceSeq since gets from a read
// (and, when it joined a read already under way, from the events
// dispatched since that read began, k). Recovered, the subscription drops
// the message.created events up to since (conn.deliver): so a since beyond
// every seq the read knows is never recovered, whether the subscriber made
// the read or joined it. Not recovered, lastSeq is still the highest seq
// dispatched beside the read when its events were let go: a joiner
// attached after some of them, and is told to reconcile up to them.
func (r *recoverer) outcome(res store.DialogRecovery, since int64, joined bool, k kept) recovery {
	fail := recovery{lastSeq: max(knownLastSeq(res, k.events), k.last)}
	evs := res.Events
	if !res.Complete && (len(evs) == 0 || evs[0].Seq > since) {
		return fail // more than RecoverMax after since
	}
	if since > fail.lastSeq {
		return fail // seqs the dialog never had
	}
	out := recovery{ok: true, upTo: since}
	size := 0
	for _, e := range evs {
		if e.Seq <= since {
			continue
		}
		if e.Frame == nil {
			return fail // older than the window, or never in the outbox
		}
		out.frames = append(out.frames, e.Frame)
		size += len(e.Frame)
		out.upTo = e.Seq
	}
	if joined {
		if k.full {
			return fail
		}
		slices.SortFunc(k.events, func(a, b bufferedEvent) int { return cmp.Compare(a.seq, b.seq) })
		for _, e := range k.events {
			switch {
			case e.seq <= out.upTo:
			case e.seq == out.upTo+1:
				out.frames = append(out.frames, e.b)
				size += len(e.b)
				out.upTo = e.seq
			default:
				// A gap: the missing event may reach this subscriber
				// after ones it would already have.
				return fail
			}
		}
	}
	if len(out.frames) > r.cfg.RecoverMax || size > r.cfg.RecoverBytes {
		return fail
	}
	out.lastSeq = fail.lastSeq
	if len(out.frames) > 0 {
		out.lastSeq = max(out.lastSeq, out.upTo)
	}
	return out
}
