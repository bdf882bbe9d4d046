package restapi_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/restapi"
)

// livenessTTL is short so a "killed" instance is dead within a second; the
// idempotency lock lives an hour, so only the liveness check can free it.
const livenessTTL = time.Second

// liveInstance keeps an instance's presence liveness marker fresh (as the
// gateway's presence loop does) until the returned kill function is called;
// then the marker lapses after livenessTTL, as after a crash. refresh
// renews the marker at once.
func liveInstance(t *testing.T, h *harness, id string) (refresh func() error, kill func()) {
	t.Helper()
	p, err := presence.New(h.rt, presence.Config{InstanceID: id, LivenessTTL: livenessTTL},
		nil, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	refresh = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := p.RefreshLiveness(ctx)
		return err
	}
	if err := refresh(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(livenessTTL / 5)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_ = refresh()
			}
		}
	}()
	var once sync.Once
	kill = func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
	t.Cleanup(kill)
	return refresh, kill
}

// A send whose instance dies while it holds the idempotency lock never
// blocks the client's retries on a surviving instance until the lock's TTL:
// killed after the commit, the retry replays the stored outcome at once;
// killed before it, the retry takes the lock over as soon as the dead
// instance's liveness marker lapses, and runs the send exactly once.
func TestCrashedOwnerNeverBlocksRetries(t *testing.T) {
	for _, stage := range []string{"committed", "locked"} {
		t.Run("killed "+stage, func(t *testing.T) {
			idA, idB := "inst-a-"+ids.New(), "inst-b-"+ids.New()
			a := newIdemHarness(t, idemOpts{idem: restapi.IdempotencyConfig{LockTTL: time.Hour, InstanceID: idA}})
			b := newIdemHarness(t, idemOpts{idem: restapi.IdempotencyConfig{LockTTL: time.Hour, InstanceID: idB}})
			refreshA, killA := liveInstance(t, a, idA)
			liveInstance(t, b, idB)
			alice, aTok := a.user()
			bob, _ := a.user()
			d := a.dialog(aTok, bob)
			path := "/v1/dialogs/" + d.ID + "/messages"
			body := `{"body":"sent once","clientMessageId":"c1"}`
			key := keyHdr("crash-" + ids.New())

			// Instance A stops inside the request at the stage (its handler
			// never finishes while "dead"); the test releases it at the end so
			// the server can close.
			reached, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			restapi.SetIdempotencyStage(a.api, func(name string) {
				if name == stage {
					once.Do(func() {
						close(reached)
						<-release
					})
				}
			})
			type answer struct {
				code int
				body []byte
			}
			first := make(chan answer, 1)
			go func() {
				code, out, _ := a.doH(aTok, "POST", path, body, key)
				first <- answer{code, out}
			}()
			var released sync.Once
			unblock := func() { released.Do(func() { close(release) }) }
			t.Cleanup(func() { unblock(); <-first })
			select {
			case <-reached:
			case <-time.After(30 * time.Second):
				t.Fatal("the send on instance A never reached " + stage)
			}

			var got []byte
			if stage == "committed" {
				// PostgreSQL holds the outcome: the retry replays it at once,
				// whether or not A's marker has lapsed yet.
				killA()
				code, out, hdr := b.doH(aTok, "POST", path, body, key)
				if code != 201 || hdr.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry on B after A committed: %d %s", code, out)
				}
				got = out
			} else {
				// A live owner is never taken over (its marker renewed just
				// now, so a stalled refresh loop on a busy machine cannot
				// make it look dead).
				if err := refreshA(); err != nil {
					t.Fatal(err)
				}
				code, out, _ := b.doH(aTok, "POST", path, body, key)
				wantError(t, code, out, 409, "idempotency_in_progress")
				killA()
				deadline := time.Now().Add(30 * time.Second)
				for {
					code, out, _ := b.doH(aTok, "POST", path, body, key)
					if code == 201 {
						got = out
						break
					}
					wantError(t, code, out, 409, "idempotency_in_progress")
					if time.Now().After(deadline) {
						t.Fatal("the retry on B never took over the dead instance's lock")
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			// Later retries replay the same bytes, and the message exists once.
			code, again, hdr := b.doH(aTok, "POST", path, body, key)
			if code != 201 || !bytes.Equal(again, got) || hdr.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second retry: %d %s, want the replay of %s", code, again, got)
			}
			if n := b.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 1 {
				t.Fatalf("%d message rows, want 1", n)
			}
			// The "dead" handler resumes: it neither sends twice nor answers
			// anything else.
			unblock()
			ans := <-first
			first <- ans
			if ans.code != 201 || !bytes.Equal(ans.body, got) {
				t.Fatalf("the resumed first request: %d %s, want %s", ans.code, ans.body, got)
			}
			if n := b.count("SELECT count(*) FROM messages WHERE sender_id=$1", alice); n != 1 {
				t.Fatalf("%d message rows after the first request resumed, want 1", n)
			}
		})
	}
}
