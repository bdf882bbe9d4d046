package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// A group sending into two dialogs waits for the first one's row lock
// while another instance sends into the second: the group's message there
// takes the next seq, so it must not carry an earlier createdAt than the
// message before it. Clients order dialogs by lastMessage.createdAt and
// show history with these times.
func TestCreatedAtFollowsSeqWhenAGroupWaitedForALock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hold   bool // keep the group waiting for as long as the lock is held
		linger time.Duration
	}{
		{"lock wait held", true, 100 * time.Millisecond},
		{"default lock wait", false, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st1, pool := openStore(t)
			st2 := store.New(pool) // a second instance
			a, b := ids.New(), ids.New()
			for _, u := range []string{a, b} {
				if err := st1.EnsureUser(ctx, u); err != nil {
					t.Fatal(err)
				}
			}
			d1, d2 := newDialog(t, st1, a, b), newDialog(t, st1, a, b)
			if d1 > d2 {
				d1, d2 = d2, d1 // the group locks in id order: d1 first
			}
			if tc.hold {
				st1.HoldCommitterOnLocks()
			}
			st1.SetSendLinger(tc.linger)
			release, pid := holdDialogPID(t, d1)
			var wg sync.WaitGroup
			for _, d := range []string{d1, d2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, _, _, err := st1.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d, SenderID: a, Body: "group"}); err != nil {
						t.Errorf("group send into %s: %v", d, err)
					}
				}()
			}
			waitBlocked(t, pool, pid, 1) // the group's statement waits for d1
			if _, _, _, err := st2.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d2, SenderID: b, Body: "other instance"}); err != nil {
				t.Fatal(err)
			}
			release()
			wg.Wait()
			msgs, _, err := st1.ListMessages(ctx, d2, 0, 10)
			if err != nil || len(msgs) != 2 {
				t.Fatalf("history of d2: %v %v", msgs, err)
			}
			if msgs[0].Body != "other instance" {
				// Only a lock wait longer than the default makes this order
				// certain; with the default the group may give up first.
				if tc.hold {
					t.Fatalf("d2's seq 1 is %q, want the other instance's message", msgs[0].Body)
				}
				t.Logf("the group gave up its lock wait before the other instance sent")
			}
			if msgs[1].CreatedAt.Before(msgs[0].CreatedAt) {
				t.Errorf("d2 history: seq %d %q at %s, seq %d %q at %s: the later seq is older by %s",
					msgs[0].Seq, msgs[0].Body, msgs[0].CreatedAt.Format(time.StampMicro),
					msgs[1].Seq, msgs[1].Body, msgs[1].CreatedAt.Format(time.StampMicro), msgs[0].CreatedAt.Sub(msgs[1].CreatedAt))
			}
		})
	}
}

// Should the database server's clock step back, a dialog's next message
// still carries a createdAt no earlier than its previous one. The step is
// made by moving the previous message an hour ahead, as a clock an hour
// fast would have stamped it.
func TestCreatedAtNeverBeforeThePreviousMessageOfItsDialog(t *testing.T) {
	ctx := context.Background()
	st, pool := openStore(t)
	a, _, d := twoUsers(t, st)
	first, _, _, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d, SenderID: a, Body: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE messages SET created_at = created_at + interval '1 hour' WHERE id = $1`, first.ID); err != nil {
		t.Fatal(err)
	}
	second, _, _, err := st.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: d, SenderID: a, Body: "second"})
	if err != nil {
		t.Fatal(err)
	}
	msgs, _, err := st.ListMessages(ctx, d, 0, 10)
	if err != nil || len(msgs) != 2 {
		t.Fatalf("history: %v %v", msgs, err)
	}
	if msgs[1].CreatedAt.Before(msgs[0].CreatedAt) || second.CreatedAt.Before(msgs[0].CreatedAt) {
		t.Errorf("seq 2 stored at %s, answered at %s, before seq 1 at %s",
			msgs[1].CreatedAt.Format(time.StampMicro), second.CreatedAt.Format(time.StampMicro), msgs[0].CreatedAt.Format(time.StampMicro))
	}
	if !second.CreatedAt.Equal(msgs[1].CreatedAt) {
		t.Errorf("the send answered createdAt %s, the history holds %s", second.CreatedAt, msgs[1].CreatedAt)
	}
}

func newDialog(t *testing.T, st *store.Store, creator string, members ...string) string {
	t.Helper()
	d, err := st.CreateDialog(context.Background(), ids.New(), creator, "", members)
	if err != nil {
		t.Fatal(err)
	}
	return d.ID
}
