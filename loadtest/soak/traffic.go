package soak

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// timeline records, with their times, what the recovery measurement and the
// per-fault error table need: successful sends, resubscriptions, socket
// outages and client-visible errors by code. Safe for concurrent use.
type timeline struct {
	mu       sync.Mutex
	sendsOK  []time.Time
	outages  []outage // per listener connection loss
	errs     []clientErr
	rawDups  int
	conflict []Violation
}

type outage struct {
	down, up time.Time // up zero: still down
}

type clientErr struct {
	at   time.Time
	code string
}

func (tl *timeline) sendOK(t time.Time) {
	tl.mu.Lock()
	tl.sendsOK = append(tl.sendsOK, t)
	tl.mu.Unlock()
}

func (tl *timeline) err(code string) {
	tl.mu.Lock()
	tl.errs = append(tl.errs, clientErr{time.Now(), code})
	tl.mu.Unlock()
}

// down opens an outage and returns its index for up.
func (tl *timeline) down(t time.Time) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.outages = append(tl.outages, outage{down: t})
	return len(tl.outages) - 1
}

func (tl *timeline) up(i int, t time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if i >= 0 {
		tl.outages[i].up = t
	}
}

// errCode names an API failure the way the per-fault table counts it.
func errCode(err error) string {
	var ae *loadtest.APIError
	if errors.As(err, &ae) {
		if ae.Code == "" {
			return strconv.Itoa(ae.Status)
		}
		return strconv.Itoa(ae.Status) + " " + ae.Code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "transport"
}

// retryable reports whether a failed request may be sent again with the
// same Idempotency-Key / identity: transport failures, 5xx, 429 and 409
// idempotency_in_progress.
func retryable(err error) (bool, time.Duration) {
	var ae *loadtest.APIError
	if !errors.As(err, &ae) {
		return true, 0
	}
	switch {
	case ae.Status >= 500, ae.Status == http.StatusTooManyRequests,
		ae.Status == http.StatusConflict && ae.Code == "idempotency_in_progress":
		return true, ae.RetryAfter
	}
	return false, 0
}

// backoff is the wait before attempt n (0-based): full jitter from 100 ms,
// capped at cap (and at least the server's Retry-After, capped the same).
func backoff(rng *rand.Rand, n int, retryAfter, cap time.Duration) time.Duration {
	d := min(100*time.Millisecond<<min(n, 6), cap)
	d = time.Duration(rng.Int64N(int64(d)) + 1)
	return max(d, min(retryAfter, cap))
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ledger holds every send's record. Safe for concurrent use.
type ledger struct {
	mu    sync.Mutex
	sends []*SendRecord
}

func (l *ledger) add(r *SendRecord) {
	l.mu.Lock()
	l.sends = append(l.sends, r)
	l.mu.Unlock()
}

func (l *ledger) snapshot() []SendRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]SendRecord, len(l.sends))
	for i, r := range l.sends {
		out[i] = *r
	}
	return out
}

// send posts one message with a fresh Idempotency-Key, retrying with the
// same key (on the other instance after a failure, as a load balancer
// would) until a 201, a permanent error or retryFor passes.
func (r *runner) send(ctx context.Context, rng *rand.Rand, user loadtest.User, dialogID string) {
	key := ids.New()
	rec := &SendRecord{Key: key, DialogID: dialogID}
	r.ledger.add(rec)
	gw := rng.IntN(2)
	deadline := time.Now().Add(r.cfg.RetryFor)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := r.api[gw].SendMessage(actx, user, dialogID, BodyPrefix+key, key)
		cancel()
		if err == nil {
			r.ledger.mu.Lock()
			rec.Confirmed, rec.MessageID, rec.Seq = true, m.ID, m.Seq
			r.ledger.mu.Unlock()
			r.tl.sendOK(time.Now())
			return
		}
		if ctx.Err() != nil {
			return
		}
		r.tl.err(errCode(err))
		ok, ra := retryable(err)
		if !ok || time.Now().After(deadline) {
			return
		}
		if !sleepCtx(ctx, backoff(rng, attempt, ra, time.Second)) {
			return
		}
		gw = 1 - gw
	}
}

// wsFrame is a realtime frame as the soak's clients read it.
type wsFrame struct {
	Type     string `json:"type"`
	Event    string `json:"event"`
	EntityID string `json:"entityId"`
	DialogID string `json:"dialogId"`
	Seq      int64  `json:"seq"`
	LastSeq  int64  `json:"lastSeq"`
	Error    string `json:"error"`
}

// listener is one user's WebSocket client. It follows the reconnect and
// reconcile algorithm of docs/realtime-protocol.md: resubscribe after every
// reconnect, fetch history after the highest gapless seq it holds when the
// server's lastSeq is ahead, on resync and on a gap older than 500 ms, and
// dedupe by seq and message id.
type listener struct {
	r       *runner
	user    loadtest.User
	home    int
	dialogs []string

	mu       sync.Mutex
	view     map[string]map[int64]string
	known    map[string]int64
	gapSince map[string]time.Time
}

func newListener(r *runner, u loadtest.User, home int, dialogs []string) *listener {
	l := &listener{r: r, user: u, home: home, dialogs: dialogs, view: map[string]map[int64]string{},
		known: map[string]int64{}, gapSince: map[string]time.Time{}}
	for _, d := range dialogs {
		l.view[d] = map[int64]string{}
	}
	return l
}

// apply records message id at seq of dialog d and advances known.
func (l *listener) apply(d string, seq int64, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.view[d]
	if v == nil {
		return
	}
	if have, ok := v[seq]; ok {
		if have != id {
			l.r.tl.mu.Lock()
			l.r.tl.conflict = append(l.r.tl.conflict, Violation{InvPhantom, "dialog " + d + " seq " + strconv.FormatInt(seq, 10) + " seen as " + have + " and " + id, time.Now()})
			l.r.tl.mu.Unlock()
		} else {
			l.r.tl.mu.Lock()
			l.r.tl.rawDups++
			l.r.tl.mu.Unlock()
		}
		return
	}
	v[seq] = id
	for {
		if _, ok := v[l.known[d]+1]; !ok {
			break
		}
		l.known[d]++
	}
	if len(v) > int(l.known[d]) {
		if _, ok := l.gapSince[d]; !ok {
			l.gapSince[d] = time.Now()
		}
	} else {
		delete(l.gapSince, d)
	}
}

// reconcile fetches d's history after the highest gapless seq.
func (l *listener) reconcile(ctx context.Context, gw, d string) error {
	api := l.r.apiFor(gw)
	for range 10_000 {
		l.mu.Lock()
		after := l.known[d]
		l.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		items, next, err := api.History(rctx, l.user, d, after, 100)
		cancel()
		if err != nil {
			l.r.tl.err(errCode(err))
			return err
		}
		for _, m := range items {
			l.apply(d, m.Seq, m.ID)
		}
		if next == nil || len(items) == 0 {
			return nil
		}
	}
	return nil
}

// finalReconcile closes every gap over REST after traffic stopped.
func (l *listener) finalReconcile(ctx context.Context) {
	for _, d := range l.dialogs {
		for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
			if l.reconcile(ctx, l.r.stack.GWAddr[(l.home+attempt)%2], d) == nil {
				break
			}
			sleepCtx(ctx, 500*time.Millisecond)
		}
	}
}

func (l *listener) clientView() ClientView {
	l.mu.Lock()
	defer l.mu.Unlock()
	cv := ClientView{UserID: l.user.ID, Dialogs: map[string]map[int64]string{}}
	for d, v := range l.view {
		cp := make(map[int64]string, len(v))
		for k, id := range v {
			cp[k] = id
		}
		cv.Dialogs[d] = cp
	}
	return cv
}

// run keeps the client connected until ctx ends. It returns to its home
// instance after a while on the other one, so each instance keeps a steady
// share of the sockets (the resource-growth check compares like with like).
func (l *listener) run(ctx context.Context, rng *rand.Rand) {
	gw := l.home
	outageIdx := -1
	attempt := 0
	for ctx.Err() == nil {
		err := l.session(ctx, gw, &outageIdx, &attempt)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errGoHome) {
			gw = l.home
			continue
		}
		if outageIdx < 0 {
			outageIdx = l.r.tl.down(time.Now())
		}
		if err != nil {
			l.r.tl.err(err.Error())
		}
		if !sleepCtx(ctx, backoff(rng, attempt, 0, 2*time.Second)) {
			return
		}
		attempt++
		gw = 1 - gw
	}
}

var errGoHome = errors.New("ws_rebalance")

// session is one connection: dial, subscribe everything, reconcile, then
// read until the connection fails.
func (l *listener) session(ctx context.Context, gw int, outageIdx, attempt *int) error {
	addr := l.r.stack.GWAddr[gw]
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(dctx, "ws://"+addr+loadtest.RealtimePath, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + l.user.Token}}, Subprotocols: []string{loadtest.Subprotocol}})
	if err != nil {
		if resp != nil {
			return errors.New("ws_dial " + strconv.Itoa(resp.StatusCode))
		}
		return errors.New("ws_dial")
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	frames := make(chan wsFrame, 256)
	readErr := make(chan error, 1)
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go func() {
		for {
			_, b, err := c.Read(rctx)
			if err != nil {
				readErr <- err
				return
			}
			var f wsFrame
			if json.Unmarshal(b, &f) != nil {
				continue
			}
			select {
			case frames <- f:
			case <-rctx.Done():
				readErr <- rctx.Err()
				return
			}
		}
	}()
	for _, d := range l.dialogs {
		if err := c.Write(dctx, websocket.MessageText, loadtest.SubscribeFrame(d)); err != nil {
			return errors.New("ws_write")
		}
	}
	pending := len(l.dialogs)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	ping := time.NewTicker(20 * time.Second)
	defer ping.Stop()
	var since time.Time
	subscribeBy := time.Now().Add(5 * time.Second)
	for {
		select {
		case <-ctx.Done():
			_ = c.Close(websocket.StatusNormalClosure, "")
			return nil
		case err := <-readErr:
			if code := websocket.CloseStatus(err); code != -1 {
				return errors.New("ws_close_" + strconv.Itoa(int(code)))
			}
			return errors.New("ws_eof")
		case f := <-frames:
			switch f.Type {
			case "subscribed":
				pending--
				l.mu.Lock()
				behind := f.LastSeq > l.known[f.DialogID]
				l.mu.Unlock()
				if behind {
					_ = l.reconcile(ctx, addr, f.DialogID)
				}
				if pending == 0 {
					since = time.Now()
					l.r.tl.up(*outageIdx, since)
					*outageIdx, *attempt = -1, 0
				}
			case "event":
				if f.Event == "message.created" && f.Seq > 0 {
					l.apply(f.DialogID, f.Seq, f.EntityID)
				}
			case "resync":
				for _, d := range l.dialogs {
					_ = l.reconcile(ctx, addr, d)
				}
			case "error":
				if pending > 0 {
					return errors.New("ws_error " + f.Error)
				}
			}
		case <-tick.C:
			if pending > 0 && time.Now().After(subscribeBy) {
				return errors.New("ws_subscribe_timeout")
			}
			l.mu.Lock()
			var gaps []string
			for d, t := range l.gapSince {
				if time.Since(t) > 500*time.Millisecond {
					gaps = append(gaps, d)
				}
			}
			l.mu.Unlock()
			sort.Strings(gaps)
			for _, d := range gaps {
				_ = l.reconcile(ctx, addr, d)
			}
			if gw != l.home && pending == 0 && time.Since(since) > 20*time.Second {
				_ = c.Close(websocket.StatusNormalClosure, "")
				return errGoHome
			}
		case <-ping.C:
			_ = c.Write(ctx, websocket.MessageText, loadtest.PingFrame)
		}
	}
}
