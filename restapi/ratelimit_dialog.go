package restapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/han-app/gateway/store"
)

// The dialog family of message send protects a dialog's members from a
// flood, so only a send into the dialog spends it (docs/ratelimit.md, "Only
// members spend a dialog's limit"). The limiter admits before anything is
// known of the sender, so the admission waits in the request (dialogSpend)
// for the answer to settle it: a send that committed keeps it; a send whose
// statement may have committed (its answer lost) keeps it too; every other
// answer — a refusal of any kind, a replay — gives it back before it is
// written. The RateLimit fields show the dialog only to a sender the send
// proved a member (it committed); a refusal's fields are those of an
// unknown id.

// Refund results of han_ratelimit_refunds_total.
const (
	refundDialogNotFound = "dialog_not_found" // the sender is no member
	refundDialogUnsent   = "dialog_unsent"    // any other answer that sent nothing
)

// dialogSpend is a message send's dialog admission until the answer
// settles it.
type dialogSpend struct {
	// refund gives the admission back (result: the metric label).
	refund func(result string)
	// show writes the RateLimit fields with the dialog's item.
	show func()
	// kept: the send committed, or may have; nothing is given back.
	kept bool
}

// requestLimits is the state of r's route declared with answersDB0Outage,
// nil on any other route.
func requestLimits(ctx context.Context) *db0Deferral {
	d, _ := ctx.Value(ctxDB0Deferral{}).(*db0Deferral)
	return d
}

// holdDialogSpend leaves sp in r for its answer to settle.
func holdDialogSpend(r *http.Request, sp *dialogSpend) {
	if d := requestLimits(r.Context()); d != nil {
		d.dialog = sp
	}
}

// sendOutcome records what the send's outcome err (nil: the statement
// committed; created: it wrote a message) means for its dialog admission: a
// send that wrote a message keeps it and shows the dialog (its sender is a
// member); one that repeated an earlier clientMessageId wrote nothing into
// the dialog and gives it back, as a replay does; a statement that failed
// without a known outcome keeps it (the message may be in the dialog).
func sendOutcome(ctx context.Context, err error, created bool) {
	d := requestLimits(ctx)
	if d == nil || d.dialog == nil {
		return
	}
	switch {
	case err == nil && !created:
	case err == nil:
		d.dialog.kept = true
		d.dialog.show()
	case !sendWroteNothing(err):
		d.dialog.kept = true
	}
}

// sendWroteNothing reports whether a failed store.SendMessage is known to
// have written nothing: its own checks refused it (not a member, a bad
// attachment, a live idempotency record), the dialog's queue was full,
// PostgreSQL cut the statement short over budget, or the caller left while
// it still waited in the queue (the statement runs on a context of its own,
// never cancelled). Anything else may have followed a commit whose answer
// was lost.
func sendWroteNothing(err error) bool {
	for _, e := range []error{store.ErrDialogNotFound, store.ErrInvalidAttachment, store.ErrIdemExists,
		store.ErrDialogBusy, store.ErrDatabaseBusy, context.Canceled} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// settleDialogSpend settles r's dialog admission for an answer that is not
// a committed send (a refusal, a replay), before the answer is written: it
// is given back (result: the metric label) unless the send committed or may
// have.
func settleDialogSpend(r *http.Request, result string) {
	d := requestLimits(r.Context())
	if d == nil || d.dialog == nil {
		return
	}
	sp := d.dialog
	d.dialog = nil
	if !sp.kept {
		sp.refund(result)
	}
}

// failedSendResult is the refund label of a send answered with err.
func failedSendResult(err error) string {
	if errors.Is(err, store.ErrDialogNotFound) {
		return refundDialogNotFound
	}
	return refundDialogUnsent
}

// markOutsider records that the limiter found r's sender is no member of
// the dialog (its limit was used up, so membership decided between 429 and
// the answer an unknown id gets).
func markOutsider(r *http.Request) {
	if d := requestLimits(r.Context()); d != nil {
		d.outsider = true
	}
}

// knownOutsider reports whether the limiter found the sender is no member.
func knownOutsider(ctx context.Context) bool {
	d := requestLimits(ctx)
	return d != nil && d.outsider
}
