package clustertest_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/project"
)

// newKey is the header of a send with a fresh Idempotency-Key.
func newKey() map[string]string { return map[string]string{"Idempotency-Key": ids.New()} }

// storedMessages is the number of messages PostgreSQL holds for dialogID.
func storedMessages(t *testing.T, dialogID string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM messages WHERE dialog_id = $1`, dialogID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A client retrying a send through another instance gets the first answer
// again, byte for byte, marked as a replay; the same key with another body
// is refused; PostgreSQL holds one message per key.
func TestGatewaysReplayIdempotentSendAcrossInstances(t *testing.T) {
	shared(t)
	gws := startGateways(t, env.Cluster, 3)
	masters, err := env.Cluster.Masters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, aTok := userOn(t, env.Cluster, gws[0], masters[0])
	bob, _ := userOn(t, env.Cluster, gws[1], masters[1])
	dialog := createDialog(t, gws[0], aTok, bob)
	url := func(g *gw) string { return g.url() + "/v1/dialogs/" + dialog + "/messages" }
	const sends = 6
	for i := range sends {
		key := map[string]string{"Idempotency-Key": fmt.Sprintf("replay-%d-%s", i, ids.New())}
		body := fmt.Sprintf(`{"body":"replay %d"}`, i)
		first := mustCall(t, 201, "POST", url(gws[i%3]), aTok, body, key)
		code, again, h, err := apiCall("POST", url(gws[(i+1)%3]), aTok, body, key)
		if err != nil || code != 201 || again != first || h.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("send %d retried on another instance: %d %s (replayed %q, %v); first answer %s",
				i, code, again, h.Get("Idempotent-Replayed"), err, first)
		}
		code, other, _, err := apiCall("POST", url(gws[(i+2)%3]), aTok, `{"body":"something else"}`, key)
		if err != nil || code != 409 || other != `{"error":"idempotency_key_reused"}` {
			t.Fatalf("send %d: the key with another body: %d %s (%v), want 409 idempotency_key_reused", i, code, other, err)
		}
	}
	if n := storedMessages(t, dialog); n != sends {
		t.Fatalf("%d messages stored for %d keys, want one per key", n, sends)
	}
}

// The send route's limits hold across instances on a cluster, where the
// user's and the dialog's counters live on different masters: once the
// dialog's limit is reached every instance answers 429 rate_limited with
// Retry-After, nothing more is stored, and the same user can still send to
// another dialog.
func TestGatewaysRateLimitAcrossInstances(t *testing.T) {
	shared(t)
	ctx := context.Background()
	label := ratelimit.Label("POST", "/v1/dialogs/{id}/messages")
	const window = 10 * time.Minute
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// The instances read the runtime settings when they start.
	if _, err := pool.Exec(ctx, `INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules) VALUES ($1, 'sliding', 'fail-closed', $2)`,
		label, fmt.Sprintf(`[{"family":"user","limit":10,"windowMs":%d},{"family":"dialog","limit":3,"windowMs":%d}]`,
			window.Milliseconds(), window.Milliseconds())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DELETE FROM rate_limit_policies WHERE route = $1`, label); err != nil {
			t.Error(err)
		}
	})
	gws := startGateways(t, env.Cluster, 3)
	masters, err := env.Cluster.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rh := ratelimit.RouteHash(label)
	var alice, aTok string
	for alice == "" {
		u, tok := userOn(t, env.Cluster, gws[0], masters[0])
		if m, err := env.Cluster.MasterOf(ctx, ratelimit.Key(ratelimit.FamilyUser, u, rh, ratelimit.SlidingLog, window)); err != nil {
			t.Fatal(err)
		} else if m == masters[0] {
			alice, aTok = u, tok
		}
	}
	bob, _ := userOn(t, env.Cluster, gws[1], masters[1])
	var dialog string
	for dialog == "" {
		d := createDialog(t, gws[0], aTok, bob)
		if m, err := env.Cluster.MasterOf(ctx, ratelimit.Key(ratelimit.FamilyDialog, d, rh, ratelimit.SlidingLog, window)); err != nil {
			t.Fatal(err)
		} else if m != masters[0] {
			dialog = d
		}
	}
	url := func(g *gw, d string) string { return g.url() + "/v1/dialogs/" + d + "/messages" }
	for i, g := range gws {
		mustCall(t, 201, "POST", url(g, dialog), aTok, fmt.Sprintf(`{"body":"limited %d"}`, i), newKey())
	}
	for _, g := range gws {
		code, body, h, err := apiCall("POST", url(g, dialog), aTok, `{"body":"one too many"}`, newKey())
		retry, _ := strconv.Atoi(h.Get("Retry-After"))
		if err != nil || code != 429 || body != `{"error":"rate_limited"}` || retry <= 0 {
			t.Fatalf("4th send to a dialog limited to 3, on instance %s: %d %s (Retry-After %q, %v)", g.name, code, body, h.Get("Retry-After"), err)
		}
	}
	if n := storedMessages(t, dialog); n != 3 {
		t.Fatalf("%d messages stored, want the 3 admitted", n)
	}
	other := createDialog(t, gws[1], aTok, bob)
	mustCall(t, 201, "POST", url(gws[2], other), aTok, `{"body":"another dialog"}`, newKey())
}

// The project Redis API through HTTP on a cluster, for a project on each
// master. The cache: an entry written on one instance is refused a
// create-only write on another, listed and counted on a third, deleted,
// and gone. The queue: a topic and a subscription made on two instances, a
// message published on a third and published again (the same message,
// 200), claimed on one instance, acknowledged on another, and never
// claimed again.
func TestGatewaysProjectAPIRoundTrip(t *testing.T) {
	shared(t)
	ctx := context.Background()
	gws := startGateways(t, env.Cluster, 3)
	masters, err := env.Cluster.Masters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	admin, tok := userOn(t, env.Cluster, gws[0], masters[0])
	for _, m := range masters {
		var pid string
		for pid == "" {
			p := ids.New()
			if owner, err := env.Cluster.MasterOf(ctx, project.NewKeys("dev", p).Meta()); err != nil {
				t.Fatal(err)
			} else if owner == m {
				pid = p
			}
		}
		if err := store.New(pool).CreateProject(ctx, pid, "cluster queue", []store.ProjectMember{{UserID: admin, Role: store.RoleAdmin}}); err != nil {
			t.Fatal(err)
		}
		cacheRoundTrip(t, gws, tok, pid)
		queueRoundTrip(t, gws, tok, pid)
	}
}

func cacheRoundTrip(t *testing.T, gws []*gw, tok, pid string) {
	t.Helper()
	base := func(g *gw) string { return g.url() + "/projects/" + pid + "/redis" }
	put := `{"key":"cart:1","type":"json","value":"{\"items\":2}","ttlSeconds":3600}`
	mustCall(t, 201, "PUT", base(gws[0])+"/cache", tok, put, nil)
	code, body, _, err := apiCall("PUT", base(gws[1])+"/cache", tok,
		`{"key":"cart:1","type":"string","value":"other","createOnly":true}`, nil)
	if err != nil || code != 409 || body != `{"error":"cache_key_exists"}` {
		t.Fatalf("create-only write of an existing key on another instance: %d %s (%v)", code, body, err)
	}
	var list struct {
		Items []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
		} `json:"items"`
	}
	decodeInto(t, mustCall(t, 200, "GET", base(gws[2])+"/cache", tok, "", nil), &list)
	if len(list.Items) != 1 || list.Items[0].Key != "cart:1" || list.Items[0].Value != `{"items":2}` {
		t.Fatalf("cache listing: %+v, want the one entry as written", list.Items)
	}
	var snap struct {
		Cache struct {
			Entries    int   `json:"entries"`
			UsageBytes int64 `json:"usageBytes"`
		} `json:"cache"`
	}
	decodeInto(t, mustCall(t, 200, "GET", base(gws[0]), tok, "", nil), &snap)
	if snap.Cache.Entries != 1 || snap.Cache.UsageBytes != int64(len("cart:1")+len(`{"items":2}`)) {
		t.Fatalf("snapshot's cache: %+v, want 1 entry of key + value bytes", snap.Cache)
	}
	mustCall(t, 204, "DELETE", base(gws[1])+"/cache?key=cart%3A1", tok, "", nil)
	list.Items = nil
	decodeInto(t, mustCall(t, 200, "GET", base(gws[2])+"/cache", tok, "", nil), &list)
	if len(list.Items) != 0 {
		t.Fatalf("cache listing after the delete: %+v", list.Items)
	}
}

func queueRoundTrip(t *testing.T, gws []*gw, tok, pid string) {
	t.Helper()
	base := func(g *gw) string { return g.url() + "/projects/" + pid + "/redis" }
	topic := jsonField(t, mustCall(t, 201, "POST", base(gws[0])+"/topics", tok, `{"name":"orders","description":"cluster"}`, nil), "id")
	sub := jsonField(t, mustCall(t, 201, "POST", base(gws[1])+"/subscriptions", tok,
		fmt.Sprintf(`{"topicId":%q,"name":"workers"}`, topic), nil), "id")
	publish := fmt.Sprintf(`{"producerId":"svc","clientEventId":"evt-1","payload":{"order":%q}}`, pid)
	first := mustCall(t, 201, "POST", base(gws[2])+"/topics/"+topic+"/messages", tok, publish, nil)
	msg := jsonField(t, first, "id")
	if again := mustCall(t, 200, "POST", base(gws[0])+"/topics/"+topic+"/messages", tok, publish, nil); jsonField(t, again, "id") != msg {
		t.Fatalf("publish retried on another instance: %s, first %s", again, first)
	}
	var claimed struct {
		Items []struct {
			Message struct {
				ID string `json:"id"`
			} `json:"message"`
			Token string `json:"token"`
		} `json:"items"`
	}
	decodeInto(t, mustCall(t, 200, "POST", base(gws[1])+"/subscriptions/"+sub+"/claim", tok, `{"count":10}`, nil), &claimed)
	if len(claimed.Items) != 1 || claimed.Items[0].Message.ID != msg || claimed.Items[0].Token == "" {
		t.Fatalf("claim: %+v, want the one message %s with a token", claimed.Items, msg)
	}
	ack := fmt.Sprintf(`{"messageId":%q,"token":%q,"status":"processed","result":"done"}`, msg, claimed.Items[0].Token)
	if r := mustCall(t, 200, "POST", base(gws[2])+"/subscriptions/"+sub+"/receipts", tok, ack, nil); jsonField(t, r, "status") != "processed" {
		t.Fatalf("ack: %s", r)
	}
	claimed.Items = nil
	decodeInto(t, mustCall(t, 200, "POST", base(gws[0])+"/subscriptions/"+sub+"/claim", tok, `{"count":10}`, nil), &claimed)
	if len(claimed.Items) != 0 {
		t.Fatalf("claimed again after the ack: %+v", claimed.Items)
	}
}
