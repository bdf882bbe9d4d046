package loadtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Deliveries accounts for realtime events end to end: publishers report
// each accepted publish (dialog, seq and the number of subscribers that
// should get it), connections report what they received (deduplicated per
// connection and dialog), and Finish turns the difference into loss.
// Latency is measured from each event's scheduled send time. Safe for
// concurrent use.
//
// Loss is counted per subscriber (connection × dialog): the accepted
// events of its dialog it did not get. A delivery of an event whose publish
// the generator saw fail (the server may still have delivered it) is not
// expected anywhere and is counted in delivery_unexpected, so it can never
// stand in for an accepted event another subscriber missed.
type Deliveries struct {
	reg           *Registry
	latency       *Trend
	received      *Counter
	duplicates    *Counter
	unexpected    *Counter
	other         *Counter
	publishFailed *Rate
	expected      atomic.Int64
	unique        atomic.Int64
	// finished is set by Finish: deliveries arriving later were counted
	// lost and are not accounted any more.
	finished atomic.Bool

	mu      sync.Mutex // guards dialogs
	dialogs map[string]*dialogDeliveries
}

// dialogDeliveries is what one dialog was sent and what its subscribers
// got. Guarded by Deliveries.mu.
type dialogDeliveries struct {
	accepted seqSet // seqs of the accepted publishes
	// untracked counts accepted publishes accepted could not hold (a seq
	// more than maxSeqSpan from the others): no delivery can be matched
	// to them, so every subscriber loses them.
	untracked   int64
	subscribers int // how many connections should get each (the most a publish named)
	// after: seqs up to it belong to an earlier measurement (After).
	after int64
	logs  []*subscriberLog
}

// subscriberLog is what one connection received of one dialog. Written by
// the connection's read loop, read by Drain and Finish.
type subscriberLog struct {
	mu    sync.Mutex // guards seqs, far
	seqs  seqSet
	far   int64 // seqs too far from the others to be stored: never matched
	after int64 // the dialog's After when the log was made: older seqs are ignored
}

// MaxEventsPerDialog bounds the accepted events of one dialog that one
// Deliveries can match to deliveries (a bit per seq between the dialog's
// lowest and highest). A scenario whose plan could exceed it is refused:
// CheckEventsPerDialog.
const MaxEventsPerDialog = maxSeqSpan - 128

// CheckEventsPerDialog refuses a plan that publishes more than
// MaxEventsPerDialog events into one of dialogs (events going round-robin)
// at rate events/s for dur in one measurement.
func CheckEventsPerDialog(rate int, dur time.Duration, dialogs int) error {
	planned := ConstantArrivalRate{Rate: rate, Duration: dur}.Planned()
	if dialogs < 1 || (planned+int64(dialogs)-1)/int64(dialogs) > MaxEventsPerDialog {
		return fmt.Errorf("%d events/s for %s put more than %d events into one of %d dialogs, more than one measurement can track: use more dialogs, a lower rate or a shorter duration",
			rate, dur, MaxEventsPerDialog, dialogs)
	}
	return nil
}

// NewDeliveries records into reg's delivery_* metrics.
func NewDeliveries(reg *Registry) *Deliveries {
	return &Deliveries{
		reg: reg, latency: reg.Trend(MetricDeliveryLatency), received: reg.Counter(MetricDeliveryReceived),
		duplicates: reg.Counter(MetricDeliveryDuplicates), unexpected: reg.Counter(MetricDeliveryUnexpected),
		other:         reg.Counter(MetricWSEventsOther),
		publishFailed: reg.Rate(MetricPublishFailed),
		dialogs:       map[string]*dialogDeliveries{},
	}
}

// dialog returns the record of dialogID, creating it. Call with d.mu held.
func (d *Deliveries) dialog(dialogID string) *dialogDeliveries {
	dd := d.dialogs[dialogID]
	if dd == nil {
		dd = &dialogDeliveries{}
		d.dialogs[dialogID] = dd
	}
	return dd
}

// Published records an accepted publish of event seq (> 0) on dialogID
// that subscribers connections should each receive once.
func (d *Deliveries) Published(dialogID string, seq int64, subscribers int) {
	d.mu.Lock()
	dd := d.dialog(dialogID)
	if !dd.accepted.add(seq) {
		dd.untracked++
	}
	dd.subscribers = max(dd.subscribers, subscribers)
	d.mu.Unlock()
	d.expected.Add(int64(subscribers))
	d.reg.Counter(MetricDeliveryExpected).Add(int64(subscribers))
	d.publishFailed.Add(false)
}

// After declares that the events of dialogID up to seq belong to an
// earlier measurement on the same connections (the seqs of a dialog go on
// rising from one step to the next). One of them arriving now was counted
// lost there and stays so: it is not counted here, neither as received
// nor as unexpected. Call before the first event of the measurement.
func (d *Deliveries) After(dialogID string, seq int64) {
	d.mu.Lock()
	d.dialog(dialogID).after = seq
	d.mu.Unlock()
}

// PublishFailed records a publish the target refused or that failed; its
// event is not expected anywhere.
func (d *Deliveries) PublishFailed() { d.publishFailed.Add(true) }

// Dropped records an event the generator was due to publish but dropped
// (every VU busy): a failed publish, and subscribers deliveries that never
// happened, each counted in delivery_latency as slower than any measured
// one. Its event is not expected anywhere.
func (d *Deliveries) Dropped(subscribers int) {
	d.publishFailed.Add(true)
	d.latency.AddDropped(int64(subscribers))
}

// newLog registers one more subscriber of dialogID: a connection that got
// an event of it. dialogID may alias a read buffer: it is copied.
func (d *Deliveries) newLog(dialogID string) *subscriberLog {
	l := &subscriberLog{}
	d.mu.Lock()
	dd := d.dialogs[dialogID]
	if dd == nil {
		dd = d.dialog(strings.Clone(dialogID))
	}
	l.after = dd.after
	dd.logs = append(dd.logs, l)
	d.mu.Unlock()
	return l
}

// mark records a unique delivery of seq into d's accounting; it reports
// false when d was finished (the delivery came after the drain and stays
// lost) or seq belongs to an earlier measurement (After). Checked under
// l.mu, which Finish's tally takes after setting finished: a delivery is
// either in the tally or not counted at all.
func (l *subscriberLog) mark(d *Deliveries, seq int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d.finished.Load() || seq <= l.after {
		return false
	}
	if !l.seqs.add(seq) {
		l.far++
	}
	return true
}

// Expected and Received are the running totals.
func (d *Deliveries) Expected() int64 { return d.expected.Load() }

// Received is the number of unique deliveries so far, those of events
// whose publish failed included.
func (d *Deliveries) Received() int64 { return d.unique.Load() }

// tally compares every subscriber's deliveries with its dialog's accepted
// events: lost counts the accepted events subscribers did not get (a
// subscriber that got nothing at all has no log and loses every one),
// unaccepted the deliveries of events that were not accepted.
func (d *Deliveries) tally() (lost, unaccepted int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dd := range d.dialogs {
		acc := int64(dd.accepted.n) + dd.untracked
		for _, l := range dd.logs {
			l.mu.Lock()
			got := int64(l.seqs.common(&dd.accepted))
			lost += acc - got
			// Deliveries too far to store may be of the untracked
			// accepted events: those are counted lost, not unexpected.
			unaccepted += int64(l.seqs.n) - got + max(l.far-dd.untracked, 0)
			l.mu.Unlock()
		}
		if missing := dd.subscribers - len(dd.logs); missing > 0 {
			lost += int64(missing) * acc
		}
	}
	return lost, unaccepted
}

// Drain waits until every subscriber got every accepted event of its
// dialog, timeout passed or ctx ended; it reports whether everything
// arrived.
func (d *Deliveries) Drain(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		// Fewer unique deliveries than expected ones cannot be complete;
		// only then is the per-subscriber comparison worth its cost.
		if d.unique.Load() >= d.expected.Load() {
			if lost, _ := d.tally(); lost == 0 {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// Finish records delivery_lost, delivery_loss, the deliveries of events
// not accepted (into delivery_unexpected) and delivery_rate (unique
// deliveries per second over measured).
//
// Finish ends the accounting: a delivery that arrives afterwards stays
// lost and is counted in neither delivery_received nor delivery_latency.
func (d *Deliveries) Finish(measured time.Duration) {
	d.finished.Store(true)
	exp, got := d.expected.Load(), d.unique.Load()
	lost, unaccepted := d.tally()
	d.unexpected.Add(unaccepted)
	// With nothing expected, nothing was measured: delivery_lost and
	// delivery_duplicates keep no data, so thresholds on them fail.
	if exp > 0 || lost > 0 {
		d.reg.Counter(MetricDeliveryLost).Add(lost)
		d.duplicates.Add(0)
	}
	if exp > 0 {
		d.reg.Rate(MetricDeliveryLoss).AddN(min(lost, exp), exp)
	}
	if measured > 0 {
		d.reg.Gauge(MetricDeliveryRate, UnitPerSecond).Set(float64(got) / measured.Seconds())
	}
}
