package loadtest

import (
	"testing"
	"time"
)

// A gap that never closes (a publish that failed after taking its seq)
// must not make a subscriber hold every later seq of the dialog for the
// rest of the run; duplicates of recent events are still caught.
func TestSeqTrackerBoundsWhatWaitsBehindAGap(t *testing.T) {
	var tr seqTracker
	if !tr.observe(1) {
		t.Fatal("seq 1 not new")
	}
	// Seq 2 never comes.
	for seq := int64(3); seq < 3+20*maxAhead; seq++ {
		if !tr.observe(seq) {
			t.Fatalf("seq %d not new", seq)
		}
		if len(tr.ahead) > maxAhead {
			t.Fatalf("%d seqs wait behind the gap at seq %d", len(tr.ahead), seq)
		}
	}
	last := int64(3 + 20*maxAhead - 1)
	for _, seq := range []int64{last, last - 1, 1} {
		if tr.observe(seq) {
			t.Errorf("seq %d seen twice counted as new", seq)
		}
	}
}

// seqSet holds seqs in any order, counts what two sets share, and refuses
// a seq too far from the others rather than allocating for it.
func TestSeqSet(t *testing.T) {
	var a, b seqSet
	for _, seq := range []int64{500, 70, 3, 64, 63, 500, 130} {
		if !a.add(seq) {
			t.Fatalf("add(%d) refused", seq)
		}
	}
	if a.n != 6 {
		t.Fatalf("n = %d, want 6", a.n)
	}
	for _, seq := range []int64{3, 4, 64, 500, 1000} {
		b.add(seq)
	}
	if got := a.common(&b); got != 3 {
		t.Fatalf("common = %d, want 3 (3, 64, 500)", got)
	}
	if got := a.common(&seqSet{}); got != 0 {
		t.Fatalf("common with an empty set = %d", got)
	}
	if a.add(0) || a.add(maxSeqSpan+1000) {
		t.Fatal("a seq that is not positive or too far away was stored")
	}
}

// An accepted event whose seq lies too far from the dialog's other seqs to
// be tracked must still be expected: if no subscriber gets it, it is lost,
// not left out of the accounting.
func TestUntrackableAcceptedSeqIsNotLeftOut(t *testing.T) {
	reg := NewRegistry()
	dl := NewDeliveries(reg)
	far := int64(1 + maxSeqSpan + 64)
	dl.Published("d", 1, 2)
	dl.Published("d", far, 2)
	l := dl.newLog("d")
	l.mark(dl, 1)
	dl.Finish(time.Second)
	// Subscriber 1 got seq 1 only, subscriber 2 got nothing: 3 of 4 lost.
	if got := reg.Counter(MetricDeliveryLost).Value(); got != 3 {
		t.Errorf("delivery_lost = %d, want 3 (expected %d)", got, reg.Counter(MetricDeliveryExpected).Value())
	}
}
