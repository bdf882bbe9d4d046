package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// RateLimit hammers one limited endpoint with a few users from many VUs and
// checks the decisions: decisions/s (http_reqs rate), every 429 carrying
// Retry-After and the RateLimit / RateLimit-Policy fields (docs/ratelimit.md),
// and no user admitted more than the limit allows over the run. The
// same-run baseline for decisions/s is redis-benchmark's raw EVALSHA rate
// of the limiter script (docs/loadtest.md).
//
// Gateway only.
type RateLimit struct {
	users, vus int
	endpoint   string
	limit      int
	window     time.Duration
	gw         gatewayFlags
}

// Metrics of the rate-limit scenario.
const (
	MetricRLAllowed      = "ratelimit_allowed"       // counter: 2xx answers
	MetricRLDenied       = "ratelimit_denied"        // counter: 429 answers
	MetricRLBadHeaders   = "ratelimit_bad_headers"   // counter: answers lacking the RateLimit headers
	MetricRLOverAdmitted = "ratelimit_over_admitted" // counter: admissions beyond limit × windows touched
)

// Describe implements Scenario.
func (s *RateLimit) Describe() string {
	return "many VUs, few users on one limited route: decisions/s, 429 correctness, no over-admission (gateway)"
}

// Name implements loadtest.Scenario.
func (s *RateLimit) Name() string { return "rate-limit" }

// Flags implements Scenario.
func (s *RateLimit) Flags(fs *flag.FlagSet, getenv func(string) string) {
	fs.IntVar(&s.users, "users", 4, "users (each one limit identity)")
	fs.IntVar(&s.vus, "vus", 16, "concurrent VUs")
	fs.StringVar(&s.endpoint, "endpoint", "GET /v1/me", "the limited route: METHOD path (no body)")
	fs.IntVar(&s.limit, "limit", 120, "the route's per-user limit per window, to check admissions against")
	fs.DurationVar(&s.window, "window", time.Minute, "the route's window")
	s.gw.register(fs, getenv, false)
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *RateLimit) DeclareMetrics(reg *loadtest.Registry) {
	for _, n := range []string{MetricRLAllowed, MetricRLDenied, MetricRLBadHeaders, MetricRLOverAdmitted} {
		reg.Counter(n)
	}
}

// Run implements loadtest.Scenario.
func (s *RateLimit) Run(ctx context.Context, t *loadtest.T) error {
	method, path, ok := strings.Cut(strings.TrimSpace(s.endpoint), " ")
	if !ok || !strings.HasPrefix(path, "/") || s.users < 1 || s.vus < 1 || s.vus > maxAuxConns || s.limit < 1 || s.window <= 0 {
		return loadtest.Usage(fmt.Errorf(`-endpoint "METHOD /path", -users, -limit and -window must be set and positive, -vus 1..%d`, maxAuxConns))
	}
	tg, err := openTarget(ctx, t.Opts.Target)
	if err != nil {
		return err
	}
	defer tg.close()
	if !tg.gateway {
		return loadtest.Usage(errors.New("rate-limit needs the gateway: the target must be a gateway URL"))
	}
	if err := s.gw.check(); err != nil {
		return loadtest.Usage(err)
	}
	t.Info("target", tg.describe())
	users, err := loadtest.MintUsers([]byte(s.gw.devSecret), s.users, s.gw.tokenTTL)
	if err != nil {
		return err
	}
	api, err := loadtest.NewAPI(tg.base, loadtest.NewHTTPClient(t.Src, s.vus, 10*time.Second), t.Reg)
	if err != nil {
		return err
	}
	defer api.Close()
	allowed := make([]atomic.Int64, s.users)
	cAllowed, cDenied := t.Reg.Counter(MetricRLAllowed), t.Reg.Counter(MetricRLDenied)
	bad := t.Reg.Counter(MetricRLBadHeaders)
	exec := loadtest.ConstantVUs{VUs: s.vus, Duration: t.Opts.Duration}
	t.SetPhase("requesting")
	t.Reg.ResetClock()
	_, err = exec.Run(ctx, t.Reg, func(ctx context.Context, it loadtest.Iter) error {
		u := it.VU % s.users
		_, err := api.Do(ctx, loadtest.Request{Method: method, Template: path, Token: users[u].Token,
			Expected: []int{http.StatusTooManyRequests},
			OnResponse: func(status int, h http.Header) {
				switch {
				case status/100 == 2:
					allowed[u].Add(1)
					cAllowed.Inc()
					if h.Get("RateLimit") == "" || h.Get("RateLimit-Policy") == "" {
						bad.Inc()
					}
				case status == http.StatusTooManyRequests:
					cDenied.Inc()
					ra, err := strconv.Atoi(h.Get("Retry-After"))
					if err != nil || ra < 1 || h.Get("RateLimit") == "" || h.Get("RateLimit-Policy") == "" {
						bad.Inc()
					}
				}
			}})
		return err
	})
	t.Reg.StopClock()
	if err != nil {
		return err
	}
	// A fixed or sliding window admits at most limit per window; a run of
	// length d touches at most ceil(d/window)+1 windows.
	windows := int64((t.Reg.Elapsed()+s.window-1)/s.window) + 1
	over := t.Reg.Counter(MetricRLOverAdmitted)
	for u := range allowed {
		if n := allowed[u].Load(); n > int64(s.limit)*windows {
			over.Add(n - int64(s.limit)*windows)
		}
	}
	t.Info("windows_touched", windows)
	t.Info("decisions_per_s", fmt.Sprintf("%.0f", float64(cAllowed.Value()+cDenied.Value())/t.Reg.Elapsed().Seconds()))
	return nil
}
