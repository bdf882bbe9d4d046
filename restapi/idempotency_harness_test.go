package restapi_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/restapi"
	"github.com/han-app/gateway/store/rds"
)

// idemKey is a fresh Idempotency-Key header for one logical request.
func idemKey() map[string]string { return map[string]string{"Idempotency-Key": "k-" + ids.New()} }

func keyHdr(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

// idemOpts configures a server of the idempotency/attachment tests.
type idemOpts struct {
	rdb, rt redis.UniversalClient // zero: the package's redis-server
	idem    restapi.IdempotencyConfig
	att     restapi.AttachmentConfig
	limiter restapi.RateLimiter
	trusted []netip.Prefix // Config.TrustedProxies
}

// newIdemHarness is newHarness with the idempotency, attachment and Redis
// settings of o and a blob folder of the test's own.
func newIdemHarness(t *testing.T, o idemOpts) *harness {
	t.Helper()
	base := newHarness(t)
	if o.rdb == nil {
		o.rdb, o.rt = base.rdb, base.rt
	}
	if o.att.BlobDir == "" {
		o.att.BlobDir = t.TempDir()
	}
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))
	v, err := auth.NewVerifier(context.Background(), auth.Config{DevHS256Secret: devSecret, Redis: o.rdb}, logger)
	if err != nil {
		t.Fatal(err)
	}
	api, err := restapi.NewServer(restapi.Deps{
		Config: restapi.Config{HMACSecret: []byte("hmac-secret-0123456789"), Idempotency: o.idem, Attachments: o.att,
			TrustedProxies: o.trusted},
		Logger: logger, Store: base.store, Redis: o.rdb, Realtime: o.rt, Verifier: v, RateLimiter: o.limiter})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close)
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	return &harness{t: t, srv: srv, api: api, pool: base.pool, rdb: o.rdb, rt: o.rt, store: base.store}
}

// privateRedis starts a redis-server of the test's own (for faults) and
// returns it with api_backend clients for DB0 and DB1 using budget as their
// timeouts. The TTL audit runs on it when the test ends.
func privateRedis(t *testing.T, opts testenv.RedisOptions, budget time.Duration) (*testenv.RedisServer, redis.UniversalClient, redis.UniversalClient) {
	t.Helper()
	r, err := testenv.StartRedis(opts)
	if err != nil {
		t.Fatal(err)
	}
	rc := rds.RedisConfig{DialTimeout: budget, ReadTimeout: budget, WriteTimeout: budget, PoolTimeout: budget}
	rdb, err := rds.NewRedis(r.URL(0), rc)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rds.NewRedis(r.URL(1), rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rdb.Close()
		rt.Close()
		// After repeated dial failures go-redis probes the dead server from a
		// goroutine that notices Close only after its current 1 s pause.
		testenv.Eventually(t, 5*time.Second, func() bool {
			buf := make([]byte, 1<<20)
			return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("(*ConnPool).tryDial"))
		}, "go-redis dial prober still running after Close")
		if !t.Failed() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// A server the test left killed has nothing to audit.
			if bad, err := r.KeysWithoutTTL(ctx); err == nil && len(bad) > 0 {
				t.Errorf("keys without a TTL: %v", bad)
			}
		}
		r.Stop()
	})
	return r, rdb, rt
}

func (h *harness) count(q string, args ...any) int {
	h.t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// redisDump returns every name, field and value of every han:api:idem* key
// in DB0 of r, for "nothing secret is stored" checks.
func redisDump(t *testing.T, r *testenv.RedisServer) string {
	t.Helper()
	ctx := context.Background()
	c := r.AdminClient(0)
	defer c.Close()
	var b strings.Builder
	for _, p := range []string{"han:api:idem:*", "han:api:idemlock:*"} {
		keys, err := c.Keys(ctx, p).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			b.WriteString(k + "\n")
			if strings.HasPrefix(k, "han:api:idem:") {
				for f, v := range c.HGetAll(ctx, k).Val() {
					b.WriteString(f + "=" + v + "\n")
				}
			} else {
				b.WriteString(c.Get(ctx, k).Val() + "\n")
			}
		}
	}
	return b.String()
}
