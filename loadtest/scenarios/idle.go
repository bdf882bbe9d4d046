package scenarios

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/han-app/gateway/loadtest"
)

// Idle holds N connections open and reports what each costs the server:
// (HeapInuse + StackInuse) delta, goroutines and RSS per connection, read
// from the target's /debug/memstats (after a forced GC) or /metrics (the
// gateway, Centrifugo with Prometheus on). It also reports how fast the
// connections opened (connect_rate).
type Idle struct {
	conns, dialogs, concurrency int
	settle                      time.Duration
	gw                          gatewayFlags
	cpu                         loadtest.ProcCPU
}

// Metrics of the idle scenario.
const (
	MetricServerMemPerConn        = "server_mem_per_conn"        // gauge, bytes: (HeapInuse+StackInuse) delta / connections
	MetricServerRSSPerConn        = "server_rss_per_conn"        // gauge, bytes
	MetricServerGoroutinesPerConn = "server_goroutines_per_conn" // gauge
	MetricConnectRate             = "connect_rate"               // gauge: connections opened (and subscribed) per second of setup
)

// Describe implements Scenario.
func (s *Idle) Describe() string {
	return "hold N idle connections; the server's heap+stack, goroutines and RSS per connection"
}

// Name implements loadtest.Scenario.
func (s *Idle) Name() string { return "idle-connections" }

// Flags implements Scenario.
func (s *Idle) Flags(fs *flag.FlagSet, getenv func(string) string) {
	fs.IntVar(&s.conns, "conns", 1000, "connections to hold (at most ≈19,000 per process: RLIMIT_NOFILE is 20,000)")
	fs.IntVar(&s.dialogs, "dialogs", 0, "when positive, each connection subscribes to one of this many dialogs")
	fs.IntVar(&s.concurrency, "connect-concurrency", 64, "connections set up at a time")
	fs.DurationVar(&s.settle, "settle", time.Second, "pause after connecting before the first reading")
	fs.Var(&s.cpu, "cpu-pid", "name=PID (name=PID+: with its children): report that process's CPU-ms per connection over the connect phase alone (info connect_cpu_ms_per_conn_<name>); repeatable; the generator's own is always reported")
	s.gw.register(fs, getenv, false)
	s.gw.registerCentrifugo(fs)
}

// DeclareMetrics implements loadtest.MetricDeclarer.
func (s *Idle) DeclareMetrics(reg *loadtest.Registry) {
	reg.Gauge(MetricServerMemPerConn, loadtest.UnitBytes)
	reg.Gauge(MetricServerRSSPerConn, loadtest.UnitBytes)
	reg.Gauge(MetricServerGoroutinesPerConn, loadtest.UnitNone)
	reg.Gauge(MetricConnectRate, loadtest.UnitPerSecond)
}

// check validates the flags.
func (s *Idle) check() error {
	if s.conns < 1 || s.concurrency < 1 || s.dialogs < 0 {
		return errors.New("-conns and -connect-concurrency must be positive, -dialogs ≥ 0")
	}
	return s.cpu.Check()
}

// Run implements loadtest.Scenario.
func (s *Idle) Run(ctx context.Context, t *loadtest.T) error {
	if err := s.check(); err != nil {
		return loadtest.Usage(err)
	}
	tg, err := openTargets(ctx, t.Opts.Target)
	if err != nil {
		return err
	}
	defer tg.close()
	t.Info("target", tg.describe())
	if tg.inproc != nil {
		t.Info("note", "in-process target: the memory figures include the load generator's own client connections")
	}
	if err := t.NeedFiles(s.conns, tg.perConnFiles()); err != nil {
		return err
	}
	sh := shape{conns: s.conns}
	if s.dialogs > 0 {
		sh.dialogs, sh.subsPerConn = s.dialogs, 1
		if err := sh.validate(tg.gateway); err != nil {
			return loadtest.Usage(err)
		}
	}
	switch {
	case tg.gateway:
		err = s.gw.check()
	case tg.centrifugo:
		err = s.gw.checkCentrifugo()
	}
	if err != nil {
		return loadtest.Usage(err)
	}
	client := loadtest.NewHTTPClient(nil, 2, 30*time.Second)
	defer client.CloseIdleConnections()
	before, err := readStats(ctx, client, tg)
	if err != nil {
		return fmt.Errorf("server stats before: %w", err)
	}
	cfg := fleetConfig{shape: sh, concurrency: s.concurrency, gw: &s.gw, reg: t.Reg}
	fl, err := prepare(ctx, t, tg, cfg)
	if err != nil {
		return err
	}
	defer fl.close(ctx, s.concurrency)
	if tg.gateway {
		// Setup traffic (users, dialogs) leaves garbage and pooled
		// connections behind: take the "before" reading after it.
		if before, err = readStats(ctx, client, tg); err != nil {
			return fmt.Errorf("server stats before: %w", err)
		}
	}
	connectStart, cpu0 := time.Now(), s.cpu.Sample()
	if err := fl.connect(ctx, t, tg, cfg); err != nil {
		return err
	}
	connectTook := time.Since(connectStart)
	s.reportConnectCPU(t, cpu0)
	t.Reg.Gauge(MetricConnectRate, loadtest.UnitPerSecond).Set(float64(s.conns) / connectTook.Seconds())
	t.Info("connect_duration", connectTook.Round(time.Millisecond))
	t.Reg.ResetClock()
	t.SetPhase(fmt.Sprintf("holding %d connections", s.conns))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(max(s.settle, t.Opts.Duration)):
	}
	after, err := readStats(ctx, client, tg)
	if err != nil {
		return fmt.Errorf("server stats after: %w", err)
	}
	t.Reg.StopClock()
	open := fl.stillOpen()
	s.report(t, before, after)
	t.Info("connections_open_at_end", open)
	if open < s.conns {
		return fmt.Errorf("%d of %d connections dropped while idle", s.conns-open, s.conns)
	}
	return nil
}

// reportConnectCPU records each -cpu-pid process's (and the generator's)
// CPU per connection since cpu0.
func (s *Idle) reportConnectCPU(t *loadtest.T, cpu0 loadtest.CPUSample) {
	cpu := s.cpu.Sample().PerOp(cpu0, int64(s.conns))
	for _, name := range sortedKeys(cpu) {
		t.Info("connect_cpu_ms_per_conn_"+name, cpu[name])
	}
}

// readStats reads the target's process figures; over several gateways,
// their sum (the cost per connection is then the fleet's average).
func readStats(ctx context.Context, client *http.Client, tg *target) (loadtest.ServerStats, error) {
	if !tg.spread() {
		return loadtest.ReadServerStats(ctx, client, tg.base)
	}
	var sum loadtest.ServerStats
	for i, base := range tg.bases {
		st, err := loadtest.ReadServerStats(ctx, client, base)
		if err != nil {
			return sum, fmt.Errorf("%s: %w", base, err)
		}
		sum.HeapInuse += st.HeapInuse
		sum.StackInuse += st.StackInuse
		sum.RSS += st.RSS
		sum.Goroutines += st.Goroutines
		sum.GCForced = st.GCForced && (i == 0 || sum.GCForced)
		sum.Source = st.Source
	}
	return sum, nil
}

// report records the server's cost per connection: the difference between
// the readings before and after connecting.
func (s *Idle) report(t *loadtest.T, before, after loadtest.ServerStats) {
	n := float64(s.conns)
	mem := (float64(after.HeapInuse+after.StackInuse) - float64(before.HeapInuse+before.StackInuse)) / n
	t.Reg.Gauge(MetricServerMemPerConn, loadtest.UnitBytes).Set(mem)
	t.Reg.Gauge(MetricServerGoroutinesPerConn, loadtest.UnitNone).Set(float64(after.Goroutines-before.Goroutines) / n)
	if after.RSS > 0 {
		t.Reg.Gauge(MetricServerRSSPerConn, loadtest.UnitBytes).Set((float64(after.RSS) - float64(before.RSS)) / n)
	}
	t.Info("stats_source", after.Source)
	t.Info("gc_forced", after.GCForced)
	t.Info("server_heap_inuse_delta", int64(after.HeapInuse)-int64(before.HeapInuse))
	t.Info("server_stack_inuse_delta", int64(after.StackInuse)-int64(before.StackInuse))
}
