package scenarios

import (
	"context"
	"flag"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
)

// Broadcast measures fan-out alone: connections subscribe to dialogs and a
// publisher puts event frames (CONTRACT §7 format, payload-byte data)
// straight onto the dialogs' channels at a fixed aggregate rate — Redis
// Pub/Sub for the gateway, the /publish socket for the baseline. Latency is
// measured on every subscriber from each event's scheduled send time.
type Broadcast struct {
	conns, dialogs, subsPerConn int
	rate, payload, publishers   int
	maxPublishers               int
	publisherConns, concurrency int
	drain                       time.Duration
	compare                     string
	faultDropEvery              int64
	gw                          gatewayFlags
}

// Describe implements Scenario.
func (b *Broadcast) Describe() string {
	return "fan-out alone: events published straight to the dialogs' channels at a fixed rate; deliveries/s, p99 from schedule, loss"
}

// Name implements loadtest.Scenario.
func (b *Broadcast) Name() string { return "broadcast" }

// Flags implements Scenario.
func (b *Broadcast) Flags(fs *flag.FlagSet, getenv func(string) string) {
	fs.IntVar(&b.conns, "conns", 50, "WebSocket connections")
	fs.IntVar(&b.dialogs, "dialogs", 5, "dialogs (channels) the connections spread over")
	fs.IntVar(&b.subsPerConn, "subs-per-conn", 1, "dialogs each connection subscribes to")
	fs.IntVar(&b.rate, "rate", 100, "events published per second, all dialogs together (deliveries/s = rate × subscribers per dialog)")
	fs.IntVar(&b.payload, "payload", 128, "bytes of each event's data object")
	fs.IntVar(&b.publishers, "publishers", 8, "publisher VUs started up front")
	fs.IntVar(&b.maxPublishers, "max-publishers", 256, "most publisher VUs: a due event with every VU busy gets a new one up to this, else it is dropped (dropped_iterations)")
	fs.IntVar(&b.publisherConns, "publisher-conns", 4, "publish sockets to a baseline target")
	fs.IntVar(&b.concurrency, "connect-concurrency", 64, "connections set up at a time")
	fs.DurationVar(&b.drain, "drain", 3*time.Second, "how long to wait for in-flight deliveries after the last publish")
	fs.StringVar(&b.compare, "compare", "", "run the same shape against this baseline first (baseline or baseline-inprocess) and report the ratio")
	fs.Int64Var(&b.faultDropEvery, "fault-drop-every", 0, "fault injection: a baseline this run starts drops every n-th delivery (proves the thresholds catch loss)")
	b.gw.register(fs, getenv, true)
}

// Metrics of the comparison.
const (
	MetricBaselineDeliveryRate = "baseline_delivery_rate" // gauge: the baseline's unique deliveries/s in the same run
	MetricBaselineRatio        = "baseline_ratio"         // gauge: target delivery_rate ÷ baseline_delivery_rate
)

// DeclareMetrics implements loadtest.MetricDeclarer.
func (b *Broadcast) DeclareMetrics(reg *loadtest.Registry) {
	reg.Gauge(MetricBaselineDeliveryRate, loadtest.UnitPerSecond)
	reg.Gauge(MetricBaselineRatio, loadtest.UnitRatio)
}

func (b *Broadcast) shape() shape { return shape{b.conns, b.dialogs, b.subsPerConn} }

// Run implements loadtest.Scenario.
func (b *Broadcast) Run(ctx context.Context, t *loadtest.T) error {
	if b.payload < loadtest.MinEventPayload || b.payload > 16<<10 {
		return fmt.Errorf("-payload must be %d..16384", loadtest.MinEventPayload)
	}
	if b.rate < 1 || b.publishers < 1 || b.maxPublishers < b.publishers || b.publisherConns < 1 || b.concurrency < 1 {
		return fmt.Errorf("-rate, -publishers, -publisher-conns and -connect-concurrency must be positive, -max-publishers ≥ -publishers")
	}
	if b.faultDropEvery > 0 {
		prev := BaselineConfig.DropEvery
		BaselineConfig.DropEvery = b.faultDropEvery
		defer func() { BaselineConfig.DropEvery = prev }()
		t.Info("fault_drop_every", b.faultDropEvery)
	}
	sh := b.shape()
	subs := sh.subscribers()
	total := 0
	for _, n := range subs {
		total += n
	}
	t.Info("conns", b.conns)
	t.Info("dialogs", b.dialogs)
	t.Info("subscribers_per_dialog", float64(total)/float64(b.dialogs))
	t.Info("publish_rate", b.rate)
	t.Info("offered_delivery_rate", float64(b.rate)*float64(total)/float64(b.dialogs))
	t.Info("payload_bytes", b.payload)

	if b.compare != "" {
		if b.compare != TargetBaseline && b.compare != TargetBaselineInProcess {
			return fmt.Errorf("-compare %q: want %s or %s", b.compare, TargetBaseline, TargetBaselineInProcess)
		}
		breg := loadtest.NewRegistry()
		t.Logf("broadcast: baseline phase (%s)", b.compare)
		if err := b.phase(ctx, t, b.compare, breg, "baseline"); err != nil {
			return fmt.Errorf("baseline phase: %w", err)
		}
		bs := breg.Snapshot()
		rate := bs.Metrics[loadtest.MetricDeliveryRate].Value
		t.Reg.Gauge(MetricBaselineDeliveryRate, loadtest.UnitPerSecond).Set(rate)
		t.Info("baseline_delivery_p99", time.Duration(bs.Metrics[loadtest.MetricDeliveryLatency].Percentile(99)))
		t.Info("baseline_delivery_lost", bs.Metrics[loadtest.MetricDeliveryLost].Count)
	}
	if err := b.phase(ctx, t, t.Opts.Target, t.Reg, "target"); err != nil {
		return err
	}
	if b.compare != "" {
		if base := t.Reg.Gauge(MetricBaselineDeliveryRate, loadtest.UnitPerSecond).Value(); base > 0 {
			got := t.Reg.Gauge(loadtest.MetricDeliveryRate, loadtest.UnitPerSecond).Value()
			t.Reg.Gauge(MetricBaselineRatio, loadtest.UnitRatio).Set(got / base)
		}
	}
	return nil
}

// phase runs the whole shape once against spec, recording into reg.
func (b *Broadcast) phase(ctx context.Context, t *loadtest.T, spec string, reg *loadtest.Registry, label string) (err error) {
	tg, err := openTarget(ctx, spec)
	if err != nil {
		return err
	}
	defer tg.close()
	t.Info(label, tg.describe())
	sh := b.shape()
	if err := sh.validate(tg.gateway); err != nil {
		return err
	}
	pubFiles := b.publisherConns
	if tg.gateway {
		pubFiles = b.maxPublishers // one Redis connection per concurrent publish at most
	}
	if err := t.NeedFiles(b.conns+pubFiles, tg.perConnFiles()); err != nil {
		return err
	}
	if tg.gateway {
		if err := b.gw.check(); err != nil {
			return err
		}
	}
	dl := loadtest.NewDeliveries(reg)
	cfg := fleetConfig{shape: sh, concurrency: b.concurrency, gw: &b.gw, reg: reg, deliveries: dl}
	fl, err := prepare(ctx, t, tg, cfg)
	if err != nil {
		return err
	}
	defer fl.close(b.concurrency)
	if err := fl.connect(ctx, t, tg, cfg); err != nil {
		return err
	}

	var pub publisher
	if tg.gateway {
		pub, err = newRedisPublisher(ctx, b.gw.redisURL, b.maxPublishers)
	} else {
		pub, err = newBaselinePublisher(ctx, t, tg.base, b.publisherConns)
	}
	if err != nil {
		return err
	}
	defer pub.Close()

	exec := loadtest.ConstantArrivalRate{Rate: b.rate, Duration: t.Opts.Duration,
		PreAllocatedVUs: b.publishers, MaxVUs: b.maxPublishers}
	seqs := make([]atomic.Int64, b.dialogs)
	channels := make([]string, b.dialogs)
	for d, id := range fl.dialogIDs {
		channels[d] = loadtest.DialogChannelPrefix + id
	}
	bufs := make([][]byte, exec.PeakVUs())
	t.SetPhase(label + ": publishing")
	reg.ResetClock()
	_, err = exec.Run(ctx, reg, func(ctx context.Context, it loadtest.Iter) error {
		d := int(it.N % int64(b.dialogs))
		seq := seqs[d].Add(1)
		bufs[it.VU] = loadtest.AppendEvent(bufs[it.VU][:0], fl.dialogIDs[d], ids.New(), seq, it.Scheduled.UnixNano(), b.payload)
		if err := pub.Publish(ctx, channels[d], bufs[it.VU]); err != nil {
			dl.PublishFailed()
			return err
		}
		dl.Published(fl.subs[d])
		return nil
	})
	if err != nil {
		return err
	}
	t.SetPhase(label + ": draining")
	dl.Drain(ctx, b.drain)
	reg.StopClock()
	dl.Finish(reg.Elapsed())
	if open := fl.stillOpen(); open < b.conns {
		t.Info(label+"_connections_dropped", b.conns-open)
	}
	t.SetPhase(label + ": closing")
	return ctx.Err()
}
