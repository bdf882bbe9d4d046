package scenarios

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// shape is the fan-out layout: conns connections over dialogs dialogs, each
// connection subscribed to subsPerConn of them, spread evenly.
type shape struct {
	conns, dialogs, subsPerConn int
}

// maxAuxConns bounds the REST and publisher connections a scenario opens
// besides its load connections: they come out of loadtest.FileReserve.
const maxAuxConns = 512

// maxShapeConns and maxShapeSubscriptions bound a shape before it is
// laid out (per connection and per dialog).
const (
	maxShapeConns         = 1_000_000
	maxShapeSubscriptions = 10_000_000
)

// maxDialogMembers is the gateway's cap on members per dialog
// (docs/decisions.md), so on the gateway a dialog's subscribers are its
// members.
const maxDialogMembers = 100

func (s shape) validate(gateway bool) error {
	if s.conns < 1 || s.dialogs < 1 || s.subsPerConn < 1 || s.subsPerConn > s.dialogs {
		return errors.New("want conns ≥ 1, dialogs ≥ 1 and 1 ≤ subs-per-conn ≤ dialogs")
	}
	// Bounded before anything is sized by the shape; the descriptor budget
	// (T.NeedFiles) bounds the connections of a run further.
	if s.conns > maxShapeConns || int64(s.conns)*int64(s.subsPerConn) > maxShapeSubscriptions {
		return fmt.Errorf("at most %d connections and %d subscriptions (conns × subs-per-conn)", maxShapeConns, maxShapeSubscriptions)
	}
	if int64(s.dialogs) > int64(s.conns)*int64(s.subsPerConn) {
		return fmt.Errorf("%d dialogs but only %d subscriptions (conns × subs-per-conn): every dialog needs a subscriber", s.dialogs, s.conns*s.subsPerConn)
	}
	if gateway {
		for d, n := range s.subscribers() {
			if n < 2 || n > maxDialogMembers {
				return fmt.Errorf("dialog %d would have %d members; the gateway needs 2..%d per dialog (adjust conns, dialogs, subs-per-conn)", d, n, maxDialogMembers)
			}
		}
	}
	return nil
}

// dialogsOf lists the dialogs connection c subscribes to.
func (s shape) dialogsOf(c int) []int {
	out := make([]int, s.subsPerConn)
	for m := range out {
		out[m] = (c*s.subsPerConn + m) % s.dialogs
	}
	return out
}

// subscribers counts the connections of each dialog.
func (s shape) subscribers() []int {
	n := make([]int, s.dialogs)
	for c := range s.conns {
		for _, d := range s.dialogsOf(c) {
			n[d]++
		}
	}
	return n
}

// members lists the connections of each dialog.
func (s shape) members() [][]int {
	out := make([][]int, s.dialogs)
	for c := range s.conns {
		for _, d := range s.dialogsOf(c) {
			out[d] = append(out[d], c)
		}
	}
	return out
}

// forEach runs f(0..n-1) with at most conc at a time and returns the first
// error (the others are cancelled through ctx).
func forEach(ctx context.Context, n, conc int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		firstErr error
		once     sync.Once
		wg       sync.WaitGroup
	)
	for range min(max(conc, 1), n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// fleet is a set of connected, subscribed clients.
type fleet struct {
	shape     shape
	dialogIDs []string
	subs      []int           // subscribers per dialog
	users     []loadtest.User // gateway and Centrifugo: user c owns connection c
	conns     []*loadtest.WSConn
	dialer    *loadtest.WSDialer
	setupAPI  *loadtest.API // gateway only: users and dialogs, on the first target
	// ticketAPIs fetch each connection's ticket from the gateway it then
	// dials (gateway only; one per target, the first is setupAPI).
	ticketAPIs []*loadtest.API
}

type fleetConfig struct {
	shape       shape
	concurrency int
	gw          *gatewayFlags
	reg         *loadtest.Registry
	deliveries  *loadtest.Deliveries
}

// prepare creates the users and dialogs (gateway), or picks dialog ids
// (baseline) and mints connection tokens (Centrifugo, which knows neither
// users nor dialogs beforehand). Setup traffic is recorded in a registry of
// its own so it does not mix with the measured requests.
func prepare(ctx context.Context, t *loadtest.T, tg *target, cfg fleetConfig) (*fleet, error) {
	fl := &fleet{shape: cfg.shape, subs: cfg.shape.subscribers(), dialogIDs: make([]string, cfg.shape.dialogs)}
	fl.dialer = loadtest.NewWSDialer(cfg.reg, t.Src, cfg.deliveries)
	if !tg.gateway {
		for d := range fl.dialogIDs {
			fl.dialogIDs[d] = ids.New()
		}
		if tg.centrifugo {
			fl.dialer.Protocol = loadtest.ProtocolCentrifugo
			var err error
			if fl.users, err = loadtest.MintUsers([]byte(cfg.gw.cfSecret), cfg.shape.conns, cfg.gw.tokenTTL); err != nil {
				return nil, err
			}
		}
		return fl, nil
	}
	fl.dialer.Origin = cfg.gw.origin
	fl.dialer.PerTarget = tg.spread()
	setupReg := loadtest.NewRegistry()
	for _, base := range tg.bases {
		api, err := loadtest.NewAPI(base, loadtest.NewHTTPClient(t.Src, cfg.concurrency, 30*time.Second), setupReg)
		if err != nil {
			fl.close(ctx, 0)
			return nil, err
		}
		fl.ticketAPIs = append(fl.ticketAPIs, api)
	}
	api := fl.ticketAPIs[0]
	fl.setupAPI = api
	var err error
	if fl.users, err = loadtest.MintUsers([]byte(cfg.gw.devSecret), cfg.shape.conns, cfg.gw.tokenTTL); err != nil {
		return nil, err
	}
	var done atomic.Int64
	t.SetPhase("setup: users")
	err = forEach(ctx, len(fl.users), cfg.concurrency, func(ctx context.Context, i int) error {
		if err := api.Me(ctx, fl.users[i]); err != nil {
			return fmt.Errorf("create user: %w", err)
		}
		t.SetPhase(fmt.Sprintf("setup: users %d/%d", done.Add(1), len(fl.users)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	members := cfg.shape.members()
	done.Store(0)
	err = forEach(ctx, len(members), cfg.concurrency, func(ctx context.Context, d int) error {
		creator := fl.users[members[d][0]]
		others := make([]string, 0, len(members[d])-1)
		for _, c := range members[d][1:] {
			others = append(others, fl.users[c].ID)
		}
		dl, err := api.CreateDialog(ctx, creator, others)
		if err != nil {
			return fmt.Errorf("create dialog: %w", err)
		}
		fl.dialogIDs[d] = dl.ID
		t.SetPhase(fmt.Sprintf("setup: dialogs %d/%d", done.Add(1), len(members)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return fl, nil
}

// wsURL is the realtime URL for connection c (fetching a ticket when the
// gateway wants one) and the bearer token to send, if any.
func (fl *fleet) wsURL(ctx context.Context, tg *target, gw *gatewayFlags, c int) (string, string, error) {
	base := "ws" + tg.baseOf(c)[len("http"):] + loadtest.RealtimePath
	if tg.centrifugo {
		return "ws" + tg.base[len("http"):] + loadtest.CentrifugoPath, fl.users[c].Token, nil
	}
	if !tg.gateway {
		return base, "", nil
	}
	if gw.auth == "ticket" {
		api := fl.ticketAPIs[c%len(fl.ticketAPIs)]
		tk, err := api.Ticket(ctx, fl.users[c])
		if err != nil {
			return "", "", fmt.Errorf("ticket: %w", err)
		}
		return api.WSURL(tk), "", nil
	}
	return base, fl.users[c].Token, nil
}

// connect dials every connection and subscribes it to its dialogs.
func (fl *fleet) connect(ctx context.Context, t *loadtest.T, tg *target, cfg fleetConfig) error {
	fl.conns = make([]*loadtest.WSConn, cfg.shape.conns)
	var done atomic.Int64
	return forEach(ctx, cfg.shape.conns, cfg.concurrency, func(ctx context.Context, c int) error {
		u, bearer, err := fl.wsURL(ctx, tg, cfg.gw, c)
		if err != nil {
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		wc, err := fl.dialer.Dial(dctx, u, bearer)
		if err != nil {
			return fmt.Errorf("connection %d: %w", c, err)
		}
		fl.conns[c] = wc
		for _, d := range cfg.shape.dialogsOf(c) {
			if _, err := wc.Subscribe(dctx, fl.dialogIDs[d]); err != nil {
				return fmt.Errorf("connection %d: subscribe: %w", c, err)
			}
		}
		if n := done.Add(1); n%100 == 0 || int(n) == cfg.shape.conns {
			t.SetPhase(fmt.Sprintf("setup: connected %d/%d", n, cfg.shape.conns))
		}
		return nil
	})
}

// closeBudget bounds the close handshakes of a fleet's teardown.
const closeBudget = 10 * time.Second

// close ends every connection with a normal closure, concurrency at a
// time, and drops the setup clients' idle connections. A close handshake
// waits up to 5 s for a peer that stopped answering; so once ctx is done
// (the run's -max-duration) or closeBudget has passed, every connection
// still open is dropped at once without one.
func (fl *fleet) close(ctx context.Context, concurrency int) {
	ctx, cancel := context.WithTimeout(ctx, closeBudget)
	defer cancel()
	var wg sync.WaitGroup
	dropped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(dropped)
		for _, c := range fl.conns {
			if c != nil {
				wg.Go(c.CloseNow)
			}
		}
	})
	_ = forEach(ctx, len(fl.conns), concurrency, func(_ context.Context, i int) error {
		if c := fl.conns[i]; c != nil {
			c.Close()
		}
		return nil
	})
	if !stop() {
		<-dropped
		wg.Wait()
	}
	fl.dialer.Close()
	for _, api := range fl.ticketAPIs {
		api.Close()
	}
}

// stillOpen counts connections that have not ended.
func (fl *fleet) stillOpen() int {
	n := 0
	for _, c := range fl.conns {
		if c == nil {
			continue
		}
		select {
		case <-c.Done():
		default:
			n++
		}
	}
	return n
}
