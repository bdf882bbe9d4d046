package restapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store/rds"
)

// The DB0 outage rule (docs/degraded-mode.md) of the routes whose handlers
// apply it themselves: while DB0 fails they replay a completed PostgreSQL
// idempotency record for the key, else fail closed. Such a route says so
// where it is registered (answersDB0Outage), and the middleware and the
// limiter read that one declaration: a route is never named twice.

// db0Route is what a route declared with answersDB0Outage.
type db0Route struct {
	// withReserve: the route's rate-limit decision waits for the
	// idempotency reserve and goes to Redis in its round trip
	// (ratelimit_paired.go).
	withReserve bool
}

// limitTiming says when the rate-limit decision of a route declared with
// answersDB0Outage is made.
type limitTiming int

const (
	// limitFirst: before the handler runs, as on every other route.
	limitFirst limitTiming = iota
	// limitWithReserve: left pending for the idempotency reserve, which
	// sends both in one round trip (ratelimit_paired.go); only for a
	// handler that always reaches serveIdempotent or returns an error
	// (message send, attachment init).
	limitWithReserve
)

// answersDB0Outage declares that rt's handler applies the DB0 outage rule
// itself, for every method rt is registered for, and returns rt. The
// route's rate-limit policy must fail closed: the limiter then hands the
// handler a DB0 failure (DeferDB0Failure) instead of answering 503. Called
// while the routes are registered, never after.
func (s *Server) answersDB0Outage(rt *mux.Route, limit limitTiming) *mux.Route {
	tpl, err := rt.GetPathTemplate()
	methods, merr := rt.GetMethods()
	if err != nil || merr != nil || len(methods) == 0 {
		panic(fmt.Sprintf("restapi: answersDB0Outage needs a route with a path template and methods (%v, %v)", err, merr))
	}
	if s.db0Routes == nil {
		s.db0Routes = map[string]db0Route{}
	}
	for _, m := range methods {
		s.db0Routes[ratelimit.Label(m, tpl)] = db0Route{withReserve: limit == limitWithReserve}
	}
	return rt
}

// db0Deferral carries a DB0 failure met before the handler ran, the
// rate-limit decision left pending for the idempotency reserve
// (ratelimit_paired.go), and a message send's dialog admission until its
// answer settles it (ratelimit_dialog.go).
type db0Deferral struct {
	err         error
	withReserve bool // the route's declaration (answersDB0Outage)
	limit       *pendingLimit
	dialog      *dialogSpend
	// outsider: the dialog's limit was used up and the limiter found the
	// sender is no member of it.
	outsider bool
	// limitKeys are the DB0 keys the route's rate-limit decision counts
	// this request on (none when no family applied, or no Redis limiter
	// runs): the DB0 a route that hands out what its limit guards depends
	// on (requireDB0).
	limitKeys []string
}

type ctxDB0Deferral struct{}

// deferDB0Failures prepares the routes declared with answersDB0Outage to
// receive a DB0 failure from the rate limiter (DeferDB0Failure).
func (s *Server) deferDB0Failures(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt, ok := s.db0Routes[ratelimit.Label(r.Method, RouteTemplate(r))]; ok {
			r = r.WithContext(context.WithValue(r.Context(), ctxDB0Deferral{}, &db0Deferral{withReserve: rt.withReserve}))
		}
		next.ServeHTTP(w, r)
	})
}

// DeferDB0Failure is for RateLimiter implementations. When the limiter
// cannot decide because DB0 failed (err is a Redis unavailable/OOM error) on
// a route whose handler applies the DB0 outage rule itself — message send,
// attachment init, download URL — it records err and returns true: the
// limiter then lets the request through if its in-process limit admits it
// (each such answer costs a PostgreSQL lookup, so it is never unlimited),
// and the handler answers from a completed PostgreSQL idempotency record or
// fails closed with err, never running the business effect without its
// limit. Elsewhere it returns false and the limiter fails closed as usual.
func DeferDB0Failure(r *http.Request, err error) bool {
	d, ok := r.Context().Value(ctxDB0Deferral{}).(*db0Deferral)
	if !ok || d.err != nil {
		return false
	}
	if !errors.Is(err, rds.ErrRedisUnavailable) && !errors.Is(err, rds.ErrRedisOOM) && !errors.Is(err, rds.ErrExpiryDenied) {
		return false
	}
	d.err = err
	return true
}

// db0DeferralOf is the deferral of a route declared with answersDB0Outage,
// else nil.
func db0DeferralOf(ctx context.Context) *db0Deferral {
	d, _ := ctx.Value(ctxDB0Deferral{}).(*db0Deferral)
	return d
}

// deferredDB0 returns the DB0 failure the limiter deferred to the handler.
func deferredDB0(ctx context.Context) error {
	if d := db0DeferralOf(ctx); d != nil {
		return d.err
	}
	return nil
}
