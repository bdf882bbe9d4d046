package gateway_test

import "testing"

// A subscribe to a dialog whose channel this instance already listens on
// costs Redis nothing and still checks membership: a non-member gets
// dialog_not_found and none of the dialog's events, a member gets
// subscribed with the current lastSeq and every message after it.
func TestSubscribeToAChannelTheInstanceHoldsChecksMembership(t *testing.T) {
	pool := openPool(t)
	in := newInstance(t, pool, opts{})
	u := in.users(3)
	alice, bob, carol := u[0], u[1], u[2]
	d := in.dialog(alice, carol)
	own := in.dialog(bob, alice)
	first := in.post(alice, d, "before")

	a := in.connect(alice)
	a.subscribe(d) // the instance now listens on d's channel
	b := in.connect(bob)
	b.subscribe(own)
	b.send(`{"type":"subscribe","dialogId":"` + d + `"}`)
	if f := b.expect("error"); f.Error != "dialog_not_found" {
		t.Fatalf("non-member subscribing to a held channel: %s", f.raw)
	}
	c := in.connect(carol)
	if seq := c.subscribe(d); seq != first.Seq {
		t.Fatalf("member joining a held channel: lastSeq %d, want %d", seq, first.Seq)
	}

	m := in.post(alice, d, "after")
	for name, cl := range map[string]*client{"alice": a, "carol": c} {
		if f := cl.expect("event"); f.DialogID != d || f.Seq != m.Seq {
			t.Fatalf("%s: got %s, want message seq %d of the dialog", name, f.raw, m.Seq)
		}
	}
	// Bob's next event is from his own dialog, published after: nothing
	// of d reached him.
	mine := in.post(alice, own, "to bob")
	if f := b.expect("event"); f.DialogID != own || f.Seq != mine.Seq {
		t.Fatalf("non-member got %s, want only his own dialog's message", f.raw)
	}
}
