package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store"
)

// scenario drives the real program through what its users do: a dialog
// with idempotent sends, and a project with cache entries and a topic.
type scenario struct {
	t                *testing.T
	m                *Main
	alice, bob       string
	aTok, bTok       string
	dialog           string
	project, topicID string
}

func newScenario(t *testing.T, m *Main) *scenario {
	t.Helper()
	s := &scenario{t: t, m: m, alice: ids.New(), bob: ids.New()}
	s.aTok, s.bTok = s.token(s.alice), s.token(s.bob)
	call(t, "GET", m.URL()+"/v1/me", s.bTok, "")
	code, body := call(t, "POST", m.URL()+"/v1/dialogs", s.aTok, fmt.Sprintf(`{"memberIds":[%q]}`, s.bob))
	if code != 201 {
		t.Fatalf("create dialog: %d %s", code, body)
	}
	s.dialog = jsonField(t, body, "id")
	s.project = ids.New()
	if err := store.New(m.pg).CreateProject(context.Background(), s.project, "resilience",
		[]store.ProjectMember{{UserID: s.alice, Role: store.RoleAdmin}}); err != nil {
		t.Fatal(err)
	}
	code, body = s.prj("POST", "/topics", `{"name":"orders","description":"resilience"}`)
	if code != 201 {
		t.Fatalf("create topic: %d %s", code, body)
	}
	s.topicID = jsonField(t, body, "id")
	return s
}

func (s *scenario) token(sub string) string {
	tok, err := auth.MintDevToken([]byte(devSecret), auth.DevClaims{Subject: sub, Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}

func (s *scenario) send(key, text string) (int, string) {
	s.t.Helper()
	return callH(s.t, "POST", s.m.URL()+"/v1/dialogs/"+s.dialog+"/messages", s.aTok, `{"body":"`+text+`"}`,
		map[string]string{"Idempotency-Key": key, "Content-Type": "application/json"})
}

// messages is the number of messages the dialog's history holds.
func (s *scenario) messages() int {
	s.t.Helper()
	code, body := call(s.t, "GET", s.m.URL()+"/v1/dialogs/"+s.dialog+"/messages?afterSeq=0&limit=100", s.bTok, "")
	if code != 200 {
		s.t.Fatalf("history: %d %s", code, body)
	}
	return strings.Count(body, `"seq":`)
}

func (s *scenario) prj(method, rest, body string) (int, string) {
	s.t.Helper()
	return callH(s.t, method, s.m.URL()+"/projects/"+s.project+"/redis"+rest, s.aTok, body,
		map[string]string{"Content-Type": "application/json"})
}

func (s *scenario) publish(clientEventID, payload string) (int, string) {
	s.t.Helper()
	return s.prj("POST", "/topics/"+s.topicID+"/messages",
		fmt.Sprintf(`{"producerId":"svc","clientEventId":%q,"payload":%s}`, clientEventID, payload))
}

// topicMessages is the number of messages the topic holds.
func (s *scenario) topicMessages() int {
	s.t.Helper()
	code, body := s.prj("GET", "/topics/"+s.topicID+"/messages?limit=100", "")
	if code != 200 {
		s.t.Fatalf("topic messages: %d %s", code, body)
	}
	return strings.Count(body, `"clientEventId":`)
}

func jsonField(t *testing.T, body, field string) string {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	s, _ := v[field].(string)
	if s == "" {
		t.Fatalf("no %q in %s", field, body)
	}
	return s
}

func startOn(t *testing.T, r *testenv.RedisServer, extra map[string]string) *Main {
	t.Helper()
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = r.URL(0), r.URL(1)
	for k, v := range extra {
		vars[k] = v
	}
	return start(t, vars)
}

func countKeys(t *testing.T, r *testenv.RedisServer, db int, pattern string) int {
	t.Helper()
	c := r.AdminClient(db)
	defer c.Close()
	keys, err := c.Keys(context.Background(), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// Restart with AOF/RDB: the idempotency records and the project's
// reliable keys (topic messages, publish dedupe) are in Redis again after a
// crash and restart, so a retried send and a retried publish replay instead
// of producing a second message.
func TestRestartWithAOFKeepsIdempotencyAndProjectKeys(t *testing.T) {
	testRestartKeeps(t, true)
}

func TestRestartWithRDBKeepsIdempotencyAndProjectKeys(t *testing.T) {
	testRestartKeeps(t, false)
}

func testRestartKeeps(t *testing.T, aof bool) {
	r, err := testenv.StartRedis(testenv.RedisOptions{AppendOnly: aof})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	m := startOn(t, r, nil)
	s := newScenario(t, m)
	code, first := s.send("restart-1", "kept across a restart")
	if code != 201 {
		t.Fatalf("send: %d %s", code, first)
	}
	code, pub := s.publish("evt-1", `{"order":1}`)
	if code != 201 && code != 200 {
		t.Fatalf("publish: %d %s", code, pub)
	}
	idem := countKeys(t, r, 0, "han:api:idem:*")
	prj := countKeys(t, r, 0, "han:prj:*")
	if idem == 0 || prj == 0 {
		t.Fatalf("nothing to keep: %d idempotency keys, %d project keys", idem, prj)
	}
	if !aof {
		admin := r.AdminClient(0)
		err := admin.Save(context.Background()).Err()
		admin.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := countKeys(t, r, 0, "han:api:idem:*"); got != idem {
		t.Fatalf("idempotency keys after restart: %d, want %d", got, idem)
	}
	if got := countKeys(t, r, 0, "han:prj:*"); got != prj {
		t.Fatalf("project keys after restart: %d, want %d", got, prj)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := s.send("restart-1", "kept across a restart")
		return code == 201
	}, "the service did not recover after the restart")
	if code, replay := s.send("restart-1", "kept across a restart"); code != 201 || replay != first {
		t.Fatalf("replay after restart: %d %s, want %s", code, replay, first)
	}
	if code, body := s.publish("evt-1", `{"order":1}`); code != 200 && code != 201 {
		t.Fatalf("publish replay after restart: %d %s", code, body)
	}
	if code, body := s.publish("evt-1", `{"order":2}`); code != 409 {
		t.Fatalf("the publish dedupe record must survive the restart (different body → 409): %d %s", code, body)
	}
	if n := s.messages(); n != 1 {
		t.Fatalf("dialog messages: %d, want 1", n)
	}
	if n := s.topicMessages(); n != 1 {
		t.Fatalf("topic messages: %d, want 1", n)
	}
}

// Corrupted AOF rehearsal for the whole service: the AOF tail is
// corrupted while Redis is down, the server refuses to load it,
// redis-check-aof --fix truncates the bad tail, the server starts with
// everything written before, and the running service recovers without a
// restart of its own.
func TestCorruptedAOFRehearsal(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{AppendOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	m := startOn(t, r, nil)
	s := newScenario(t, m)
	code, first := s.send("aof-1", "written before the corruption")
	if code != 201 {
		t.Fatalf("send: %d %s", code, first)
	}
	idem := countKeys(t, r, 0, "han:api:idem:*")
	r.Kill()
	incr, err := filepath.Glob(filepath.Join(r.Dir, "appendonlydir", "*.incr.aof"))
	if err != nil || len(incr) != 1 {
		t.Fatalf("incremental AOF: %v %v", incr, err)
	}
	f, err := os.OpenFile(incr[0], os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A command cut off mid-argument followed by garbage: not a clean
	// truncation, so aof-load-truncated does not save the day.
	_, _ = f.WriteString("*3\r\n$3\r\nSET\r\n$8\r\nhan:api:\r\nXXXXgarbage\r\n")
	f.Close()
	if err := r.Restart(); err == nil {
		t.Fatal("redis-server loaded a corrupted AOF")
	}
	out, err := runCheckAOF(filepath.Join(r.Dir, "appendonlydir", "appendonly.aof.manifest"))
	if err != nil {
		t.Fatalf("redis-check-aof --fix: %v\n%s", err, out)
	}
	if err := r.Restart(); err != nil {
		t.Fatalf("restart after the fix: %v", err)
	}
	if got := countKeys(t, r, 0, "han:api:idem:*"); got != idem {
		lg, _ := os.ReadFile(filepath.Join(r.Dir, "redis.log"))
		t.Fatalf("idempotency keys after the fix: %d, want %d\n%s", got, idem, lastLog(lg))
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := s.send("aof-2", "after the rehearsal")
		return code == 201
	}, "the service did not recover after the AOF fix")
	if code, replay := s.send("aof-1", "written before the corruption"); code != 201 || replay != first {
		t.Fatalf("replay: %d %s", code, replay)
	}
	if n := s.messages(); n != 2 {
		t.Fatalf("dialog messages: %d, want 2", n)
	}
}

// Empty restore: Redis comes back with no data at all. Completed
// sends replay byte for byte from PostgreSQL (and warm the key again), new
// sends work, nothing is duplicated, and the realtime link resyncs (the
// instance's Pub/Sub link and presence come back without a restart).
func TestEmptyRestore(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	m := startOn(t, r, nil)
	s := newScenario(t, m)
	code, first := s.send("empty-1", "before the restore")
	if code != 201 {
		t.Fatalf("send: %d %s", code, first)
	}
	admin := r.AdminClient(0)
	err = admin.FlushAll(context.Background()).Err()
	admin.Close()
	if err != nil {
		t.Fatal(err)
	}
	if n := countKeys(t, r, 0, "*"); n != 0 {
		t.Fatalf("FLUSHALL left %d DB0 keys", n)
	}
	if code, replay := s.send("empty-1", "before the restore"); code != 201 || replay != first {
		t.Fatalf("a completed send must replay from PostgreSQL after an empty restore: %d %s", code, replay)
	}
	if code, body := s.send("empty-1", "a different body"); code != 409 {
		t.Fatalf("the durable fingerprint must still hold after an empty restore: %d %s", code, body)
	}
	if code, body := s.send("empty-2", "after the restore"); code != 201 {
		t.Fatalf("new send after an empty restore: %d %s", code, body)
	}
	if n := s.messages(); n != 2 {
		t.Fatalf("dialog messages: %d, want 2", n)
	}
	// Also lose the server (no persistence): the service recovers without a
	// restart and the Pub/Sub link is reported up again.
	r.Kill()
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		code, body := call(t, "GET", m.URL()+"/readyz", "", "")
		return code == 200 && strings.Contains(body, `"pubsub":"ok"`) && !strings.Contains(body, "degraded")
	}, "readiness did not return to ok after the empty restart")
	if code, replay := s.send("empty-1", "before the restore"); code != 201 || replay != first {
		t.Fatalf("replay after the empty restart: %d %s", code, replay)
	}
	if n := s.messages(); n != 2 {
		t.Fatalf("dialog messages after the empty restart: %d, want 2", n)
	}
}

// Memory pressure and eviction cause no duplicate business side effect:
// a small maxmemory with volatile-lru; the project cache is filled past it
// so Redis evicts, and retried sends and publishes are still exactly-once.
func TestMemoryPressureVolatileLRU(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{MaxMemory: "4mb", EvictionPolicy: "volatile-lru"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	m := startOn(t, r, nil)
	s := newScenario(t, m)
	value := strings.Repeat("v", 32<<10)
	evicted := func() int64 {
		admin := r.AdminClient(0)
		defer admin.Close()
		info, err := admin.Info(context.Background(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "evicted_keys:"); ok {
				fmt.Sscan(v, &n)
			}
		}
		return n
	}
	round := 0
	for i := 0; i < 400 && evicted() == 0; i++ {
		code, body := s.prj("PUT", "/cache", fmt.Sprintf(`{"key":"fill-%d","type":"string","value":%q,"ttlSeconds":3600}`, i, value))
		if code != 200 && code != 201 && code != 503 && code != 409 {
			t.Fatalf("cache put %d: %d %s", i, code, body)
		}
		// Interleave business writes with the pressure, each retried once.
		if i%20 == 0 {
			round++
			key := fmt.Sprintf("mp-%d", round)
			c1, b1 := s.send(key, key)
			c2, b2 := s.send(key, key)
			if c1 == 201 && (c2 != 201 || b2 != b1) {
				t.Fatalf("retried send under pressure: %d %s then %d %s", c1, b1, c2, b2)
			}
			if c1 != 201 && c1 != 503 {
				t.Fatalf("send under pressure: %d %s", c1, b1)
			}
			p1, b1 := s.publish(key, `{"n":1}`)
			p2, b2 := s.publish(key, `{"n":1}`)
			accepted := func(c int) bool { return c == 200 || c == 201 }
			if !accepted(p1) && p1 != 503 || accepted(p1) && !accepted(p2) {
				t.Fatalf("publish under pressure and its retry: %d %s then %d %s", p1, b1, p2, b2)
			}
		}
	}
	if evicted() == 0 {
		t.Fatal("no eviction happened: the test did not create memory pressure")
	}
	// Every send that was accepted appears once; retries add nothing.
	seen := map[string]int{}
	code, body := call(t, "GET", m.URL()+"/v1/dialogs/"+s.dialog+"/messages?afterSeq=0&limit=100", s.bTok, "")
	if code != 200 {
		t.Fatalf("history: %d %s", code, body)
	}
	for i := 1; i <= round; i++ {
		seen[fmt.Sprintf("mp-%d", i)] = strings.Count(body, fmt.Sprintf(`"body":"mp-%d"`, i))
	}
	for k, n := range seen {
		if n > 1 {
			t.Fatalf("message %s stored %d times", k, n)
		}
	}
	code, body = s.prj("GET", "/topics/"+s.topicID+"/messages?limit=100", "")
	if code != 200 {
		t.Fatalf("topic messages: %d %s", code, body)
	}
	for i := 1; i <= round; i++ {
		if n := strings.Count(body, fmt.Sprintf(`"clientEventId":"mp-%d"`, i)); n > 1 {
			t.Fatalf("topic message mp-%d stored %d times", i, n)
		}
	}
	// After the pressure the cache evicted entries but every retried send
	// still replays from PostgreSQL even if its Redis record was evicted.
	for i := 1; i <= round; i++ {
		key := fmt.Sprintf("mp-%d", i)
		if seen[key] == 1 {
			if code, _ := s.send(key, key); code != 201 {
				t.Fatalf("replay of %s after eviction: %d", key, code)
			}
		}
	}
	if n := s.messages(); n > round {
		t.Fatalf("dialog has %d messages for %d distinct sends", n, round)
	}
}

// Network partition, latency and reconnect backoff, through a TCP
// fault proxy between the service and its redis-server: latency under the
// budget is absorbed; a partition fails new sends closed (503) within the
// budget while completed sends replay from PostgreSQL; after the partition
// heals the service recovers on its own and nothing was duplicated.
func TestNetworkPartitionAndLatency(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	p, err := faultproxy.Start(r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	url := func(db int) string { return strings.Replace(r.URL(db), r.Addr(), p.Addr(), 1) }
	vars := baseEnv()
	vars["REDIS_URL"], vars["REDIS_REALTIME_URL"] = url(0), url(1)
	vars["HAN_REDIS_TIMEOUT"] = "500ms"
	m := start(t, vars)
	s := newScenario(t, m)

	code, first := s.send("net-1", "before the partition")
	if code != 201 {
		t.Fatalf("send: %d %s", code, first)
	}
	p.SetLatency(20 * time.Millisecond)
	if code, body := s.send("net-2", "with latency"); code != 201 {
		t.Fatalf("latency under the budget must be absorbed: %d %s", code, body)
	}
	p.SetLatency(0)

	p.Blackhole(true)
	began := time.Now()
	code, body := s.send("net-3", "during the partition")
	if code != 503 || body != `{"error":"redis_unavailable"}` {
		t.Fatalf("a new send during a partition must fail closed: %d %s", code, body)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("fail-closed took %v with a 500ms Redis budget", d)
	}
	if code, replay := s.send("net-1", "before the partition"); code != 201 || replay != first {
		t.Fatalf("a completed send must replay from PostgreSQL during a partition: %d %s", code, replay)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := call(t, "GET", m.URL()+"/readyz", "", "")
		return code == 200 && strings.Contains(body, "degraded")
	}, "readiness does not report the partition")

	p.Blackhole(false)
	p.Cut() // connections that lived through the partition are out of step
	testenv.Eventually(t, 15*time.Second, func() bool {
		code, _ := s.send("net-3", "during the partition")
		return code == 201
	}, "sends did not recover after the partition healed")
	testenv.Eventually(t, 15*time.Second, func() bool {
		code, body := call(t, "GET", m.URL()+"/readyz", "", "")
		return code == 200 && strings.Contains(body, `"pubsub":"ok"`) && !strings.Contains(body, "degraded")
	}, "readiness did not recover after the partition healed")
	if n := s.messages(); n != 3 {
		t.Fatalf("dialog messages: %d, want 3 (no loss, no duplicate)", n)
	}
}

func runCheckAOF(manifest string) ([]byte, error) {
	cmd := exec.Command("redis-check-aof", "--fix", manifest)
	cmd.Stdin = strings.NewReader("y\n")
	return cmd.CombinedOutput()
}

// lastLog is the tail of a redis.log, for failure messages.
func lastLog(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// The outage semantics hold at a modest bounded rate across many dialogs
// (small enough for CI): 16 dialogs, each with its own sender, 12 messages
// each sent concurrently; Redis is killed once a third of them are in and
// restarted after sends have been refused. Every refusal is a fail-closed
// 503 redis_unavailable within the budget; clients retry with the same
// Idempotency-Key; at the end every dialog holds each of its messages
// exactly once (no loss, no duplicate) and the service recovered without a
// restart.
func TestOutageManyDialogsNoLossNoDuplicate(t *testing.T) {
	const dialogs, perDialog = 16, 12
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	m := startOn(t, r, map[string]string{"HAN_REDIS_TIMEOUT": "500ms"})
	base := newScenario(t, m)
	type dlg struct{ id, tok string }
	ds := make([]dlg, dialogs)
	for i := range ds {
		sender := ids.New()
		tok := base.token(sender)
		call(t, "GET", m.URL()+"/v1/me", tok, "")
		code, body := call(t, "POST", m.URL()+"/v1/dialogs", tok, fmt.Sprintf(`{"memberIds":[%q]}`, base.bob))
		if code != 201 {
			t.Fatalf("create dialog: %d %s", code, body)
		}
		ds[i] = dlg{id: jsonField(t, body, "id"), tok: tok}
	}

	var (
		mu         sync.Mutex // guards the counters below
		done       int
		refused    int
		slowest    time.Duration
		unexpected []string
	)
	killed := make(chan struct{})
	var killOnce sync.Once
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < perDialog; n++ {
				key, text := fmt.Sprintf("out-%d-%d", i, n), fmt.Sprintf("d%d-m%d", i, n)
				deadline := time.Now().Add(30 * time.Second)
				for {
					began := time.Now()
					code, body := callH(t, "POST", m.URL()+"/v1/dialogs/"+d.id+"/messages", d.tok, `{"body":"`+text+`"}`,
						map[string]string{"Idempotency-Key": key, "Content-Type": "application/json"})
					took := time.Since(began)
					mu.Lock()
					switch {
					case code == 201:
						done++
						if done == dialogs*perDialog/3 {
							killOnce.Do(func() { close(killed) })
						}
					case code == 503 && body == `{"error":"redis_unavailable"}`:
						refused++
						slowest = max(slowest, took)
					case code == 429:
					default:
						unexpected = append(unexpected, fmt.Sprintf("%d %s", code, body))
					}
					mu.Unlock()
					if code == 201 || time.Now().After(deadline) {
						break
					}
					time.Sleep(20 * time.Millisecond) // the client's retry pause
				}
			}
		}()
	}
	<-killed
	r.Kill()
	testenv.Eventually(t, 20*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return refused >= 10 }, "no send was refused during the outage")
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	if len(unexpected) > 0 {
		t.Fatalf("unexpected answers: %v", unexpected[:min(5, len(unexpected))])
	}
	if done != dialogs*perDialog {
		t.Fatalf("%d of %d sends completed", done, dialogs*perDialog)
	}
	if slowest > 5*time.Second {
		t.Fatalf("a fail-closed answer took %v with a 500ms Redis budget", slowest)
	}
	for i, d := range ds {
		code, body := call(t, "GET", m.URL()+"/v1/dialogs/"+d.id+"/messages?afterSeq=0&limit=100", base.bTok, "")
		if code != 200 {
			t.Fatalf("history: %d %s", code, body)
		}
		if got := strings.Count(body, `"seq":`); got != perDialog {
			t.Errorf("dialog %d holds %d messages, want %d", i, got, perDialog)
		}
		for n := 0; n < perDialog; n++ {
			if c := strings.Count(body, fmt.Sprintf(`"body":"d%d-m%d"`, i, n)); c != 1 {
				t.Errorf("dialog %d message %d stored %d times", i, n, c)
			}
		}
	}
	t.Logf("%d sends, %d fail-closed refusals during the outage, slowest refusal %v", done, refused, slowest)
}
