package restapi

import (
	"context"
	"net/http"

	"github.com/han-app/gateway/ratelimit"
)

// The rate-limit decision of a keyed write (message send, attachment init)
// and its idempotency reserve are independent scripts on DB0, so they go
// to Redis in one round trip: the limiter prepares the decision and leaves
// it pending in the request, and the reserve sends both. The limiter still
// decides before anything else happens: a denial is answered 429 (a lock the
// reserve took meanwhile is given back), and every answer the handler gives
// before the reserve — a validation error — first settles the pending
// decision alone, so a request over its limit gets 429 as it would have
// without the pairing.

// The routes whose decision waits for the reserve say so where they are
// registered (answersDB0Outage with limitWithReserve). On a Redis Cluster a
// decision is one call per family and cannot ride with the reserve, yet it
// waits all the same, and is made alone when the reserve would be sent:
// the request's body is in by then. Decided before the body, a message
// send's dialog admission would be held for as long as its client takes to
// send the body (up to the body deadline, longer than a window), and an
// outsider whose send is to be refused and given back could hold a
// dialog's whole limit with a few stalled bodies.

// pendingLimit is a decision the limiter left to the handler.
type pendingLimit struct {
	// pr is the decision's one script call, to pair with the reserve; nil
	// when it takes one call per family (a Redis Cluster): decide makes it
	// then, alone.
	pr     *ratelimit.Prepared
	decide func(context.Context) (ratelimit.Decision, error)
	// apply answers the decision as the limiter would have: RateLimit
	// headers, or the 429/503 response (false: the request stops).
	apply func(ratelimit.Decision, error) bool
}

// paired reports whether pl's decision is one script call that can ride
// with the reserve.
func (pl *pendingLimit) paired() bool { return pl.pr != nil && pl.pr.Call() != nil }

// decision makes pl's decision alone. It is made even when the request's
// context ended (a body that timed out, a client that left), within the
// limiter's own budget, so the request is counted and answered for what
// happened to it, not for the limiter's cancelled call.
func (pl *pendingLimit) decision(ctx context.Context) (ratelimit.Decision, error) {
	ctx = context.WithoutCancel(ctx)
	if pl.pr == nil {
		return pl.decide(ctx)
	}
	return pl.pr.Finish(pl.pr.Send(ctx))
}

// settle decides pl alone and applies it.
func (pl *pendingLimit) settle(ctx context.Context) bool {
	return pl.apply(pl.decision(ctx))
}

// limitHolder is where r's decision may be left pending (its limit field),
// or nil when it must be made now.
func limitHolder(r *http.Request) *db0Deferral {
	d, ok := r.Context().Value(ctxDB0Deferral{}).(*db0Deferral)
	if !ok || d.limit != nil || !d.withReserve {
		return nil
	}
	return d
}

// takeLimit removes and returns the pending decision, if any.
func takeLimit(ctx context.Context) *pendingLimit {
	d, ok := ctx.Value(ctxDB0Deferral{}).(*db0Deferral)
	if !ok || d.limit == nil {
		return nil
	}
	pl := d.limit
	d.limit = nil
	return pl
}

// settlePendingLimit settles the request's pending decision, if any; false
// when it answered the request.
func settlePendingLimit(w http.ResponseWriter, r *http.Request) bool {
	if pl := takeLimit(r.Context()); pl != nil {
		return pl.settle(r.Context())
	}
	return true
}
