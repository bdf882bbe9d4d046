package gateway_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/auth"
	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/internal/wsschema"
	"github.com/han-app/gateway/presence"
	"github.com/han-app/gateway/pubsub"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Redis: true, Postgres: true}, &env)
}

var (
	devSecret   = []byte("gateway-test-secret-0123456789abcdef")
	testOrigin  = "https://chat.example.test"
	migrateOnce sync.Once
	migrateErr  error
)

// openPool opens a pool on the package's database (migrated once).
func openPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool, err := store.OpenPG(ctx, env.DatabaseURL, store.PGConfig{MaxConns: 40})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	migrateOnce.Do(func() { _, migrateErr = store.Migrate(ctx, pool) })
	if migrateErr != nil {
		t.Fatal(migrateErr)
	}
	return pool
}

// opts tunes one gateway instance of a test.
type opts struct {
	id       string
	rtURL    string // DB1; zero value: the package's server, DB 1
	hub      func(*gateway.Config)
	presence func(*presence.Config)
	sub      func(*pubsub.SubscriberConfig)
	relay    func(*pubsub.RelayConfig)
	leeway   time.Duration // the verifier's leeway on exp; zero value: its default (30s)
	// rtBudget bounds each call of the instance's DB1 client (dial and
	// read); zero value: 500 ms, so that tests of a Redis outage see its
	// refusals quickly.
	rtBudget time.Duration
}

// instance is one gateway instance: the real gateway.Service on real Redis
// and PostgreSQL, its handler served by httptest on GET /v1/realtime.
// Events come the way the send path produces them: store.SendMessage with
// Event set, then the service's Publisher (post below). The REST API in
// front of it is tested in restapi and, end to end, in cmd/han-gateway.
type instance struct {
	t        testing.TB
	id       string
	svc      *gateway.Service
	srv      *httptest.Server
	store    *store.Store
	pool     *pgxpool.Pool
	rt       redis.UniversalClient
	reg      *prometheus.Registry
	verifier *auth.Verifier
}

func newInstance(t testing.TB, pool *pgxpool.Pool, o opts) *instance {
	t.Helper()
	ctx := context.Background()
	if o.id == "" {
		o.id = "gw-" + ids.New()[24:]
	}
	if o.rtURL == "" {
		o.rtURL = env.Redis.URL(1)
	}
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if o.rtBudget == 0 {
		o.rtBudget = 500 * time.Millisecond
	}
	rt, err := rds.NewRedis(o.rtURL, rds.RedisConfig{ReadTimeout: o.rtBudget, DialTimeout: o.rtBudget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close(); rt.Close() })
	var logOut io.Writer = io.Discard
	if os.Getenv("HAN_TEST_LOG") != "" {
		logOut = os.Stderr
	}
	logger := slog.New(slog.NewJSONHandler(logOut, nil)).With("instance", o.id)
	v, err := auth.NewVerifier(ctx, auth.Config{DevHS256Secret: devSecret, Redis: rdb, Leeway: o.leeway}, logger)
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(pool)
	reg := prometheus.NewRegistry()
	cfg := gateway.ServiceConfig{
		Hub:        gateway.Config{InstanceID: o.id, AllowedOrigins: []string{testOrigin}},
		Presence:   presence.Config{OfflineDebounce: 200 * time.Millisecond},
		Subscriber: pubsub.SubscriberConfig{CanaryInterval: 500 * time.Millisecond, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond},
		Relay:      pubsub.RelayConfig{Grace: time.Hour}, // the relay has its own tests
		Registerer: reg,
	}
	if o.hub != nil {
		o.hub(&cfg.Hub)
	}
	if o.presence != nil {
		o.presence(&cfg.Presence)
	}
	if o.sub != nil {
		o.sub(&cfg.Subscriber)
	}
	if o.relay != nil {
		o.relay(&cfg.Relay)
	}
	svc, err := gateway.NewService(gateway.Deps{Config: cfg, Logger: logger, Store: st, Realtime: rt, Verifier: v})
	if err != nil {
		t.Fatal(err)
	}
	svc.Start()
	mux := http.NewServeMux()
	mux.Handle("GET /v1/realtime", svc.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(svc.Close)
	in := &instance{t: t, id: o.id, svc: svc, srv: srv, store: st, pool: pool, rt: rt, reg: reg, verifier: v}
	testenv.Eventually(t, 10*time.Second, svc.PubSubHealthy, "pubsub link of %s never came up", o.id)
	return in
}

func (in *instance) wsURL() string {
	return "ws" + strings.TrimPrefix(in.srv.URL, "http") + "/v1/realtime"
}

// token mints a user token.
func token(t testing.TB, userID string) string {
	t.Helper()
	tok, err := auth.MintDevToken(devSecret, auth.DevClaims{Subject: userID, Kind: auth.KindUser, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// users records n users in PostgreSQL and returns their ids.
func (in *instance) users(n int) []string {
	in.t.Helper()
	out := make([]string, n)
	for i := range out {
		out[i] = ids.New()
		if err := in.store.EnsureUser(context.Background(), out[i]); err != nil {
			in.t.Fatal(err)
		}
	}
	return out
}

// dialog creates a dialog of the given members (the first is the creator).
func (in *instance) dialog(members ...string) string {
	in.t.Helper()
	d, err := in.store.CreateDialog(context.Background(), ids.New(), members[0], "t", members[1:])
	if err != nil {
		in.t.Fatal(err)
	}
	return d.ID
}

type messageDTO struct {
	ID        string `json:"id"`
	DialogID  string `json:"dialogId"`
	Seq       int64  `json:"seq"`
	SenderID  string `json:"senderId"`
	Body      string `json:"body"`
	CreatedAt int64  `json:"createdAt"`
}

func dtoOf(m store.Message) messageDTO {
	return messageDTO{ID: m.ID, DialogID: m.DialogID, Seq: m.Seq, SenderID: m.SenderID, Body: m.Body, CreatedAt: m.CreatedAt.UnixMilli()}
}

// post sends a message the way the send path does: the message and its
// message.created outbox event in one transaction, then the publish after
// the commit through this instance's Publisher (a failed publish is left
// to the outbox relay, as on the send path). It returns the stored message.
func (in *instance) post(userID, dialogID, body string) messageDTO {
	in.t.Helper()
	ctx := context.Background()
	m, ev, created, err := in.store.SendMessage(ctx, store.SendMessage{ID: ids.New(), DialogID: dialogID, SenderID: userID,
		Body: body, Event: true})
	if err != nil || !created {
		in.t.Fatalf("send: created %v: %v", created, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = in.svc.Publisher().Publish(pctx, ev.Channel, ev.Payload)
	return dtoOf(m)
}

// history returns every stored message after afterSeq (the reconciliation
// a client makes after a resync), page by page.
func (in *instance) history(dialogID string, afterSeq int64) []messageDTO {
	in.t.Helper()
	var out []messageDTO
	for i := 0; i < 100; i++ {
		page, more, err := in.store.ListMessages(context.Background(), dialogID, afterSeq, 100)
		if err != nil {
			in.t.Fatal(err)
		}
		for _, m := range page {
			out = append(out, dtoOf(m))
		}
		if !more {
			return out
		}
		afterSeq = page[len(page)-1].Seq
	}
	in.t.Fatal("history does not end")
	return nil
}

// ticket issues a ticket for userID as the ticket endpoint does, for a
// token that expires in an hour.
func (in *instance) ticket(userID string) (string, int64) {
	in.t.Helper()
	tk, exp, err := in.svc.IssueTicket(context.Background(), userID, time.Now().Add(time.Hour))
	if err != nil {
		in.t.Fatalf("ticket: %v", err)
	}
	return tk, exp.UnixMilli()
}

// frame is any server → client frame.
type frame struct {
	Type         string          `json:"type"`
	Channel      string          `json:"channel"`
	ID           string          `json:"id"`
	Event        string          `json:"event"`
	EntityID     string          `json:"entityId"`
	DialogID     string          `json:"dialogId"`
	Seq          int64           `json:"seq"`
	Data         json.RawMessage `json:"data"`
	ConnectionID string          `json:"connectionId"`
	Instance     string          `json:"instance"`
	HeartbeatMs  int64           `json:"heartbeatMs"`
	ExpiresAt    int64           `json:"expiresAt"`
	ServerTime   int64           `json:"serverTime"`
	LastSeq      int64           `json:"lastSeq"`
	Reason       string          `json:"reason"`
	Error        string          `json:"error"`
	Recovered    *bool           `json:"recovered"`

	raw []byte
}

// client is a real WebSocket client (coder/websocket Dial) whose frames a
// goroutine reads into a channel.
// frameSchemas are the published frame shapes (docs/asyncapi.yaml): every
// frame a test client sends, and every frame the gateway itself writes, is
// checked against them.
var frameSchemas = sync.OnceValues(func() (*wsschema.Validator, error) { return wsschema.Load("../docs/schemas/ws") })

func validFrame(fromClient bool, b []byte) error {
	v, err := frameSchemas()
	if err != nil {
		return err
	}
	if fromClient {
		return v.Client(b)
	}
	return v.Server(b)
}

// privateRedis starts a redis-server of the test's own (for faults) and
// returns it with an admin client on DB1; both end with the test.
func privateRedis(t *testing.T) (*testenv.RedisServer, *redis.Client) {
	t.Helper()
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	admin := r.AdminClient(1)
	t.Cleanup(func() { admin.Close() })
	return r, admin
}

type client struct {
	t       testing.TB
	ws      *websocket.Conn
	frames  chan frame
	done    chan struct{}
	err     error     // the read error that ended the client; valid after done
	endedAt time.Time // when that error was read; valid after done
	hello   frame
}

type dialOpts struct {
	token  string // bearer token
	ticket string
	origin string
	noSub  bool // do not offer han.v1
}

func (in *instance) dialRaw(o dialOpts) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	if o.token != "" {
		h.Set("Authorization", "Bearer "+o.token)
	}
	if o.origin != "" {
		h.Set("Origin", o.origin)
	}
	u := in.wsURL()
	if o.ticket != "" {
		u += "?ticket=" + o.ticket
	}
	dopt := &websocket.DialOptions{HTTPHeader: h}
	if !o.noSub {
		dopt.Subprotocols = []string{gateway.Subprotocol}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.Dial(ctx, u, dopt)
}

// connect dials with a bearer token and waits for hello.
func (in *instance) connect(userID string) *client {
	in.t.Helper()
	c := in.connectWith(dialOpts{token: token(in.t, userID)})
	c.hello = c.expect("hello")
	return c
}

// connectWith dials and starts reading; it does not wait for anything.
func (in *instance) connectWith(o dialOpts) *client {
	in.t.Helper()
	ws, _, err := in.dialRaw(o)
	if err != nil {
		in.t.Fatalf("dial: %v", err)
	}
	ws.SetReadLimit(1 << 20)
	c := &client{t: in.t, ws: ws, frames: make(chan frame, 4096), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				c.err, c.endedAt = err, time.Now()
				return
			}
			var f frame
			if err := json.Unmarshal(b, &f); err != nil {
				c.err = fmt.Errorf("undecodable frame %q: %w", b, err)
				return
			}
			// Event frames are forwarded byte for byte from what the test
			// published (often synthetic); cmd/han-gateway checks the
			// events the real producers publish.
			if f.Type != "event" {
				if err := validFrame(false, b); err != nil {
					c.t.Errorf("server frame does not match docs/schemas/ws: %v", err)
				}
			}
			f.raw = b
			c.frames <- f
		}
	}()
	in.t.Cleanup(func() { c.ws.CloseNow(); <-c.done })
	return c
}

// next returns the next frame or fails after timeout.
func (c *client) next(timeout time.Duration) frame {
	c.t.Helper()
	select {
	case f := <-c.frames:
		return f
	case <-c.done:
		select {
		case f := <-c.frames:
			return f
		default:
		}
		c.t.Fatalf("connection ended: %v", c.err)
	case <-time.After(timeout):
		c.t.Fatalf("no frame within %v", timeout)
	}
	return frame{}
}

// expect returns the next frame of type typ, skipping presence and typing
// events (which arrive whenever users come and go); any other frame fails
// the test.
func (c *client) expect(typ string) frame {
	c.t.Helper()
	for {
		f := c.next(10 * time.Second)
		if f.Type == "event" && (f.Event == gateway.EventPresenceChanged || f.Event == gateway.EventTyping) {
			continue
		}
		if f.Type == typ {
			return f
		}
		c.t.Fatalf("want a %s frame, got %s", typ, f.raw)
	}
}

// send writes a frame, first checked against its schema in docs/schemas/ws;
// sendRaw writes a deliberately invalid one.
func (c *client) send(v string) {
	c.t.Helper()
	if err := validFrame(true, []byte(v)); err != nil {
		c.t.Fatalf("client frame does not match docs/schemas/ws: %v", err)
	}
	c.sendRaw(v)
}

func (c *client) sendRaw(v string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(v)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// subscribe subscribes and returns the subscribed frame's lastSeq.
func (c *client) subscribe(dialogID string) int64 {
	c.t.Helper()
	c.send(`{"type":"subscribe","dialogId":"` + dialogID + `"}`)
	f := c.expect("subscribed")
	if f.DialogID != dialogID {
		c.t.Fatalf("subscribed to %s, want %s", f.DialogID, dialogID)
	}
	return f.LastSeq
}

// closeStatus waits for the connection to end and returns the close code
// the server sent (-1 if none).
func (c *client) closeStatus(timeout time.Duration) (websocket.StatusCode, string) {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(timeout):
		c.t.Fatalf("connection still open after %v", timeout)
	}
	var ce websocket.CloseError
	if asCloseError(c.err, &ce) {
		return ce.Code, ce.Reason
	}
	return -1, ""
}
