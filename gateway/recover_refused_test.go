package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/han-app/gateway/gateway"
	"github.com/han-app/gateway/internal/testenv"
)

// Operators tell the subscribes answered with a resync because their user
// had spent the instance's recovery reads from the other resyncs:
// han_ws_recover_reads_refused_total counts the first only, and each of
// them is among han_ws_recoveries_total{outcome="resync"}.
func TestRecoveryReadsRefusedForTheBudgetAreCounted(t *testing.T) {
	in := newInstance(t, openPool(t), opts{hub: func(c *gateway.Config) {
		c.RecoverReadBurst, c.RecoverReadRate = 1, 0.001 // none comes back during the test
	}})
	u := in.users(2)
	d1, d2 := in.dialog(u[0], u[1]), in.dialog(u[0], u[1])
	for _, d := range []string{d1, d2} {
		in.post(u[1], d, "m")
	}
	c := in.connect(u[0])
	// The user's one read: recovered.
	if r := c.subscribeSince(d1, 0); r.sub.Recovered == nil || !*r.sub.Recovered {
		t.Fatalf("within the budget: resync %v, subscribed %s", r.resync, r.sub.raw)
	}
	// A read of its own past the budget: the dialog's resync.
	if r := c.subscribeSince(d2, 0); r.resync == nil || r.resync.Reason != gateway.ResyncRecoveryUnavailable || r.sub.Recovered == nil || *r.sub.Recovered {
		t.Fatalf("past the budget: resync %v, subscribed %s", r.resync, r.sub.raw)
	}
	// The same answer for another reason (a sinceSeq the dialog never
	// had), to a user with a read left, is not a refusal.
	o := in.connect(u[1])
	if r := o.subscribeSince(d2, 99); r.resync == nil || r.resync.Reason != gateway.ResyncRecoveryUnavailable {
		t.Fatalf("sinceSeq beyond lastSeq: resync %v, subscribed %s", r.resync, r.sub.raw)
	}
	got := map[string]float64{}
	testenv.Eventually(t, 5*time.Second, func() bool {
		got = recoveryMetrics(t, in.reg)
		return got["resync"] == 2
	}, "the recovery answers were not counted")
	want := map[string]float64{"recovered": 1, "resync": 2, "refused": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("han_ws_recoveries_total and han_ws_recover_reads_refused_total: %v, want %v", got, want)
	}
}

// recoveryMetrics reads han_ws_recoveries_total by outcome, and
// han_ws_recover_reads_refused_total as "refused".
func recoveryMetrics(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "han_ws_recoveries_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" {
						out[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		case "han_ws_recover_reads_refused_total":
			out["refused"] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return out
}
