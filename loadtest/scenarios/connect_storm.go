package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// ConnectStorm measures recovery from an instance restart: N clients are
// connected and subscribed; the instance is restarted (by -restart-cmd, or
// by hand); every client that loses its connection waits as the server
// advised (close 1001 with the JSON reason {"retryMs":n}) plus up to
// -advice-jitter (1 s, as the web SDK), or a
// jittered exponential backoff when given no advice or refused (1013,
// 429, 503), then takes a new ticket, reconnects and resubscribes with
// sinceSeq (the seq up to which it had every event), so the server replays
// what it missed; only a dialog answered with resync is read over REST
// (-recover=false: plain subscribe and a REST history read, as before the
// socket recovered). With -send-rate, messages go into the dialogs over
// REST while the storm runs, so the clients have events to recover. It
// reports the time until every client is resubscribed, the replayed
// events, resyncs, gaps and REST reads.
//
// Gateway only.
type ConnectStorm struct {
	conns, dialogs, subsPerConn int
	concurrency                 int
	wait                        time.Duration
	restartCmd                  string
	minBackoff, maxBackoff      time.Duration
	adviceJitter                time.Duration
	sendRate                    int
	sendTarget                  string
	recover                     bool
	gw                          gatewayFlags
}

// Metrics of the connect storm.
const (
	MetricReconnectDuration = "reconnect_duration" // trend: connection lost → resubscribed, per client
	MetricReconnectAttempts = "reconnect_attempts" // counter
	MetricStormDuration     = "storm_duration"     // gauge, ns: first loss → last client resubscribed
	MetricStormResubscribed = "storm_resubscribed" // gauge: clients back at the end
	MetricStormReplayed     = "storm_replayed"     // counter: events the server replayed on resubscribes with sinceSeq
	MetricStormResyncs      = "storm_resyncs"      // counter: resubscribes answered resync (that dialog read over REST)
	MetricStormGaps         = "storm_gaps"         // counter: resubscribes with sinceSeq that left a gap (must stay 0)
	MetricStormRESTReads    = "storm_rest_reads"   // counter: history reads over REST while reconnecting
	MetricStormSent         = "storm_sent"         // counter: messages sent during the storm (-send-rate)
	MetricStormSendErrors   = "storm_send_errors"  // counter: sends that failed (e.g. the instance was down)
	MetricStormBehind       = "storm_behind"       // gauge: (client, dialog) pairs missing a sent message after the storm (must be 0)
	// MetricStormServe is the storm as the restarted instance saw it: its
	// first accepted handshake → the last client resubscribed (gauge, ns).
	MetricStormServe = "storm_serve_duration"
)

// Describe implements Scenario.
func (s *ConnectStorm) Describe() string {
	return "all clients reconnect after an instance restart; time until all are resubscribed, advised backoff honoured (gateway)"
}

// Name implements loadtest.Scenario.
func (s *ConnectStorm) Name() string { return "connect-storm" }

// Flags implements Scenario.
func (s *ConnectStorm) Flags(fs *flag.FlagSet, getenv func(string) string) {
	fs.IntVar(&s.conns, "conns", 1000, "clients")
	fs.IntVar(&s.dialogs, "dialogs", 100, "dialogs the clients spread over")
	fs.IntVar(&s.subsPerConn, "subs-per-conn", 1, "dialogs each client subscribes to")
	fs.IntVar(&s.concurrency, "connect-concurrency", 64, "initial connections set up at a time")
	fs.DurationVar(&s.wait, "wait", 2*time.Minute, "how long to wait for the disconnect wave and the recovery")
	fs.StringVar(&s.restartCmd, "restart-cmd", "", "shell command that restarts the target instance once every client is connected (empty: restart it by hand)")
	fs.DurationVar(&s.minBackoff, "min-backoff", 100*time.Millisecond, "first reconnect delay without server advice")
	fs.DurationVar(&s.maxBackoff, "max-backoff", 5*time.Second, "largest reconnect delay without server advice")
	fs.DurationVar(&s.adviceJitter, "advice-jitter", time.Second, "a client told to wait retryMs waits retryMs plus a uniform [0, this) (the web SDK's 1s)")
	fs.IntVar(&s.sendRate, "send-rate", 0, "messages/s sent over REST into the clients' dialogs while the storm runs (0: none)")
	fs.StringVar(&s.sendTarget, "send-target", "", "gateway base URL for those sends (default: the target)")
	fs.BoolVar(&s.recover, "recover", true, "resubscribe with sinceSeq (recovery over the socket); false: plain subscribe and a REST history read")
	s.gw.register(fs, getenv, false)
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *ConnectStorm) DeclareMetrics(reg *loadtest.Registry) {
	reg.Trend(MetricReconnectDuration)
	reg.Counter(MetricReconnectAttempts)
	reg.Gauge(MetricStormDuration, loadtest.UnitNone)
	reg.Gauge(MetricStormResubscribed, loadtest.UnitNone)
	for _, m := range []string{MetricStormReplayed, MetricStormResyncs, MetricStormGaps, MetricStormRESTReads, MetricStormSent, MetricStormSendErrors} {
		reg.Counter(m)
	}
	reg.Gauge(MetricStormBehind, loadtest.UnitNone)
	reg.Gauge(MetricStormServe, loadtest.UnitNone)
	reg.Gauge(MetricConnectRate, loadtest.UnitNone)
}

// Run implements loadtest.Scenario.
func (s *ConnectStorm) Run(ctx context.Context, t *loadtest.T) error {
	if s.concurrency < 1 || s.minBackoff <= 0 || s.maxBackoff < s.minBackoff || s.wait <= 0 || s.sendRate < 0 || s.adviceJitter < 0 {
		return loadtest.Usage(errors.New("-connect-concurrency, -min-backoff, -max-backoff and -wait must be positive (max ≥ min), -send-rate and -advice-jitter ≥ 0"))
	}
	tg, err := openTarget(ctx, t.Opts.Target)
	if err != nil {
		return err
	}
	defer tg.close()
	if !tg.gateway {
		return loadtest.Usage(errors.New("connect-storm restarts a gateway instance: the target must be a gateway URL"))
	}
	if err := s.gw.check(); err != nil {
		return loadtest.Usage(err)
	}
	sh := shape{s.conns, s.dialogs, s.subsPerConn}
	if err := sh.validate(true); err != nil {
		return loadtest.Usage(err)
	}
	if err := t.NeedFiles(s.conns, 1); err != nil {
		return err
	}
	t.Info("target", tg.describe())
	cfg := fleetConfig{shape: sh, concurrency: s.concurrency, gw: &s.gw, reg: t.Reg}
	fl, err := prepare(ctx, t, tg, cfg)
	if err != nil {
		return err
	}
	defer fl.close(ctx, s.concurrency)
	connStart := time.Now()
	if err := fl.connect(ctx, t, tg, cfg); err != nil {
		return err
	}
	// The same clients' first connect (ticket, handshake, subscribe), the
	// rate the storm is compared with: N ÷ connect_rate is how long a
	// fresh connect of all of them takes.
	rate := float64(s.conns) / time.Since(connStart).Seconds()
	t.Reg.Gauge(MetricConnectRate, loadtest.UnitNone).Set(rate)
	t.Info("connect_rate", fmt.Sprintf("%.0f/s", rate))

	wctx, cancel := context.WithTimeout(ctx, s.wait)
	defer cancel()
	t.Reg.ResetClock()
	if s.restartCmd != "" {
		t.SetPhase("restarting the target")
		cmd := exec.CommandContext(wctx, "sh", "-c", s.restartCmd)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("restart-cmd: %w", err)
		}
		defer func() { _ = cmd.Wait() }()
	} else {
		t.SetPhase("waiting for the instance restart")
	}

	snd, err := s.startSender(wctx, t, fl)
	if err != nil {
		return err
	}
	st := s.watch(wctx, t, tg, fl, cfg)
	t.Reg.StopClock()
	if snd != nil {
		snd.stop()
		t.Reg.Gauge(MetricStormBehind, loadtest.UnitNone).Set(float64(snd.behind(ctx, fl)))
	}
	return s.report(t, st, rate)
}

// report records what the storm came to and fails the run when a client
// did not come back.
func (s *ConnectStorm) report(t *loadtest.T, st *stormWatch, rate float64) error {
	lost, back := st.lost.Load(), st.back.Load()
	t.Reg.Gauge(MetricStormResubscribed, loadtest.UnitNone).Set(float64(back))
	t.Info("clients_lost", lost)
	t.Info("clients_resubscribed", back)
	if !st.firstLoss.IsZero() && !st.lastBack.IsZero() {
		t.Reg.Gauge(MetricStormDuration, loadtest.UnitNone).Set(float64(st.lastBack.Sub(st.firstLoss)))
		t.Info("storm_duration", st.lastBack.Sub(st.firstLoss))
	}
	if first := st.firstAccepted.Load(); first != 0 && !st.lastBack.IsZero() {
		serve := st.lastBack.Sub(time.Unix(0, first))
		t.Reg.Gauge(MetricStormServe, loadtest.UnitNone).Set(float64(serve))
		t.Info("storm_serve_duration", serve)
		t.Info("storm_serve_vs_connect", fmt.Sprintf("%.2f× the first connect of all clients", serve.Seconds()*rate/float64(s.conns)))
	}
	switch {
	case lost == 0:
		return errors.New("no client lost its connection within -wait: was the instance restarted?")
	case back < lost:
		return fmt.Errorf("%d of %d clients did not resubscribe within -wait", lost-back, lost)
	}
	return nil
}

// stormWatch is what watch saw: clients lost and back, the first loss and
// the last resubscription.
type stormWatch struct {
	mu        sync.Mutex // guards firstLoss, lastBack while watching
	firstLoss time.Time
	lastBack  time.Time
	lost      atomic.Int64
	back      atomic.Int64
	// firstAccepted: Unix ns of the first handshake accepted after a loss.
	firstAccepted atomic.Int64
}

// watch waits, for every client, for its connection to end and then
// reconnects and resubscribes it, until each is back or wctx ends.
func (s *ConnectStorm) watch(wctx context.Context, t *loadtest.T, tg *target, fl *fleet, cfg fleetConfig) *stormWatch {
	st := &stormWatch{}
	var wg sync.WaitGroup
	recDur := t.Reg.Trend(MetricReconnectDuration)
	for c := range fl.conns {
		wg.Go(func() {
			conn := fl.conns[c]
			select {
			case <-conn.Done():
			case <-wctx.Done():
				return
			}
			lostAt := time.Now()
			n := st.lost.Add(1)
			st.mu.Lock()
			if st.firstLoss.IsZero() {
				st.firstLoss = lostAt
			}
			st.mu.Unlock()
			t.SetPhase(fmt.Sprintf("storm: %d lost, %d back", n, st.back.Load()))
			if err := s.reconnect(wctx, t, tg, fl, cfg, c, conn.Err(), &st.firstAccepted); err != nil {
				return
			}
			recDur.Add(time.Since(lostAt))
			b := st.back.Add(1)
			st.mu.Lock()
			st.lastBack = time.Now()
			st.mu.Unlock()
			t.SetPhase(fmt.Sprintf("storm: %d lost, %d back", st.lost.Load(), b))
		})
	}
	wg.Wait()
	return st
}

// reconnect brings client c back: wait as advised, then ticket → dial →
// subscribe → reconcile, retrying with backoff until it works or ctx ends.
func (s *ConnectStorm) reconnect(ctx context.Context, t *loadtest.T, tg *target, fl *fleet, cfg fleetConfig, c int, cause error,
	firstAccepted *atomic.Int64) error {
	attempts := t.Reg.Counter(MetricReconnectAttempts)
	old := fl.conns[c] // the lost connection: what it had seen of each dialog
	_, advised := loadtest.CloseAdvice(cause)
	backoff := s.minBackoff
	earliest := time.Now().Add(advised)
	next := advised // the server's advice for the next attempt (0: none)
	for {
		var delay time.Duration
		if next > 0 {
			// As the web SDK does: the advised delay plus a little jitter
			// of the client's own (the server already drew the delay at
			// random per socket).
			delay, next = next+rand.N(s.adviceJitter+1), 0
		} else {
			delay = backoff/2 + rand.N(backoff/2+1)
			backoff = min(backoff*2, s.maxBackoff)
		}
		// Never before the server's advice (earliest): the client waits
		// at least the advised retryMs by construction.
		delay = max(delay, time.Until(earliest))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		attempts.Inc()
		u, bearer, err := fl.wsURL(ctx, tg, cfg.gw, c)
		if err != nil {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		wc, err := fl.dialer.Dial(dctx, u, bearer)
		if err == nil {
			firstAccepted.CompareAndSwap(0, time.Now().UnixNano())
		}
		if err != nil {
			cancel()
			// Refused with advice (e.g. 1013 try again later): honour it.
			if _, retry := loadtest.CloseAdvice(err); retry > 0 {
				earliest, next = time.Now().Add(retry), retry
			}
			continue
		}
		ok := true
		for _, d := range cfg.shape.dialogsOf(c) {
			if err := s.resubscribe(dctx, t, fl, old, wc, c, d); err != nil {
				ok = false
				break
			}
		}
		cancel()
		if !ok {
			wc.CloseNow()
			continue
		}
		fl.conns[c] = wc
		return nil
	}
}
