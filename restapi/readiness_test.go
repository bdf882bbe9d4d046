package restapi_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store"
)

// pingCounter counts the checks readiness sends to one dependency and the
// most that ran at once.
type pingCounter struct {
	mu                   sync.Mutex // guards the fields below
	calls, running, most int
}

func (c *pingCounter) begin() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.running++
	c.most = max(c.most, c.running)
}

func (c *pingCounter) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running--
}

func (c *pingCounter) counts() (calls, most int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls, c.most
}

// countedPG passes the readiness pings on to PostgreSQL, counting them.
type countedPG struct {
	restapi.Pinger
	n *pingCounter
}

func (p countedPG) Ping(ctx context.Context) error {
	p.n.begin()
	defer p.n.end()
	return p.Pinger.Ping(ctx)
}

// countedPings is a go-redis hook that counts a client's PINGs.
type countedPings struct{ n *pingCounter }

func (h countedPings) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countedPings) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "ping" {
			return next(ctx, cmd)
		}
		h.n.begin()
		defer h.n.end()
		return next(ctx, cmd)
	}
}

func (h countedPings) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// /readyz is public, and a flood of probes must not make a healthy instance
// look down to its load balancer. Probes that come together share one check
// per dependency (never two at once), and a check's result serves the
// probes of the next second, so a flood costs each dependency at most one
// check a second. A real outage still shows in readiness within seconds,
// and so does its end.
func TestReadyzFloodSharesOneCheckPerDependency(t *testing.T) {
	base := newHarness(t)
	ready, err := store.OpenReadinessPG(context.Background(), env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ready.Close)
	r, rdb, rt := privateRedis(t, testenv.RedisOptions{}, 500*time.Millisecond)
	pg, db0, db1 := &pingCounter{}, &pingCounter{}, &pingCounter{}
	rdb.AddHook(countedPings{db0})
	rt.AddHook(countedPings{db1})
	h := base.server(io.Discard, func(d *restapi.Deps) {
		d.Redis, d.Realtime, d.ReadyPG = rdb, rt, countedPG{ready, pg}
	})
	probe := func() (int, string) {
		resp, err := http.Get(h.srv.URL + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	const probes = 100
	answers := make([]string, probes)
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for i := range answers {
		wg.Go(func() {
			<-begin
			if code, b := probe(); code != 200 || !strings.Contains(b, `"status":"ok"`) {
				answers[i] = b
			}
		})
	}
	start := time.Now()
	close(begin)
	wg.Wait()
	// Checks of one dependency start at least a second apart.
	allowed := int(time.Since(start)/time.Second) + 1
	for i, b := range answers {
		if b != "" {
			t.Errorf("probe %d of the flood: %s", i, b)
		}
	}
	for name, n := range map[string]*pingCounter{"postgres": pg, "redis": db0, "redisRealtime": db1} {
		if calls, most := n.counts(); calls > allowed || most > 1 {
			t.Errorf("%s: %d probes made %d checks (%d at once), want at most %d (1 at once)",
				name, probes, calls, most, allowed)
		}
	}

	thaw := r.Freeze(t)
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, b := probe()
		return code == 200 && strings.Contains(b, `"status":"degraded"`) && strings.Contains(b, `"redis":"down"`)
	}, "readiness did not report the stalled Redis")
	thaw()
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, b := probe()
		return code == 200 && strings.Contains(b, `"status":"ok"`)
	}, "readiness did not recover after Redis came back")
}
