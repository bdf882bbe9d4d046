package restapi_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/restapi"
)

// routesOnlyGateway lets NewServer register the realtime routes (ticket,
// presence) for a test that only walks the router; it is never called.
type routesOnlyGateway struct{}

func (routesOnlyGateway) Handler() http.Handler { return http.NotFoundHandler() }
func (routesOnlyGateway) IssueTicket(context.Context, string, time.Time) (string, time.Time, error) {
	return "", time.Time{}, errors.New("routes only")
}
func (routesOnlyGateway) OnlineConnections(context.Context, string) (int, error) {
	return 0, errors.New("routes only")
}
func (routesOnlyGateway) PubSubHealthy() bool { return false }

// servedRoutes lists every "METHOD /template" the server's router serves.
func servedRoutes(t *testing.T, api *restapi.Server) map[string]bool {
	t.Helper()
	served := map[string]bool{}
	err := api.Router().Walk(func(rt *mux.Route, _ *mux.Router, _ []*mux.Route) error {
		tpl, err := rt.GetPathTemplate()
		methods, merr := rt.GetMethods()
		if err == nil && merr == nil {
			for _, m := range methods {
				served[m+" "+tpl] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return served
}

// A route is named by its registration, by the rate-limit policies
// (ratelimit.DefaultPolicies) and, when its handler answers a DB0 outage
// itself, by its declaration (answersDB0Outage). A policy whose label
// names no route never applies (the route falls to "other", which does
// not fail closed), and a fail-closed route whose handler does not answer
// the outage itself refuses a replay PostgreSQL could give; the documented
// rule (docs/ratelimit.md) is that the fail-closed routes are exactly the
// ones that answer the outage themselves.
func TestRouteDeclarationsAgree(t *testing.T) {
	h := newHarness(t)
	full := h.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime = h.rdb, h.rt
		d.Gateway = routesOnlyGateway{}
	})
	served := servedRoutes(t, full.api)
	policies := ratelimit.DefaultPolicies()
	outage := restapi.DB0OutageRoutes(full.api)
	for _, label := range append(policies.Labels(), ratelimit.MessageSendRoute) {
		if !served[label] {
			t.Errorf("rate-limit policy %q names no route the server serves", label)
		}
	}
	for _, label := range policies.Labels() {
		method, tpl, _ := strings.Cut(label, " ")
		_, p := policies.Lookup(method, tpl)
		if _, declared := outage[label]; declared != (p.OnFailure == ratelimit.FailClosed) {
			t.Errorf("%s: policy fails closed: %v, handler answers a DB0 outage (answersDB0Outage): %v",
				label, p.OnFailure == ratelimit.FailClosed, declared)
		}
	}
	for label := range outage {
		method, tpl, _ := strings.Cut(label, " ")
		if got, _ := policies.Lookup(method, tpl); got != label {
			t.Errorf("%s answers a DB0 outage but has no rate-limit policy of its own (it is %q)", label, got)
		}
	}
	if !outage[ratelimit.MessageSendRoute] {
		t.Errorf("%s: its rate-limit decision should wait for the idempotency reserve", ratelimit.MessageSendRoute)
	}
}
