package project

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/loop"
	"github.com/han-app/gateway/lua"
	"github.com/han-app/gateway/store/rds"
)

// ModuleBudget is the module-wide budget of reliable bytes across every
// project of one environment (64 MiB by default). Its counter lives
// under its own hash tag, outside every project's slot, so no script spans
// both: a write that adds bytes first reserves them here with a capped
// increment (Reserve), then runs its project script, then settles (Settle):
// the reservation becomes what the project script really added, or is
// refunded. A crash between the phases leaves bytes counted — the counter
// only ever drifts upward, so the budget never over-admits — and
// Reconcile brings it back to the sum of the project budgets. A Queue may
// instead draw its publishes' bytes on a lease of this budget (lease.go),
// which the same counters account for. The same protocol runs in
// standalone and Cluster mode. Safe for concurrent use.
type ModuleBudget struct {
	rdb  redis.UniversalClient
	env  string
	keys ModuleKeys
	cap  int64
}

// NewModuleBudget returns the module budget of env with capBytes as its cap.
func NewModuleBudget(rdb redis.UniversalClient, env string, capBytes int64) *ModuleBudget {
	return &ModuleBudget{rdb: rdb, env: env, keys: NewModuleKeys(env), cap: capBytes}
}

// Cap is the module budget in bytes.
func (b *ModuleBudget) Cap() int64 { return b.cap }

// Reservation is phase one's receipt: pass it to Settle. Gen is the
// reconcile generation read before the project script runs; a zero ID
// means nothing is reserved.
type Reservation struct {
	ID     string
	Amount int64
	Gen    int64
}

// Reserve reserves amount bytes for projectID. granted is false when the
// cap would be passed; the returned Reservation still carries Gen (for the
// release a refused write may cause, e.g. its dedupe purge).
func (b *ModuleBudget) Reserve(ctx context.Context, projectID string, amount int64) (r Reservation, granted bool, err error) {
	id := newBudgetID()
	res, err := lua.ProjectTopicBudgetReserve.Run(ctx, b.rdb, []string{b.keys.Budget(), b.keys.Reservations(), b.keys.Projects(), b.keys.Seen()},
		id, amount, b.cap, projectID).Int64Slice()
	if err != nil {
		return Reservation{}, false, classifyProject(err)
	}
	if len(res) != 4 {
		return Reservation{}, false, ErrDataStateInvalid
	}
	r.Gen = res[1]
	if res[0] != 1 {
		return r, false, nil
	}
	r.ID, r.Amount = id, amount
	return r, true, nil
}

// Gen reads the reconcile generation, for a write that only releases bytes
// (trim, deletes): pass it to Settle in a Reservation without ID. It
// checks the module budget's counters too (ErrDataStateInvalid when one is
// not a decimal integer as HINCRBY writes it), so that such a write is
// refused before the project script runs rather than leave a release the
// settle cannot apply.
func (b *ModuleBudget) Gen(ctx context.Context) (int64, error) {
	v, err := b.rdb.HMGet(ctx, b.keys.Budget(), "gen", "committed", "reserved", "leased", "rstart", "rpos").Result()
	if err != nil {
		return 0, classifyProject(err)
	}
	var gen int64
	for i, x := range v {
		if x == nil {
			continue
		}
		n, ok := parseStoredInt(x)
		if !ok {
			return 0, ErrDataStateInvalid
		}
		if i == 0 {
			gen = n
		}
	}
	return gen, nil
}

// Settle is phase two: it drops r's reservation, commits the bytes the
// project script added and subtracts those it released (unless a reconcile
// ran since r.Gen was read: then the release is left counted until the
// next reconcile, which is safe). It runs even under OOM and is meant to
// be called with a context the client cannot cancel.
func (b *ModuleBudget) Settle(ctx context.Context, r Reservation, added, released int64) error {
	if r.ID == "" && added == 0 && released == 0 {
		return nil
	}
	err := lua.ProjectTopicBudgetSettle.Run(ctx, b.rdb, []string{b.keys.Budget(), b.keys.Reservations()},
		r.ID, added, released, r.Gen).Err()
	return classifyProject(err)
}

// ModuleUsage is the module budget's state.
type ModuleUsage struct {
	Committed int64 // bytes the projects hold, as last settled or reconciled
	// Reserved is what counts against the cap beyond Committed: open
	// reservations and leases (Leased, part of it) not yet returned.
	Reserved int64
	Leased   int64
}

// Usage reads the module counters.
func (b *ModuleBudget) Usage(ctx context.Context) (ModuleUsage, error) {
	v, err := b.rdb.HMGet(ctx, b.keys.Budget(), "committed", "reserved", "leased").Result()
	if err != nil {
		return ModuleUsage{}, classifyProject(err)
	}
	var u ModuleUsage
	for i, p := range []*int64{&u.Committed, &u.Reserved, &u.Leased} {
		if v[i] == nil {
			continue
		}
		n, ok := parseStoredInt(v[i])
		if !ok {
			return ModuleUsage{}, ErrDataStateInvalid
		}
		*p = n
	}
	u.Reserved += u.Leased
	return u, nil
}

// ReconcileResult is what one reconcile did.
type ReconcileResult struct {
	Ran                 bool // false: another instance was reconciling
	Projects            int  // project budgets summed
	Before, After       int64
	DroppedReservations int64 // reservations and expired leases dropped
	// Unreadable counts the projects whose budget could not be read (a
	// counter negative or not a number, a key of another type); their
	// ids, the first unreadableIDsMax of them, are in UnreadableIDs.
	Unreadable    int
	UnreadableIDs []string
	// Pruned counts the ids dropped from the projects SET: their budget
	// held nothing and no reservation or lease named them for the grace.
	Pruned int
}

// unreadableIDsMax bounds the unreadable project ids a reconcile reports.
const unreadableIDsMax = 32

// Reconcile sets the module counter to the sum of the project budgets
// (plus what was committed while it scanned). Reservations older than
// staleAfter are dropped first: their writer is gone; so are expired
// leases.
//
// A project whose budget cannot be read is skipped, so one corrupt
// project does not stop the reconcile of every other. Its bytes are
// unknown: it is counted as holding a whole project budget (the service's,
// ProjectBudgetBytes: no script admits bytes past it, and every script
// that adds bytes refuses while the budget is unreadable),
// and the counter is never raised on its account: it becomes the smaller
// of its current value (which never under-counts) and the sum with that
// allowance. So it is not under-counted, and an over-count of the other
// projects is still brought down.
//
// A project the scan reads with nothing held leaves the projects SET when
// no reservation or lease call has named it for the grace (staleAfter, at
// least the lease lifetime), so the SET, and the scan, hold only projects
// that hold bytes or wrote lately.
func (b *ModuleBudget) Reconcile(ctx context.Context, staleAfter time.Duration) (ReconcileResult, error) {
	keys := b.reconcileKeys()
	begin, err := lua.ProjectTopicBudgetReconcile.Run(ctx, b.rdb, keys, "begin", staleAfter.Milliseconds(),
		reconcileWindow.Milliseconds()).Int64Slice()
	if err != nil {
		return ReconcileResult{}, classifyProject(err)
	}
	if len(begin) < 1 || begin[0] != 1 {
		return ReconcileResult{}, nil
	}
	if len(begin) != 3 {
		return ReconcileResult{}, ErrDataStateInvalid
	}
	res := ReconcileResult{Ran: true, DroppedReservations: begin[2]}
	sum, err := b.scan(ctx, begin[1], max(staleAfter, moduleLeaseTTL), &res)
	if err != nil {
		return res, err
	}
	sum += int64(res.Unreadable) * ProjectBudgetBytes
	end, err := lua.ProjectTopicBudgetReconcile.Run(ctx, b.rdb, keys, "end", begin[1], sum, b01(res.Unreadable > 0)).Int64Slice()
	if err != nil {
		return res, classifyProject(err)
	}
	if len(end) != 3 || end[0] != 1 {
		res.Ran = false
		return res, nil
	}
	res.Before, res.After = end[1], end[2]
	return res, nil
}

func (b *ModuleBudget) reconcileKeys() []string {
	return []string{b.keys.Budget(), b.keys.Reservations(), b.keys.Leases(), b.keys.Projects(), b.keys.Seen()}
}

// scan sums the budgets of the projects SET, reconcileChunk ids per round
// trip, and asks the window gen's reconcile to drop each chunk's ids read
// with nothing held whose stamp is older than grace. It fills res's
// counts.
func (b *ModuleBudget) scan(ctx context.Context, gen int64, grace time.Duration, res *ReconcileResult) (int64, error) {
	var sum int64
	var cursor uint64
	for {
		ids, next, err := b.rdb.SScan(ctx, b.keys.Projects(), cursor, "", reconcileChunk).Result()
		if err != nil {
			return 0, classifyProject(err)
		}
		n, unreadable, empty, err := b.sumProjects(ctx, ids)
		if err != nil {
			return 0, err
		}
		sum += n
		res.Unreadable += len(unreadable)
		res.Projects += len(ids) - len(unreadable)
		for _, id := range unreadable {
			if len(res.UnreadableIDs) < unreadableIDsMax {
				res.UnreadableIDs = append(res.UnreadableIDs, id)
			}
		}
		if len(empty) > 0 {
			args := append([]any{"prune", gen, grace.Milliseconds()}, anys(empty)...)
			pr, err := lua.ProjectTopicBudgetReconcile.Run(ctx, b.rdb, b.reconcileKeys(), args...).Int64Slice()
			if err != nil {
				return 0, classifyProject(err)
			}
			if len(pr) == 2 && pr[0] == 1 {
				res.Pruned += int(pr[1])
			}
		}
		if cursor = next; cursor == 0 {
			return sum, nil
		}
	}
}

// reconcileChunk is how many project ids the reconcile reads per round
// trip.
const reconcileChunk = 256

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// sumProjects sums the reliable bytes of the projects ids and returns the
// ids of those whose budget it cannot read (a counter negative or not a
// number, or a key of another type) and of those that hold nothing (no
// budget, or every counter 0). A call Redis did not answer fails the
// whole sum.
func (b *ModuleBudget) sumProjects(ctx context.Context, ids []string) (sum int64, unreadable, empty []string, err error) {
	cmds, err := b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.HMGet(ctx, NewKeys(b.env, id).Budget(), "msg", "rcpt", "dd")
		}
		return nil
	})
	if err != nil && rds.Unanswered(err) {
		return 0, nil, nil, classifyProject(err)
	}
	for i, c := range cmds {
		v, err := c.(*redis.SliceCmd).Result()
		if err != nil && rds.Unanswered(err) {
			return 0, nil, nil, classifyProject(err)
		}
		n, ok := projectBytes(v)
		switch {
		case err != nil || !ok:
			unreadable = append(unreadable, ids[i])
		case n == 0:
			empty = append(empty, ids[i])
		}
		sum += n
	}
	return sum, unreadable, empty, nil
}

// projectBytes is the sum of one project's budget counters (a missing one
// is 0); ok is false when one is not a decimal integer as HINCRBY writes
// one (a sign included).
func projectBytes(v []any) (sum int64, ok bool) {
	for _, x := range v {
		if x == nil {
			continue
		}
		n, ok := parseStoredInt(x)
		if !ok {
			return 0, false
		}
		sum += n
	}
	return sum, true
}

// reconcileWindow is how long a reconcile may run before another instance
// presumes it dead and starts its own.
const reconcileWindow = time.Minute

// BudgetReconcilerConfig tunes the periodic reconcile job.
type BudgetReconcilerConfig struct {
	// Interval between runs; zero value means 1m.
	Interval time.Duration
	// StaleReservation is the age after which an unsettled reservation
	// is dropped, and how long a project that holds nothing stays in the
	// reconcile's scan after the last reservation or lease naming it;
	// zero value means 5m (far beyond any request's Redis budget).
	StaleReservation time.Duration
	// Timeout of one run; zero value means 30s.
	Timeout time.Duration
}

// BudgetReconciler runs ModuleBudget.Reconcile periodically (on every
// instance; concurrent runs step aside). Close stops it and waits.
type BudgetReconciler struct {
	b      *ModuleBudget
	cfg    BudgetReconcilerConfig
	logger *slog.Logger
	loop   *loop.Loop
}

// NewBudgetReconciler returns a stopped reconciler for b.
func NewBudgetReconciler(b *ModuleBudget, cfg BudgetReconcilerConfig, logger *slog.Logger) *BudgetReconciler {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	if cfg.StaleReservation <= 0 {
		cfg.StaleReservation = 5 * time.Minute
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	r := &BudgetReconciler{b: b, cfg: cfg, logger: logger}
	r.loop = loop.New(loop.Config{Interval: cfg.Interval, Timeout: cfg.Timeout}, func(ctx context.Context) bool {
		r.runOnce(ctx)
		return true
	})
	return r
}

// Start starts the loop; the first run is one Interval later.
func (r *BudgetReconciler) Start() { r.loop.Start() }

func (r *BudgetReconciler) runOnce(ctx context.Context) {
	res, err := r.b.Reconcile(ctx, r.cfg.StaleReservation)
	switch {
	case err != nil && ctx.Err() == nil:
		// The error's kind only: Redis error text may carry key names.
		r.logger.LogAttrs(ctx, slog.LevelWarn, "module budget reconcile failed", slog.String("kind", rds.Kind(err)))
	case err == nil && res.Unreadable > 0:
		// Project ids only, never the values found: they name the
		// projects an operator must repair.
		r.logger.LogAttrs(ctx, slog.LevelWarn, "module budget reconcile skipped projects whose budget is unreadable",
			slog.Int("unreadable", res.Unreadable), slog.Any("project_ids", res.UnreadableIDs),
			slog.Int64("before", res.Before), slog.Int64("after", res.After), slog.Int("projects", res.Projects))
	case err == nil && res.Ran && (res.Before != res.After || res.Pruned > 0):
		r.logger.LogAttrs(ctx, slog.LevelInfo, "module budget reconciled", slog.Int64("before", res.Before),
			slog.Int64("after", res.After), slog.Int("projects", res.Projects), slog.Int("pruned", res.Pruned),
			slog.String("dropped_reservations", strconv.FormatInt(res.DroppedReservations, 10)))
	}
}

// Close stops the loop and waits for a run in progress, whose context it
// cancels. Idempotent.
func (r *BudgetReconciler) Close() { r.loop.Close() }
