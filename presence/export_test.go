package presence

import "context"

// SweepInstance runs one sweep of instance id's index as Sweep does once
// it found the instance's marker expired, calling between, when not nil,
// between the batch's disconnects and its index removal.
func (p *Presence) SweepInstance(ctx context.Context, id string, between func()) (n int, done bool, err error) {
	p.afterSweepDisconnect = between
	defer func() { p.afterSweepDisconnect = nil }()
	return p.sweepInstance(ctx, id, 50, true)
}

// SetRetakeCap lowers the bound of the retake queue (retakeMax), so that a
// test overflows it with a handful of connections.
func (p *Presence) SetRetakeCap(n int) {
	p.mu.Lock()
	p.retakeCap = n
	p.mu.Unlock()
}

// SetAfterSweepDisconnect sets the hook Sweep runs between a batch's
// disconnects and its index removal (nil: none). Set it before the sweep.
func (p *Presence) SetAfterSweepDisconnect(fn func()) { p.afterSweepDisconnect = fn }

// Adopt hands a listing of users' offline checks (score) to their pending
// checks, as a disconnect pipeline's bookkeeping does.
func (p *Presence) Adopt(users []string, score int64) { p.adopt(users, score) }
