package project

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// Module budget leases. Reserving every publish's bytes on the module
// budget costs two module calls (reserve, settle) around the project
// script. Instead an instance leases a small chunk of the module budget
// (ModuleLeaseMaxBytes at most) and lets its publishes draw on it locally:
// most publishes then make one call, the project script. The lease's
// bytes count against the cap (field leased) from the moment it is granted
// until the instance returns it, with what its scripts added committed;
// so the module counter never under-counts. Near the cap (less than
// cap/ModuleLeaseKeepDivisor free after a lease) no lease is granted and
// every publish reserves exactly, as without leases.
const (
	// ModuleLeaseMaxBytes is the largest lease an instance takes.
	ModuleLeaseMaxBytes = 64 << 10
	// moduleLeaseTTL is how long a lease lives in Redis: past it the
	// reconcile drops it. moduleLeaseUse is how long the instance draws on
	// it after asking, well inside the TTL, so no script that draws on a
	// lease runs after the reconcile dropped it.
	moduleLeaseTTL = 10 * time.Second
	moduleLeaseUse = moduleLeaseTTL / 2
	// ModuleLeaseKeepDivisor: no lease is granted into the last
	// cap/ModuleLeaseKeepDivisor bytes of the module budget.
	ModuleLeaseKeepDivisor = 16
	// moduleLeaseBackoff is how long an instance reserves exactly after a
	// lease was refused, before it asks for one again.
	moduleLeaseBackoff = time.Second
	// moduleLeaseRetryAfter is how long the writes that need a renewal
	// fail at once after a renewal Redis did not answer, instead of
	// renewing again against a Redis that is likely still stalled.
	moduleLeaseRetryAfter = 250 * time.Millisecond
	// moduleLeaseAheadDivisor: once less than size/moduleLeaseAheadDivisor
	// of the lease is left, the write that sees it takes the next lease
	// while the others still draw on the rest.
	moduleLeaseAheadDivisor = 4
	// moduleLeaseCarryMax bounds the projects a lease call names besides
	// the asker's: those the instance drew for within moduleLeaseUse, which
	// the next lease may then draw for without a call of their own.
	moduleLeaseCarryMax = 512
)

// lease is one lease this instance holds; guarded by moduleLeases.mu.
type lease struct {
	id       string
	size     int64
	gen      int64     // module gen when it was granted
	deadline time.Time // no new draw after it
	used     int64     // bytes drawn by scripts in flight or added by them
	released int64     // bytes the scripts released
	inflight int       // scripts drawing on it now
	retired  bool      // replaced: returned when the last script is done
	// projects are those it may draw for: the call that granted it named
	// them, which added them to the module's projects SET and stamped them
	// there, so the reconcile keeps them while the lease is drawn on.
	projects map[string]struct{}
	// drained, when set, is closed by the last script instead of
	// returning the lease itself: the renewal waiting on it returns it.
	drained chan struct{}
}

// moduleLeases is one instance's lease on the module budget. Safe for
// concurrent use.
type moduleLeases struct {
	mb   *ModuleBudget
	size int64 // 0: no leases
	// budget is the queue's Redis budget: no write waits longer than it
	// for a lease, whether it renews or waits for another write's renewal.
	budget time.Duration

	mu         sync.Mutex
	cur        *lease
	renewing   *renewal  // the renewal in progress, if any
	exactUntil time.Time // a lease was refused: reserve exactly until then
	// drawnAt is when the instance last drew for each project (within
	// moduleLeaseUse, 4×moduleLeaseCarryMax projects at most): the call
	// that takes the next lease names them again.
	drawnAt map[string]time.Time
	// failedUntil: a renewal got no reply from Redis (failedErr); until
	// then the writes that need a renewal fail with failedErr at once.
	failedUntil time.Time
	failedErr   error
}

// renewal is one renewal of the lease in progress. The writes waiting for
// it share its outcome: when it failed, they fail with its error instead
// of renewing again one after another, each waiting out its own timeout
// behind the others' (during a Redis stall the n-th write would answer
// only after n timeouts).
type renewal struct {
	done chan struct{} // closed when the renewal ends
	err  error         // why it failed (nil: it did not); set before done is closed
}

func newModuleLeases(mb *ModuleBudget, size int64, budget time.Duration) *moduleLeases {
	return &moduleLeases{mb: mb, size: min(max(size, 0), ModuleLeaseMaxBytes), budget: budget, drawnAt: map[string]time.Time{}}
}

// newLease is the lease id granted by a call at asked that named asker
// and carried.
func newLease(id string, size, gen int64, asked time.Time, asker string, carried []string) *lease {
	l := &lease{id: id, size: size, gen: gen, deadline: asked.Add(moduleLeaseUse),
		projects: make(map[string]struct{}, len(carried)+1)}
	l.projects[asker] = struct{}{}
	for _, p := range carried {
		l.projects[p] = struct{}{}
	}
	return l
}

// drewLocked notes a draw for projectID at now. Called with m.mu held.
func (m *moduleLeases) drewLocked(projectID string, now time.Time) {
	if _, ok := m.drawnAt[projectID]; ok || len(m.drawnAt) < 4*moduleLeaseCarryMax {
		m.drawnAt[projectID] = now
	}
}

// carriedLocked lists the projects drawn for within moduleLeaseUse before
// now (moduleLeaseCarryMax at most), for the call that takes the next
// lease to name: the projects written steadily stay named from lease to
// lease, an idle one needs a call of its own again. It forgets the older
// draws. Called with m.mu held.
func (m *moduleLeases) carriedLocked(now time.Time) []string {
	var out []string
	for p, at := range m.drawnAt {
		switch {
		case now.Sub(at) > moduleLeaseUse:
			delete(m.drawnAt, p)
		case len(out) < moduleLeaseCarryMax:
			out = append(out, p)
		}
	}
	return out
}

// grant is what one write holds of the module budget while its project
// script runs: amount bytes of a lease, or an exact reservation, or
// nothing (granted false; r.Gen still serves a release).
type grant struct {
	l       *lease
	r       Reservation
	amount  int64
	granted bool
	// renewed, when not nil, is closed when the renewal ahead this write
	// started ends; done waits for it, so the renewal overlaps the write's
	// own script instead of preceding it, and never outlives the write.
	renewed chan struct{}
}

// acquire grants need bytes to a write of projectID. It waits for a lease
// no longer than ctx allows and the Redis budget.
func (m *moduleLeases) acquire(ctx context.Context, projectID string, need int64) (grant, error) {
	wctx, cancel := context.WithTimeout(ctx, m.budget)
	defer cancel()
	if m.size == 0 || need > m.size {
		return m.exact(wctx, projectID, need)
	}
	for {
		m.mu.Lock()
		now := time.Now()
		if l := m.cur; l != nil && now.Before(l.deadline) && l.size-l.used >= need {
			if _, named := l.projects[projectID]; named {
				return m.drawLocked(wctx, l, projectID, need, now), nil
			}
		}
		if now.Before(m.failedUntil) {
			err := m.failedErr
			m.mu.Unlock()
			return grant{}, err
		}
		if m.cur == nil && now.Before(m.exactUntil) {
			m.mu.Unlock()
			return m.exact(wctx, projectID, need)
		}
		if r := m.renewing; r != nil {
			m.mu.Unlock()
			select {
			case <-r.done:
				if r.err != nil {
					return grant{}, r.err
				}
				continue
			case <-wctx.Done():
				return grant{}, classifyProject(wctx.Err())
			}
		}
		return m.renewLocked(wctx, projectID, need, now)
	}
}

// drawLocked draws need bytes on l for a write of projectID and, when
// that leaves little of l, starts the renewal ahead. Called with m.mu
// held; it unlocks it.
func (m *moduleLeases) drawLocked(ctx context.Context, l *lease, projectID string, need int64, now time.Time) grant {
	l.used += need
	l.inflight++
	m.drewLocked(projectID, now)
	ahead := m.renewing == nil && l.size-l.used < m.size/moduleLeaseAheadDivisor && !now.Before(m.exactUntil) &&
		!now.Before(m.failedUntil)
	var r *renewal
	var carry []string
	if ahead {
		r = &renewal{done: make(chan struct{})}
		m.renewing = r
		carry = m.carriedLocked(now)
	}
	m.mu.Unlock()
	g := grant{l: l, amount: need, granted: true}
	if ahead {
		g.renewed = make(chan struct{})
		go func() {
			defer close(g.renewed)
			m.renewAhead(ctx, projectID, carry, now, r)
		}()
	}
	return g
}

// renewLocked is the renewal by this write: it retires the current lease,
// waits for the scripts still drawing on it (one round trip at most) so it
// is returned in the same call, and asks for the next lease, or an exact
// reservation for itself. Called with m.mu held; it unlocks it. The writes
// that arrive meanwhile wait for it and share its outcome.
func (m *moduleLeases) renewLocked(ctx context.Context, projectID string, need int64, now time.Time) (grant, error) {
	old := m.cur
	carry := m.carriedLocked(now)
	ret := m.retireLocked()
	var drained chan struct{}
	if old != nil && ret == nil {
		drained = make(chan struct{})
		old.drained = drained
	}
	r := &renewal{done: make(chan struct{})}
	m.renewing = r
	m.mu.Unlock()
	if drained != nil {
		ret = m.awaitDrained(ctx, old, drained)
	}
	// The renewal also returns a lease: the client may not cancel it, but
	// it ends with the write's budget.
	rctx, cancel := budgeted(ctx)
	g, err := m.renew(rctx, ret, projectID, carry, need, now)
	cancel()
	m.mu.Lock()
	m.endRenewalLocked(r, err)
	m.mu.Unlock()
	return g, err
}

// endRenewalLocked ends renewal r with err and wakes the writes waiting
// for it. After a renewal Redis did not answer (a stall, a lost
// connection) the writes that need a renewal fail at once for
// moduleLeaseRetryAfter: the next renewal would most likely wait out a
// full timeout as well. An answered error (OOM) holds off nothing. Called
// with m.mu held.
func (m *moduleLeases) endRenewalLocked(r *renewal, err error) {
	r.err = err
	m.renewing = nil
	switch {
	case err == nil:
		m.failedUntil, m.failedErr = time.Time{}, nil
	case errors.Is(err, rds.ErrRedisUnavailable):
		m.failedUntil, m.failedErr = time.Now().Add(moduleLeaseRetryAfter), err
	}
	close(r.done)
}

// awaitDrained waits until no script draws on the retired lease l and
// returns it for the renewal to return. When ctx ends first, the last
// script returns l itself (nil is returned) unless it is already done.
func (m *moduleLeases) awaitDrained(ctx context.Context, l *lease, drained chan struct{}) *lease {
	select {
	case <-drained:
		return l
	case <-ctx.Done():
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.inflight == 0 {
		return l // closed meanwhile
	}
	l.drained = nil
	return nil
}

// renewAhead takes the next lease while the current one still has room
// (the caller already drew on it, and its done waits for this renewal), so
// the other writes go on drawing on the current lease instead of waiting
// for a renewal when it runs out. The current lease is retired when the
// next one is granted, and its last script returns it. Near the cap no
// lease is granted: the current one serves until it runs out, then writes
// reserve exactly. A failed call leaves the current lease in use: the
// renewal happens when it runs out (the writes waiting meanwhile share the
// failure, as with any renewal). r is the renewal marker the caller set;
// renewAhead ends it. ctx's deadline, the write's budget, bounds the call.
func (m *moduleLeases) renewAhead(ctx context.Context, projectID string, carry []string, asked time.Time, r *renewal) {
	id := newBudgetID()
	rctx, cancel := budgeted(ctx)
	res, err := m.mb.lease(rctx, nil, leaseAsk{id: id, amount: m.size, projectID: projectID, carry: carry})
	cancel()
	m.mu.Lock()
	defer func() {
		m.endRenewalLocked(r, err)
		m.mu.Unlock()
	}()
	switch {
	case err != nil:
	case res.outcome == 2:
		// The caller's own grant draws on the current lease, so it is
		// never returnable here: its last script returns it.
		m.retireLocked()
		m.cur = newLease(id, m.size, res.gen, asked, projectID, carry)
	default:
		m.exactUntil = time.Now().Add(moduleLeaseBackoff)
	}
}

// retireLocked takes the current lease out of use and returns it when it
// can be returned now (no script draws on it).
func (m *moduleLeases) retireLocked() *lease {
	old := m.cur
	m.cur = nil
	if old == nil {
		return nil
	}
	old.retired = true
	if old.inflight == 0 {
		return old
	}
	return nil
}

// renew returns ret (if any) and takes a new lease drawing need for the
// caller (and naming the carried projects too), or an exact reservation
// of need when the module is near its cap.
func (m *moduleLeases) renew(ctx context.Context, ret *lease, projectID string, carry []string, need int64, asked time.Time) (grant, error) {
	id := newBudgetID()
	res, err := m.mb.lease(ctx, ret, leaseAsk{id: id, amount: m.size, exact: need, projectID: projectID, carry: carry})
	if err != nil {
		// ret stays unreturned: its bytes stay counted until the
		// reconcile drops it, which only over-counts.
		return grant{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch res.outcome {
	case 2:
		// Renewals run one at a time, so m.cur is nil here.
		l := newLease(id, m.size, res.gen, asked, projectID, carry)
		l.used, l.inflight = need, 1
		m.drewLocked(projectID, time.Now())
		m.cur = l
		return grant{l: l, amount: need, granted: true}, nil
	case 1:
		m.exactUntil = time.Now().Add(moduleLeaseBackoff)
		return grant{r: Reservation{ID: id, Amount: need, Gen: res.gen}, amount: need, granted: true}, nil
	}
	m.exactUntil = time.Now().Add(moduleLeaseBackoff)
	return grant{r: Reservation{Gen: res.gen}}, nil
}

// exact reserves need bytes for this write alone.
func (m *moduleLeases) exact(ctx context.Context, projectID string, need int64) (grant, error) {
	r, ok, err := m.mb.Reserve(ctx, projectID, need)
	if err != nil {
		return grant{}, err
	}
	return grant{r: r, amount: need, granted: ok}, nil
}

// done ends a write: added bytes of its grant were kept by the project
// script, released bytes it freed. A lease takes both locally (the bytes
// not kept are free again); an exact reservation settles now. The module
// calls it makes (a settle, the return of a retired lease) run with a
// context the client cannot cancel: a refund must not be lost to a closed
// connection. It reports whether such a call failed.
func (m *moduleLeases) done(ctx context.Context, g grant, added, released int64) error {
	if g.renewed != nil {
		<-g.renewed
	}
	if l := g.l; l != nil {
		m.mu.Lock()
		l.used -= g.amount - added
		l.released += released
		l.inflight--
		last := l.retired && l.inflight == 0
		drained := l.drained
		if last && drained != nil {
			l.drained, last = nil, false
		} else {
			drained = nil
		}
		m.mu.Unlock()
		if drained != nil {
			close(drained) // the waiting renewal returns it
		}
		if last {
			return m.giveBack(ctx, l)
		}
		return nil
	}
	if !g.granted && released == 0 {
		return nil
	}
	sctx, cancel := uncancelable(ctx)
	defer cancel()
	return m.mb.Settle(sctx, g.r, added, released)
}

// giveBack returns a retired lease nothing draws on any more.
func (m *moduleLeases) giveBack(ctx context.Context, l *lease) error {
	sctx, cancel := uncancelable(ctx)
	defer cancel()
	_, err := m.mb.lease(sctx, l, leaseAsk{})
	return err
}

// uncancelable is ctx without its cancellation, bounded to 2 s, for the
// module calls that return bytes.
func uncancelable(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
}

// budgeted is uncancelable(ctx) that also ends at ctx's deadline, for the
// lease calls a write waits for: they return bytes, so the client may not
// cancel them, but no write waits for one past its budget.
func budgeted(ctx context.Context) (context.Context, context.CancelFunc) {
	end := time.Now().Add(2 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(end) {
		end = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), end)
}

// leaseAsk is the new lease (or exact reservation) a lease call asks for;
// a zero value asks for none. A granted lease may draw for projectID and
// carry; an exact reservation is for projectID alone.
type leaseAsk struct {
	id        string
	amount    int64
	exact     int64
	projectID string
	carry     []string
}

type leaseResult struct {
	outcome int64 // 2 lease, 1 exact reservation, 0 neither
	gen     int64
}

// lease returns ret (if not nil) and takes what ask asks for, in one call.
func (b *ModuleBudget) lease(ctx context.Context, ret *lease, ask leaseAsk) (leaseResult, error) {
	retID, used, released, gen := "", int64(0), int64(0), int64(0)
	if ret != nil {
		retID, used, released, gen = ret.id, ret.used, ret.released, ret.gen
	}
	args := append([]any{retID, used, released, gen, ask.id, ask.amount, moduleLeaseTTL.Milliseconds(), b.cap,
		b.cap / ModuleLeaseKeepDivisor, ask.exact, ask.projectID}, anys(ask.carry)...)
	res, err := lua.ProjectTopicBudgetLease.Run(ctx, b.rdb,
		[]string{b.keys.Budget(), b.keys.Reservations(), b.keys.Leases(), b.keys.Projects(), b.keys.Seen()}, args...).Int64Slice()
	if err != nil {
		return leaseResult{}, classifyProject(err)
	}
	if len(res) != 5 {
		return leaseResult{}, ErrDataStateInvalid
	}
	return leaseResult{outcome: res[0], gen: res[1]}, nil
}

// newBudgetID is a random reservation or lease id.
func newBudgetID() string {
	var id [12]byte
	_, _ = rand.Read(id[:])
	return hex.EncodeToString(id[:])
}
