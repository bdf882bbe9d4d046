package loadtest_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// A setup call refused with 503 and Retry-After (the gateway's
// database_busy: nothing was written) is sent again after the wait, as a
// 429 is; a 503 without Retry-After (an outage) fails at once.
func TestSetupCallsWaitOutABusy503(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/dialogs" && n == 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"database_busy"}`))
		case r.URL.Path == "/v1/dialogs":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"d1","memberIds":["a","b"],"lastSeq":0}`))
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"redis_unavailable"}`))
		}
	}))
	defer srv.Close()
	api, err := loadtest.NewAPI(srv.URL, srv.Client(), loadtest.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	u := loadtest.User{ID: "a", Token: "t"}

	start := time.Now()
	d, err := api.CreateDialog(ctx, u, []string{"b"})
	if err != nil {
		t.Fatalf("create dialog after one busy answer: %v", err)
	}
	if d.ID != "d1" || calls.Load() != 2 {
		t.Fatalf("dialog %q after %d calls, want d1 after 2", d.ID, calls.Load())
	}
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("retried after %v, before the Retry-After of 1s", waited)
	}

	calls.Store(0)
	err = api.Me(ctx, u)
	var ae *loadtest.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.Code != "redis_unavailable" {
		t.Fatalf("503 without Retry-After: err %v, want the 503 itself", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("503 without Retry-After sent %d times, want once", calls.Load())
	}
}
