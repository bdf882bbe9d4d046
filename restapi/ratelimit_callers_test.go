package restapi_test

import (
	"io"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi"
)

// A rate-limit policy is refused when it counts none of the callers that
// reach its route (ratelimit.Callers), because the limiter skips a family
// whose subject a caller lacks and would let that caller through unlimited.
// That check is only as good as its idea of who reaches which route, so
// the router is asked: every served route is called with no token, a user
// token and a service token under a policy of every family the limiter may
// name a caller by, and the principal each request is counted as (the
// families its decision holds) must be a caller Callers names for the
// route's own label, and for "other" when the route has no built-in policy
// of its own.
func TestRateLimitCallersMatchTheRouter(t *testing.T) {
	base := newHarness(t)
	served := limitableRoutes(t, base)
	rule := func(f ratelimit.Family) ratelimit.Rule {
		return ratelimit.Rule{Family: f, Limit: 1 << 20, Window: time.Hour}
	}
	every := ratelimit.Policy{Algorithm: ratelimit.FixedWindow, OnFailure: ratelimit.FallbackLocal,
		Rules: []ratelimit.Rule{rule(ratelimit.FamilyUser), rule(ratelimit.FamilyIP), rule(ratelimit.FamilyService)}}
	routes := map[string]ratelimit.Policy{}
	for label := range served {
		routes[label] = every
	}
	var mu sync.Mutex
	seen := map[string]ratelimit.Decision{}
	lim, err := ratelimit.New(ratelimit.Config{Redis: base.rdb, Policies: ratelimit.Static{Set: ratelimit.MustPolicySet("callers", routes, every)},
		OnDecision: func(label string, d ratelimit.Decision) {
			mu.Lock()
			seen[label] = d
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	h := base.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime, d.Gateway, d.RateLimits = base.rdb, base.rt, routesOnlyGateway{}, lim
	})
	_, userTok := h.user()
	tokens := []string{"", userTok, h.serviceToken("callers")}
	vars := regexp.MustCompile(`\{[^}]*\}`)
	defaults := ratelimit.DefaultPolicies()
	counted := 0
	for label := range served {
		method, template, _ := strings.Cut(label, " ")
		path := vars.ReplaceAllStringFunc(template, func(string) string { return ids.New() })
		for _, tok := range tokens {
			mu.Lock()
			clear(seen)
			mu.Unlock()
			// Straight to the handler: the probe sends what no client
			// sends (no body, made-up ids) and its answers are not checked.
			req := httptest.NewRequest(method, path, nil)
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			h.api.Handler().ServeHTTP(httptest.NewRecorder(), req)
			mu.Lock()
			d, ok := seen[label]
			mu.Unlock()
			if !ok {
				continue
			}
			counted++
			caller := countedAs(d)
			if !hasCaller(ratelimit.Callers(label), caller) {
				t.Errorf("%s: a request is counted as %s, but Callers names only %v", label, caller.Name, ratelimit.Callers(label))
			}
			if l, _ := defaults.Lookup(method, template); l == ratelimit.OtherRoute && !hasCaller(ratelimit.Callers(l), caller) {
				t.Errorf("%s falls to %q and is counted as %s, but Callers names only %v", label, l, caller.Name, ratelimit.Callers(l))
			}
		}
	}
	if counted < len(defaults.Labels()) {
		t.Fatalf("only %d requests reached the rate limit; the probe does not reach the routes", counted)
	}
}

// countedAs is the kind of caller decision d counted.
func countedAs(d ratelimit.Decision) ratelimit.Caller {
	for _, f := range d.Families {
		switch f.Rule.Family {
		case ratelimit.FamilyUser:
			return ratelimit.UserCaller
		case ratelimit.FamilyService:
			return ratelimit.ServiceCaller
		}
	}
	return ratelimit.AnonymousCaller
}

func hasCaller(cs []ratelimit.Caller, c ratelimit.Caller) bool {
	return slices.ContainsFunc(cs, func(k ratelimit.Caller) bool { return k.Name == c.Name })
}

// limitableRoutes lists "METHOD /template" of every route a server with
// every route registered serves; a route that picks its method itself (the
// project API) is listed under every method a client may send.
func limitableRoutes(t *testing.T, base *harness) map[string]bool {
	t.Helper()
	probe := base.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime, d.Gateway = base.rdb, base.rt, routesOnlyGateway{}
	})
	out := map[string]bool{}
	err := probe.api.Router().Walk(func(rt *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := rt.GetPathTemplate()
		if err != nil {
			return nil
		}
		methods, err := rt.GetMethods()
		if err != nil {
			methods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
		}
		for _, m := range methods {
			out[m+" "+tpl] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
