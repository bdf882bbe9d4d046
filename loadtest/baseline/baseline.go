package baseline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"
)

const (
	subprotocol   = "han.v1"
	channelPrefix = "han:rt:dialog:"
	maxFrame      = 4 << 10  // inbound client frame limit, as the gateway's
	maxPublish    = 64 << 10 // one published event
)

// Config tunes a Server.
type Config struct {
	// InstanceID is reported in hello. Zero value means "baseline".
	InstanceID string
	// QueueSize bounds each connection's outbound queue; a connection whose
	// queue is full is dropped (slow consumer). Zero value means 128.
	QueueSize int
	// DropEvery, when positive, silently skips every n-th delivery: a fault
	// switch that proves a load test notices broken delivery.
	DropEvery int64
}

// Stats is the /debug/memstats document: the process's memory after a
// forced GC and the server's counters.
type Stats struct {
	HeapInuse   uint64 `json:"heapInuse"`
	StackInuse  uint64 `json:"stackInuse"`
	HeapAlloc   uint64 `json:"heapAlloc"`
	Sys         uint64 `json:"sys"`
	RSS         uint64 `json:"rssBytes"` // 0 where /proc is missing
	Goroutines  int    `json:"goroutines"`
	Connections int64  `json:"connections"`
	Deliveries  int64  `json:"deliveries"`
	SlowClosed  int64  `json:"slowClosed"`
	GCForced    bool   `json:"gcForced"`
}

// Server is the baseline broadcast server.
type Server struct {
	cfg    Config
	logger *slog.Logger

	ctx    context.Context // cancelled by Close; parent of every connection
	cancel context.CancelFunc
	wg     sync.WaitGroup // connection handlers and writers

	mu       sync.RWMutex                    // guards channels
	channels map[string]map[*client]struct{} // dialog id → subscribers

	nextID     atomic.Int64
	conns      atomic.Int64
	deliveries atomic.Int64
	slowClosed atomic.Int64
	dropSeq    atomic.Int64

	lnMu    sync.Mutex // guards ln, httpSrv, closed
	ln      net.Listener
	httpSrv *http.Server
	closed  bool
	serveWG sync.WaitGroup
}

type client struct {
	conn   *websocket.Conn
	q      chan []byte
	cancel context.CancelFunc
	subs   map[string]struct{} // owned by the reader
}

// New returns a server; serve it with Start or mount Handler.
func New(cfg Config, logger *slog.Logger) *Server {
	if cfg.InstanceID == "" {
		cfg.InstanceID = "baseline"
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 128
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, logger: logger, ctx: ctx, cancel: cancel, channels: map[string]map[*client]struct{}{}}
}

// Handler serves /v1/realtime, /publish, /debug/memstats and /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/realtime", s.realtime)
	mux.HandleFunc("GET /publish", s.publishWS)
	mux.HandleFunc("POST /publish", s.publishHTTP)
	mux.HandleFunc("GET /debug/memstats", s.memstats)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	return mux
}

// Start listens on addr (e.g. 127.0.0.1:0) and serves in the background.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn)}
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.closed {
		ln.Close()
		return errors.New("baseline: server closed")
	}
	s.ln, s.httpSrv = ln, srv
	s.serveWG.Go(func() { _ = srv.Serve(ln) })
	return nil
}

// Addr is the listening address after Start.
func (s *Server) Addr() string {
	s.lnMu.Lock()
	defer s.lnMu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// URL is the base http:// URL after Start.
func (s *Server) URL() string { return "http://" + s.Addr() }

// Close stops listening, drops every connection and waits for their
// goroutines. Idempotent.
func (s *Server) Close() error {
	s.lnMu.Lock()
	srv := s.httpSrv
	already := s.closed
	s.closed = true
	s.lnMu.Unlock()
	if already {
		return nil
	}
	s.cancel()
	var err error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = srv.Shutdown(ctx)
		cancel()
		s.serveWG.Wait()
	}
	s.wg.Wait()
	return err
}

// Connections is the number of open realtime connections.
func (s *Server) Connections() int64 { return s.conns.Load() }

func (s *Server) realtime(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{subprotocol}, InsecureSkipVerify: true})
	if err != nil {
		return
	}
	if c.Subprotocol() != subprotocol {
		_ = c.Close(websocket.StatusPolicyViolation, "subprotocol han.v1 required")
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	c.SetReadLimit(maxFrame)
	ctx, cancel := context.WithCancel(s.ctx)
	cl := &client{conn: c, q: make(chan []byte, s.cfg.QueueSize), cancel: cancel, subs: map[string]struct{}{}}
	s.conns.Add(1)
	id := s.nextID.Add(1)
	cl.q <- []byte(`{"type":"hello","connectionId":"` + strconv.FormatInt(id, 10) + `","instance":"` + s.cfg.InstanceID + `","heartbeatMs":0}`)

	var writer sync.WaitGroup
	writer.Go(func() { s.writeLoop(ctx, cl) })
	s.readLoop(ctx, cl)

	cancel()
	writer.Wait()
	s.mu.Lock()
	for d := range cl.subs {
		if set := s.channels[d]; set != nil {
			delete(set, cl)
			if len(set) == 0 {
				delete(s.channels, d)
			}
		}
	}
	s.mu.Unlock()
	s.conns.Add(-1)
	_ = c.CloseNow()
}

// writeLoop is the connection's only writer.
func (s *Server) writeLoop(ctx context.Context, cl *client) {
	for {
		select {
		case <-ctx.Done():
			return
		case f := <-cl.q:
			if err := cl.conn.Write(ctx, websocket.MessageText, f); err != nil {
				cl.cancel()
				return
			}
		}
	}
}

type clientFrame struct {
	Type     string `json:"type"`
	DialogID string `json:"dialogId"`
}

func (s *Server) readLoop(ctx context.Context, cl *client) {
	for {
		_, b, err := cl.conn.Read(ctx)
		if err != nil {
			return
		}
		var f clientFrame
		if err := json.Unmarshal(b, &f); err != nil {
			s.enqueue(cl, []byte(`{"type":"error","error":"invalid_frame"}`))
			continue
		}
		switch f.Type {
		case "subscribe":
			if f.DialogID == "" || len(f.DialogID) > 64 {
				s.enqueue(cl, []byte(`{"type":"error","error":"invalid_dialog"}`))
				continue
			}
			s.mu.Lock()
			set := s.channels[f.DialogID]
			if set == nil {
				set = map[*client]struct{}{}
				s.channels[f.DialogID] = set
			}
			set[cl] = struct{}{}
			s.mu.Unlock()
			cl.subs[f.DialogID] = struct{}{}
			// After the subscription is in place: nothing published from now
			// on is missed.
			s.enqueue(cl, []byte(`{"type":"subscribed","dialogId":"`+f.DialogID+`","lastSeq":0}`))
		case "unsubscribe":
			s.mu.Lock()
			if set := s.channels[f.DialogID]; set != nil {
				delete(set, cl)
				if len(set) == 0 {
					delete(s.channels, f.DialogID)
				}
			}
			s.mu.Unlock()
			delete(cl.subs, f.DialogID)
		case "ping":
			s.enqueue(cl, []byte(`{"type":"pong"}`))
		default:
			s.enqueue(cl, []byte(`{"type":"error","error":"unknown_frame"}`))
		}
	}
}

// enqueue never blocks: a full queue drops the client.
func (s *Server) enqueue(cl *client, f []byte) bool {
	select {
	case cl.q <- f:
		return true
	default:
		s.slowClosed.Add(1)
		cl.cancel()
		return false
	}
}

// Publish fans frame out to the subscribers of channel
// (han:rt:dialog:<id>) and returns how many it was queued for. frame is
// shared, not copied: the caller must not modify it.
func (s *Server) Publish(channel string, frame []byte) int {
	dialog, ok := strings.CutPrefix(channel, channelPrefix)
	if !ok {
		return 0
	}
	n := 0
	s.mu.RLock()
	for cl := range s.channels[dialog] {
		if s.cfg.DropEvery > 0 && s.dropSeq.Add(1)%s.cfg.DropEvery == 0 {
			continue
		}
		if s.enqueue(cl, frame) {
			n++
		}
	}
	s.mu.RUnlock()
	s.deliveries.Add(int64(n))
	return n
}

// publishWS takes events on a WebSocket: each message is
// "<channel>\n<event frame>".
func (s *Server) publishWS(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	defer c.CloseNow()
	c.SetReadLimit(maxPublish)
	for {
		_, b, err := c.Read(s.ctx)
		if err != nil {
			return
		}
		i := strings.IndexByte(string(b[:min(len(b), 256)]), '\n')
		if i < 0 {
			_ = c.Close(websocket.StatusUnsupportedData, "want <channel>\\n<frame>")
			return
		}
		s.Publish(string(b[:i]), b[i+1:])
	}
}

// publishHTTP: POST /publish?channel=han:rt:dialog:<id> with the frame as
// the body → {"subscribers":n}.
func (s *Server) publishHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPublish))
	if err != nil {
		http.Error(w, `{"error":"payload_too_large"}`, http.StatusRequestEntityTooLarge)
		return
	}
	n := s.Publish(r.URL.Query().Get("channel"), b)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"subscribers":` + strconv.Itoa(n) + `}`))
}

// ReadStats forces a GC and reads the process's memory and the counters.
func (s *Server) ReadStats() Stats {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return Stats{
		HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, HeapAlloc: ms.HeapAlloc, Sys: ms.Sys,
		RSS: readRSS(), Goroutines: runtime.NumGoroutine(), Connections: s.conns.Load(),
		Deliveries: s.deliveries.Load(), SlowClosed: s.slowClosed.Load(), GCForced: true,
	}
}

func (s *Server) memstats(w http.ResponseWriter, _ *http.Request) {
	b, _ := json.Marshal(s.ReadStats())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// readRSS reads the resident set size from /proc/self/statm (Linux).
func readRSS() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
