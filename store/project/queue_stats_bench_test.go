package project_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/han-app/gateway/lua"
)

// BenchmarkProjectQueueRedisCost runs BenchmarkProjectQueue with Redis
// recording every command it runs (SLOWLOG at 0 µs), then logs the mean
// time Redis spent per call of each command and of each project script.
// The recording costs Redis time itself, so the rates it reports are not
// comparable with BenchmarkProjectQueue's; the per-call figures are what
// it is for.
//
//	go run ./internal/testenv/cmd/withpg -- go test -run '^$' -bench BenchmarkProjectQueueRedisCost -benchtime 5000x -v ./store/project/
func BenchmarkProjectQueueRedisCost(b *testing.B) {
	ctx := context.Background()
	admin := env.Redis.AdminClient(0)
	defer admin.Close()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "1000000"}} {
		if err := admin.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			b.Fatal(err)
		}
	}
	defer admin.ConfigSet(ctx, "slowlog-log-slower-than", "10000")
	admin.SlowLogReset(ctx)
	BenchmarkProjectQueue(b)
	entries, err := admin.SlowLogGet(ctx, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	names := map[string]string{
		lua.ProjectTopicPublish.Hash(): "publish", lua.ProjectTopicClaim.Hash(): "claim",
		lua.ProjectTopicAck.Hash(): "ack", lua.ProjectTopicBudgetLease.Hash(): "lease",
	}
	type stat struct {
		calls int
		usec  int64
	}
	stats := map[string]*stat{}
	for _, e := range entries {
		if len(e.Args) == 0 {
			continue
		}
		name := strings.ToLower(e.Args[0])
		if (name == "evalsha" || name == "evalsha_ro") && len(e.Args) > 1 {
			if n, ok := names[e.Args[1]]; ok {
				name = n
			}
		}
		s := stats[name]
		if s == nil {
			s = &stat{}
			stats[name] = s
		}
		s.calls++
		s.usec += e.Duration.Microseconds()
	}
	keys := make([]string, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out strings.Builder
	for _, k := range keys {
		s := stats[k]
		fmt.Fprintf(&out, "%-12s calls %7d  usec/call %6.2f  usec total %8d\n", k, s.calls, float64(s.usec)/float64(s.calls), s.usec)
	}
	b.Log("\n" + out.String())
}
