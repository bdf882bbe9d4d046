package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/store"
)

// BenchmarkDialogLastSeq compares the subscribe check from 32 concurrent
// callers per CPU (a reconnect storm's resubscribes) done as one query per check,
// as every subscribe did, with DialogLastSeq, whose concurrent checks share
// one query. Compare the two in the same run:
//
//	go test -run '^$' -bench DialogLastSeq -benchtime 20000x ./store/
func BenchmarkDialogLastSeq(b *testing.B) {
	st, pool := openStore(b)
	ctx := context.Background()
	users := make([]string, 32)
	for i := range users {
		users[i] = ids.New()
		if err := st.EnsureUser(ctx, users[i]); err != nil {
			b.Fatal(err)
		}
	}
	dialogs := make([]string, 64)
	for k := range dialogs {
		d, err := st.CreateDialog(ctx, ids.New(), users[k%32], "", []string{users[(k+1)%32]})
		if err != nil {
			b.Fatal(err)
		}
		dialogs[k] = d.ID
	}
	pair := func(i int) (string, string) { return dialogs[i%64], users[(i/64)%32] }
	run := func(b *testing.B, check func(d, u string) error) {
		b.SetParallelism(32) // 32 callers per CPU
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				i++
				if err := check(pair(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("one_query_each", func(b *testing.B) {
		run(b, func(d, u string) error {
			var seq int64
			err := pool.QueryRow(ctx, `SELECT d.last_seq FROM dialogs d
				JOIN dialog_members m ON m.dialog_id = d.id AND m.user_id = $2 WHERE d.id = $1`, d, u).Scan(&seq)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			return nil
		})
	})
	b.Run("batched", func(b *testing.B) {
		run(b, func(d, u string) error {
			_, err := st.DialogLastSeq(ctx, d, u)
			if err != nil && !errors.Is(err, store.ErrDialogNotFound) {
				return err
			}
			return nil
		})
	})
}
