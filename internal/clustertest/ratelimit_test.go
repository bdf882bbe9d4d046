package clustertest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/han-app/gateway/ratelimit"
)

// On a cluster the limiter (ModeAuto) evaluates a request's families one
// script call each, since their keys live on different masters: a request
// the dialog's limit denies is not counted against the user, whose earlier
// admission is refunded, and the denial says when to retry.
func TestRateLimitAcrossMastersOnCluster(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	l, err := ratelimit.New(ratelimit.Config{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	const label = "POST /v1/dialogs/{id}/messages"
	p := ratelimit.Policy{Algorithm: ratelimit.SlidingLog, OnFailure: ratelimit.FailClosed, Rules: []ratelimit.Rule{
		{Family: ratelimit.FamilyUser, Limit: 5, Window: time.Minute},
		{Family: ratelimit.FamilyDialog, Limit: 3, Window: time.Minute},
	}}
	// A user and a dialog whose keys live on different masters.
	var subj ratelimit.Subject
	var userKey, dialogKey string
	for i := 0; subj.UserID == ""; i++ {
		u, d := fmt.Sprintf("u-%d", i), fmt.Sprintf("d-%d", i)
		uk := ratelimit.Key(ratelimit.FamilyUser, u, ratelimit.RouteHash(label), p.Algorithm, time.Minute)
		dk := ratelimit.Key(ratelimit.FamilyDialog, d, ratelimit.RouteHash(label), p.Algorithm, time.Minute)
		um, err1 := env.Cluster.MasterOf(ctx, uk)
		dm, err2 := env.Cluster.MasterOf(ctx, dk)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if um != dm {
			subj, userKey, dialogKey = ratelimit.Subject{UserID: u, DialogID: d}, uk, dk
		}
	}
	for i := range 3 {
		d, err := l.Decide(ctx, label, p, subj)
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: allowed=%v err=%v", i+1, d.Allowed, err)
		}
	}
	d, err := l.Decide(ctx, label, p, subj)
	if err != nil || d.Allowed || d.RetryAfterMs <= 0 {
		t.Fatalf("4th request on a dialog limited to 3: allowed=%v retry=%d err=%v", d.Allowed, d.RetryAfterMs, err)
	}
	if n, err := rdb.ZCard(ctx, userKey).Result(); err != nil || n != 3 {
		t.Fatalf("the user's window holds %d admissions (%v), want 3: the denied request must be refunded", n, err)
	}
	if n, err := rdb.ZCard(ctx, dialogKey).Result(); err != nil || n != 3 {
		t.Fatalf("the dialog's window holds %d admissions (%v), want 3", n, err)
	}
	// Another dialog of the same user still has room: only the user's 5 count.
	other := subj
	other.DialogID = "d-other"
	for i := range 2 {
		if d, err := l.Decide(ctx, label, p, other); err != nil || !d.Allowed {
			t.Fatalf("other dialog, request %d: allowed=%v err=%v", i+1, d.Allowed, err)
		}
	}
	if d, err := l.Decide(ctx, label, p, other); err != nil || d.Allowed {
		t.Fatalf("the user's 6th request must be denied by the user's limit: allowed=%v err=%v", d.Allowed, err)
	}
}
