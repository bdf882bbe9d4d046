package gateway

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMessageCreatedAt(t *testing.T) {
	for in, want := range map[string]int64{
		`{"type":"event","event":"message.created","data":{"id":"x","createdAt":1796023931123,"body":"b"}}`: 1796023931123,
		`{"type":"event","event":"message.created","data":{"createdAt":-5}}`:                                0,
		`{"type":"event","event":"typing","data":{"createdAt":1796023931123}}`:                              0,
		`{"type":"event","event":"message.created","data":{}}`:                                              0,
		`{"type":"event","event":"message.created","data":{"createdAt":"1796023931123"}}`:                   0,
	} {
		got, ok := messageCreatedAt([]byte(in))
		if got != want || ok != (want != 0) {
			t.Errorf("messageCreatedAt(%s) = %d %v, want %d", in, got, ok, want)
		}
	}
}

// The observer records commit-to-fan-out latency of message events only,
// and always calls through.
func TestDeliveryObserver(t *testing.T) {
	reg := prometheus.NewRegistry()
	o, err := newDeliveryObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	created := time.UnixMilli(1796023931000)
	o.now = func() time.Time { return created.Add(40 * time.Millisecond) }
	var calls int
	d := o.wrap(func(string, []byte) { calls++ })
	d("c", []byte(`{"type":"event","event":"message.created","data":{"createdAt":1796023931000}}`))
	d("c", []byte(`{"type":"event","event":"typing","data":{}}`))
	if calls != 2 {
		t.Fatalf("dispatch called %d times, want 2", calls)
	}
	var m dto.Metric
	if err := o.latency.Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() < 0.039 || h.GetSampleSum() > 0.041 {
		t.Fatalf("histogram: count %d sum %v, want 1 sample of 40ms", h.GetSampleCount(), h.GetSampleSum())
	}
}
