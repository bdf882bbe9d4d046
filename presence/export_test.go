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
