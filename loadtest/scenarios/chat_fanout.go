package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// ChatFanout is the REST send path end to end: N users in M dialogs, all
// connected and subscribed, senders posting messages over REST
// (Idempotency-Key on every send) at a fixed aggregate rate (open model:
// constant arrival rate). Delivery latency runs from each message's
// scheduled send time to its arrival on every member's socket; afterwards
// the history of every dialog is read back to check that PostgreSQL holds
// every accepted message once, in order.
//
// -send-only connects no socket (the figure leaves fan-out out),
// -hot-dialog puts every user in one dialog, and -step-rates measures
// rising rates with the same users until one does not hold (≥ 99 % of the
// offered sends accepted and send_latency p99 ≤ -step-p99).
//
// Gateway only. The default rate limits of POST /v1/dialogs/{id}/messages
// (30 per user and 60 per dialog per 10 s) cap what this measures; 429s are
// counted in errors{status=429,…} and fail a step.
type ChatFanout struct {
	sf    sendFlags
	drain time.Duration
	gw    gatewayFlags
}

// Describe implements Scenario.
func (s *ChatFanout) Describe() string {
	return "users in dialogs, all connected; senders POST messages at a fixed rate (or rising steps); delivery to every member, history check (gateway)"
}

// Name implements loadtest.Scenario.
func (s *ChatFanout) Name() string { return "chat-fanout" }

// Flags implements Scenario.
func (s *ChatFanout) Flags(fs *flag.FlagSet, getenv func(string) string) {
	s.sf.register(fs, true)
	fs.BoolVar(&s.sf.sendOnly, "send-only", false, "connect no socket: measure the send path without fan-out (users and dialogs are still created, the history still checked)")
	fs.DurationVar(&s.drain, "drain", 3*time.Second, "how long to wait for in-flight deliveries after the last send")
	s.gw.register(fs, getenv, false)
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *ChatFanout) DeclareMetrics(reg *loadtest.Registry) { declareSendMetrics(reg) }

// Run implements loadtest.Scenario.
func (s *ChatFanout) Run(ctx context.Context, t *loadtest.T) error {
	if err := s.sf.check(); err != nil {
		return loadtest.Usage(err)
	}
	if s.drain < 0 {
		return loadtest.Usage(errors.New("-drain must not be negative"))
	}
	if err := checkEventsPerDialog(s.sf.rate, s.sf.steps, t.Opts.Duration, s.sf.warmup, s.sf.shape().dialogs); err != nil && !s.sf.sendOnly {
		return loadtest.Usage(err)
	}
	tg, err := openTargets(ctx, t.Opts.Target)
	if err != nil {
		return err
	}
	defer tg.close()
	if !tg.gateway {
		return loadtest.Usage(errors.New("chat-fanout sends over the gateway's REST API: the target must be a gateway URL"))
	}
	if err := s.gw.check(); err != nil {
		return loadtest.Usage(err)
	}
	// Sender connections (≤ -max-senders) come out of loadtest.FileReserve.
	if err := t.NeedFiles(s.sf.users, 1); err != nil {
		return err
	}
	t.Info("target", tg.describe())
	s.describe(t)
	var dl *loadtest.Deliveries
	if !s.sf.sendOnly {
		dl = loadtest.NewDeliveries(t.Reg)
	}
	cfg := fleetConfig{shape: s.sf.shape(), concurrency: s.sf.concurrency, gw: &s.gw, reg: t.Reg, deliveries: dl}
	fl, err := prepare(ctx, t, tg, cfg)
	if err != nil {
		return err
	}
	defer fl.close(ctx, s.sf.concurrency)
	if dl != nil {
		if err := fl.connect(ctx, t, tg, cfg); err != nil {
			return err
		}
	}
	apis, err := sendAPIs(t, tg, s.sf.maxSenders)
	defer func() {
		for _, api := range apis {
			api.Close()
		}
	}()
	if err != nil {
		return err
	}
	r := s.sendRunOf(fl, apis, dl)
	if err := s.send(ctx, t, r, fl, dl); err != nil {
		return err
	}
	return r.reconcile(ctx, t, gatewayHistory(fl))
}

// describe records the shape in the summary.
func (s *ChatFanout) describe(t *loadtest.T) {
	sh := s.sf.shape()
	t.Info("users", sh.conns)
	t.Info("dialogs", sh.dialogs)
	t.Info("hot_dialog", s.sf.hot)
	t.Info("send_only", s.sf.sendOnly)
}

// sendAPIs returns one measured REST client per target, sharing
// maxConns keep-alive connections each; over several targets each also
// counts its requests and errors per target.
func sendAPIs(t *loadtest.T, tg *target, maxConns int) ([]*loadtest.API, error) {
	apis := make([]*loadtest.API, 0, len(tg.bases))
	for _, base := range tg.bases {
		api, err := loadtest.NewAPI(base, loadtest.NewHTTPClient(t.Src, maxConns, 30*time.Second), t.Reg)
		if err != nil {
			return apis, err
		}
		if tg.spread() {
			api.CountPerTarget()
		}
		apis = append(apis, api)
	}
	return apis, nil
}

// sendRunOf binds the send path to the gateway's REST API; each send has
// an Idempotency-Key of its own. Over several targets a sender always
// posts through the same one (sender mod targets), the one its own
// connection is on.
func (s *ChatFanout) sendRunOf(fl *fleet, apis []*loadtest.API, dl *loadtest.Deliveries) *sendRun {
	r := newSendRun(&s.sf, func(ctx context.Context, d, sender int, body string) (string, int64, error) {
		api := apis[sender%len(apis)]
		m, err := api.SendMessage(ctx, fl.users[sender], fl.dialogIDs[d], body, ids.New())
		return m.ID, m.Seq, err
	}, httpStatusOf)
	if dl != nil {
		r.onOK = func(d int, seq int64) { dl.Published(fl.dialogIDs[d], seq, fl.subs[d]) }
		r.onFail = dl.PublishFailed
		r.onDrop = func(d int) { dl.Dropped(fl.subs[d]) }
	}
	return r
}

// send measures the send path, then waits for the deliveries in flight.
func (s *ChatFanout) send(ctx context.Context, t *loadtest.T, r *sendRun, fl *fleet, dl *loadtest.Deliveries) error {
	t.Reg.ResetClock()
	if err := r.measureAll(ctx, t, "chat-fanout"); err != nil {
		return err
	}
	if dl != nil {
		t.SetPhase("draining")
		dl.Drain(ctx, s.drain)
	}
	t.Reg.StopClock()
	if dl != nil {
		dl.Finish(t.Reg.Elapsed())
		if open := fl.stillOpen(); open < s.sf.users {
			t.Info("connections_dropped", s.sf.users-open)
		}
	}
	return ctx.Err()
}

// httpStatusOf labels a failed send: its HTTP status, or timeout/transport.
func httpStatusOf(err error) string {
	var ae *loadtest.APIError
	switch {
	case errors.As(err, &ae):
		return strconv.Itoa(ae.Status)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "timeout"
	}
	return "transport"
}

// gatewayHistory reads a dialog's history over REST as its first member.
func gatewayHistory(fl *fleet) historyReader {
	members := fl.shape.members()
	return func(ctx context.Context, d int, after int64) ([]stored, bool, error) {
		items, next, err := fl.setupAPI.History(ctx, fl.users[members[d][0]], fl.dialogIDs[d], after, 100)
		if err != nil {
			return nil, false, fmt.Errorf("dialog %d: %w", d, err)
		}
		out := make([]stored, len(items))
		for i, m := range items {
			marker, _ := loadtest.ScheduledNanosFromBody(m.Body)
			out[i] = stored{id: m.ID, seq: m.Seq, marker: marker}
		}
		return out, next != nil, nil
	}
}
