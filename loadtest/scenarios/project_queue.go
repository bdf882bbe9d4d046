package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// ProjectQueue drives the project Redis API's reliable queue
// (docs/project-redis-api.md):
// it creates a topic and a subscription, publishes at a fixed rate while
// claimer VUs claim and acknowledge, and trims the topic now and then so the
// 2 MiB project budget is released. It reports publish, claim and ack
// throughput and the publish → claim latency from each message's scheduled
// time; the topic is deleted at the end.
//
// Gateway only; needs an existing project (hanctl project create --member)
// and a member's user id.
type ProjectQueue struct {
	project, user        string
	rate, publishers     int
	maxPublishers        int
	claimers, claimCount int
	trimEvery            int
	gw                   gatewayFlags
}

// Metrics of the project queue.
const (
	MetricQueuePublished    = "queue_published"     // counter: 201 publishes
	MetricQueueClaimed      = "queue_claimed"       // counter: claimed items
	MetricQueueAcked        = "queue_acked"         // counter: 200 receipts
	MetricQueueClaimLatency = "queue_claim_latency" // trend: scheduled publish → claimed
)

// Describe implements Scenario.
func (s *ProjectQueue) Describe() string {
	return "project Redis API: publish at a fixed rate, claim and ack with VUs; publish/claim/ack throughput (gateway)"
}

// Name implements loadtest.Scenario.
func (s *ProjectQueue) Name() string { return "project-queue" }

// Flags implements Scenario.
func (s *ProjectQueue) Flags(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&s.project, "project", "", "project id (hanctl project create --member <user>)")
	fs.StringVar(&s.user, "user", "", "user id of a member with write permission")
	fs.IntVar(&s.rate, "rate", 50, "messages published per second")
	fs.IntVar(&s.publishers, "publishers", 8, "publisher VUs started up front")
	fs.IntVar(&s.maxPublishers, "max-publishers", 256, "most publisher VUs (else due publishes are dropped)")
	fs.IntVar(&s.claimers, "claimers", 4, "claimer VUs")
	fs.IntVar(&s.claimCount, "claim-count", 10, "messages per claim (1..20)")
	fs.IntVar(&s.trimEvery, "trim-every", 100, "trim the topic after this many acks")
	s.gw.register(fs, getenv, false)
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *ProjectQueue) DeclareMetrics(reg *loadtest.Registry) {
	reg.Counter(MetricQueuePublished)
	reg.Counter(MetricQueueClaimed)
	reg.Counter(MetricQueueAcked)
	reg.Trend(MetricQueueClaimLatency)
}

type claimItem struct {
	Message struct {
		ID      string          `json:"id"`
		Payload json.RawMessage `json:"payload"`
	} `json:"message"`
	Token string `json:"token"`
}

// Run implements loadtest.Scenario.
func (s *ProjectQueue) Run(ctx context.Context, t *loadtest.T) error {
	if s.project == "" || s.user == "" {
		return loadtest.Usage(errors.New("project-queue needs -project and -user (a member of the project)"))
	}
	if s.rate < 1 || s.publishers < 1 || s.maxPublishers < s.publishers || s.maxPublishers+s.claimers > maxAuxConns || s.claimers < 1 || s.claimCount < 1 || s.claimCount > 20 || s.trimEvery < 1 {
		return loadtest.Usage(fmt.Errorf("-rate, -publishers, -claimers, -trim-every must be positive, -publishers ≤ -max-publishers, -max-publishers + -claimers ≤ %d and -claim-count 1..20", maxAuxConns))
	}
	tg, err := openTarget(ctx, t.Opts.Target)
	if err != nil {
		return err
	}
	defer tg.close()
	if !tg.gateway {
		return loadtest.Usage(errors.New("project-queue needs the gateway: the target must be a gateway URL"))
	}
	if err := s.gw.check(); err != nil {
		return loadtest.Usage(err)
	}
	t.Info("target", tg.describe())
	tok, err := auth.MintDevToken([]byte(s.gw.devSecret), auth.DevClaims{Subject: s.user, TTL: s.gw.tokenTTL})
	if err != nil {
		return err
	}
	api, err := loadtest.NewAPI(tg.base, loadtest.NewHTTPClient(t.Src, s.maxPublishers+s.claimers, 30*time.Second), t.Reg)
	if err != nil {
		return err
	}
	defer api.Close()
	root := "/projects/" + s.project + "/redis"

	var topic, sub struct {
		ID string `json:"id"`
	}
	if _, err := api.Do(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/topics",
		Path: root + "/topics", Token: tok, Body: map[string]any{"name": "loadtest-" + ids.New()[:8], "description": "han-loadtest"},
		Out: &topic, OK: []int{http.StatusCreated}}); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = api.Do(dctx, loadtest.Request{Method: http.MethodDelete, Template: "/projects/{projectId}/redis/topics/{topicId}",
			Path: root + "/topics/" + topic.ID, Token: tok, OK: []int{http.StatusNoContent}})
	}()
	if _, err := api.Do(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/subscriptions",
		Path: root + "/subscriptions", Token: tok, Body: map[string]any{"topicId": topic.ID, "name": "loadtest"},
		Out: &sub, OK: []int{http.StatusCreated}}); err != nil {
		return fmt.Errorf("create subscription: %w", err)
	}

	published, claimed, acked := t.Reg.Counter(MetricQueuePublished), t.Reg.Counter(MetricQueueClaimed), t.Reg.Counter(MetricQueueAcked)
	latency := t.Reg.Trend(MetricQueueClaimLatency)
	var trimMu sync.Mutex // one trim at a time
	var ackN atomic.Int64
	t.SetPhase("publishing and claiming")
	t.Reg.ResetClock()
	pubExec := loadtest.ConstantArrivalRate{Rate: s.rate, Duration: t.Opts.Duration, PreAllocatedVUs: s.publishers, MaxVUs: s.maxPublishers,
		// A dropped publish is a message no claimer ever gets: an unbounded
		// claim latency, ranked above every measured one.
		OnDrop: func(loadtest.Iter) { latency.AddDropped(1) }}
	claimExec := loadtest.ConstantVUs{VUs: s.claimers, Duration: t.Opts.Duration}
	var wg sync.WaitGroup
	var pubErr, claimErr error
	wg.Go(func() {
		_, pubErr = pubExec.Run(ctx, t.Reg, func(ctx context.Context, it loadtest.Iter) error {
			_, err := api.Do(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/topics/{topicId}/messages",
				Path: root + "/topics/" + topic.ID + "/messages", Token: tok,
				Body: map[string]any{"producerId": "han-loadtest", "clientEventId": ids.New(),
					// A nanosecond integer exceeds 2^53, which the API refuses
					// (RFC 8785 numbers): the time travels as a string.
					"payload": map[string]any{"body": loadtest.ChatBody(it.Scheduled.UnixNano(), 0)}},
				OK: []int{http.StatusCreated}})
			if err == nil {
				published.Inc()
			}
			return err
		})
	})
	wg.Go(func() {
		_, claimErr = claimExec.Run(ctx, t.Reg, func(ctx context.Context, _ loadtest.Iter) error {
			var res struct {
				Items []claimItem `json:"items"`
			}
			if _, err := api.Do(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/subscriptions/{subscriptionId}/claim",
				Path: root + "/subscriptions/" + sub.ID + "/claim", Token: tok, Body: map[string]any{"count": s.claimCount},
				Out: &res, OK: []int{http.StatusOK}}); err != nil {
				return err
			}
			now := time.Now()
			if len(res.Items) == 0 {
				// Nothing to claim: do not spin on an empty queue.
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
				return nil
			}
			for _, it := range res.Items {
				claimed.Inc()
				if sched, ok := loadtest.ScheduledNanos(it.Message.Payload); ok {
					latency.Add(now.Sub(time.Unix(0, sched)))
				}
				if _, err := api.Do(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/subscriptions/{subscriptionId}/receipts",
					Path: root + "/subscriptions/" + sub.ID + "/receipts", Token: tok,
					Body: map[string]any{"messageId": it.Message.ID, "token": it.Token, "status": "processed", "result": ""},
					OK:   []int{http.StatusOK}}); err != nil {
					return err
				}
				acked.Inc()
				if ackN.Add(1)%int64(s.trimEvery) == 0 && trimMu.TryLock() {
					_, _ = api.Do(ctx, loadtest.Request{Method: http.MethodPost, Template: "/projects/{projectId}/redis/topics/{topicId}/trim",
						Path: root + "/topics/" + topic.ID + "/trim", Token: tok, Body: map[string]any{}, OK: []int{http.StatusOK}})
					trimMu.Unlock()
				}
			}
			return nil
		})
	})
	wg.Wait()
	t.Reg.StopClock()
	el := t.Reg.Elapsed().Seconds()
	t.Info("publish_per_s", fmt.Sprintf("%.1f", float64(published.Value())/el))
	t.Info("claim_per_s", fmt.Sprintf("%.1f", float64(claimed.Value())/el))
	t.Info("ack_per_s", fmt.Sprintf("%.1f", float64(acked.Value())/el))
	return errors.Join(pubErr, claimErr)
}
