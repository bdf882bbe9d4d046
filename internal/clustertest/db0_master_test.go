package clustertest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// On a Redis Cluster a DB0 failure is one master's, and a failure reported
// without its key (Observe) cannot name that master: it marks nothing
// down, where marking the whole of DB0 down would fail every call on the
// healthy masters until a probe answered.
func TestDB0HealthObserveWithoutKeyMarksNothingDown(t *testing.T) {
	health := rds.NewRedisHealth(shared(t), rds.HealthConfig{}, nil)
	t.Cleanup(health.Close)
	err := health.Observe(fmt.Errorf("eval: %w", context.DeadlineExceeded))
	if !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("an unanswered call classified as %v, want redis unavailable", err)
	}
	if health.Down() || health.Check() != nil {
		t.Fatal("a failure reported without its key marked DB0 down on a cluster")
	}
}

// On a Redis Cluster a DB0 failure is one master's. The limiter given the
// shared DB0 health reports a decision that got no reply with its key, so
// only that master is marked down: the decisions whose keys live on the
// healthy masters are made while it stalls (they were all refused once the
// failure marked the whole of DB0 down), the stalled master's fail at
// once, and they are made again once it wakes.
func TestDB0HealthMarksOnlyTheMasterThatFailed(t *testing.T) {
	c, rdb := stallCluster(t)
	ctx := context.Background()
	health := rds.NewRedisHealth(rdb, rds.HealthConfig{}, nil)
	t.Cleanup(health.Close)
	l, err := ratelimit.New(ratelimit.Config{Redis: rdb, Health: health, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	const label = "GET /v1/dialogs"
	p := ratelimit.Policy{Algorithm: ratelimit.FixedWindow, OnFailure: ratelimit.FailClosed,
		Rules: []ratelimit.Rule{{Family: ratelimit.FamilyUser, Limit: 1000, Window: time.Minute}}}
	keyOf := func(u string) string { return limitKey(label, p, u) }
	victim := c.Nodes[0]
	users := usersByMaster(t, c, keyOf)
	stalled, healthy := users[victim.Addr()], othersThan(users, victim.Addr())
	decide := func(u string) error {
		d, err := l.Decide(ctx, label, p, ratelimit.Subject{UserID: u})
		if err == nil && !d.Allowed {
			t.Fatalf("user %s denied under a limit of 1000", u)
		}
		return err
	}
	for _, u := range users { // load the scripts, open the connections
		if err := decide(u); err != nil {
			t.Fatal(err)
		}
	}

	thaw := victim.Freeze(t)
	defer thaw()
	if err := decide(stalled); err == nil {
		t.Fatal("a decision on the stalled master was made")
	}
	if err := health.Check(); err != nil {
		t.Fatalf("one stalled master marked the whole of DB0 down: %v", err)
	}
	if err := health.CheckKey(keyOf(stalled)); !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("the stalled master is not marked down: %v", err)
	}
	for i := range 12 {
		if err := decide(healthy[i%len(healthy)]); err != nil {
			t.Fatalf("decision %d on a healthy master while one stalled: %v", i+1, err)
		}
	}
	if err := decide(stalled); !errors.Is(err, rds.ErrRedisUnavailable) {
		t.Fatalf("a decision on the stalled master once it was marked down: %v, want it refused at once", err)
	}

	thaw()
	testenv.Eventually(t, 20*time.Second, func() bool {
		return decide(stalled) == nil && !health.Down()
	}, "decisions on the stalled master were not made again once it woke")
}

// A download URL is handed out only where its rate limit can be applied
// (docs/degraded-mode.md). On a Redis Cluster that limit lives on the
// master of the user's limit key, and that master alone decides: while
// another master stalls, the users whose limit lives on the healthy
// masters get their URLs every time (a DB0 check by PING went to a master
// picked at random, and one that reached the stalled master refused the
// request), and those whose limit lives on the stalled master are refused
// 503 redis_unavailable until it wakes.
func TestGatewaysDownloadURLChecksTheMasterOfItsLimit(t *testing.T) {
	c, _ := stallCluster(t)
	g := startGateways(t, c, 1)[0]
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	label, p := ratelimit.DefaultPolicies().Lookup(http.MethodGet, "/v1/attachments/{id}/download-url")
	if len(p.Rules) != 1 || p.Rules[0].Family != ratelimit.FamilyUser {
		t.Fatalf("the download URL's policy is %+v; this test expects one user rule", p)
	}
	victim := c.Nodes[0]
	users := usersByMaster(t, c, func(u string) string { return limitKey(label, p, u) })
	stalled, healthy := users[victim.Addr()], othersThan(users, victim.Addr())
	att := uploadedFor(t, store.New(pool), stalled, healthy...)
	get := func(u string) (int, string) {
		code, b, _, err := apiCall(http.MethodGet, g.url()+"/v1/attachments/"+att+"/download-url", userToken(t, u), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return code, b
	}
	for _, u := range users {
		if code, b := get(u); code != http.StatusOK {
			t.Fatalf("download URL before the stall: %d %s", code, b)
		}
	}

	thaw := victim.Freeze(t)
	defer thaw()
	for i := range 20 {
		if code, b := get(healthy[i%len(healthy)]); code != http.StatusOK {
			t.Fatalf("download URL %d of a user whose limit lives on a healthy master, while another stalled: %d %s", i+1, code, b)
		}
	}
	if code, b := get(stalled); code != http.StatusServiceUnavailable || b != `{"error":"redis_unavailable"}` {
		t.Fatalf("download URL of a user whose limit lives on the stalled master: %d %s, want 503 redis_unavailable", code, b)
	}

	thaw()
	testenv.Eventually(t, 20*time.Second, func() bool {
		code, _ := get(stalled)
		return code == http.StatusOK
	}, "the download URL was still refused once the master woke")
}

// limitKey is the key a decision of policy p of route label counts user u
// on (p's first rule, a user rule).
func limitKey(label string, p ratelimit.Policy, u string) string {
	r := p.Rules[0]
	return ratelimit.Key(r.Family, u, ratelimit.RouteHash(label), p.Algorithm, r.Window)
}

// usersByMaster is, for each master of c, a user whose key (keyOf) lives
// on it, by master address.
func usersByMaster(t *testing.T, c *testenv.RedisCluster, keyOf func(string) string) map[string]string {
	t.Helper()
	users := map[string]string{}
	for len(users) < c.Opts.Masters {
		u := ids.New()
		m, err := c.MasterOf(context.Background(), keyOf(u))
		if err != nil {
			t.Fatal(err)
		}
		if users[m.Addr()] == "" {
			users[m.Addr()] = u
		}
	}
	return users
}

// othersThan are the users of users on masters other than addr.
func othersThan(users map[string]string, addr string) []string {
	var out []string
	for a, u := range users {
		if a != addr {
			out = append(out, u)
		}
	}
	return out
}

// uploadedFor records the users, a dialog of theirs and an uploaded
// attachment of it, and returns the attachment's id.
func uploadedFor(t *testing.T, st *store.Store, uploader string, members ...string) string {
	t.Helper()
	ctx := context.Background()
	for _, u := range append([]string{uploader}, members...) {
		if err := st.EnsureUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	d, err := st.CreateDialog(ctx, ids.New(), uploader, "attachments", members)
	if err != nil {
		t.Fatal(err)
	}
	a, err := st.CreateAttachment(ctx, store.CreateAttachment{ID: ids.New(), DialogID: d.ID, UploaderID: uploader,
		Filename: "a.txt", ContentType: "text/plain", SizeBytes: 3, UploadTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.MarkAttachmentUploaded(ctx, a.ID, "blob-"+a.ID, "sha"); err != nil {
		t.Fatal(err)
	}
	return a.ID
}
