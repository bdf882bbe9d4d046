package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
)

// withQuery appends one query parameter to a PostgreSQL URL.
func withQuery(u, kv string) string {
	if strings.Contains(u, "?") {
		return u + "&" + kv
	}
	return u + "?" + kv
}

type sendResult struct {
	code       int
	body       string
	retryAfter string
	err        error
}

// A row lock held by someone else makes the sends queued behind it answer
// 503 database_busy with Retry-After within the request budget, instead of
// waiting for the lock and starving the pool; readiness stays 200 the whole
// time (it has its own connection) and reports the saturated pool in its
// body; a send to another dialog is served while the lock is still held.
func TestBusyDatabaseIsNotDown(t *testing.T) {
	vars := baseEnv()
	vars["HAN_DB_REQUEST_TIMEOUT"] = "500ms"
	vars["DATABASE_URL"] = withQuery(env.DatabaseURL, "pool_max_conns=4")
	m := start(t, vars)
	tok := func(sub string) string {
		s, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	alice, bob, carol, dave := ids.New(), ids.New(), ids.New(), ids.New()
	toks := map[string]string{alice: tok(alice), bob: tok(bob), carol: tok(carol), dave: tok(dave)}
	for _, u := range []string{alice, bob, carol, dave} {
		if code, body := call(t, "GET", m.URL()+"/v1/me", toks[u], ""); code != 200 {
			t.Fatalf("first request: %d %s", code, body)
		}
	}
	dialog := func(creator, other string) string {
		code, body := call(t, "POST", m.URL()+"/v1/dialogs", toks[creator], fmt.Sprintf(`{"memberIds":[%q]}`, other))
		if code != 201 {
			t.Fatalf("create dialog: %d %s", code, body)
		}
		return body[strings.Index(body, `"id":"`)+6:][:36]
	}
	// Sends into one dialog on one instance are written one batch at a
	// time (one pool connection), so six locked dialogs are what keeps a
	// pool of four saturated.
	busyDialogs := make([]string, 6)
	for i := range busyDialogs {
		busyDialogs[i] = dialog(alice, bob)
	}
	busyDialog, otherDialog := busyDialogs[0], dialog(carol, dave)

	// Someone else holds the dialog's row lock (the one every send takes).
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	lockTx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lockTx.Rollback(ctx) }()
	if _, err := lockTx.Exec(ctx, "SELECT 1 FROM dialogs WHERE id = ANY($1::uuid[]) FOR UPDATE", busyDialogs); err != nil {
		t.Fatal(err)
	}

	// Readiness is polled for the whole time the lock is held.
	var (
		pollMu    sync.Mutex
		notReady  []string
		saturated bool
		polls     int
	)
	stopPoll := make(chan struct{})
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		c := &http.Client{Timeout: 5 * time.Second}
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(50 * time.Millisecond):
			}
			resp, err := c.Get(m.URL() + "/readyz")
			pollMu.Lock()
			polls++
			if err != nil {
				notReady = append(notReady, "error: "+err.Error())
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					notReady = append(notReady, fmt.Sprintf("%d %s", resp.StatusCode, b))
				}
				if strings.Contains(string(b), `"saturated":true`) && strings.Contains(string(b), `"postgresPool":"saturated"`) {
					saturated = true
				}
			}
			pollMu.Unlock()
		}
	}()
	stopPolling := func() {
		select {
		case <-stopPoll:
		default:
			close(stopPoll)
		}
		<-pollDone
	}
	defer stopPolling()

	// 40 sends queue behind the locks (two senders, under the rate limits).
	client := &http.Client{Timeout: 20 * time.Second}
	send := func(u, dialogID, key string) sendResult {
		req, _ := http.NewRequest("POST", m.URL()+"/v1/dialogs/"+dialogID+"/messages", strings.NewReader(`{"body":"queued"}`))
		req.Header.Set("Authorization", "Bearer "+toks[u])
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			return sendResult{err: err}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return sendResult{code: resp.StatusCode, body: string(b), retryAfter: resp.Header.Get("Retry-After")}
	}
	results := make([]sendResult, 40)
	var wg sync.WaitGroup
	for i := range results {
		u := alice
		if i%2 == 1 {
			u = bob
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = send(u, busyDialogs[i%len(busyDialogs)], fmt.Sprintf("busy-%d-%s", i, ids.New()))
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil || r.code != 503 || r.body != `{"error":"database_busy"}` || r.retryAfter == "" {
			t.Errorf("send %d behind the lock: %d %q Retry-After=%q err=%v", i, r.code, r.body, r.retryAfter, r.err)
		}
	}

	// Another dialog is served while the lock is still held.
	if r := send(carol, otherDialog, "other-"+ids.New()); r.err != nil || r.code != 201 {
		t.Errorf("send to another dialog while the lock is held: %d %s err=%v", r.code, r.body, r.err)
	}
	if _, err := lockTx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the lock holder's transaction ended early: %v", err)
	}
	stopPolling()
	pollMu.Lock()
	if polls == 0 || len(notReady) > 0 {
		t.Errorf("/readyz left 200 while the pool was busy (%d of %d polls): %v", len(notReady), polls, notReady)
	}
	if !saturated {
		t.Errorf("/readyz never reported the saturated pool in %d polls", polls)
	}
	pollMu.Unlock()

	// Pool load shows in metrics too.
	fams := scrape(t, m)
	for _, name := range []string{"han_db_pool_acquired_conns", "han_db_pool_idle_conns", "han_db_pool_max_conns",
		"han_db_pool_empty_acquire_total", "han_db_pool_acquire_wait_seconds_total"} {
		if fams[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	if f := fams["han_db_pool_empty_acquire_total"]; f != nil && f.GetMetric()[0].GetCounter().GetValue() == 0 {
		t.Error("no acquisition waited for a connection")
	}

	// Once the lock is gone, the dialog takes sends again.
	if err := lockTx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := send(alice, busyDialog, "after-"+ids.New()); r.code != 201 {
		t.Fatalf("send after the lock was released: %d %s err=%v", r.code, r.body, r.err)
	}
}
