package restapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// A new user's first request records the user, sharing one statement with
// other first requests. When that statement stalls (another session holds
// a lock on users: a migration, a VACUUM FULL), a first request that
// queued behind it answers 503 database_busy within its own request budget;
// it waited for the stalled statement to end and then for its own, up to
// two budgets. The log holds no PostgreSQL text or token. Once the lock is
// gone the same tokens work.
func TestFirstRequestQueuedBehindAStalledUserRecordEndsWithinTheBudget(t *testing.T) {
	const budget = time.Second
	base := newHarness(t)
	base.store.SetRequestTimeout(budget)
	h, logs := base.withLog(nil)
	lock := testenv.LockTable(t, env.DatabaseURL, "users", "ACCESS EXCLUSIVE")

	type answer struct {
		code  int
		body  string
		retry string
		took  time.Duration
	}
	first := func(tok string, out chan<- answer) {
		start := time.Now()
		code, b, hdr := h.doH(tok, "GET", "/v1/me", "", nil)
		out <- answer{code, string(b), hdr.Get("Retry-After"), time.Since(start)}
	}
	toks := make([]string, 4)
	for i := range toks {
		toks[i] = mint(t, ids.New(), auth.KindUser)
	}
	stalled := make(chan answer, 1)
	go first(toks[0], stalled)
	// The first record is in PostgreSQL, waiting for the lock; the others
	// queue behind it.
	lock.WaitBlocked(1)
	queued := make(chan answer, len(toks)-1)
	for _, tok := range toks[1:] {
		go first(tok, queued)
	}
	for range toks[1:] {
		a := <-queued
		if a.code != http.StatusServiceUnavailable || a.body != `{"error":"database_busy"}` || a.retry != "1" {
			t.Errorf("queued first request: %d %s Retry-After=%q", a.code, a.body, a.retry)
		}
		if a.took > budget*3/2 {
			t.Errorf("queued first request answered after %v, request budget %v", a.took, budget)
		}
	}
	if a := <-stalled; a.code != http.StatusServiceUnavailable || a.body != `{"error":"database_busy"}` {
		t.Errorf("stalled first request: %d %s", a.code, a.body)
	}
	// The log names no SQL, no PostgreSQL message and no token.
	for _, leak := range append([]string{"users", "lock", "statement", "deadline"}, toks...) {
		if strings.Contains(logs.String(), leak) {
			t.Errorf("the log holds %.20q: %s", leak, logs)
		}
	}
	lock.Release()
	for _, tok := range toks {
		if code, b := h.do(tok, "GET", "/v1/me", ""); code != 200 {
			t.Fatalf("first request after the lock was released: %d %s", code, b)
		}
	}
}
