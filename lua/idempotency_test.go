package lua_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
)

func init() {
	keys := []string{"han:api:idem:{acl:u:k}", "han:api:idemlock:{acl:u:k}", "han:api:idemgone:{acl:u:k}"}
	invocations["idem_reserve"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.IdemReserve.Run(ctx, c, keys, "fp", "owner", 30000).Err()
	}
	invocations["idem_extend"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.IdemExtend.Run(ctx, c, keys, "owner", 30000).Err()
	}
	invocations["idem_complete"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.IdemComplete.Run(ctx, c, keys, "owner", "fp", 201, "rid", 1, "", 86400000).Err()
	}
	invocations["idem_takeover"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.IdemTakeover.Run(ctx, c, keys, "fp", "dead", "owner", 30000).Err()
	}
	invocations["idem_release"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.IdemRelease.Run(ctx, c, keys, "owner").Err()
	}
	invocations["idem_abandon"] = func(ctx context.Context, c redis.Scripter) error {
		return lua.IdemAbandon.Run(ctx, c, keys, "owner", 30000).Err()
	}
}

// The scripts' state machine, called directly: absent -> in_progress ->
// completed, fingerprint comparison, owner-only extend/complete/release.
func TestIdempotencyScripts(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	rec, lock := "han:api:idem:{msg_send:u1:k1}", "han:api:idemlock:{msg_send:u1:k1}"
	keys := []string{rec, lock, "han:api:idemgone:{msg_send:u1:k1}"}
	reserve := func(fp, owner string) []any {
		t.Helper()
		v, err := lua.IdemReserve.Run(ctx, c, keys, fp, owner, 30000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	run := func(s *lua.Script, args ...any) int64 {
		t.Helper()
		v, err := s.Run(ctx, c, keys, args...).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	if r := reserve("fpA", "owner1"); r[0] != "acquired" {
		t.Fatalf("first reserve: %v", r)
	}
	if st := c.HGet(ctx, rec, "state").Val(); st != "in_progress" {
		t.Fatalf("state after reserve: %q", st)
	}
	// The same owner again (a retried call whose reply was lost) keeps it.
	if r := reserve("fpA", "owner1"); r[0] != "acquired" {
		t.Fatalf("repeated reserve by the owner: %v", r)
	}
	if r := reserve("fpA", "owner2"); r[0] != "in_progress" || r[1].(int64) <= 0 {
		t.Fatalf("same key while in progress: %v", r)
	}
	if r := reserve("fpB", "owner2"); r[0] != "conflict" {
		t.Fatalf("other fingerprint while in progress: %v", r)
	}
	// A foreign owner token can neither extend, complete nor release.
	if v := run(lua.IdemExtend, "owner2", 60000); v != 0 {
		t.Fatalf("foreign extend: %d", v)
	}
	if v := run(lua.IdemRelease, "owner2"); v != 0 {
		t.Fatalf("foreign release: %d", v)
	}
	if v := run(lua.IdemComplete, "owner2", "fpA", 201, "r1", 1, "", 86400000); v != 0 {
		t.Fatalf("foreign complete: %d", v)
	}
	if c.Get(ctx, lock).Val() != "owner1" || c.HGet(ctx, rec, "state").Val() != "in_progress" {
		t.Fatal("a foreign token changed the lock or the record")
	}
	if pttl := c.PTTL(ctx, lock).Val(); pttl > 30*time.Second {
		t.Fatalf("foreign extend moved the TTL: %v", pttl)
	}
	// The owner extends both keys.
	if v := run(lua.IdemExtend, "owner1", 60000); v != 1 {
		t.Fatalf("owner extend: %d", v)
	}
	if c.PTTL(ctx, lock).Val() <= 30*time.Second || c.PTTL(ctx, rec).Val() <= 30*time.Second {
		t.Fatal("owner extend did not extend lock and record")
	}
	if v := run(lua.IdemComplete, "owner1", "fpA", 201, "r1", 7, "m", 86400000); v != 1 {
		t.Fatalf("owner complete: %d", v)
	}
	if c.Exists(ctx, lock).Val() != 0 {
		t.Fatal("complete must release the lock")
	}
	if ttl := c.PTTL(ctx, rec).Val(); ttl <= 23*time.Hour {
		t.Fatalf("completed record TTL: %v", ttl)
	}
	r := reserve("fpA", "owner3")
	if r[0] != "replay" || r[1].(int64) != 201 || r[2] != "r1" || r[3].(int64) != 7 || r[4] != "m" {
		t.Fatalf("replay: %v", r)
	}
	if r := reserve("fpB", "owner3"); r[0] != "conflict" {
		t.Fatalf("other fingerprint after completion: %v", r)
	}
	// Release never deletes a completed record, and nobody owns a lock now.
	if v := run(lua.IdemRelease, "owner1"); v != -1 {
		t.Fatalf("release without lock: %d", v)
	}
	if c.HGet(ctx, rec, "state").Val() != "completed" {
		t.Fatal("completed record lost")
	}
}

func TestIdempotencyReleaseAndTakeover(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	keys := []string{"han:api:idem:{msg_send:u2:k}", "han:api:idemlock:{msg_send:u2:k}", "han:api:idemgone:{msg_send:u2:k}"}
	if v, _ := lua.IdemReserve.Run(ctx, c, keys, "fp", "a", 30000).Slice(); v[0] != "acquired" {
		t.Fatalf("reserve: %v", v)
	}
	if v, _ := lua.IdemRelease.Run(ctx, c, keys, "a").Int(); v != 1 {
		t.Fatalf("release: %d", v)
	}
	if n := c.Exists(ctx, keys...).Val(); n != 0 {
		t.Fatalf("release must return the key to absent, %d keys left", n)
	}
	// Another fingerprint may use the key now.
	if v, _ := lua.IdemReserve.Run(ctx, c, keys, "other", "b", 50).Slice(); v[0] != "acquired" {
		t.Fatalf("reserve after release: %v", v)
	}
	// The owner vanished: lock and in-progress record expire together, and
	// the key behaves as absent.
	testenv.Eventually(t, 2*time.Second, func() bool { return c.Exists(ctx, keys...).Val() == 0 }, "in-progress keys did not expire")
	if v, _ := lua.IdemReserve.Run(ctx, c, keys, "third", "c", 30000).Slice(); v[0] != "acquired" {
		t.Fatalf("reserve after expiry: %v", v)
	}
	if v, _ := lua.IdemExtend.Run(ctx, c, keys, "b", 30000).Int(); v != 0 {
		t.Fatalf("the expired owner must not extend the new lock: %d", v)
	}
}

// A survivor takes over a dead owner's lock only while the lock still holds
// the value it saw: of two survivors that saw the same dead owner, exactly
// one runs the request; a completed record or another fingerprint is never
// overwritten.
func TestIdempotencyTakeoverComparesTheHolder(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	keys := []string{"han:api:idem:{msg_send:u3:k}", "han:api:idemlock:{msg_send:u3:k}", "han:api:idemgone:{msg_send:u3:k}"}
	takeover := func(fp, seen, owner string) []any {
		t.Helper()
		v, err := lua.IdemTakeover.Run(ctx, c, keys, fp, seen, owner, 3600000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v, _ := lua.IdemReserve.Run(ctx, c, keys, "fp", "t0:dead-instance", 3600000).Slice(); v[0] != "acquired" {
		t.Fatalf("reserve: %v", v)
	}
	v, _ := lua.IdemReserve.Run(ctx, c, keys, "fp", "t1:survivor-1", 3600000).Slice()
	if v[0] != "in_progress" || len(v) < 4 || v[3] != "t0:dead-instance" {
		t.Fatalf("in-progress reply must name the holder: %v", v)
	}
	if r := takeover("other", "t0:dead-instance", "t1:survivor-1"); r[0] != "conflict" {
		t.Fatalf("takeover with another fingerprint: %v", r)
	}
	if r := takeover("fp", "t0:dead-instance", "t1:survivor-1"); r[0] != "acquired" {
		t.Fatalf("first survivor's takeover: %v", r)
	}
	if c.Get(ctx, keys[1]).Val() != "t1:survivor-1" || c.HGet(ctx, keys[0], "state").Val() != "in_progress" {
		t.Fatal("takeover did not hand the lock over")
	}
	r := takeover("fp", "t0:dead-instance", "t2:survivor-2")
	if r[0] != "in_progress" || r[3] != "t1:survivor-1" {
		t.Fatalf("second survivor's takeover of the same dead owner: %v", r)
	}
	if c.Get(ctx, keys[1]).Val() != "t1:survivor-1" {
		t.Fatal("the second survivor replaced the first one's lock")
	}
	if n, _ := lua.IdemComplete.Run(ctx, c, keys, "t1:survivor-1", "fp", 201, "r1", 1, "", 86400000).Int(); n != 1 {
		t.Fatalf("new owner's complete: %d", n)
	}
	if r := takeover("fp", "t1:survivor-1", "t2:survivor-2"); r[0] != "replay" || r[2] != "r1" {
		t.Fatalf("takeover after completion must replay: %v", r)
	}
	if c.Exists(ctx, keys[1]).Val() != 0 {
		t.Fatal("a takeover after completion took a lock")
	}
}

// A reserve or takeover whose reply never came is given up with
// idem_abandon: a lock the call took is released (a completed record stays),
// and the token is marked so a copy of the call that reaches Redis later
// takes nothing; the mark carries the TTL given. Other owners are
// untouched.
func TestIdempotencyAbandon(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	keys := []string{"han:api:idem:{msg_send:u4:k}", "han:api:idemlock:{msg_send:u4:k}", "han:api:idemgone:{msg_send:u4:k}"}
	abandon := func(owner string) int64 {
		t.Helper()
		n, err := lua.IdemAbandon.Run(ctx, c, keys, owner, 30000).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	reserve := func(owner string) []any {
		t.Helper()
		v, err := lua.IdemReserve.Run(ctx, c, keys, "fp", owner, 30000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	// The call ran before it was given up: its lock and in-progress record
	// go, and the key is free for the retry.
	if r := reserve("late-1"); r[0] != "acquired" {
		t.Fatalf("reserve: %v", r)
	}
	if n := abandon("late-1"); n != 1 {
		t.Fatalf("abandon of the holder: %d, want 1", n)
	}
	if c.Exists(ctx, keys[0], keys[1]).Val() != 0 {
		t.Fatal("abandon left the lock or the in-progress record")
	}
	if ttl := c.PTTL(ctx, keys[2]).Val(); ttl <= 0 || ttl > 30*time.Second {
		t.Fatalf("the mark's TTL is %v, want (0, 30s]", ttl)
	}
	// Given up before it arrived: the late copy takes nothing.
	if n := abandon("late-2"); n != 0 {
		t.Fatalf("abandon of a token without the lock: %d, want 0", n)
	}
	if r := reserve("late-2"); r[0] != "abandoned" {
		t.Fatalf("late reserve of an abandoned token: %v", r)
	}
	if v, _ := lua.IdemTakeover.Run(ctx, c, keys, "fp", "dead", "late-2", 30000).Slice(); v[0] != "abandoned" {
		t.Fatalf("late takeover of an abandoned token: %v", v)
	}
	if c.Exists(ctx, keys[0], keys[1]).Val() != 0 {
		t.Fatal("a late copy of an abandoned call wrote the record or the lock")
	}
	// The retry, with its own token, runs; abandoning another token leaves
	// its lock alone, and its completed record survives a late abandon.
	if r := reserve("retry"); r[0] != "acquired" {
		t.Fatalf("retry: %v", r)
	}
	if n := abandon("late-3"); n != 0 || c.Get(ctx, keys[1]).Val() != "retry" {
		t.Fatalf("abandon of another token touched the retry's lock: %d", n)
	}
	if n, _ := lua.IdemComplete.Run(ctx, c, keys[:2], "retry", "fp", 201, "r1", 1, "", 86400000).Int(); n != 1 {
		t.Fatalf("complete: %d", n)
	}
	if n := abandon("retry"); n != 0 || c.HGet(ctx, keys[0], "state").Val() != "completed" {
		t.Fatalf("abandon after completion: %d, record %v", n, c.HGetAll(ctx, keys[0]).Val())
	}
}
