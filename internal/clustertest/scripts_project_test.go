package clustertest_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
)

// The project scripts on one project's keys (and its environment's module
// budget), in an order where each finds what it needs.
func init() {
	const hash = "0123456789abcdef0123456789abcdef"
	cache := func(p place, entry bool) []string {
		k := p.project()
		keys := []string{k.Meta(), k.CacheIndex(), k.CacheExpiry(), k.CacheSizes(), k.CacheContainer()}
		if entry {
			keys = append(keys, k.CacheEntry("k"))
		}
		return keys
	}
	add := map[string]invocation{
		"project/cache_put": func(ctx context.Context, c redis.Scripter, p place) error {
			return lua.ProjectCachePut.Run(ctx, c, cache(p, true), "k", "string", "v", 60000, 0, 2, 1048576, 0, 0, 16).Err()
		},
		"project/cache_delete": func(ctx context.Context, c redis.Scripter, p place) error {
			return lua.ProjectCacheDelete.Run(ctx, c, cache(p, true), "k", 0, 16).Err()
		},
		"project/cache_prune": func(ctx context.Context, c redis.Scripter, p place) error {
			return lua.ProjectCachePrune.Run(ctx, c, cache(p, false), 0, 16, "k", 1).Err()
		},
		"project/cache_state": func(ctx context.Context, c redis.Scripter, p place) error {
			return lua.ProjectCacheState.Run(ctx, c, cache(p, false), 1000).Err()
		},
		"project/meta_sync": func(ctx context.Context, c redis.Scripter, p place) error {
			return lua.ProjectMetaSync.Run(ctx, c, cache(p, false)[:4], 1048576, 0, 0).Err()
		},
		"project/topic_create": func(ctx context.Context, c redis.Scripter, p place) error {
			k := p.project()
			return lua.ProjectTopicCreate.Run(ctx, c, []string{k.Topics(), k.TopicNames()}, p.topic(), "orders", "", 100).Err()
		},
		"project/topic_sub_create": func(ctx context.Context, c redis.Scripter, p place) error {
			k, tid := p.project(), p.topic()
			_ = lua.ProjectTopicCreate.Run(ctx, c, []string{k.Topics(), k.TopicNames()}, tid, "orders", "", 100).Err()
			return lua.ProjectTopicSubCreate.Run(ctx, c, []string{k.Topics(), k.Subscriptions(), k.TopicSubscriptions(tid), k.TopicStream(tid)},
				p.sub(), tid, "billing", 100).Err()
		},
		"project/topic_sub_status": func(ctx context.Context, c redis.Scripter, p place) error {
			return lua.ProjectTopicSubStatus.Run(ctx, c, []string{p.project().Subscriptions()}, p.sub(), "online").Err()
		},
		"project/topic_publish": func(ctx context.Context, c redis.Scripter, p place) error {
			if err := invocations["project/topic_sub_create"](ctx, c, p); err != nil {
				return err
			}
			k, tid, sid := p.project(), p.topic(), p.sub()
			res, err := lua.ProjectTopicPublish.Run(ctx, c, []string{k.Topics(), k.Budget(), k.Dedupe(), k.DedupeExpiry(), k.TopicStream(tid),
				k.TopicSubscriptions(tid), k.TopicOpen(tid), k.TopicDone(tid), k.Receipts(sid)},
				tid, 2<<20, 4096, 60000, 16, 1, sid, tid+"\nprod\nevt", hash, "prod", "evt", `{"a":1}`, 7, 150, 1<<20).Slice()
			if err == nil {
				if row, _ := res[0].([]any); len(row) == 0 || (row[0] != "created" && row[0] != "replay") {
					err = fmt.Errorf("publish: %v", res)
				}
			}
			return err
		},
		"project/topic_messages": func(ctx context.Context, c redis.Scripter, p place) error {
			k := p.project()
			return lua.ProjectTopicMessages.Run(ctx, c, []string{k.Topics(), k.TopicStream(p.topic())}, p.topic(), "", 10).Err()
		},
		"project/topic_claim": func(ctx context.Context, c redis.Scripter, p place) error {
			k, tid, sid := p.project(), p.topic(), p.sub()
			return lua.ProjectTopicClaim.Run(ctx, c, []string{k.Topics(), k.Subscriptions(), k.TopicStream(tid), k.TopicOpen(tid),
				k.TopicDone(tid), k.Receipts(sid), k.Leases(sid)}, sid, tid, 60000, 10, 0, 100, 1, hash).Err()
		},
		"project/topic_ack": func(ctx context.Context, c redis.Scripter, p place) error {
			k, tid, sid := p.project(), p.topic(), p.sub()
			return lua.ProjectTopicAck.Run(ctx, c, []string{k.Subscriptions(), k.TopicOpen(tid), k.TopicDone(tid), k.Receipts(sid), k.Leases(sid)},
				sid, tid, "0-1", hash, "processed", "").Err()
		},
		"project/topic_receipts": func(ctx context.Context, c redis.Scripter, p place) error {
			k, tid, sid := p.project(), p.topic(), p.sub()
			return lua.ProjectTopicReceipts.Run(ctx, c, []string{k.Subscriptions(), k.TopicStream(tid), k.Receipts(sid)}, sid, tid, "", 10).Err()
		},
		"project/topic_state": func(ctx context.Context, c redis.Scripter, p place) error {
			k := p.project()
			return lua.ProjectTopicState.Run(ctx, c, []string{k.Topics(), k.Subscriptions(), k.Budget(), k.Dedupe(), k.DedupeExpiry()}, 100).Err()
		},
		"project/topic_trim": func(ctx context.Context, c redis.Scripter, p place) error {
			k, tid, sid := p.project(), p.topic(), p.sub()
			return lua.ProjectTopicTrim.Run(ctx, c, []string{k.Topics(), k.Budget(), k.Dedupe(), k.DedupeExpiry(), k.TopicStream(tid),
				k.TopicSubscriptions(tid), k.TopicOpen(tid), k.TopicDone(tid), k.Receipts(sid), k.Leases(sid)}, tid, 10, 10, 4096, 16, 1, sid).Err()
		},
		"project/topic_sub_delete": func(ctx context.Context, c redis.Scripter, p place) error {
			k, tid, sid := p.project(), p.topic(), p.sub()
			return lua.ProjectTopicSubDelete.Run(ctx, c, []string{k.Subscriptions(), k.Budget(), k.Dedupe(), k.DedupeExpiry(),
				k.TopicSubscriptions(tid), k.TopicOpen(tid), k.TopicDone(tid), k.Receipts(sid), k.Leases(sid)}, sid, tid, 4096, 16).Err()
		},
		"project/topic_delete": func(ctx context.Context, c redis.Scripter, p place) error {
			k, tid := p.project(), p.topic()
			return lua.ProjectTopicDelete.Run(ctx, c, []string{k.Topics(), k.TopicNames(), k.Subscriptions(), k.Budget(), k.Dedupe(),
				k.DedupeExpiry(), k.TopicStream(tid), k.TopicSubscriptions(tid), k.TopicOpen(tid), k.TopicDone(tid)}, tid, 4096, 16, 0).Err()
		},
		"project/topic_budget_reserve": func(ctx context.Context, c redis.Scripter, p place) error {
			m := p.module()
			return lua.ProjectTopicBudgetReserve.Run(ctx, c, []string{m.Budget(), m.Reservations(), m.Projects(), m.Seen()}, "r1", 100, 1<<20, "p").Err()
		},
		"project/topic_budget_settle": func(ctx context.Context, c redis.Scripter, p place) error {
			m := p.module()
			return lua.ProjectTopicBudgetSettle.Run(ctx, c, []string{m.Budget(), m.Reservations()}, "r1", 100, 0, 0).Err()
		},
		"project/topic_budget_lease": func(ctx context.Context, c redis.Scripter, p place) error {
			m := p.module()
			keys := []string{m.Budget(), m.Reservations(), m.Leases(), m.Projects(), m.Seen()}
			res, err := lua.ProjectTopicBudgetLease.Run(ctx, c, keys, "", 0, 0, 0, "l1", 65536, 10000, 1<<20, 1<<16, 100, "p", "q").Int64Slice()
			if err != nil || res[0] != 2 {
				return fmt.Errorf("take: %v %v", res, err)
			}
			return lua.ProjectTopicBudgetLease.Run(ctx, c, keys, "l1", 100, 0, res[1], "", 0, 10000, 1<<20, 1<<16, 0, "p").Err()
		},
		"project/topic_budget_reconcile": func(ctx context.Context, c redis.Scripter, p place) error {
			m := p.module()
			keys := []string{m.Budget(), m.Reservations(), m.Leases(), m.Projects(), m.Seen()}
			res, err := lua.ProjectTopicBudgetReconcile.Run(ctx, c, keys, "begin", 60000, 60000).Int64Slice()
			if err != nil || res[0] != 1 {
				return fmt.Errorf("begin: %v %v", res, err)
			}
			if err := lua.ProjectTopicBudgetReconcile.Run(ctx, c, keys, "prune", res[1], 0, "p", "q").Err(); err != nil {
				return fmt.Errorf("prune: %w", err)
			}
			return lua.ProjectTopicBudgetReconcile.Run(ctx, c, keys, "end", res[1], 0).Err()
		},
	}
	for k, v := range add {
		invocations[k] = v
	}
}
