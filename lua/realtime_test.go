package lua_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/lua"
)

func init() {
	conn, user, online := "han:rt:conn:{acl-u}:c1", "han:rt:user:{acl-u}:connections", "han:rt:user:{acl-u}:online"
	add := map[string]func(ctx context.Context, c redis.Scripter) error{
		"rt_heartbeat": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTHeartbeat.Run(ctx, c, []string{conn, user, online}, "acl-u", "c1", "i1", 0, 90000, 120000, 100).Err()
		},
		"rt_disconnect": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTDisconnect.Run(ctx, c, []string{conn, user, conn + ":closed"}, "c1", 90000, 100).Err()
		},
		"rt_disconnect_user": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTDisconnectUser.Run(ctx, c, []string{user, conn}, 90000, "c1").Err()
		},
		"rt_offline": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTOffline.Run(ctx, c, []string{user, online, "han:rt:user:{acl-u}:offline"}, 90000, "t1", 120000).Err()
		},
		"rt_presence": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTPresence.Run(ctx, c, []string{user}, 90000).Err()
		},
		"rt_instance_heartbeat": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTInstanceHeartbeat.Run(ctx, c, []string{"han:rt:instance:{acl-i}", "han:rt:instance:{acl-i}:connections"},
				10000, 120000, "acl-u:c1").Err()
		},
		"rt_instances_add": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTInstancesAdd.Run(ctx, c, []string{"han:rt:instances"}, "acl-i", 120000).Err()
		},
		"rt_index_remove": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTIndexRemove.Run(ctx, c, []string{"han:rt:instance:{acl-i}:connections"}, "acl-u:c1", "1").Err()
		},
		"rt_index_update": func(ctx context.Context, c redis.Scripter) error {
			return lua.RTIndexUpdate.Run(ctx, c, []string{"han:rt:instance:{acl-i}:connections"}, 120000, 1, "acl-u:c1", "acl-u:~offline").Err()
		},
		"rt_ticket_redeem": func(ctx context.Context, c redis.Scripter) error {
			err := lua.RTTicketRedeem.Run(ctx, c, []string{"han:rt:ticket:acl"}).Err()
			if err == redis.Nil {
				return nil
			}
			return err
		},
	}
	for k, v := range add {
		invocations[k] = v
	}
}

// The heartbeat removes stale members in bounded batches, never the
// connection it refreshes, and a duplicate disconnect is harmless.
func TestPresenceScripts(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	conn := func(id string) string { return "han:rt:conn:{u1}:" + id }
	user, online := "han:rt:user:{u1}:connections", "han:rt:user:{u1}:online"
	// Five stale members (heartbeat at 1 ms after the epoch).
	for _, m := range []string{"s1", "s2", "s3", "s4", "s5"} {
		if err := c.ZAdd(ctx, user, redis.Z{Score: 1, Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hb := func(id string) []any {
		v, err := lua.RTHeartbeat.Run(ctx, c, []string{conn(id), user, online}, "u1", id, "i1", 3, 90000, 120000, 2).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	r := hb("c1")
	if r[1].(int64) != 1 || r[2].(int64) != 2 {
		t.Fatalf("first heartbeat: want became_online=1 and 2 stale removed, got %v", r)
	}
	r = hb("c1")
	if r[1].(int64) != 0 || r[2].(int64) != 2 {
		t.Fatalf("second heartbeat: want became_online=0 and the next 2 stale removed, got %v", r)
	}
	if n := c.ZCard(ctx, user).Val(); n != 2 {
		t.Fatalf("want c1 and one stale member left, got %d members", n)
	}
	h := c.HGetAll(ctx, conn("c1")).Val()
	if h["user_id"] != "u1" || h["instance"] != "i1" || h["subscriptions_count"] != "3" || h["last_seen"] == "" {
		t.Fatalf("connection HASH: %v", h)
	}
	for _, k := range []string{conn("c1"), user, online} {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Fatalf("%s has no TTL (%v)", k, ttl)
		}
	}
	disc := func() []any {
		v, err := lua.RTDisconnect.Run(ctx, c, []string{conn("c1"), user}, "c1", 90000, 10).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if r := disc(); r[0].(int64) != 1 || r[1].(int64) != 0 {
		t.Fatalf("disconnect: %v", r)
	}
	if r := disc(); r[0].(int64) != 0 || r[1].(int64) != 0 {
		t.Fatalf("a duplicate disconnect must remove nothing: %v", r)
	}
	if c.Exists(ctx, user).Val() != 0 {
		t.Fatal("the last stale member should have gone with the disconnect")
	}
	off := func() int64 {
		v, err := lua.RTOffline.Run(ctx, c, []string{user, online}, 90000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v[0].(int64)
	}
	if off() != 1 || off() != 0 {
		t.Fatal("the offline transition must be reported exactly once")
	}
}

// A periodic heartbeat (cap 0) that arrives after the connection's
// disconnect does not register it again; the disconnect's closed marker
// expires with the connection TTL.
func TestHeartbeatAfterDisconnectRegistersNothing(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	conn, user, online, closed := "han:rt:conn:{u3}:c1", "han:rt:user:{u3}:connections", "han:rt:user:{u3}:online", "han:rt:conn:{u3}:c1:closed"
	hb := func() []any {
		t.Helper()
		v, err := lua.RTHeartbeat.Run(ctx, c, []string{conn, user, online, closed}, "u3", "c1", "i1", 0, 90000, 120000, 100, 0).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if r := hb(); r[3].(int64) != 0 || c.Exists(ctx, conn).Val() != 1 {
		t.Fatalf("a heartbeat of an open connection must register it: %v", r)
	}
	if err := lua.RTDisconnect.Run(ctx, c, []string{conn, user, closed}, "c1", 90000, 100).Err(); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, closed).Val(); ttl <= 0 || ttl > 90*time.Second {
		t.Fatalf("closed marker TTL %v, want within the connection TTL", ttl)
	}
	if r := hb(); r[3].(int64) != 2 {
		t.Fatalf("a heartbeat after the disconnect: want skipped (2), got %v", r)
	}
	if c.Exists(ctx, conn).Val() != 0 || c.ZScore(ctx, user, "c1").Err() != redis.Nil {
		t.Fatal("a heartbeat after the disconnect registered the connection again")
	}
}

// An offline check run again (its reply was lost) answers as its first run
// did; another check does not report the same transition.
func TestOfflineCheckRunAgainAnswersTheSame(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	user, online, record := "han:rt:user:{u2}:connections", "han:rt:user:{u2}:online", "han:rt:user:{u2}:offline"
	if err := c.Set(ctx, online, "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	off := func(token string) int64 {
		t.Helper()
		v, err := lua.RTOffline.Run(ctx, c, []string{user, online, record}, 90000, token, 120000).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v[0].(int64)
	}
	if off("a") != 1 {
		t.Fatal("the first check must report the transition")
	}
	if ttl := c.PTTL(ctx, record).Val(); ttl <= 0 {
		t.Fatalf("the offline record has no TTL (%v)", ttl)
	}
	if off("a") != 1 {
		t.Fatal("the same check run again must report the transition again")
	}
	if off("") != 0 || off("a:") != 0 {
		t.Fatal("a check whose token only shares a prefix must not report the transition again")
	}
	if off("b") != 0 {
		t.Fatal("another check must not report the transition again")
	}
	// Back online: the same check run again finds a live connection.
	if err := c.ZAdd(ctx, user, redis.Z{Score: float64(time.Now().UnixMilli()), Member: "c1"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Expire(ctx, user, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if off("a") != 0 {
		t.Fatal("a check must not report offline while a connection is live")
	}
}

// The offline transition's time is its disconnect's, unless the online
// marker (the time of the user's latest registration or refresh) is later:
// then the check's own, so it is later than any online transition it
// ends. A check run again reports the same time.
func TestOfflineTimeIsLaterThanTheLatestRegistration(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	user, online, record := "han:rt:user:{u8}:connections", "han:rt:user:{u8}:online", "han:rt:user:{u8}:offline"
	now := time.Now().UnixMilli()
	off := func(token string, disconnect int64) []any {
		t.Helper()
		v, err := lua.RTOffline.Run(ctx, c, []string{user, online, record}, 90000, token, 120000, disconnect).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		marker, disconnect int64
		later              bool // the transition is stamped with the check's time
	}{{now - 5000, now - 1000, false}, {now - 1000, now - 5000, true}, {1, now - 5000, false}} {
		if err := c.Set(ctx, online, tc.marker, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		v := off("t", tc.disconnect)
		if len(v) < 3 || v[0].(int64) != 1 {
			t.Fatalf("%+v: reply %v", tc, v)
		}
		at, checked := v[2].(int64), v[1].(int64)
		if tc.later && at != checked || !tc.later && at != tc.disconnect {
			t.Fatalf("%+v: the transition's time is %d (check at %d)", tc, at, checked)
		}
		if again := off("t", tc.disconnect); len(again) < 3 || again[0].(int64) != 1 || again[2].(int64) != at {
			t.Fatalf("%+v: the check run again answered %v, want its first time %d", tc, again, at)
		}
	}
}

// A script that must set a TTL refuses to write anything when the ACL
// denies the expiry command.
func TestPresenceScriptsRefuseWithoutExpiry(t *testing.T) {
	ctx := context.Background()
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	admin := r.AdminClient(0)
	defer admin.Close()
	if err := admin.Do(ctx, "acl", "setuser", "api_backend", "-pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	opt, _ := redis.ParseURL(r.URL(1))
	c := redis.NewClient(opt)
	defer c.Close()
	keys := []string{"han:rt:conn:{u}:c", "han:rt:user:{u}:connections", "han:rt:user:{u}:online"}
	err = lua.RTHeartbeat.Run(ctx, c, keys, "u", "c", "i", 0, 90000, 120000, 10).Err()
	if err == nil || !strings.Contains(err.Error(), "expiry_denied") {
		t.Fatalf("want expiry_denied, got %v", err)
	}
	err = lua.RTInstanceHeartbeat.Run(ctx, c, []string{"han:rt:instance:{i}", "han:rt:instance:{i}:connections"}, 10000, 120000, "u:c").Err()
	if err == nil || !strings.Contains(err.Error(), "expiry_denied") {
		t.Fatalf("want expiry_denied, got %v", err)
	}
	admin1 := r.AdminClient(1)
	defer admin1.Close()
	if n := admin1.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("a refused script wrote %d keys", n)
	}
}

// The cap counts a user's live members only (stale ones are free slots),
// refuses a new connection at the cap without writing anything, and never
// refuses the refresh of a connection already registered.
func TestPresenceConnectionCap(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	conn := func(id string) string { return "han:rt:conn:{u2}:" + id }
	user, online := "han:rt:user:{u2}:connections", "han:rt:user:{u2}:online"
	if err := c.ZAdd(ctx, user, redis.Z{Score: 1, Member: "stale"}).Err(); err != nil {
		t.Fatal(err)
	}
	hb := func(id string, maxConns int) []any {
		t.Helper()
		v, err := lua.RTHeartbeat.Run(ctx, c, []string{conn(id), user, online}, "u2", id, "i1", 0, 90000, 120000, 0, maxConns).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	refused := func(v []any) bool { return v[3].(int64) == 1 }
	if refused(hb("c1", 2)) || refused(hb("c2", 2)) {
		t.Fatal("two connections under a cap of 2 (one stale member) must register")
	}
	if !refused(hb("c3", 2)) {
		t.Fatal("a third connection must be refused")
	}
	if c.Exists(ctx, conn("c3")).Val() != 0 || c.ZScore(ctx, user, "c3").Err() != redis.Nil || c.ZCard(ctx, user).Val() != 3 {
		t.Fatal("a refused connection must write nothing")
	}
	if refused(hb("c1", 2)) || refused(hb("c2", 1)) {
		t.Fatal("a registered connection's heartbeat is never refused")
	}
	// A connection no longer registered (a sweep removed its member, or
	// its member went stale) is registered again only within the cap.
	if !refused(hb("stale", 2)) {
		t.Fatal("a connection whose member is stale must be refused at the cap")
	}
	if err := c.ZRem(ctx, user, "c2").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ZAdd(ctx, user, redis.Z{Score: 2, Member: "stale2"}).Err(); err != nil {
		t.Fatal(err)
	}
	if refused(hb("c2", 2)) {
		t.Fatal("a swept connection must be registered again while the user is under the cap")
	}
	if err := c.ZRem(ctx, user, "c2").Err(); err != nil {
		t.Fatal(err)
	}
	if refused(hb("c3", 2)) || !refused(hb("c2", 2)) {
		t.Fatal("a swept connection must be refused once the user has reached the cap meanwhile")
	}
	if refused(hb("c2", 0)) {
		t.Fatal("cap 0 means no cap")
	}
	if err := lua.RTDisconnect.Run(ctx, c, []string{conn("c1"), user}, "c1", 90000, 10).Err(); err != nil {
		t.Fatal(err)
	}
	if err := lua.RTDisconnect.Run(ctx, c, []string{conn("c3"), user}, "c3", 90000, 10).Err(); err != nil {
		t.Fatal(err)
	}
	if refused(hb("c4", 2)) {
		t.Fatal("a disconnect must free its slot")
	}
}

// rt_disconnect_user removes several connections of one user in one call,
// reports the live ones left, and a duplicate call removes nothing.
func TestDisconnectUserScript(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	conn := func(id string) string { return "han:rt:conn:{u7}:" + id }
	user, online := "han:rt:user:{u7}:connections", "han:rt:user:{u7}:online"
	for _, id := range []string{"c1", "c2", "c3"} {
		if err := lua.RTHeartbeat.Run(ctx, c, []string{conn(id), user, online}, "u7", id, "i1", 0, 90000, 120000, 100).Err(); err != nil {
			t.Fatal(err)
		}
	}
	run := func() []any {
		v, err := lua.RTDisconnectUser.Run(ctx, c, []string{user, conn("c1"), conn("c2")}, 90000, "c1", "c2").Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if r := run(); r[0].(int64) != 2 || r[1].(int64) != 1 {
		t.Fatalf("disconnect of c1 and c2: %v, want 2 removed and 1 live", r)
	}
	if c.Exists(ctx, conn("c1"), conn("c2")).Val() != 0 || c.Exists(ctx, conn("c3")).Val() != 1 {
		t.Fatal("the removed connections' HASHes must go, the other's stay")
	}
	if r := run(); r[0].(int64) != 0 || r[1].(int64) != 1 {
		t.Fatalf("a duplicate disconnect must remove nothing: %v", r)
	}
	// With the closed markers (a drain): each is left with the TTL, and a
	// periodic heartbeat of the connection run afterwards registers nothing.
	closed := conn("c3") + ":closed"
	if err := lua.RTDisconnectUser.Run(ctx, c, []string{user, conn("c3"), closed}, 90000, "c3").Err(); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, closed).Val(); ttl <= 0 || ttl > 90*time.Second {
		t.Fatalf("the closed marker's TTL is %v", ttl)
	}
	v, err := lua.RTHeartbeat.Run(ctx, c, []string{conn("c3"), user, online, closed}, "u7", "c3", "i1", 0, 90000, 120000, 100, 0).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if v[3].(int64) != 2 || c.Exists(ctx, conn("c3")).Val() != 0 || c.ZScore(ctx, user, "c3").Err() != redis.Nil {
		t.Fatalf("a heartbeat after the drain registered the connection again: %v", v)
	}
}

// The sweep of a dead instance spares a connection registered again after
// the instance was found dead (a fresh heartbeat), and removes an index
// entry only while its score is the one the sweep read.
func TestSweepScriptsSpareFreshRegistrations(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	conn, user, online := "han:rt:conn:{u4}:c1", "han:rt:user:{u4}:connections", "han:rt:user:{u4}:online"
	if err := lua.RTHeartbeat.Run(ctx, c, []string{conn, user, online}, "u4", "c1", "i1", 0, 90000, 120000, 100, 16).Err(); err != nil {
		t.Fatal(err)
	}
	v, err := lua.RTDisconnect.Run(ctx, c, []string{conn, user}, "c1", 90000, 100, 5000).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if v[0].(int64) != -1 || v[1].(int64) != 1 || c.Exists(ctx, conn).Val() != 1 || c.ZScore(ctx, user, "c1").Err() != nil {
		t.Fatalf("a registration younger than the fresh window was not spared: %v", v)
	}
	// Older than the window: removed.
	c.ZAdd(ctx, user, redis.Z{Score: float64(time.Now().Add(-10 * time.Second).UnixMilli()), Member: "c1"})
	v, err = lua.RTDisconnect.Run(ctx, c, []string{conn, user}, "c1", 90000, 100, 5000).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if v[0].(int64) != 1 || v[1].(int64) != 0 || c.Exists(ctx, conn).Val() != 0 {
		t.Fatalf("an old registration was not removed: %v", v)
	}

	index := "han:rt:instance:{i4}:connections"
	c.ZAdd(ctx, index, redis.Z{Score: 1000, Member: "u4:c1"}, redis.Z{Score: 2000, Member: "u4:c2"})
	c.PExpire(ctx, index, time.Minute)
	n, err := lua.RTIndexRemove.Run(ctx, c, []string{index}, "u4:c1", "1000", "u4:c2", "1999", "u4:c3", "5").Int()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || c.ZScore(ctx, index, "u4:c1").Err() != redis.Nil || c.ZScore(ctx, index, "u4:c2").Val() != 2000 {
		t.Fatalf("index removal: %d removed, members %v", n, c.ZRangeWithScores(ctx, index, 0, -1).Val())
	}
}
