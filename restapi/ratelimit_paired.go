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
// registered (answersDB0Outage with limitWithReserve).

// pendingLimit is a decision the limiter left to the handler.
type pendingLimit struct {
	pr *ratelimit.Prepared
	// apply answers the decision as the limiter would have: RateLimit
	// headers, or the 429/503 response (false: the request stops).
	apply func(ratelimit.Decision, error) bool
}

// settle decides pl alone and applies it. The decision is made even when
// the request's context ended (a body that timed out, a client that left),
// within the limiter's own budget, so the request is counted and answered
// for what happened to it, not for the limiter's cancelled call.
func (pl *pendingLimit) settle(ctx context.Context) bool {
	return pl.apply(pl.pr.Finish(pl.pr.Send(context.WithoutCancel(ctx))))
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
