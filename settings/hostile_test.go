package settings_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/settings"
	"github.com/han-app/gateway/store/rds"
)

// A rule whose limit × window does not fit the limiter's arithmetic (the
// product wraps around in 64 bits) is refused at refresh like any invalid
// version: the route keeps enforcing its previous policy, and its requests
// keep being decided. Taken, the bucket script refuses such a rule on every
// call, so a fail-closed route answered every request 503. (The table
// refuses such rows when they are written; these are written as a database
// from before that check could hold them.)
func TestLimitTimesWindowOverflowIsRefused(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	p := f.provider(settings.Config{})
	lim := f.instance(p)
	before := p.Version()
	for _, c := range []struct{ algorithm, rules string }{
		{"bucket", `[{"family":"user","limit":2305843009213693952,"windowMs":8}]`},         // 2^61 × 8 = 2^64
		{"sliding", `[{"family":"user","limit":9223372036854775807,"windowMs":2}]`},        // wraps to -2
		{"fixed", `[{"family":"user","limit":4611686018427387905,"windowMs":4}]`},          // wraps to 4
		{"bucket", `[{"family":"user","limit":1125899906842625,"windowMs":1}]`},            // 2^50 + 1, no wrap
		{"bucket", `[{"family":"user","limit":36028797018963968,"windowMs":31536000000}]`}, // 2^55 × 1 year
	} {
		f.execOldRow(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
			VALUES ('POST /v1/attachments', $1, 'fail-closed', $2)
			ON CONFLICT (route) DO UPDATE SET algorithm = EXCLUDED.algorithm, rules = EXCLUDED.rules`, c.algorithm, c.rules)
		if err := p.Refresh(ctx); !errors.Is(err, settings.ErrInvalid) {
			t.Errorf("%s %s: want ErrInvalid, got %v", c.algorithm, c.rules, err)
		}
		label, pol := lim.Policies().Lookup("POST", "/v1/attachments")
		d, err := lim.Decide(ctx, label, pol, ratelimit.Subject{UserID: ids.New()})
		if err != nil || !d.Allowed {
			t.Errorf("%s %s: a first request on the route: %+v %v", c.algorithm, c.rules, d, err)
		}
		if p.Version() != before || userLimit(t, p, "POST", "/v1/attachments") != 30 {
			t.Fatalf("%s %s replaced the settings in force: version %d, user limit %d", c.algorithm, c.rules,
				p.Version(), userLimit(t, p, "POST", "/v1/attachments"))
		}
	}
}

// The shared snapshot is only a copy of what PostgreSQL holds, and an
// instance takes it only when it is signed with the deployment's secret
// (HAN_HMAC_SECRET) for the key it is under. A value under the key of the
// state PostgreSQL is at that is not so signed - planted by someone who
// holds DB1's credentials but not the secret: a well-formed copy naming
// that state with every route unlimited, one signed with another secret, a
// genuine snapshot of another state copied there - is ignored, and so is a
// signed one that cannot be used (not JSON, another Redis type, naming
// another state, or with policies no version could pass). The instance
// applies PostgreSQL's rows, and the copy is replaced, so the instances that
// read it next take the right one. So without the secret, a copy planted
// in Redis cannot keep a committed change from the instances; with it, it
// can (docs/runtime-settings.md, "Trust").
func TestUnusableSharedSnapshotIsReplacedFromPostgreSQL(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	p := f.provider(settings.Config{})
	invalidRule := `{"GET /v1/me":{"algorithm":"fixed","onFailure":"local","rules":[{"family":"user","limit":0,"windowMs":1000}]}}`
	unlimited := `{"GET /v1/me":{"algorithm":"fixed","onFailure":"local","rules":[]},"POST /v1/dialogs/{id}/messages":{"algorithm":"sliding","onFailure":"local","rules":[]}}`
	snapshot := func(v int64, stamp, policies string) []byte {
		return []byte(`{"version":` + itoa(v) + `,"stamp":"` + stamp + `","policies":` + policies + `,"tunables":{}}`)
	}
	signed := func(key string, body []byte) []byte { return settings.SealSnapshot(testSecret, key, body) }
	for i, c := range []struct {
		name  string
		plant func(key string, version int64, stamp string)
	}{
		{"unsigned, naming the state, every route unlimited", func(key string, v int64, stamp string) {
			f.db1.Set(ctx, key, snapshot(v, stamp, unlimited), 0)
		}},
		{"signed with another secret", func(key string, v int64, stamp string) {
			f.db1.Set(ctx, key, settings.SealSnapshot([]byte("another-secret-0123456789"), key, snapshot(v, stamp, unlimited)), 0)
		}},
		{"a signed snapshot of another state copied here", func(key string, v int64, stamp string) {
			other := settings.SnapshotKey(v+1, stamp)
			f.db1.Set(ctx, key, signed(other, snapshot(v, stamp, unlimited)), 0)
		}},
		{"a signature cut short", func(key string, v int64, stamp string) {
			f.db1.Set(ctx, key, signed(key, snapshot(v, stamp, unlimited))[1:], 0)
		}},
		{"not JSON", func(key string, _ int64, _ string) { f.db1.Set(ctx, key, signed(key, []byte("{not json")), 0) }},
		{"a hash", func(key string, _ int64, _ string) { f.db1.HSet(ctx, key, "version", "1") }},
		{"another state", func(key string, v int64, _ string) {
			f.db1.Set(ctx, key, signed(key, snapshot(v-1, ids.New(), `{}`)), 0)
		}},
		{"an invalid rule", func(key string, v int64, stamp string) {
			f.db1.Set(ctx, key, signed(key, snapshot(v, stamp, invalidRule)), 0)
		}},
		{"an unknown family", func(key string, v int64, stamp string) {
			f.db1.Set(ctx, key, signed(key, snapshot(v, stamp, strings.Replace(invalidRule, `"user","limit":0`, `"planet","limit":5`, 1))), 0)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			limit := 11 + i
			f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
				VALUES ('GET /v1/me', 'fixed', 'local', $1)
				ON CONFLICT (route) DO UPDATE SET rules = EXCLUDED.rules`,
				`[{"family":"user","limit":`+itoa(int64(limit))+`,"windowMs":60000}]`)
			v, stamp := f.head()
			key := settings.SnapshotKey(v, stamp)
			c.plant(key, v, stamp)
			if err := p.Refresh(ctx); err != nil {
				t.Fatalf("refresh with a planted snapshot: %v", err)
			}
			if p.Version() != v || userLimit(t, p, "GET", "/v1/me") != limit {
				t.Fatalf("instance at version %d with limit %d; PostgreSQL is at %d with limit %d",
					p.Version(), userLimit(t, p, "GET", "/v1/me"), v, limit)
			}
			var s settings.Snapshot
			stored, err := f.db1.Get(ctx, key).Bytes()
			b, signed := settings.OpenSnapshot(testSecret, key, stored)
			if err != nil || !signed || json.Unmarshal(b, &s) != nil || s.Version != v || s.Stamp != stamp ||
				len(s.Policies["GET /v1/me"].Rules) != 1 || s.Policies["GET /v1/me"].Rules[0].Limit != limit {
				t.Fatalf("the shared snapshot was not replaced: %s %v", b, err)
			}
			next := f.provider(settings.Config{})
			if next.Version() != v || userLimit(t, next, "GET", "/v1/me") != limit {
				t.Fatalf("an instance started now: version %d, limit %d", next.Version(), userLimit(t, next, "GET", "/v1/me"))
			}
		})
	}
}

// A huge value planted under the snapshot key of the state PostgreSQL is at
// costs an instance a bounded read, not the whole value (every instance
// reads that key, a waiting one up to twenty times a second, and would hold
// it in memory): the instance applies PostgreSQL's rows and replaces the
// value with the real snapshot.
func TestHugeSharedSnapshotIsReadOnlyUpToItsBound(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	p := f.provider(settings.Config{RedisTimeout: 5 * time.Second})
	ad := env.Redis.AdminClient(1)
	defer ad.Close()
	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ('GET /v1/me', 'fixed', 'local', '[{"family":"user","limit":9,"windowMs":60000}]')`)
	v, stamp := f.head()
	key := settings.SnapshotKey(v, stamp)
	const planted = 16 << 20
	if err := ad.Set(ctx, key, strings.Repeat(" ", planted-1)+"{", settings.SnapshotTTL).Err(); err != nil {
		t.Fatal(err)
	}
	sent := func() int64 {
		info := ad.Info(ctx, "stats").Val()
		_, rest, _ := strings.Cut(info, "total_net_output_bytes:")
		n, err := strconv.ParseInt(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]), 10, 64)
		if err != nil {
			t.Fatalf("INFO stats: %v", err)
		}
		return n
	}
	before := sent()
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sent() - before; got >= planted {
		t.Fatalf("the refresh made Redis send %d bytes for a planted value of %d", got, planted)
	}
	if p.Version() != v || userLimit(t, p, "GET", "/v1/me") != 9 {
		t.Fatalf("instance at version %d with limit %d, PostgreSQL at %d with 9", p.Version(), userLimit(t, p, "GET", "/v1/me"), v)
	}
	if n := f.db1.StrLen(ctx, key).Val(); n >= planted {
		t.Fatalf("the planted value (%d bytes) was not replaced", n)
	}
}

// The dialog family protects a dialog's members on message send, where a
// send by an outsider gives its dialog admission back. On any other route
// an outsider's request (a history read answered 404, an attachment whose
// {id} is not a dialog at all) would spend the dialog's limit for good — on
// the send's own key when algorithm and window match — and silence the
// members. Such a rule is refused; the route keeps its policy in force.
// (The table refuses such rows when they are written; these are written as
// a database from before that check could hold them.)
func TestDialogFamilyOutsideMessageSendIsRefused(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	p := f.provider(settings.Config{})
	before := p.Version()
	for _, route := range []string{"GET /v1/dialogs/{id}/messages", "GET /v1/attachments/{id}/download-url", "other"} {
		method, template, _ := strings.Cut(route, " ")
		_, inForce := p.Policies().Lookup(method, template)
		f.execOldRow(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
			VALUES ($1, 'sliding', 'local', '[{"family":"user","limit":300,"windowMs":10000},{"family":"dialog","limit":60,"windowMs":10000}]')`, route)
		if err := p.Refresh(ctx); !errors.Is(err, settings.ErrInvalid) {
			t.Errorf("dialog family on %s: want ErrInvalid, got %v", route, err)
		}
		if _, pol := p.Policies().Lookup(method, template); p.Version() != before || !reflect.DeepEqual(pol, inForce) {
			t.Fatalf("dialog family on %s replaced the settings in force: version %d, policy %+v", route, p.Version(), pol)
		}
		f.exec(`DELETE FROM rate_limit_policies`)
		if err := p.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		before = p.Version()
	}
	// On message send it is the built-in family.
	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ('POST /v1/dialogs/{id}/messages', 'sliding', 'fail-closed', '[{"family":"user","limit":5,"windowMs":10000},{"family":"dialog","limit":5,"windowMs":10000}]')`)
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
}

// PostgreSQL stalled under a refresh — a session holds a lock on a settings
// table after a change committed — costs each instance no more than the
// refresh's own deadline: the settings in force stay, the rate limiter keeps
// deciding meanwhile, the refresh lock is given back at once (not left for
// its 30 s TTL), and once the lock is gone every instance applies the change.
func TestStalledPostgreSQLKeepsTheSettingsInForce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	a := f.provider(settings.Config{})
	b := f.provider(settings.Config{PeerWait: 50 * time.Millisecond})
	lim := f.instance(a)
	before := a.Version()
	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ('GET /v1/me', 'fixed', 'local', '[{"family":"user","limit":4,"windowMs":60000}]')`)
	v := f.version()

	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "LOCK TABLE rate_limit_policies IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	const deadline = 700 * time.Millisecond
	errs := make(chan error, 2)
	start := time.Now()
	for _, p := range []*settings.Provider{a, b} {
		go func() {
			rctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			errs <- p.Refresh(rctx)
		}()
	}
	time.Sleep(deadline / 2)
	if d := get(t, lim, ids.New(), "GET", "/v1/me"); !d.allowed || d.policy != `"user";q=120;w=60` {
		t.Fatalf("a decision while the refresh is stalled: %+v", d)
	}
	for range 2 {
		if err := <-errs; err == nil {
			t.Fatal("a refresh succeeded while PostgreSQL held the table")
		}
	}
	if el := time.Since(start); el > deadline+time.Second {
		t.Fatalf("the stalled refreshes took %v, deadline %v", el, deadline)
	}
	if a.Version() != before || b.Version() != before {
		t.Fatalf("versions %d/%d after a failed refresh, want %d in force", a.Version(), b.Version(), before)
	}
	if n := f.db1.Exists(ctx, rds.LockKey(rds.LockSettingsRefresh, "test")).Val(); n != 0 {
		t.Fatal("the refresh lock outlived the stalled refresh")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*settings.Provider{a, b} {
		if err := p.Refresh(ctx); err != nil || p.Version() != v || userLimit(t, p, "GET", "/v1/me") != 4 {
			t.Fatalf("after the stall: version %d (want %d), limit %d, %v", p.Version(), v, userLimit(t, p, "GET", "/v1/me"), err)
		}
	}
}

// A version whose snapshot is over the bound (a huge tunable) still applies
// on every instance, each reading PostgreSQL: it is not shared, since no
// instance would take it.
func TestSnapshotOverItsBoundIsNotShared(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	a := f.provider(settings.Config{})
	f.exec(`INSERT INTO runtime_settings(name, value) VALUES ('x.big', to_jsonb(repeat('x', $1::int))), ('x.int', '7')`,
		settings.MaxSnapshotBytes+1)
	v := f.version()
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	b := f.provider(settings.Config{})
	for _, p := range []*settings.Provider{a, b} {
		if p.Version() != v || p.Int("x.int", 1) != 7 {
			t.Fatalf("instance at version %d, x.int %d; PostgreSQL at %d, 7", p.Version(), p.Int("x.int", 1), v)
		}
	}
	if n := f.db1.Exists(ctx, f.snapshotKey()).Val(); n != 0 || f.publishes(v) != 0 {
		t.Fatalf("a snapshot over %d bytes was shared", settings.MaxSnapshotBytes)
	}
}
