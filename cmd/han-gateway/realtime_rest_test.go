package main

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
)

// A on instance 1, B on instance 2, one dialog: A's REST send on instance 1
// reaches B on instance 2 as an event frame whose JSON has exactly the fields
// of the realtime protocol's event frame and whose data is the message DTO the
// REST call returned; A's own socket gets the same bytes.
func TestCrossInstanceRESTSendReachesSockets(t *testing.T) {
	vars1, vars2 := baseEnv(), baseEnv()
	vars1["HAN_INSTANCE_ID"], vars2["HAN_INSTANCE_ID"] = "e2e-one-"+ids.New()[24:], "e2e-two-"+ids.New()[24:]
	one, two := start(t, vars1), start(t, vars2)
	a, b := ids.New(), ids.New()
	aTok, bTok := userToken(t, a), userToken(t, b)
	d := restDialog(t, one, aTok, b)

	ca, cb := connectRT(t, one, aTok), connectRT(t, two, bTok)
	if ca.hello.Instance != one.Config.InstanceID || cb.hello.Instance != two.Config.InstanceID {
		t.Fatalf("hello frames: %s / %s", ca.hello.raw, cb.hello.raw)
	}
	ca.subscribe(d)
	cb.subscribe(d)

	m := restSend(t, one, aTok, d, "hello from instance 1")
	f := cb.expect("event")
	if f.Event != "message.created" || f.Seq != m.Seq || f.EntityID != m.ID || f.DialogID != d || f.Channel != "dialog:"+d || f.ID == "" {
		t.Fatalf("event frame: %s", f.raw)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(f.raw, &fields); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if fmt.Sprint(keys) != "[channel data dialogId entityId event id seq type]" {
		t.Fatalf("event frame fields: %v", keys)
	}
	var data restMessage
	if err := json.Unmarshal(f.Data, &data); err != nil || data != m {
		t.Fatalf("event data %s, REST returned %+v", f.Data, m)
	}
	if fa := ca.expect("event"); !bytes.Equal(fa.raw, f.raw) {
		t.Fatalf("instance 1 forwarded %s, instance 2 %s", fa.raw, f.raw)
	}
}

// The ticket and presence endpoints of the REST API next to the sockets:
// presence answers what the sockets did (offline, two connections, offline
// with lastSeenAt), strangers and bad ids are refused, and a dialog's
// subscriber sees exactly one presence event per transition.
func TestTicketAndPresenceEndpoints(t *testing.T) {
	m := start(t, baseEnv())
	a, b, stranger := ids.New(), ids.New(), ids.New()
	aTok, bTok, sTok := userToken(t, a), userToken(t, b), userToken(t, stranger)
	if code, body := call(t, "GET", m.URL()+"/v1/me", sTok, ""); code != 200 {
		t.Fatalf("the stranger's first request: %d %s", code, body)
	}
	d := restDialog(t, m, aTok, b)
	type presenceDTO struct {
		Online      bool   `json:"online"`
		Connections int    `json:"connections"`
		LastSeenAt  *int64 `json:"lastSeenAt"`
	}
	get := func(viewerTok, target string) (int, presenceDTO, string) {
		code, body := call(t, "GET", m.URL()+"/v1/users/"+target+"/presence", viewerTok, "")
		var p presenceDTO
		if code == 200 {
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatal(err)
			}
		}
		return code, p, body
	}
	if code, p, body := get(aTok, b); code != 200 || p.Online || p.Connections != 0 || p.LastSeenAt != nil || body != `{"online":false,"connections":0,"lastSeenAt":null}` {
		t.Fatalf("offline presence: %d %s", code, body)
	}
	if code, _, body := get(sTok, b); code != 404 || body != `{"error":"user_not_found"}` {
		t.Fatalf("a stranger must not see presence: %d %s", code, body)
	}
	if code, _, body := get(aTok, "nope"); code != 400 || body != `{"error":"invalid_uuid"}` {
		t.Fatalf("bad id: %d %s", code, body)
	}

	// a watches the dialog (a browser: ticket and Origin); b comes online
	// with two connections.
	code, body := call(t, "POST", m.URL()+"/v1/realtime/tickets", aTok, "")
	var tk struct {
		Ticket    string `json:"ticket"`
		ExpiresAt int64  `json:"expiresAt"`
	}
	if code != 201 || json.Unmarshal([]byte(body), &tk) != nil || tk.Ticket == "" {
		t.Fatalf("ticket: %d %s", code, body)
	}
	if now := time.Now().UnixMilli(); tk.ExpiresAt < now+25_000 || tk.ExpiresAt > now+35_000 {
		t.Fatalf("ticket expiresAt %d is not about 30 s ahead of %d", tk.ExpiresAt, now)
	}
	ca := dialRT(t, m, "", tk.Ticket, "http://localhost:8080")
	ca.expect("hello")
	ca.subscribe(d)
	b1, b2 := connectRT(t, m, bTok), connectRT(t, m, bTok)
	if code, p, _ := get(aTok, b); code != 200 || !p.Online || p.Connections != 2 {
		t.Fatalf("online presence: %d %+v", code, p)
	}
	presenceEvent := func() (online bool, lastSeen *int64) {
		t.Helper()
		for {
			f := ca.next(10 * time.Second)
			if f.Type == "event" && f.Event == gateway.EventPresenceChanged && f.EntityID == b {
				var v struct {
					UserID     string `json:"userId"`
					Online     bool   `json:"online"`
					LastSeenAt *int64 `json:"lastSeenAt"`
				}
				if err := json.Unmarshal(f.Data, &v); err != nil || v.UserID != b || f.DialogID != d {
					t.Fatalf("presence event: %s", f.raw)
				}
				return v.Online, v.LastSeenAt
			}
		}
	}
	if online, _ := presenceEvent(); !online {
		t.Fatal("first presence event must be online")
	}
	// Closing one of two connections is no transition; closing the last is
	// one offline transition, published once.
	b1.ws.Close(websocket.StatusNormalClosure, "")
	b2.ws.Close(websocket.StatusNormalClosure, "")
	online, lastSeen := presenceEvent()
	if online || lastSeen == nil {
		t.Fatal("the second presence event must be offline with lastSeenAt")
	}
	code, p, _ := get(aTok, b)
	if code != 200 || p.Online || p.Connections != 0 || p.LastSeenAt == nil || *p.LastSeenAt < time.Now().Add(-time.Minute).UnixMilli() {
		t.Fatalf("presence after disconnect: %d %+v", code, p)
	}
	// Exactly one transition each way: b's next connection is the next event.
	connectRT(t, m, bTok)
	if online, _ := presenceEvent(); !online {
		t.Fatal("reconnect must publish online")
	}
}

// DB1 down (docs/degraded-mode.md), the whole service: tickets and presence
// answer 503, /readyz says degraded with the Pub/Sub link down, new
// connections are refused with 1013, existing sockets keep local fan-out of
// REST sends, and they get resync when DB1 is back; then tickets, presence
// and delivery work again without a restart.
func TestRealtimeRedisOutage(t *testing.T) {
	db1, err := testenv.StartRedis(testenv.RedisOptions{SeparateInstances: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db1.Stop()
	vars := baseEnv()
	vars["REDIS_REALTIME_URL"] = db1.URL(0)
	vars["HAN_REDIS_TIMEOUT"] = "500ms"
	m := start(t, vars)
	testenv.Eventually(t, 10*time.Second, m.realtime.PubSubHealthy, "the Pub/Sub link never came up")
	a, b := ids.New(), ids.New()
	aTok, bTok := userToken(t, a), userToken(t, b)
	d := restDialog(t, m, aTok, b)
	cb := connectRT(t, m, bTok)
	cb.subscribe(d)

	db1.Kill()
	testenv.Eventually(t, 10*time.Second, func() bool { return !m.realtime.PubSubHealthy() }, "the link loss went unnoticed")

	code, body := call(t, "POST", m.URL()+"/v1/realtime/tickets", aTok, "")
	if code != 503 || body != `{"error":"redis_unavailable"}` {
		t.Fatalf("ticket during the outage: %d %s", code, body)
	}
	code, body = call(t, "GET", m.URL()+"/v1/users/"+b+"/presence", aTok, "")
	if code != 503 || body != `{"error":"redis_unavailable"}` {
		t.Fatalf("presence during the outage: %d %s", code, body)
	}
	code, body = call(t, "GET", m.URL()+"/readyz", "", "")
	if code != 200 || !strings.Contains(body, `"status":"degraded"`) || !strings.Contains(body, `"pubsub":"down"`) {
		t.Fatalf("/readyz during the outage: %d %s", code, body)
	}
	if got := dialRT(t, m, aTok, "", "").closeStatus(10 * time.Second); got != gateway.CloseTryAgainLater {
		t.Fatalf("a new connection during the outage: close %d, want 1013", got)
	}

	// REST stays the truth and this instance's sockets still hear its own
	// events.
	msg := restSend(t, m, aTok, d, "while DB1 is down")
	if f := cb.expect("event"); f.Seq != msg.Seq || f.EntityID != msg.ID {
		t.Fatalf("local fan-out: %s", f.raw)
	}

	if err := db1.Restart(); err != nil {
		t.Fatal(err)
	}
	if f := cb.expect("resync"); f.Reason != "pubsub_reconnect" {
		t.Fatalf("resync: %s", f.raw)
	}
	testenv.Eventually(t, 10*time.Second, m.realtime.PubSubHealthy, "link did not come back")
	// The command pool notices the return on its own schedule (go-redis
	// retries dialing in the background after repeated failures).
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, _ := call(t, "GET", m.URL()+"/v1/users/"+b+"/presence", aTok, "")
		return code == 200
	}, "presence still failing after DB1 came back")
	code, body = call(t, "POST", m.URL()+"/v1/realtime/tickets", aTok, "")
	var tk struct{ Ticket string }
	if code != 201 || json.Unmarshal([]byte(body), &tk) != nil {
		t.Fatalf("ticket after the outage: %d %s", code, body)
	}
	dialRT(t, m, "", tk.Ticket, "http://localhost:8080").expect("hello")
	// Delivery through Redis works again.
	msg = restSend(t, m, aTok, d, "after")
	for {
		f := cb.next(10 * time.Second)
		if f.Type == "event" && f.Seq == msg.Seq {
			break
		}
	}
}
