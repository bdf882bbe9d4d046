package clustertest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// faultRun is a whole-gateway fault test's stage: its own cluster (the
// fault breaks it), three instances, two dialogs per master with a socket
// per instance each, and send traffic to all of them.
type faultRun struct {
	c   *testenv.RedisCluster
	gws []*gw
	ds  []*gwDialog
	tr  *traffic
}

func startFaultRun(t *testing.T) *faultRun {
	t.Helper()
	c := ownCluster(t, testenv.ClusterOptions{}) // stopped after the gateways (cleanups run last first)
	r := &faultRun{c: c}
	r.gws = startGateways(t, c, 3)
	r.ds = layout(t, c, r.gws, 2)
	r.tr = startTraffic(t, r.gws, r.ds)
	// Everything flows before the fault: two sends per dialog, delivered
	// to the sockets on all three instances.
	r.tr.waitSends(r.ds, 2, time.Time{}, 30*time.Second)
	for _, d := range r.ds {
		waitDelivered(t, d.socks, d.id, r.tr.allSeqs(d), 15*time.Second)
	}
	quiet(t, r.ds)
	if t.Failed() {
		t.FailNow()
	}
	return r
}

// recovered checks what follows a fault that concerned the dialogs hit
// and no other: each socket of hit got a resync; sends that began after
// the last of those resyncs are accepted and reach all three instances'
// sockets; the sockets of the other dialogs got no resync and every
// accepted send; PostgreSQL holds every accepted send exactly once with
// gapless seqs; every instance's /readyz is "ok" again.
func (r *faultRun) recovered(t *testing.T, hit []*gwDialog) {
	t.Helper()
	for _, d := range hit {
		for _, s := range d.socks {
			testenv.Eventually(t, 30*time.Second, func() bool {
				resyncs, _, _ := s.state()
				return len(resyncs) > 0
			}, "socket %s: no resync although its dialog's channel lost its master", s.name)
		}
	}
	mark := time.Now()
	r.tr.waitSends(r.ds, 3, mark, 30*time.Second)
	r.tr.checkStored(r.ds)
	for _, d := range r.ds {
		if slices.Contains(hit, d) {
			waitDelivered(t, d.socks, d.id, r.tr.since(d, mark), 15*time.Second)
			for _, s := range d.socks {
				resyncs, ended, bad := s.state()
				if ended != nil || bad != "" {
					t.Errorf("socket %s: ended %v, bad frame %q", s.name, ended, bad)
				}
				for _, f := range resyncs {
					if f != `{"type":"resync","reason":"pubsub_reconnect"}` {
						t.Errorf("socket %s: resync frame %s, want reason pubsub_reconnect", s.name, f)
					}
				}
			}
			continue
		}
		// No resync: then nothing may be missing (an event whose publish
		// failed comes through the outbox relay).
		waitDelivered(t, d.socks, d.id, r.tr.allSeqs(d), 15*time.Second)
	}
	// Every instance reports itself whole again (Redis, sharded Pub/Sub
	// and its canary), without a restart.
	for _, g := range r.gws {
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body, _, err := apiCall("GET", g.url()+"/readyz", "", "", nil)
			if code == 200 && strings.Contains(body, `"status":"ok"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateway %s: /readyz still %d %s (%v) 20s after the fault", g.name, code, body, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var others []*gwDialog
	for _, d := range r.ds {
		if !slices.Contains(hit, d) {
			others = append(others, d)
		}
	}
	quiet(t, others)
}

// Kill one master while messages are sent through all three instances:
// its replica takes over; the sockets of the dialogs whose channels it
// served get a resync and those of the other masters' dialogs none; no
// gateway restarts, sends are accepted and delivered again, and every
// accepted send is stored exactly once with gapless seqs.
func TestGatewaysSurviveMasterFailover(t *testing.T) {
	r := startFaultRun(t)
	victim := r.ds[0].master
	var hit []*gwDialog
	for _, d := range r.ds {
		if d.master == victim {
			hit = append(hit, d)
		}
	}
	probes := probeReadiness(r.gws)
	victim.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.c.WaitHealthy(ctx); err != nil {
		t.Fatalf("the replica did not take over: %v", err)
	}
	for _, d := range hit {
		if m, err := r.c.MasterOf(ctx, d.channel()); err != nil || m == victim {
			t.Fatalf("the dead master's slots were not taken over (%v)", err)
		}
	}
	r.recovered(t, hit)
	// While the master was away no instance left the load balancer: each
	// answered /readyz 200, degraded until its Pub/Sub shards were whole.
	for i, seen := range probes.stop() {
		t.Logf("gateway %s: /readyz during the failover: %v", r.gws[i].name, seen)
		if len(seen) == 0 || seen[`200 "degraded"`] == 0 {
			t.Errorf("gateway %s: /readyz during the failover %v, want 200 degraded", r.gws[i].name, seen)
		}
		for answer := range seen {
			if !strings.HasPrefix(answer, "200 ") {
				t.Errorf("gateway %s: /readyz answered %s during the failover (%v), want only 200", r.gws[i].name, answer, seen)
			}
		}
	}
}

// readinessProbes polls each instance's /readyz until stopped, as a load
// balancer does, and counts the answers by status code and "status".
type readinessProbes struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	seen  []map[string]int // per instance; read after stop
}

func probeReadiness(gws []*gw) *readinessProbes {
	p := &readinessProbes{stopc: make(chan struct{}), seen: make([]map[string]int, len(gws))}
	for i, g := range gws {
		p.seen[i] = map[string]int{}
		p.wg.Go(func() {
			for {
				select {
				case <-p.stopc:
					return
				case <-time.After(50 * time.Millisecond):
				}
				code, body, _, err := apiCall("GET", g.url()+"/readyz", "", "", nil)
				var ready struct {
					Status string `json:"status"`
				}
				if err != nil || json.Unmarshal([]byte(body), &ready) != nil {
					p.seen[i]["no answer"]++
					continue
				}
				p.seen[i][fmt.Sprintf("%d %q", code, ready.Status)]++
			}
		})
	}
	return p
}

func (p *readinessProbes) stop() []map[string]int {
	close(p.stopc)
	p.wg.Wait()
	return p.seen
}

// Move the slot of one dialog's channel to another master while messages
// are sent: the sockets of that dialog alone get a resync (not those of
// the other dialog on the same master), and the same guarantees hold.
func TestGatewaysSurviveSlotMove(t *testing.T) {
	r := startFaultRun(t)
	moved := r.ds[0]
	slot := testenv.Slot(moved.channel())
	for _, d := range r.ds[1:] {
		if testenv.Slot(d.channel()) == slot {
			t.Fatalf("two dialogs share slot %d: the test cannot tell them apart", slot)
		}
		for _, u := range d.members {
			if testenv.Slot(pubsub.UserChannel(u)) == slot {
				t.Fatalf("a member's user channel shares slot %d with the moved dialog", slot)
			}
		}
	}
	ctx := context.Background()
	masters, err := r.c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	to := masters[0]
	if to == moved.master {
		to = masters[1]
	}
	moveSlot(t, ctx, r.c, slot, moved.master, to)
	if m, err := r.c.MasterOf(ctx, moved.channel()); err != nil || m != to {
		t.Fatalf("slot %d not on the target after the move (%v)", slot, err)
	}
	r.recovered(t, []*gwDialog{moved})
}
