package gateway

import (
	"bytes"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	messageCreatedField = []byte(`"event":"message.created"`)
	createdAtField      = []byte(`"createdAt":`)
)

// deliveryObserver wraps the hub's Dispatch: for every message.created
// event this instance fans out (from Pub/Sub or the local publish path) it
// observes the time from the message's createdAt (set at commit, Unix ms)
// to the fan-out. The event is not decoded: two byte searches, no
// allocation. A nil histogram observes nothing.
type deliveryObserver struct {
	latency prometheus.Histogram
	now     func() time.Time
}

func newDeliveryObserver(reg prometheus.Registerer) (*deliveryObserver, error) {
	o := &deliveryObserver{now: time.Now}
	if reg == nil {
		return o, nil
	}
	o.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "han_delivery_latency_seconds",
		Help:    "Message commit (createdAt) to fan-out on this instance's sockets, for message.created events.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
	if err := reg.Register(o.latency); err != nil {
		return nil, err
	}
	return o, nil
}

// wrap returns dispatch preceded by the observation.
func (o *deliveryObserver) wrap(dispatch func(channel string, payload []byte)) func(string, []byte) {
	if o.latency == nil {
		return dispatch
	}
	return func(channel string, payload []byte) {
		if ms, ok := messageCreatedAt(payload); ok {
			if d := o.now().Sub(time.UnixMilli(ms)); d >= 0 {
				o.latency.Observe(d.Seconds())
			}
		}
		dispatch(channel, payload)
	}
}

// messageCreatedAt finds the createdAt (Unix ms) of a message.created frame.
func messageCreatedAt(payload []byte) (int64, bool) {
	if !bytes.Contains(payload, messageCreatedField) {
		return 0, false
	}
	i := bytes.Index(payload, createdAtField)
	if i < 0 {
		return 0, false
	}
	rest := payload[i+len(createdAtField):]
	n := 0
	for n < len(rest) && n < 19 && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	ms, err := strconv.ParseInt(string(rest[:n]), 10, 64)
	if err != nil || ms <= 0 {
		return 0, false
	}
	return ms, true
}
