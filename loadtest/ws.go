package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"
)

// MetricWSOpen is the gauge of currently open WebSocket sessions.
const MetricWSOpen = "ws_open"

// Protocol is the realtime protocol a WSDialer speaks.
type Protocol int

// The protocols.
const (
	// ProtocolGateway is the gateway's han.v1 (docs/realtime-protocol.md):
	// bearer token on the handshake, hello, subscribe by dialog id.
	ProtocolGateway Protocol = iota
	// ProtocolCentrifugo is Centrifugo's JSON protocol: a connect command
	// carrying the JWT, subscribe commands on the dialogs' channels,
	// publications as pushes, pings answered with pongs.
	ProtocolCentrifugo
)

// WSDialer opens client WebSocket connections from the source address
// pool, recording ws_connecting, ws_sessions and ws_open. Safe for
// concurrent use.
type WSDialer struct {
	// Origin is sent as the Origin header when non-empty (the gateway
	// requires it with ticket auth).
	Origin string
	// Protocol is what the server speaks; the zero value is the gateway's.
	// Set before the first Dial.
	Protocol Protocol
	// PerTarget also counts sessions and errors per server, tagged
	// target=<http base of the dialled URL>, for runs spread over several
	// gateways. Set before the first Dial.
	PerTarget  bool
	reg        *Registry
	client     *http.Client
	connecting *Trend
	sessions   *Counter
	open       *Gauge
	openN      atomic.Int64
	closed     *Counter
	errs       *errorCounter
	deliveries atomic.Pointer[Deliveries]
}

// NewWSDialer returns a dialer that records into reg and feeds received
// events to deliveries (nil: events are only counted).
func NewWSDialer(reg *Registry, src *SourceAddrs, deliveries *Deliveries) *WSDialer {
	d := &WSDialer{
		reg: reg, client: newWSHTTPClient(src),
		connecting: reg.Trend(MetricWSConnecting), sessions: reg.Counter(MetricWSSessions),
		open: reg.Gauge(MetricWSOpen, UnitNone), closed: reg.Counter(MetricWSClosed),
		errs: newErrorCounter(reg),
	}
	d.deliveries.Store(deliveries)
	return d
}

// SetDeliveries makes every connection of the dialer account received
// events to dl from now on (a new measurement step on the same
// connections).
func (d *WSDialer) SetDeliveries(dl *Deliveries) { d.deliveries.Store(dl) }

// Close drops idle handshake connections (sessions stay open).
func (d *WSDialer) Close() { d.client.CloseIdleConnections() }

// Open is the number of sessions open now.
func (d *WSDialer) Open() int64 { return d.openN.Load() }

// DialError is a failed WebSocket handshake with the HTTP status, if any.
type DialError struct {
	Status int
	Err    error
}

func (e *DialError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("websocket dial: HTTP %d", e.Status)
	}
	return "websocket dial: " + e.Err.Error()
}

func (e *DialError) Unwrap() error { return e.Err }

// Dial opens a connection to wsURL (ws://…/v1/realtime[?ticket=…]) with the
// han.v1 subprotocol and waits for the server's hello. bearer, when set, is
// sent as Authorization. With ProtocolCentrifugo, wsURL is Centrifugo's
// WebSocket endpoint, bearer goes in the connect command, and its reply
// stands for hello.
func (d *WSDialer) Dial(ctx context.Context, wsURL, bearer string) (*WSConn, error) {
	centrifugo := d.Protocol == ProtocolCentrifugo
	hdr := http.Header{}
	if d.Origin != "" {
		hdr.Set("Origin", d.Origin)
	}
	opts := &websocket.DialOptions{HTTPClient: d.client, HTTPHeader: hdr}
	if !centrifugo {
		opts.Subprotocols = []string{Subprotocol}
		if bearer != "" {
			hdr.Set("Authorization", "Bearer "+bearer)
		}
	}
	target := ""
	if d.PerTarget {
		target = targetLabel(wsURL)
	}
	t0 := time.Now()
	raw := &rawConnSlot{}
	c, resp, err := websocket.Dial(context.WithValue(ctx, rawConnKey{}, raw), wsURL, opts)
	if err != nil {
		de := &DialError{Err: err}
		if resp != nil {
			de.Status = resp.StatusCode
		}
		d.errs.addFor(target, de.Status, "ws_dial")
		return nil, de
	}
	d.connecting.Add(time.Since(t0))
	if !centrifugo && c.Subprotocol() != Subprotocol {
		_ = c.Close(websocket.StatusPolicyViolation, "subprotocol")
		d.errs.addFor(target, 0, "ws_subprotocol")
		return nil, errors.New("websocket dial: server did not accept subprotocol " + Subprotocol)
	}
	c.SetReadLimit(1 << 20)
	d.sessions.Inc()
	if target != "" {
		d.reg.Counter(Tagged(MetricWSSessions, MetricTargetTag, target)).Inc()
	}
	d.open.Set(float64(d.openN.Add(1)))
	wc := &WSConn{d: d, c: c, raw: raw.get(), target: target, helloCh: make(chan struct{}), done: make(chan struct{}), subs: map[string]*seqTracker{}}
	go wc.readLoop()
	if centrifugo {
		if err := wc.Send(ctx, centrifugoConnectCommand(bearer)); err != nil {
			wc.CloseNow()
			return nil, fmt.Errorf("centrifugo connect: %w", err)
		}
	}
	select {
	case <-wc.helloCh:
		return wc, nil
	case <-wc.done:
		select {
		case <-wc.helloCh: // hello, then closed: the caller sees Done
			return wc, nil
		default:
		}
		return nil, fmt.Errorf("websocket: closed before hello: %w", wc.err)
	case <-ctx.Done():
		wc.CloseNow()
		return nil, ctx.Err()
	}
}

// WSConn is one client connection. One goroutine reads it; Subscribe, Send
// and Close may be called from others.
type WSConn struct {
	d       *WSDialer
	c       *websocket.Conn
	raw     net.Conn // the TCP connection under c (nil if the transport did not dial one)
	target  string   // per-target tag value; empty unless the dialer counts per target
	helloCh chan struct{}
	done    chan struct{} // closed when the read loop returned
	err     error         // why the read loop returned; read after done

	// ConnectionID and Instance come from hello (set before Dial returns).
	ConnectionID, Instance string

	closing atomic.Bool
	subMu   sync.Mutex // serialises Subscribe round trips; guards lastCmd
	lastCmd uint32     // Centrifugo: the last command id sent
	pong    bool       // Centrifugo: answer pings (owned by the read loop)

	mu      sync.Mutex             // guards subs, pending
	subs    map[string]*seqTracker // dialog id → dedupe state
	pending *pendingSub
}

type pendingSub struct {
	dialogID string
	cmdID    uint32 // Centrifugo: the subscribe command's id
	since    int64  // sinceSeq of a recovering subscribe, -1 for none
	lastSeq  int64
	err      error
	done     chan struct{}
	// Set by the read loop before done is closed (a recovering subscribe):
	replayed int  // new events of the dialog that came before subscribed
	resync   bool // the server answered resync recovery_unavailable
	complete bool // every seq in (since, lastSeq] was seen
}

// Done is closed when the connection is gone.
func (w *WSConn) Done() <-chan struct{} { return w.done }

// Err is why the connection ended (valid after Done).
func (w *WSConn) Err() error { return w.err }

// Send writes one text frame.
func (w *WSConn) Send(ctx context.Context, frame []byte) error {
	if err := w.c.Write(ctx, websocket.MessageText, frame); err != nil {
		return err
	}
	w.d.reg.Counter(MetricWSMsgsSent).Inc()
	return nil
}

// ErrSubscribeRefused is a subscribe answered by an error frame.
type ErrSubscribeRefused struct{ Code string }

func (e *ErrSubscribeRefused) Error() string { return "subscribe refused: " + e.Code }

// Subscribe sends subscribe {dialogId} and waits for subscribed; it
// returns the lastSeq the server reported. Events of the dialog count as
// deliveries from then on.
func (w *WSConn) Subscribe(ctx context.Context, dialogID string) (int64, error) {
	p, err := w.subscribe(ctx, dialogID, -1)
	return p.lastSeq, err
}

// Recovery is how a subscribe with sinceSeq ended.
type Recovery struct {
	LastSeq  int64 // the dialog's lastSeq in subscribed
	Replayed int   // the dialog's events the server replayed before subscribed
	// Resync: the server could not replay (resync recovery_unavailable);
	// the client must read (sinceSeq, LastSeq] over REST.
	Resync bool
	// Complete: every seq in (sinceSeq, LastSeq] arrived on this
	// connection (replayed, or live before subscribed).
	Complete bool
}

// SubscribeSince subscribes with sinceSeq (gateway only): the missed
// message.created events are replayed before subscribed. Their seqs are
// tracked from sinceSeq + 1, so a replayed event seen twice counts as a
// duplicate delivery.
func (w *WSConn) SubscribeSince(ctx context.Context, dialogID string, sinceSeq int64) (Recovery, error) {
	if w.d.Protocol == ProtocolCentrifugo {
		return Recovery{}, errors.New("subscribe with sinceSeq: the gateway protocol only")
	}
	if sinceSeq < 0 {
		return Recovery{}, errors.New("subscribe with sinceSeq: sinceSeq must be ≥ 0")
	}
	p, err := w.subscribe(ctx, dialogID, sinceSeq)
	return Recovery{LastSeq: p.lastSeq, Replayed: p.replayed, Resync: p.resync, Complete: p.complete}, err
}

// Known is the highest seq of the dialog up to which every seq was seen on
// this connection (its lastSeq at subscribe, then the events since): what
// a reconnecting client passes as sinceSeq. Safe at any time; on a live
// connection it moves as events arrive.
func (w *WSConn) Known(dialogID string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if tr := w.subs[dialogID]; tr != nil && tr.next > 0 {
		return tr.next - 1
	}
	return 0
}

func (w *WSConn) subscribe(ctx context.Context, dialogID string, since int64) (*pendingSub, error) {
	w.subMu.Lock()
	defer w.subMu.Unlock()
	p := &pendingSub{dialogID: dialogID, since: since, done: make(chan struct{})}
	frame := SubscribeFrame(dialogID)
	if since >= 0 {
		frame = SubscribeSinceFrame(dialogID, since)
	}
	if w.d.Protocol == ProtocolCentrifugo {
		w.lastCmd = max(w.lastCmd, centrifugoConnectID) + 1
		p.cmdID = w.lastCmd
		frame = centrifugoSubscribeCommand(p.cmdID, CentrifugoChannel(dialogID))
	}
	w.mu.Lock()
	if _, ok := w.subs[dialogID]; !ok || since >= 0 {
		w.subs[dialogID] = &seqTracker{next: since + 1}
	}
	w.pending = p
	w.mu.Unlock()
	drop := func() {
		w.mu.Lock()
		if w.pending == p {
			w.pending = nil
		}
		w.mu.Unlock()
	}
	if err := w.Send(ctx, frame); err != nil {
		drop()
		return p, err
	}
	select {
	case <-p.done:
		return p, p.err
	case <-w.done:
		drop()
		return p, fmt.Errorf("subscribe: connection closed: %w", w.err)
	case <-ctx.Done():
		drop()
		return p, ctx.Err()
	}
}

// Close ends the session with a normal closure (the close handshake is
// bounded by coder/websocket's 5 s) and waits for the read loop.
func (w *WSConn) Close() {
	if w.closing.Swap(true) {
		<-w.done
		return
	}
	_ = w.c.Close(websocket.StatusNormalClosure, "")
	<-w.done
}

// CloseNow drops the connection without a close handshake. It also ends
// a Close still waiting for the peer's answer (up to 5 s against a peer
// that stopped answering): the TCP connection is closed under it.
func (w *WSConn) CloseNow() {
	w.closing.Store(true)
	if w.raw != nil {
		_ = w.raw.Close()
	}
	_ = w.c.CloseNow()
	<-w.done
}

// readLoop is the only reader. It reuses one buffer: parsed frames alias it
// and are handled before the next read.
func (w *WSConn) readLoop() {
	defer close(w.done)
	d := w.d
	received := d.reg.Counter(MetricWSMsgsReceived)
	var (
		buf       bytes.Buffer
		f         Frame
		cr        centrifugoReply
		helloSeen bool
	)
	for {
		_, r, err := w.c.Reader(context.Background())
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(r)
		}
		if err == nil {
			recvAt := time.Now()
			received.Inc()
			if d.Protocol != ProtocolCentrifugo {
				if err := ParseFrame(buf.Bytes(), &f); err != nil {
					d.errs.addFor(w.target, 0, "ws_bad_frame")
					continue
				}
				w.handle(&f, recvAt, &helloSeen)
				continue
			}
			if err = w.centrifugoMessage(buf.Bytes(), &cr, &f, recvAt, &helloSeen); err == nil {
				continue
			}
			_ = w.c.CloseNow()
		}
		w.err = err
		d.open.Set(float64(d.openN.Add(-1)))
		if !w.closing.Load() {
			d.closed.Inc()
			d.errs.addFor(w.target, 0, closeCode(err))
		}
		w.failPending(err)
		return
	}
}

// handle acts on one server frame (for Centrifugo: a reply translated to
// the frame it stands for).
func (w *WSConn) handle(f *Frame, recvAt time.Time, helloSeen *bool) {
	d := w.d
	switch f.Type {
	case "event":
		w.onEvent(f, recvAt)
	case "hello":
		if !*helloSeen {
			w.ConnectionID, w.Instance = string([]byte(f.ConnectionID)), string([]byte(f.Instance))
			*helloSeen = true
			close(w.helloCh)
		}
	case "subscribed":
		w.mu.Lock()
		if p := w.pending; p != nil && p.dialogID == f.DialogID {
			// Events up to lastSeq happened before the subscription:
			// the first one to expect is lastSeq+1.
			if tr := w.subs[p.dialogID]; tr != nil {
				p.complete = p.since >= 0 && tr.next > f.LastSeq
				// Before its first subscribed, or after a resync (the
				// client reads the gap over REST), the next event to
				// expect is lastSeq+1.
				if tr.next == 0 || (p.resync && tr.next <= f.LastSeq) {
					tr.next = f.LastSeq + 1
				}
			}
			p.lastSeq = f.LastSeq
			w.pending = nil
			close(p.done)
		}
		w.mu.Unlock()
	case "error":
		d.errs.addFor(w.target, 0, "ws:"+f.Error)
		w.mu.Lock()
		if p := w.pending; p != nil {
			p.err = &ErrSubscribeRefused{Code: string([]byte(f.Error))}
			delete(w.subs, p.dialogID)
			w.pending = nil
			close(p.done)
		}
		w.mu.Unlock()
	case "resync":
		d.errs.addFor(w.target, 0, "ws_resync")
		w.mu.Lock()
		if p := w.pending; p != nil && p.since >= 0 && f.DialogID == p.dialogID {
			p.resync = true
		}
		w.mu.Unlock()
	}
}

// centrifugoMessage handles the replies of one Centrifugo message. It
// returns an error only when the connection must end: the connect command
// was refused.
func (w *WSConn) centrifugoMessage(msg []byte, r *centrifugoReply, f *Frame, recvAt time.Time, helloSeen *bool) error {
	var fatal error
	err := eachCentrifugoReply(msg, r, func(r *centrifugoReply) {
		*f = Frame{}
		switch {
		case r.isPing():
			if w.pong {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = w.Send(ctx, centrifugoPong)
				cancel()
			}
			return
		case r.ID == centrifugoConnectID:
			if r.Error.Code != 0 {
				code := strconv.FormatUint(uint64(r.Error.Code), 10)
				w.d.errs.addFor(w.target, 0, "centrifugo_connect_"+code)
				fatal = errors.New("centrifugo connect refused: error " + code)
				return
			}
			w.pong = r.Connect.Pong
			f.Type, f.ConnectionID = "hello", r.Connect.Client
		case r.ID > centrifugoConnectID:
			w.mu.Lock()
			p := w.pending
			w.mu.Unlock()
			if p == nil || p.cmdID != r.ID {
				return // the reply to a command its caller gave up on
			}
			f.Type, f.DialogID = "subscribed", p.dialogID
			if r.Error.Code != 0 {
				f.Type, f.Error = "error", "centrifugo_"+strconv.FormatUint(uint64(r.Error.Code), 10)
			}
		case len(r.Push.Pub.Data) > 0:
			f.Type, f.Data = "event", r.Push.Pub.Data
			f.DialogID = strings.TrimPrefix(r.Push.Channel, CentrifugoDialogNamespace)
		default:
			return // join, leave, unsubscribe: not deliveries
		}
		w.handle(f, recvAt, helloSeen)
	})
	if err != nil && fatal == nil {
		w.d.errs.addFor(w.target, 0, "ws_bad_frame")
	}
	return fatal
}

func (w *WSConn) failPending(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.pending; p != nil {
		p.err = err
		w.pending = nil
		close(p.done)
	}
}

func (w *WSConn) onEvent(f *Frame, recvAt time.Time) {
	dl := w.d.deliveries.Load()
	if dl != nil && dl.finished.Load() {
		dl = nil // after the drain: counted lost, not accounted again
	}
	// Only events the load generator sent carry a scheduled time; others
	// (presence, typing, someone else's message) are not deliveries.
	sched, seq, stamped := eventStamp(f.Data)
	if f.Seq == 0 && stamped { // a Centrifugo publication: the seq is in the data
		f.Seq = seq
	}
	w.mu.Lock()
	tr, p := w.subs[f.DialogID], w.pending
	fresh := false
	var log *subscriberLog
	if tr != nil && f.Seq > 0 {
		// Every seq of a subscribed dialog is tracked (Known, recovery),
		// whoever sent the message.
		fresh = tr.observe(f.Seq)
		if fresh && p != nil && p.since >= 0 && p.dialogID == f.DialogID {
			p.replayed++
		}
		if fresh && stamped && dl != nil {
			log = tr.logFor(dl, f.DialogID)
		}
	}
	w.mu.Unlock()
	switch {
	case dl == nil:
		return
	case !stamped:
		dl.other.Inc()
		return
	case tr == nil:
		dl.unexpected.Inc()
		return
	case f.Seq > 0 && !fresh:
		dl.duplicates.Inc()
		return
	}
	if log != nil && !log.mark(dl, f.Seq) {
		return
	}
	dl.received.Inc()
	dl.unique.Add(1)
	dl.latency.Add(recvAt.Sub(time.Unix(0, sched)))
}

func closeCode(err error) string {
	if code := websocket.CloseStatus(err); code != -1 {
		return "ws_close_" + strconv.Itoa(int(code))
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "ws_eof"
	}
	return "ws_read"
}

// maxAhead bounds the seqs a seqTracker holds beyond a gap. A gap that
// never closes (a publish that failed after taking its seq, a lost
// delivery) would otherwise keep every later seq of the dialog in memory.
const maxAhead = 1024

// seqTracker detects duplicate deliveries on one (connection, dialog): seq
// below next was seen; out-of-order arrivals wait in ahead until the gap
// closes, or until more than maxAhead wait: then the tracker gives the gap
// up (an event of it arriving later counts as a duplicate). Events of one
// dialog carry distinct, increasing seqs (one per event id), so a repeated
// seq is a repeated event. Owned by the read loop (guarded by WSConn.mu).
type seqTracker struct {
	next  int64 // every seq in [1, next) was seen
	ahead map[int64]struct{}
	// log is where the unique deliveries go for the Deliveries logOf.
	log   *subscriberLog
	logOf *Deliveries
}

// logFor returns the tracker's log in dl, registering it on first use (a
// new Deliveries per measurement step).
func (t *seqTracker) logFor(dl *Deliveries, dialogID string) *subscriberLog {
	if t.logOf != dl {
		t.log, t.logOf = dl.newLog(dialogID), dl
	}
	return t.log
}

// observe records seq and reports whether it is new.
func (t *seqTracker) observe(seq int64) bool {
	if t.next == 0 {
		t.next = 1
	}
	if seq < t.next {
		return false
	}
	if seq == t.next {
		t.next++
		t.advance()
		return true
	}
	if t.ahead == nil {
		t.ahead = map[int64]struct{}{}
	}
	if _, ok := t.ahead[seq]; ok {
		return false
	}
	t.ahead[seq] = struct{}{}
	if len(t.ahead) > maxAhead {
		t.giveUpGaps()
	}
	return true
}

// giveUpGaps moves next past the older gaps so that at most maxAhead/2
// seqs stay waiting (halving, so that the sort is paid once per
// maxAhead/2 arrivals).
func (t *seqTracker) giveUpGaps() {
	waiting := make([]int64, 0, len(t.ahead))
	for s := range t.ahead {
		waiting = append(waiting, s)
	}
	slices.Sort(waiting)
	t.next = waiting[len(waiting)-maxAhead/2]
	for _, s := range waiting {
		if s >= t.next {
			break
		}
		delete(t.ahead, s)
	}
	t.advance()
}

// advance moves next over the seqs waiting in ahead that now follow it.
func (t *seqTracker) advance() {
	for len(t.ahead) > 0 {
		if _, ok := t.ahead[t.next]; !ok {
			break
		}
		delete(t.ahead, t.next)
		t.next++
	}
}

// errorCounter counts failures by status and code into errors{status=…,code=…}.
type errorCounter struct {
	reg *Registry
	mu  sync.Mutex // guards m
	m   map[[2]string]*Counter
}

func newErrorCounter(reg *Registry) *errorCounter {
	return &errorCounter{reg: reg, m: map[[2]string]*Counter{}}
}

func (e *errorCounter) add(status int, code string) {
	st := "-"
	if status != 0 {
		st = strconv.Itoa(status)
	}
	k := [2]string{st, code}
	e.mu.Lock()
	c, ok := e.m[k]
	if !ok {
		c = e.reg.Counter(Tagged(MetricErrors, "status", st, "code", code))
		e.m[k] = c
	}
	e.mu.Unlock()
	c.Inc()
	e.reg.Counter(MetricErrors).Inc()
}

// addFor is add that also counts into errors{target=…} when target is set.
func (e *errorCounter) addFor(target string, status int, code string) {
	e.add(status, code)
	if target != "" {
		e.reg.Counter(Tagged(MetricErrors, MetricTargetTag, target)).Inc()
	}
}

// CloseAdvice reads how a server ended a connection: the close code (-1
// when there was no close frame) and the reconnect delay it advised in a
// JSON close reason {"retryMs":n} (a draining server closes with 1001), zero when
// none.
func CloseAdvice(err error) (code int, retry time.Duration) {
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		return -1, 0
	}
	var r struct {
		RetryMs int64 `json:"retryMs"`
	}
	if json.Unmarshal([]byte(ce.Reason), &r) == nil && r.RetryMs > 0 && r.RetryMs < int64(time.Hour/time.Millisecond) {
		retry = time.Duration(r.RetryMs) * time.Millisecond
	}
	return int(ce.Code), retry
}
