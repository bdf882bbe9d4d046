package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// ChatFanout is the REST send path end to end: N users in M dialogs, all
// connected and subscribed, senders posting messages over REST
// (Idempotency-Key on every send) at a fixed aggregate rate. Delivery
// latency runs from each message's scheduled send time to its arrival on
// every member's socket; afterwards the history of every dialog is read
// back to check that PostgreSQL holds every accepted message.
//
// Gateway only. The default rate limits of POST /v1/dialogs/{id}/messages
// (30 per user and 60 per dialog per 10 s) cap what this measures; 429s are
// counted in errors{status=429,…}.
type ChatFanout struct {
	users, dialogs, dialogsPerUser int
	rate, bodySize, senders        int
	maxSenders                     int
	concurrency                    int
	drain                          time.Duration
	reconcile                      bool
	gw                             gatewayFlags
}

// MetricHistoryMissing counts accepted messages absent from the history.
const MetricHistoryMissing = "history_missing"

// Describe implements Scenario.
func (s *ChatFanout) Describe() string {
	return "users in dialogs, all connected; senders POST messages at a fixed rate; delivery to every member (gateway)"
}

// Name implements loadtest.Scenario.
func (s *ChatFanout) Name() string { return "chat-fanout" }

// Flags implements Scenario.
func (s *ChatFanout) Flags(fs *flag.FlagSet, getenv func(string) string) {
	fs.IntVar(&s.users, "users", 100, "users, each with one connection")
	fs.IntVar(&s.dialogs, "dialogs", 10, "dialogs")
	fs.IntVar(&s.dialogsPerUser, "dialogs-per-user", 1, "dialogs each user is a member of")
	fs.IntVar(&s.rate, "rate", 20, "messages sent per second, all dialogs together")
	fs.IntVar(&s.bodySize, "body", 128, "message body size in bytes")
	fs.IntVar(&s.senders, "senders", 16, "sender VUs started up front")
	fs.IntVar(&s.maxSenders, "max-senders", 512, "most sender VUs (a due send with every VU busy gets a new one up to this, else it is dropped)")
	fs.IntVar(&s.concurrency, "connect-concurrency", 32, "users/dialogs/connections set up at a time")
	fs.DurationVar(&s.drain, "drain", 3*time.Second, "how long to wait for in-flight deliveries after the last send")
	fs.BoolVar(&s.reconcile, "reconcile", true, "read every dialog's history afterwards and count accepted messages it lacks")
	s.gw.register(fs, getenv, false)
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *ChatFanout) DeclareMetrics(reg *loadtest.Registry) { reg.Counter(MetricHistoryMissing) }

// Run implements loadtest.Scenario.
func (s *ChatFanout) Run(ctx context.Context, t *loadtest.T) error {
	if s.rate < 1 || s.senders < 1 || s.maxSenders < s.senders || s.maxSenders > maxAuxConns || s.concurrency < 1 || s.bodySize < 32 || s.bodySize > 4000 {
		return fmt.Errorf("-rate, -senders, -connect-concurrency must be positive, -senders ≤ -max-senders ≤ %d and -body 32..4000", maxAuxConns)
	}
	tg, err := openTarget(ctx, t.Opts.Target)
	if err != nil {
		return err
	}
	defer tg.close()
	if !tg.gateway {
		return errors.New("chat-fanout sends over the gateway's REST API: the target must be a gateway URL")
	}
	if err := s.gw.check(); err != nil {
		return err
	}
	sh := shape{s.users, s.dialogs, s.dialogsPerUser}
	if err := sh.validate(true); err != nil {
		return err
	}
	// Sender connections (≤ -max-senders) come out of loadtest.FileReserve.
	if err := t.NeedFiles(s.users, 1); err != nil {
		return err
	}
	t.Info("target", tg.describe())
	dl := loadtest.NewDeliveries(t.Reg)
	cfg := fleetConfig{shape: sh, concurrency: s.concurrency, gw: &s.gw, reg: t.Reg, deliveries: dl}
	fl, err := prepare(ctx, t, tg, cfg)
	if err != nil {
		return err
	}
	defer fl.close(s.concurrency)
	if err := fl.connect(ctx, t, tg, cfg); err != nil {
		return err
	}
	api, err := loadtest.NewAPI(tg.base, loadtest.NewHTTPClient(t.Src, s.maxSenders, 30*time.Second), t.Reg)
	if err != nil {
		return err
	}
	defer api.Close()
	members := sh.members()
	accepted := make([]atomic.Int64, s.dialogs)
	exec := loadtest.ConstantArrivalRate{Rate: s.rate, Duration: t.Opts.Duration, PreAllocatedVUs: s.senders, MaxVUs: s.maxSenders}
	t.SetPhase("sending")
	t.Reg.ResetClock()
	_, err = exec.Run(ctx, t.Reg, func(ctx context.Context, it loadtest.Iter) error {
		d := int(it.N % int64(s.dialogs))
		m := members[d]
		sender := fl.users[m[int(it.N/int64(s.dialogs))%len(m)]]
		_, err := api.SendMessage(ctx, sender, fl.dialogIDs[d], loadtest.ChatBody(it.Scheduled.UnixNano(), s.bodySize), ids.New())
		if err != nil {
			dl.PublishFailed()
			return err
		}
		accepted[d].Add(1)
		dl.Published(fl.subs[d])
		return nil
	})
	if err != nil {
		return err
	}
	t.SetPhase("draining")
	dl.Drain(ctx, s.drain)
	t.Reg.StopClock()
	dl.Finish(t.Reg.Elapsed())
	if open := fl.stillOpen(); open < s.users {
		t.Info("connections_dropped", s.users-open)
	}
	if !s.reconcile {
		return nil
	}
	t.SetPhase("reconciling history")
	missing := t.Reg.Counter(MetricHistoryMissing)
	return forEach(ctx, s.dialogs, s.concurrency, func(ctx context.Context, d int) error {
		n, err := countHistory(ctx, fl.setupAPI, fl.users[members[d][0]], fl.dialogIDs[d])
		if err != nil {
			return fmt.Errorf("history: %w", err)
		}
		if want := accepted[d].Load(); n < want {
			missing.Add(want - n)
		}
		return nil
	})
}

// countHistory pages through a dialog's history and counts the messages
// the load generator sent (their bodies carry its marker).
func countHistory(ctx context.Context, api *loadtest.API, u loadtest.User, dialogID string) (int64, error) {
	var n, after int64
	for range 100_000 {
		items, next, err := api.History(ctx, u, dialogID, after, 100)
		if err != nil {
			return n, err
		}
		for _, m := range items {
			if _, ok := loadtest.ScheduledNanosFromBody(m.Body); ok {
				n++
			}
			after = max(after, m.Seq)
		}
		if next == nil || len(items) == 0 {
			return n, nil
		}
	}
	return n, errors.New("history: too many pages")
}
