package clustertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/han-app/gateway/store"
)

// The idempotency state machine holds on a cluster, for keys on every
// master: reserve → in progress for a second caller → complete → replay of
// the same request, conflict for another body.
func TestIdempotencyOnCluster(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	idem := store.NewIdempotency(rdb, nil, store.IdempotencyConfig{})
	masters := map[string]bool{}
	for _, p := range allPlaces() {
		k := p.idem()
		m, err := env.Cluster.MasterOf(ctx, k.RecordKey())
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Addr()] = true
		if r, err := idem.Reserve(ctx, k, "fp-a", "owner-1"); err != nil || r.Outcome != store.IdemAcquired {
			t.Fatalf("place %d: first reserve: %+v %v", p.n, r, err)
		}
		if r, err := idem.Reserve(ctx, k, "fp-a", "owner-2"); err != nil || r.Outcome != store.IdemInProgress || r.Holder != "owner-1" {
			t.Fatalf("place %d: concurrent reserve: %+v %v", p.n, r, err)
		}
		rec := store.IdemRecord{Fingerprint: "fp-a", Status: 201, ResourceID: "res-1", Version: 7, Meta: "{}"}
		if n, err := idem.Complete(ctx, k, "owner-2", rec, time.Hour); err != nil || n != 0 {
			t.Fatalf("place %d: complete by a non-owner must write nothing: %d %v", p.n, n, err)
		}
		if n, err := idem.Complete(ctx, k, "owner-1", rec, time.Hour); err != nil || n != 1 {
			t.Fatalf("place %d: complete: %d %v", p.n, n, err)
		}
		r, err := idem.Reserve(ctx, k, "fp-a", "owner-3")
		if err != nil || r.Outcome != store.IdemReplay || r.Record.Status != 201 || r.Record.ResourceID != "res-1" || r.Record.Version != 7 {
			t.Fatalf("place %d: retry must replay the record: %+v %v", p.n, r, err)
		}
		if r, err := idem.Reserve(ctx, k, "fp-b", "owner-3"); err != nil || r.Outcome != store.IdemConflict {
			t.Fatalf("place %d: another body must conflict: %+v %v", p.n, r, err)
		}
	}
	if len(masters) != 3 {
		t.Fatalf("idempotency keys reached %d masters, want 3", len(masters))
	}
}
