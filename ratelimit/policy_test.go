package ratelimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/ratelimit"
)

func TestRouteLabelsAreABoundedAllowList(t *testing.T) {
	set := ratelimit.DefaultPolicies()
	label, p := set.Lookup("POST", "/v1/dialogs/{id}/messages")
	if label != "POST /v1/dialogs/{id}/messages" || p.OnFailure != ratelimit.FailClosed || len(p.Rules) != 3 {
		t.Fatalf("send policy: %q %+v", label, p)
	}
	for _, tpl := range []string{"/v1/dialogs/123/messages", "/v1/unknown", "other", ""} {
		if label, _ := set.Lookup("GET", tpl); label != ratelimit.OtherRoute {
			t.Fatalf("%q labelled %q, want other", tpl, label)
		}
	}
	if label, _ := set.Lookup("DELETE", "/v1/me"); label != ratelimit.OtherRoute {
		t.Fatalf("method is part of the label: %q", label)
	}
	for _, l := range set.Labels() {
		m, tpl, _ := strings.Cut(l, " ")
		if _, p := set.Lookup(m, tpl); p.Algorithm == "" {
			t.Fatalf("%s has no algorithm", l)
		}
	}
}

func TestKeyNames(t *testing.T) {
	rh := ratelimit.RouteHash("GET /v1/me")
	if len(rh) != 16 || rh == ratelimit.RouteHash("POST /v1/me") {
		t.Fatalf("route hash %q", rh)
	}
	cases := map[string]string{
		ratelimit.Key(ratelimit.FamilyUser, "u1", rh, ratelimit.SlidingLog, time.Minute):        "han:api:rl:user:u1:" + rh + ":s60000",
		ratelimit.Key(ratelimit.FamilyIP, "abcd", rh, ratelimit.FixedWindow, time.Second):       "han:api:rl:ip:abcd:" + rh + ":f1000",
		ratelimit.Key(ratelimit.FamilyDialog, "d1", rh, ratelimit.SlidingLog, 10*time.Second):   "han:api:rl:dialog:d1:message:s10000",
		ratelimit.Key(ratelimit.FamilyService, "billing", rh, ratelimit.TokenBucket, time.Hour): "han:api:rl:service:billing:" + rh + ":b3600000",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
	for _, w := range []time.Duration{time.Millisecond, 300 * time.Millisecond, time.Minute, 24 * time.Hour} {
		k := ratelimit.Key(ratelimit.FamilyUser, "u", rh, ratelimit.FixedWindow, w)
		j := ratelimit.Jitter(k, w)
		if j < 0 || j > w.Milliseconds()/10 || j > 5000 || j != ratelimit.Jitter(k, w) {
			t.Errorf("jitter %d for window %v", j, w)
		}
	}
}

func TestPolicyValidation(t *testing.T) {
	bad := []ratelimit.Policy{
		{Algorithm: "gcra", Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 1, Window: time.Second}}},
		{Algorithm: ratelimit.FixedWindow, Rules: []ratelimit.Rule{{Family: "tenant", Limit: 1, Window: time.Second}}},
		{Algorithm: ratelimit.FixedWindow, Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 0, Window: time.Second}}},
		{Algorithm: ratelimit.FixedWindow, Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 1, Window: time.Microsecond}}},
		{Algorithm: ratelimit.TokenBucket, Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 1 << 30, Window: 24 * time.Hour}}},
		// limit × window wraps around to 0 in 64 bits
		{Algorithm: ratelimit.TokenBucket, Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 1 << 61, Window: 8 * time.Millisecond}}},
		{Algorithm: ratelimit.FixedWindow, Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 1, Window: time.Second}, {Family: ratelimit.FamilyUser, Limit: 2, Window: time.Second}}},
	}
	for i, p := range bad {
		if _, err := ratelimit.NewPolicySet("v", map[string]ratelimit.Policy{"GET /x": p}, ratelimit.Policy{}); err == nil {
			t.Errorf("policy %d accepted: %+v", i, p)
		}
	}
}

func TestRateLimitFields(t *testing.T) {
	d := ratelimit.Decision{Allowed: false, NowMs: 10_000, ResetAtMs: 12_001, Families: []ratelimit.FamilyDecision{
		{Rule: ratelimit.Rule{Family: ratelimit.FamilyUser, Limit: 30, Window: 10 * time.Second}, Remaining: 29, ResetAtMs: 19_999},
		{Rule: ratelimit.Rule{Family: ratelimit.FamilyDialog, Limit: 60, Window: 500 * time.Millisecond}, Remaining: 0, ResetAtMs: 12_001},
	}}
	if got, want := ratelimit.PolicyField(d), `"user";q=30;w=10, "dialog";q=60;w=1`; got != want {
		t.Errorf("RateLimit-Policy %s, want %s", got, want)
	}
	if got, want := ratelimit.StateField(d), `"user";r=29;t=10, "dialog";r=0;t=3`; got != want {
		t.Errorf("RateLimit %s, want %s", got, want)
	}
	if got := d.RetryAfterSeconds(); got != 3 {
		t.Errorf("Retry-After %d, want 3", got)
	}
}

// A decision answered without the dialog family describes the other
// families alone: a denial's Retry-After is the latest reset of the other
// families that deny, never the dialog's.
func TestDecisionWithoutAFamily(t *testing.T) {
	user := ratelimit.Rule{Family: ratelimit.FamilyUser, Limit: 30, Window: 10 * time.Second}
	ip := ratelimit.Rule{Family: ratelimit.FamilyIP, Limit: 600, Window: 10 * time.Second}
	dialog := ratelimit.Rule{Family: ratelimit.FamilyDialog, Limit: 60, Window: 10 * time.Second}
	both := ratelimit.Decision{NowMs: 10_000, ResetAtMs: 19_000, RetryAfterMs: 9_000, Families: []ratelimit.FamilyDecision{
		{Rule: user, Remaining: 0, ResetAtMs: 12_000}, {Rule: ip, Remaining: 7, ResetAtMs: 18_000},
		{Rule: dialog, Remaining: 0, ResetAtMs: 19_000},
	}}
	if both.DeniedOnlyBy(ratelimit.FamilyDialog) {
		t.Error("a denial the user family shares is reported as the dialog's alone")
	}
	got := both.Without(ratelimit.FamilyDialog)
	if ratelimit.StateField(got) != `"user";r=0;t=2, "ip";r=7;t=8` || got.RetryAfterSeconds() != 2 || got.Remaining != 0 {
		t.Errorf("without the dialog: %q, Retry-After %d, remaining %d", ratelimit.StateField(got), got.RetryAfterSeconds(), got.Remaining)
	}
	if ratelimit.StateField(both) != `"user";r=0;t=2, "ip";r=7;t=8, "dialog";r=0;t=9` {
		t.Errorf("Without changed the decision it was given: %q", ratelimit.StateField(both))
	}
	alone := both
	alone.Families = []ratelimit.FamilyDecision{{Rule: user, Remaining: 4, ResetAtMs: 12_000}, both.Families[2]}
	if !alone.DeniedOnlyBy(ratelimit.FamilyDialog) || alone.DeniedOnlyBy(ratelimit.FamilyUser) {
		t.Error("a denial the dialog family alone made is not reported as such")
	}
	allowed := ratelimit.Decision{Allowed: true, NowMs: 10_000, Remaining: 1, ResetAtMs: 15_000, Families: []ratelimit.FamilyDecision{
		{Rule: user, Remaining: 20, ResetAtMs: 17_000}, {Rule: dialog, Remaining: 1, ResetAtMs: 15_000},
	}}
	if got := allowed.Without(ratelimit.FamilyDialog); got.Remaining != 20 || got.ResetAtMs != 17_000 || ratelimit.PolicyField(got) != `"user";q=30;w=10` {
		t.Errorf("admission without the dialog: remaining %d reset %d policy %q", got.Remaining, got.ResetAtMs, ratelimit.PolicyField(got))
	}
}

// A policy that limits counts every caller of its route by some family:
// the limiter skips a family whose subject the caller lacks, so a rule
// list naming none of the caller's would leave it unlimited. No rules at
// all is the one way to say a route is not limited. The built-in table
// passes.
func TestPolicyCountsEveryCallerOfItsRoute(t *testing.T) {
	r := func(fs ...ratelimit.Family) ratelimit.Policy {
		p := ratelimit.Policy{Algorithm: ratelimit.FixedWindow}
		for _, f := range fs {
			p.Rules = append(p.Rules, ratelimit.Rule{Family: f, Limit: 5, Window: time.Second})
		}
		return p
	}
	const (
		user, ip, dialog, service = ratelimit.FamilyUser, ratelimit.FamilyIP, ratelimit.FamilyDialog, ratelimit.FamilyService
		public, inbox, me         = "GET /v1/public/config", "POST /v1/internal/inbox", "GET /v1/me"
	)
	for _, c := range []struct {
		label string
		p     ratelimit.Policy
		ok    bool
	}{
		{public, r(ip), true}, {public, r(user), false}, {public, r(user, service), false}, {public, r(), true},
		{me, r(user), true}, {me, r(ip), true}, {me, r(service), false},
		{ratelimit.MessageSendRoute, r(service), false}, {ratelimit.MessageSendRoute, r(dialog), false},
		{ratelimit.MessageSendRoute, r(dialog, ip), true}, {ratelimit.MessageSendRoute, r(user, dialog), true},
		{inbox, r(service), true}, {inbox, r(ip), true}, {inbox, r(user), false},
		{"GET /projects/{projectId}/redis", r(service), false},
		{ratelimit.OtherRoute, r(user, service), true}, {ratelimit.OtherRoute, r(ip), true},
		{ratelimit.OtherRoute, r(user), false}, {ratelimit.OtherRoute, r(service), false}, {ratelimit.OtherRoute, r(), true},
	} {
		routes, other := map[string]ratelimit.Policy{c.label: c.p}, ratelimit.Policy{}
		if c.label == ratelimit.OtherRoute {
			routes, other = nil, c.p
		}
		_, err := ratelimit.NewPolicySet("v", routes, other)
		if (err == nil) != c.ok {
			t.Errorf("%s %+v: %v, want ok=%v", c.label, c.p.Rules, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "no family counts") {
			t.Errorf("%s %+v: %v does not name the caller left uncounted", c.label, c.p.Rules, err)
		}
	}
	for _, l := range ratelimit.DefaultPolicies().Labels() {
		if len(ratelimit.Callers(l)) == 0 {
			t.Errorf("%s: no callers", l)
		}
	}
}
