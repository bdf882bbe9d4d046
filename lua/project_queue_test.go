package lua_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/lua"
)

// The project queue scripts as api_backend, on one project's keys (and the
// module budget's), in an order where each finds what it needs.
func init() {
	p := "han:prj:{acl:00000000-0000-7000-8000-000000000002}:"
	m := "han:prj:{acl:module}:"
	tid, sid := "00000000-0000-7000-8000-0000000000a1", "00000000-0000-7000-8000-0000000000b1"
	t, s := p+"t:"+tid+":", p+"s:"+sid+":"
	topics, names, subs, budget, dd, ddx := p+"q:topics", p+"q:tnames", p+"q:subs", p+"q:budget", p+"q:dd", p+"q:ddx"
	hash := "0123456789abcdef0123456789abcdef"
	invocations["project/topic_create"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicCreate.Run(ctx, c, []string{topics, names}, tid, "orders", "", 100).Err()
	}
	invocations["project/topic_sub_create"] = func(ctx context.Context, c redis.Scripter) error {
		_ = lua.ProjectTopicCreate.Run(ctx, c, []string{topics, names}, tid, "orders", "", 100).Err()
		return lua.ProjectTopicSubCreate.Run(ctx, c, []string{topics, subs, t + "subs", t + "s"}, sid, tid, "billing", 100).Err()
	}
	invocations["project/topic_sub_status"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicSubStatus.Run(ctx, c, []string{subs}, sid, "online").Err()
	}
	invocations["project/topic_publish"] = func(ctx context.Context, c redis.Scripter) error {
		if err := invocations["project/topic_sub_create"](ctx, c); err != nil {
			return err
		}
		res, err := lua.ProjectTopicPublish.Run(ctx, c, []string{topics, budget, dd, ddx, t + "s", t + "subs", t + "o", t + "d", s + "r"},
			tid, 2<<20, 4096, 60000, 16, 1, sid, tid+"\nprod\nevt", hash, "prod", "evt", `{"a":1}`, 7, 150, 1<<20).Slice()
		if err == nil {
			if row, _ := res[0].([]any); len(row) == 0 || (row[0] != "created" && row[0] != "replay") {
				err = fmt.Errorf("publish: %v", res)
			}
		}
		return err
	}
	invocations["project/topic_messages"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicMessages.Run(ctx, c, []string{topics, t + "s"}, tid, "", 10).Err()
	}
	invocations["project/topic_claim"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicClaim.Run(ctx, c, []string{topics, subs, t + "s", t + "o", t + "d", s + "r", s + "l"},
			sid, tid, 60000, 10, 0, 100, 1, hash).Err()
	}
	invocations["project/topic_ack"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicAck.Run(ctx, c, []string{subs, t + "o", t + "d", s + "r", s + "l"},
			sid, tid, "0-1", hash, "processed", "").Err()
	}
	invocations["project/topic_receipts"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicReceipts.Run(ctx, c, []string{subs, t + "s", s + "r"}, sid, tid, "", 10).Err()
	}
	invocations["project/topic_state"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicState.Run(ctx, c, []string{topics, subs, budget, dd, ddx}, 100).Err()
	}
	invocations["project/topic_trim"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicTrim.Run(ctx, c, []string{topics, budget, dd, ddx, t + "s", t + "subs", t + "o", t + "d", s + "r", s + "l"},
			tid, 10, 10, 4096, 16, 1, sid).Err()
	}
	invocations["project/topic_sub_delete"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicSubDelete.Run(ctx, c, []string{subs, budget, dd, ddx, t + "subs", t + "o", t + "d", s + "r", s + "l"},
			sid, tid, 4096, 16).Err()
	}
	invocations["project/topic_delete"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicDelete.Run(ctx, c, []string{topics, names, subs, budget, dd, ddx, t + "s", t + "subs", t + "o", t + "d"},
			tid, 4096, 16, 0).Err()
	}
	invocations["project/topic_budget_reserve"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicBudgetReserve.Run(ctx, c, []string{m + "budget", m + "resv", m + "projects", m + "seen"}, "r1", 100, 1<<20, "p").Err()
	}
	invocations["project/topic_budget_settle"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.ProjectTopicBudgetSettle.Run(ctx, c, []string{m + "budget", m + "resv"}, "r1", 100, 0, 0).Err()
	}
	invocations["project/topic_budget_lease"] = func(ctx context.Context, c redis.Scripter) error {
		keys := []string{m + "budget", m + "resv", m + "leases", m + "projects", m + "seen"}
		res, err := lua.ProjectTopicBudgetLease.Run(ctx, c, keys, "", 0, 0, 0, "l1", 65536, 10000, 1<<20, 1<<16, 100, "p", "q").Int64Slice()
		if err != nil || res[0] != 2 {
			return fmt.Errorf("take: %v %v", res, err)
		}
		return lua.ProjectTopicBudgetLease.Run(ctx, c, keys, "l1", 100, 0, res[1], "", 0, 10000, 1<<20, 1<<16, 0, "p").Err()
	}
	invocations["project/topic_budget_reconcile"] = func(ctx context.Context, c redis.Scripter) error {
		keys := []string{m + "budget", m + "resv", m + "leases", m + "projects", m + "seen"}
		res, err := lua.ProjectTopicBudgetReconcile.Run(ctx, c, keys, "begin", 60000, 60000).Int64Slice()
		if err != nil || res[0] != 1 {
			return fmt.Errorf("begin: %v %v", res, err)
		}
		if err := lua.ProjectTopicBudgetReconcile.Run(ctx, c, keys, "prune", res[1], 0, "p", "q").Err(); err != nil {
			return fmt.Errorf("prune: %w", err)
		}
		return lua.ProjectTopicBudgetReconcile.Run(ctx, c, keys, "end", res[1], 0).Err()
	}
}
