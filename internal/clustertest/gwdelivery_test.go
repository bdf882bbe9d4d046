package clustertest_test

import (
	"fmt"
	"testing"
	"time"
)

// Three whole gateways on one cluster: a socket on each instance
// subscribes to a dialog whose channel lives on each master; every
// instance holds one sharded subscription of the channel on its master
// (no classic one), and a message sent through any instance reaches the
// sockets on all three, and no socket gets another dialog's events.
func TestGatewaysDeliverAcrossInstancesAndMasters(t *testing.T) {
	shared(t)
	gws := startGateways(t, env.Cluster, 3)
	ds := layout(t, env.Cluster, gws, 1)
	for _, d := range ds {
		if s, n := shardSubscribers(t, env.Cluster, d.channel()); s != 3 || n != 0 {
			t.Fatalf("dialog on %s: %d sharded and %d classic subscribers on its master, want 3 (one per instance) and 0",
				d.master.Addr(), s, n)
		}
	}
	for _, d := range ds {
		var seqs []int64
		for i, g := range gws {
			seqs = append(seqs, d.send(t, g, fmt.Sprintf("from %s #%d", g.name, i)))
		}
		if seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 {
			t.Fatalf("dialog on %s: seqs %v, want 1 2 3 (one dialog, whichever instance takes the send)", d.master.Addr(), seqs)
		}
		waitDelivered(t, d.socks, d.id, seqs, 10*time.Second)
	}
	// Nothing else arrives.
	for _, d := range ds {
		for _, s := range d.socks {
			s.mu.Lock()
			for dialog := range s.seqs {
				if dialog != d.id {
					t.Errorf("socket %s got events of dialog %s it never subscribed to", s.name, dialog)
				}
			}
			s.mu.Unlock()
		}
	}
	quiet(t, ds)
}
