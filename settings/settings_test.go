package settings_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/settings"
	"github.com/han-app/gateway/store/rds"
)

func userLimit(t *testing.T, p *settings.Provider, method, template string) int {
	t.Helper()
	_, pol := p.Policies().Lookup(method, template)
	for _, r := range pol.Rules {
		if r.Family == ratelimit.FamilyUser {
			return r.Limit
		}
	}
	return 0
}

// A policy row changed in PostgreSQL reaches two running instances (each
// with its own provider and limiter, one Redis) without a restart: both
// enforce the new limit on the shared counter, and deleting the row brings
// the built-in policy back. One instance read PostgreSQL and shared the
// snapshot; it carries the 5-minute TTL. (That the REST API answers with
// these decisions — RateLimit-Policy, 429 with Retry-After — is checked end
// to end in cmd/han-gateway.)
func TestPolicyChangeReachesEveryInstanceWithoutRestart(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	a := f.provider(settings.Config{RefreshInterval: 20 * time.Millisecond})
	b := f.provider(settings.Config{RefreshInterval: 20 * time.Millisecond})
	limA, limB := f.instance(a), f.instance(b)
	a.Start()
	b.Start()

	user := ids.New()
	if d := get(t, limA, user, "GET", "/v1/me"); !d.allowed || d.policy != `"user";q=120;w=60` {
		t.Fatalf("built-in policy: %+v", d)
	}

	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ('GET /v1/me', 'fixed', 'local', '[{"family":"user","limit":3,"windowMs":60000}]')`)
	v := f.version()
	testenv.Eventually(t, 10*time.Second, func() bool { return a.Version() == v && b.Version() == v },
		"instances at %d/%d, want %d", a.Version(), b.Version(), v)
	if got := a.Policies().Version; got != settings.PolicyVersion(v) {
		t.Fatalf("policy set version %q", got)
	}

	// The same user on both instances: one shared counter with the new
	// limit (one request was made before the change, on the same key).
	if d := get(t, limB, user, "GET", "/v1/me"); !d.allowed || d.policy != `"user";q=3;w=60` {
		t.Fatalf("instance B after the change: %+v", d)
	}
	if d := get(t, limA, user, "GET", "/v1/me"); !d.allowed {
		t.Fatalf("third request: %+v", d)
	}
	for name, lim := range map[string]*ratelimit.Limiter{"A": limA, "B": limB} {
		if d := get(t, lim, user, "GET", "/v1/me"); d.allowed || d.retryAfter < 1 {
			t.Fatalf("instance %s must enforce the new limit: %+v", name, d)
		}
	}
	// Routes without a row keep their built-in policies.
	if n := userLimit(t, b, "POST", "/v1/dialogs/{id}/messages"); n != 30 {
		t.Fatalf("message send user limit %d, want the built-in 30", n)
	}

	// Exactly one instance read PostgreSQL and shared the snapshot.
	if n := f.publishes(v); n != 1 {
		t.Fatalf("version %d published %d times", v, n)
	}
	ttl := f.db1.PTTL(ctx, f.snapshotKey()).Val()
	if ttl <= 0 || ttl > settings.SnapshotTTL {
		t.Fatalf("snapshot PTTL %s, want (0, 5m]", ttl)
	}

	// Deleting the override restores the built-in policy everywhere.
	f.exec(`DELETE FROM rate_limit_policies WHERE route = 'GET /v1/me'`)
	v2 := f.version()
	testenv.Eventually(t, 10*time.Second, func() bool { return a.Version() == v2 && b.Version() == v2 },
		"instances did not pick up the delete")
	if d := get(t, limB, user, "GET", "/v1/me"); !d.allowed || d.policy != `"user";q=120;w=60` {
		t.Fatalf("after the delete: %+v", d)
	}
}

// The refresh lock is held by one instance at a time: while A holds it
// and builds a version, B neither takes it nor publishes; B still gets the
// version (from PostgreSQL, the truth) without waiting for A. A then
// publishes once, and a third instance picks the snapshot up from Redis
// without touching the lock.
func TestRefreshLockIsHeldByOneInstanceAtATime(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	a := f.provider(settings.Config{})
	b := f.provider(settings.Config{PeerWait: 50 * time.Millisecond})

	f.exec(`INSERT INTO runtime_settings(name, value) VALUES ('legacy_stub.verdict_after_polls', '5')`)
	v := f.version()
	lockKey := rds.LockKey(rds.LockSettingsRefresh, "test")

	inLock, release := make(chan struct{}), make(chan struct{})
	settings.SetInLock(a, func() {
		close(inLock)
		<-release
	})
	aDone := make(chan error, 1)
	go func() { aDone <- a.Refresh(ctx) }()
	<-inLock
	holder := f.db1.Get(ctx, lockKey).Val()
	if ttl := f.db1.PTTL(ctx, lockKey).Val(); holder == "" || ttl <= 0 || ttl > rds.DefaultLockTTL {
		t.Fatalf("refresh lock while A builds: owner %q PTTL %s", holder, ttl)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Version() != v || b.Int("legacy_stub.verdict_after_polls", 3) != 5 {
		t.Fatalf("B must read the version itself while the lock is taken: version %d", b.Version())
	}
	if got := f.db1.Get(ctx, lockKey).Val(); got != holder {
		t.Fatal("B took the refresh lock while A held it")
	}
	if n := f.publishes(v); n != 0 {
		t.Fatalf("B published %d snapshots without the lock", n)
	}
	close(release)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if a.Version() != v || f.publishes(v) != 1 {
		t.Fatalf("A: version %d, publishes %d", a.Version(), f.publishes(v))
	}
	if n := f.db1.Exists(ctx, lockKey).Val(); n != 0 {
		t.Fatal("the refresh lock outlived the refresh")
	}
	c := f.provider(settings.Config{})
	if c.Version() != v || f.publishes(v) != 1 {
		t.Fatalf("C must take the shared snapshot: version %d, publishes %d", c.Version(), f.publishes(v))
	}
}

// An invalid version is refused as a whole: the previous policies stay in
// force, nothing is shared, and the next valid version applies. (The table
// refuses such rows when they are written; these are written as a database
// from before that check could hold them.)
func TestInvalidVersionKeepsThePreviousSettings(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	p := f.provider(settings.Config{})
	before := p.Version()
	for _, rules := range []string{
		`[{"family":"planet","limit":3,"windowMs":1000}]`,
		`[{"family":"user","limit":0,"windowMs":1000}]`,
		`[{"family":"user","limit":3,"windowMs":1000,"burst":9}]`,
		`[{"family":"user","limit":3,"windowMs":0}]`,
	} {
		f.execOldRow(`INSERT INTO rate_limit_policies(route, algorithm, rules) VALUES ('GET /v1/me', 'fixed', $1)
			ON CONFLICT (route) DO UPDATE SET rules = EXCLUDED.rules`, rules)
		err := p.Refresh(ctx)
		if !errors.Is(err, settings.ErrInvalid) {
			t.Fatalf("rules %s: want ErrInvalid, got %v", rules, err)
		}
		if p.Version() != before || userLimit(t, p, "GET", "/v1/me") != 120 {
			t.Fatalf("rules %s replaced the settings in force (version %d)", rules, p.Version())
		}
		if n := f.db1.Exists(ctx, f.snapshotKey()).Val(); n != 0 {
			t.Fatalf("an invalid version was shared")
		}
	}
	f.exec(`UPDATE rate_limit_policies SET rules = '[{"family":"user","limit":7,"windowMs":1000}]'`)
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if userLimit(t, p, "GET", "/v1/me") != 7 {
		t.Fatal("the valid version did not apply")
	}
	// "other" overrides the catch-all policy.
	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ('other', 'sliding', 'fail-closed', '[{"family":"user","limit":9,"windowMs":10000},{"family":"service","limit":9,"windowMs":10000}]')`)
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	label, pol := p.Policies().Lookup("GET", "/v1/not-listed")
	if label != ratelimit.OtherRoute || pol.Algorithm != ratelimit.SlidingLog || pol.OnFailure != ratelimit.FailClosed || pol.Rules[0].Limit != 9 {
		t.Fatalf("other policy: %s %+v", label, pol)
	}
}

// PostgreSQL is the truth: with DB1 unreachable a provider still applies
// new versions, reading PostgreSQL directly.
func TestSettingsWithoutRedis(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	dead, err := rds.NewRedis("redis://127.0.0.1:1/1", rds.RedisConfig{MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	p, err := settings.New(settings.Config{Scope: "test", RedisTimeout: 200 * time.Millisecond, Secret: testSecret}, f.store, dead)
	if err != nil {
		t.Fatal(err)
	}
	f.exec(`INSERT INTO runtime_settings(name, value) VALUES ('x.int', '42'), ('x.text', '"no"')`)
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Version() != f.version() || p.Int("x.int", 1) != 42 || p.Int("x.text", 1) != 1 || p.Int("x.none", 2) != 2 {
		t.Fatalf("version %d, tunables %d %d %d", p.Version(), p.Int("x.int", 1), p.Int("x.text", 1), p.Int("x.none", 2))
	}
}

// PostgreSQL is the truth even when it goes back in time (a failover to a
// replica that had not received the last settings commit, a point-in-time
// restore): a running instance drops the lost settings for the state
// PostgreSQL is at, although its version is lower; and the next change,
// which reuses the lost version number with other content, reaches running
// and newly started instances alike, none of them taking it for the lost
// one or reading the lost one's snapshot, still in Redis.
func TestSettingsFollowPostgreSQLBackInTime(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	p := f.provider(settings.Config{})
	var (
		v0     int64
		stamp0 string
	)
	if err := f.pool.QueryRow(ctx, "SELECT version, stamp::text FROM settings_head").Scan(&v0, &stamp0); err != nil {
		t.Fatal(err)
	}

	// Committed on the primary, then lost by the failover: a limit of 3.
	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ('GET /v1/me', 'fixed', 'local', '[{"family":"user","limit":3,"windowMs":60000}]')`)
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	lostKey := f.snapshotKey()
	if n := userLimit(t, p, "GET", "/v1/me"); n != 3 || p.Version() != v0+1 {
		t.Fatalf("precondition: version %d limit %d, want %d and 3", p.Version(), n, v0+1)
	}
	if f.db1.Exists(ctx, lostKey).Val() != 1 {
		t.Fatal("precondition: the lost version's snapshot was not shared")
	}

	// The failover: the promoted replica is exactly at v0, without that row.
	f.exec(`ALTER TABLE rate_limit_policies DISABLE TRIGGER rate_limit_policies_version`)
	f.exec(`DELETE FROM rate_limit_policies`)
	f.exec(`ALTER TABLE rate_limit_policies ENABLE TRIGGER rate_limit_policies_version`)
	f.exec(`DELETE FROM settings_versions WHERE version > $1`, v0)
	f.exec(`ALTER TABLE settings_head DISABLE TRIGGER settings_head_stamp`)
	f.exec(`UPDATE settings_head SET version = $1, stamp = $2`, v0, stamp0)
	f.exec(`ALTER TABLE settings_head ENABLE TRIGGER settings_head_stamp`)

	t.Run("a running instance goes back to the older version", func(t *testing.T) {
		if err := p.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if n := userLimit(t, p, "GET", "/v1/me"); n != 120 || p.Version() != v0 {
			t.Fatalf("PostgreSQL is back at version %d without the override; the instance is at %d with limit %d", v0, p.Version(), n)
		}
	})

	t.Run("a change reusing the lost version number reaches every instance", func(t *testing.T) {
		f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
			VALUES ('GET /v1/me', 'fixed', 'local', '[{"family":"user","limit":50,"windowMs":60000}]')`)
		if v := f.version(); v != v0+1 {
			t.Fatalf("precondition: version %d, want the lost number %d", v, v0+1)
		}
		if f.snapshotKey() == lostKey {
			t.Fatal("the new state has the lost state's snapshot key")
		}
		if err := p.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		fresh := f.provider(settings.Config{}) // an instance started now
		running, started := userLimit(t, p, "GET", "/v1/me"), userLimit(t, fresh, "GET", "/v1/me")
		if running != 50 || started != 50 {
			t.Fatalf("PostgreSQL version %d says limit 50; the running instance enforces %d, a new instance %d", v0+1, running, started)
		}
	})
}

// Every change is a new version, in commit order, with its history row.
func TestEveryChangeIsANewVersion(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	v0 := f.version()
	f.exec(`INSERT INTO runtime_settings(name, value) VALUES ('a.b', '1')`)
	f.exec(`UPDATE runtime_settings SET value = '2' WHERE name = 'a.b'`)
	f.exec(`DELETE FROM runtime_settings WHERE name = 'a.b'`)
	if v := f.version(); v != v0+3 {
		t.Fatalf("version %d after three changes from %d", v, v0)
	}
	var n int
	if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM settings_versions WHERE version > $1", v0).Scan(&n); err != nil || n != 3 {
		t.Fatalf("history rows: %d %v", n, err)
	}
	rows, err := f.store.LoadSettings(ctx)
	if err != nil || rows.Version != v0+3 {
		t.Fatalf("LoadSettings: %+v %v", rows, err)
	}
}
