package gateway

import (
	"net"
	"testing"
	"time"
)

// deadlineConn records the write deadlines set on it.
type deadlineConn struct {
	net.Conn
	set []time.Time
}

func (d *deadlineConn) SetWriteDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return nil
}

func (d *deadlineConn) Write(p []byte) (int, error) { return len(p), nil }

// Every batch starts with at least the write timeout left on the socket's
// deadline, and a connection writing many batches sets a deadline about
// once per half timeout, not once per batch.
func TestCorkDeadlineCoversEveryBatchAndIsReused(t *testing.T) {
	const timeout = 10 * time.Second
	dc := &deadlineConn{}
	c := &corkConn{Conn: dc}
	start := time.Unix(1_000_000, 0)
	batches := 0
	for now := start; now.Before(start.Add(time.Minute)); now = now.Add(100 * time.Millisecond) {
		if err := c.cork(now, timeout); err != nil {
			t.Fatal(err)
		}
		if _, err := c.writeText([]byte(`{"type":"event"}`)); err != nil {
			t.Fatal(err)
		}
		if err := c.uncork(); err != nil {
			t.Fatal(err)
		}
		batches++
		if len(dc.set) == 0 {
			t.Fatal("no write deadline set for a batch")
		}
		if left := dc.set[len(dc.set)-1].Sub(now); left < timeout || left > timeout+timeout/2 {
			t.Fatalf("batch at +%v starts with %v left on its deadline, want %v..%v", now.Sub(start), left, timeout, timeout+timeout/2)
		}
	}
	// One minute of batches every 100 ms: a deadline every 5 s or so.
	if n := len(dc.set); n > 14 {
		t.Fatalf("%d deadlines set for %d batches in a minute, want about one per half timeout (12)", n, batches)
	}

	// A control frame written outside a batch clears the deadline, and the
	// next batch sets a fresh one.
	if _, err := c.Write([]byte{0x8a, 0}); err != nil { // a pong
		t.Fatal(err)
	}
	if last := dc.set[len(dc.set)-1]; !last.IsZero() {
		t.Fatalf("a write outside a batch left the deadline at %v", last)
	}
	now := start.Add(2 * time.Minute)
	if err := c.cork(now, timeout); err != nil {
		t.Fatal(err)
	}
	c.discard()
	if last := dc.set[len(dc.set)-1]; last.Sub(now) < timeout {
		t.Fatalf("after a cleared deadline the batch got %v", last.Sub(now))
	}
}
