package clustertest_test

import (
	"context"
	"testing"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// gwDialog is a dialog placed on one master: its channel and the user
// channels of every member with a socket live there, so a failure of
// that master concerns all of its sockets and a failure elsewhere none.
type gwDialog struct {
	id        string
	master    *testenv.RedisServer
	senderTok string
	members   []string  // the receiving members, one per instance
	socks     []*socket // one per instance, in instance order
}

func (d *gwDialog) channel() string { return pubsub.DialogChannel(d.id) }

// layout creates perMaster dialogs on each master of c. Each has a sender
// (no socket) and one receiving member per instance, each with a socket on
// that instance subscribed to the dialog alone.
func layout(t *testing.T, c *testenv.RedisCluster, gws []*gw, perMaster int) []*gwDialog {
	t.Helper()
	ctx := context.Background()
	masters, err := c.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	var out []*gwDialog
	for _, m := range masters {
		for range perMaster {
			d := &gwDialog{master: m}
			_, d.senderTok = userOn(t, c, gws[0], m)
			members := make([]string, len(gws))
			toks := make([]string, len(gws))
			for i := range gws {
				members[i], toks[i] = userOn(t, c, gws[i], m)
			}
			d.members = members
			for try := 0; d.id == ""; try++ {
				if try == 100 {
					t.Fatalf("no dialog channel landed on master %s", m.Addr())
				}
				if try > 0 && try%10 == 0 {
					// A new creator every ten dialogs: one user may create
					// 20 a minute, and a master that owns few slots (after
					// another test moved some) may take more tries.
					_, d.senderTok = userOn(t, c, gws[0], m)
				}
				id := createDialog(t, gws[try%len(gws)], d.senderTok, members...)
				if owner, err := c.MasterOf(ctx, pubsub.DialogChannel(id)); err != nil {
					t.Fatal(err)
				} else if owner == m {
					d.id = id
				}
			}
			for i, g := range gws {
				d.socks = append(d.socks, dialSocket(t, g, toks[i], d.id))
			}
			out = append(out, d)
		}
	}
	return out
}

// send posts one message to d through g and returns its seq.
func (d *gwDialog) send(t *testing.T, g *gw, body string) int64 {
	t.Helper()
	var m struct {
		Seq int64 `json:"seq"`
	}
	decodeInto(t, mustCall(t, 201, "POST", g.url()+"/v1/dialogs/"+d.id+"/messages", d.senderTok,
		`{"body":"`+body+`"}`, map[string]string{"Idempotency-Key": ids.New()}), &m)
	return m.Seq
}

// quiet fails the test if any socket of ds received a resync, ended, or
// got a frame that breaks its schema.
func quiet(t *testing.T, ds []*gwDialog) {
	t.Helper()
	for _, d := range ds {
		for _, s := range d.socks {
			resyncs, ended, bad := s.state()
			if len(resyncs) > 0 {
				t.Errorf("socket %s (dialog on %s) got %v, yet no channel of it lost its master", s.name, d.master.Addr(), resyncs)
			}
			if ended != nil {
				t.Errorf("socket %s ended: %v", s.name, ended)
			}
			if bad != "" {
				t.Errorf("socket %s: frame breaks its schema: %s", s.name, bad)
			}
		}
	}
}
