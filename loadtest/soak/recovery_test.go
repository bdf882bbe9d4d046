package soak

import (
	"testing"
	"time"
)

// Recovery runs from the fault's end to the first 201 and to the first
// socket back of those still down then; errors count from the fault's
// start to the end of its recovery.
func TestRecoveryFromTheFaultsEnd(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tl := &timeline{
		sendsOK: []time.Time{at(-500), at(1000), at(3200), at(5000)},
		outages: []outage{
			{down: at(500), up: at(4000)},  // down at the end, back 1 s later
			{down: at(1000), up: at(2000)}, // back on the other instance during the fault
			{down: at(600), up: at(4500)},  // the last one back
			{down: at(-9000), up: at(-8000)},
		},
		errs: []clientErr{{at(-100), "503 x"}, {at(100), "503 redis_unavailable"}, {at(3100), "transport"}, {at(9000), "503 y"}},
	}
	rec := FaultRecord{Start: at(0), End: at(3000)}
	tl.recovery(&rec, at(20000))
	if rec.SendRecoveryMs != 200 || rec.SocketRecoveryMs != 1000 || rec.AllSocketsMs != 1500 || rec.SocketsLost != 3 {
		t.Fatalf("got send %d ms, socket %d ms, all %d ms, lost %d", rec.SendRecoveryMs, rec.SocketRecoveryMs, rec.AllSocketsMs, rec.SocketsLost)
	}
	if len(rec.Errors) != 2 || rec.Errors["503 redis_unavailable"] != 1 || rec.Errors["transport"] != 1 {
		t.Fatalf("errors %v", rec.Errors)
	}

	// Nothing recovers before the window closes: reported, not zero.
	rec = FaultRecord{Start: at(0), End: at(3000)}
	(&timeline{sendsOK: []time.Time{at(1000)}, outages: []outage{{down: at(500)}}}).recovery(&rec, at(10000))
	if rec.SendRecoveryMs != -1 || rec.SocketRecoveryMs != -2 {
		t.Fatalf("no recovery: got send %d, socket %d", rec.SendRecoveryMs, rec.SocketRecoveryMs)
	}

	// Every lost socket back before the end: 0; none lost: -1.
	rec = FaultRecord{Start: at(0), End: at(3000)}
	(&timeline{outages: []outage{{down: at(500), up: at(900)}}}).recovery(&rec, at(10000))
	if rec.SocketRecoveryMs != 0 || rec.SocketsLost != 1 {
		t.Fatalf("sockets back during the fault: got %d (lost %d)", rec.SocketRecoveryMs, rec.SocketsLost)
	}
	rec = FaultRecord{Start: at(0), End: at(3000)}
	(&timeline{}).recovery(&rec, at(10000))
	if rec.SocketRecoveryMs != -1 {
		t.Fatalf("no socket lost: got %d", rec.SocketRecoveryMs)
	}
}
