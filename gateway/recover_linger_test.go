package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/pubsub"
)

// A recovery read keeps serving later subscribes of its dialog for
// RecoverLinger (2 s by default), completed with the events the instance
// dispatched since the read began. Those are only the events the instance
// received: when the dialog's last local subscriber leaves, the instance
// unsubscribes, and a message sent then never reaches it. So the read
// stops serving joiners at that moment: a socket that subscribes again
// with sinceSeq within the linger gets a read of its own and the message.
// It used to join the old read and be told recovered:true with a lastSeq
// below the message, which it then never got (not replayed, not live, no
// resync).
func TestARecoveryReadServesNoSubscribeAfterItsDialogWasLeft(t *testing.T) {
	in := newInstance(t, openPool(t), opts{}) // default RecoverLinger: 2 s
	u := in.users(2)
	d := in.dialog(u[0], u[1])
	in.post(u[0], d, "1")

	// The user's phone reconnects and recovers the dialog, then leaves it
	// (closes the chat, or the socket drops).
	a := in.connect(u[1])
	if r := a.subscribeSince(d, 0); fmt.Sprint(seqs(r.events)) != "[1]" {
		t.Fatalf("first recovery: %v %s", seqs(r.events), r.sub.raw)
	}
	a.send(`{"type":"unsubscribe","dialogId":"` + d + `"}`)
	admin := env.Redis.AdminClient(1)
	defer admin.Close()
	ch := pubsub.DialogChannel(d)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return admin.PubSubNumSub(context.Background(), ch).Val()[ch] == 0
	}, "the instance did not unsubscribe the dialog")

	m2 := in.post(u[0], d, "2") // nobody on this instance listens to the dialog now

	// Another of the user's sockets (the laptop), which holds message 1,
	// subscribes with sinceSeq within the linger of the first read.
	b := in.connect(u[1])
	r := b.subscribeSince(d, 1)
	if fmt.Sprint(seqs(r.events)) != "[2]" || r.resync != nil || r.sub.Recovered == nil || !*r.sub.Recovered {
		t.Fatalf("message %d (seq %d) is missing: replayed %v, resync %v, subscribed %s — the client is told it is complete",
			m2.Seq, m2.Seq, seqs(r.events), r.resync, r.sub.raw)
	}
}
