package store_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/han-app/gateway/store"
)

// BenchmarkOutboxMark compares marking published outbox rows delivered with
// one UPDATE (and commit) per row, as the request path did, serially and
// from 16 concurrent requests, with the batched OutboxMarker (its time
// includes the final flush in Close). The private test server runs with
// fsync and synchronous_commit off, so the per-row commit's WAL flush, which
// batching saves most of, is not even counted here:
//
//	go test -run '^$' -bench OutboxMark -benchtime 20000x ./store/
func BenchmarkOutboxMark(b *testing.B) {
	st, pool := openStore(b)
	ctx := context.Background()
	b.Run("one_by_one", func(b *testing.B) {
		_, evs := insertOutbox(b, pool, b.N)
		b.ResetTimer()
		for _, id := range evs {
			if err := st.MarkOutboxDelivered(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one_by_one_16_concurrent", func(b *testing.B) {
		_, evs := insertOutbox(b, pool, b.N)
		var next atomic.Int64
		b.SetParallelism(8) // 8 × GOMAXPROCS goroutines
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := st.MarkOutboxDelivered(ctx, evs[next.Add(1)-1]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("batched", func(b *testing.B) {
		ch, evs := insertOutbox(b, pool, b.N)
		m, err := store.NewOutboxMarker(st, store.OutboxMarkerConfig{Queue: b.N + 1}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for _, id := range evs {
			m.Mark(id)
		}
		m.Close()
		b.StopTimer()
		if _, _, pending := outboxState(b, pool, ch); pending != 0 {
			b.Fatalf("%d rows left unmarked", pending)
		}
	})
}
