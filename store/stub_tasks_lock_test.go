package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// With the legacy stub off a send records no safety task, so it does not
// touch stub_tasks at all: an operator's lock on that table (a VACUUM
// FULL, an ALTER, a cleanup after the stub's cutover) holds no send. A send
// that does record a task waits for the lock, within its budget.
func TestSendsWithoutASafetyTaskIgnoreALockOnStubTasks(t *testing.T) {
	s, _ := openStore(t)
	s.SetRequestTimeout(2 * time.Second)
	f := newSendFixture(t, s, 2)
	ctx := context.Background()
	lock := testenv.LockTable(t, env.DatabaseURL, "stub_tasks", "ACCESS EXCLUSIVE")
	for i, sender := range f.users {
		m, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: sender, Body: "no task"})
		if err != nil {
			t.Fatalf("send %d without a safety task behind a lock on stub_tasks: %v", i, err)
		}
		if m.Seq != int64(i+1) {
			t.Fatalf("send %d: seq %d", i, m.Seq)
		}
	}
	s.SetRequestTimeout(300 * time.Millisecond)
	_, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "task", SafetyTask: true})
	if !errors.Is(err, store.ErrDatabaseBusy) {
		t.Fatalf("a send with a safety task behind the lock: %v, want database_busy", err)
	}
	lock.Release()
	s.SetRequestTimeout(2 * time.Second)
	if _, _, _, err := s.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: f.dialog, SenderID: f.users[0], Body: "task", SafetyTask: true}); err != nil {
		t.Fatalf("a send with a safety task after the lock: %v", err)
	}
	checkGapless(t, s, f.dialog, 3, nil)
}
