package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// ttlPatterns are the key families that must always carry a TTL
// (docs/redis-keys.md); project reliable keys (han:prj:*) have none yet: their
// recovery depends on Redis keeping its data, so no TTL may drop them.
var ttlPatterns = []string{"han:api:*", "han:rt:*", "han:coord:*", "han:settings:*"}

// legacyDB is the database of the legacy safety stub on VM1.
const legacyDB = 2

// adminRedis is the operator's connection to one Redis instance
// (HAN_REDIS_ADMIN_URL): an ACL user allowed SCAN, UNLINK, ACL, CLIENT LIST
// and CONFIG GET in every database. Only hanctl uses it.
type adminRedis struct {
	opt *redis.Options
	dbs int
	c   map[int]*redis.Client
}

func openAdmin(ctx context.Context, getenv func(string) string) (*adminRedis, error) {
	u := getenv("HAN_REDIS_ADMIN_URL")
	if u == "" {
		return nil, errors.New("HAN_REDIS_ADMIN_URL is required (an admin connection to the Redis instance)")
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		return nil, errors.New("HAN_REDIS_ADMIN_URL: invalid redis URL") // never echo: it holds a password
	}
	opt.ReadTimeout, opt.WriteTimeout, opt.DialTimeout = adminRedisTimeout, adminRedisTimeout, 5*time.Second
	a := &adminRedis{opt: opt, c: map[int]*redis.Client{}}
	// How many databases: CONFIG GET databases; Redis Cluster has one.
	res, err := a.db(0).ConfigGet(ctx, "databases").Result()
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("admin connection: %w", redisFailure("HAN_REDIS_ADMIN_URL", adminRedisTimeout, err))
	}
	a.dbs, _ = strconv.Atoi(res["databases"])
	if a.dbs < 1 {
		a.dbs = 1
	}
	return a, nil
}

func (a *adminRedis) db(n int) *redis.Client {
	if c, ok := a.c[n]; ok {
		return c
	}
	o := *a.opt
	o.DB = n
	c := redis.NewClient(&o)
	a.c[n] = c
	return c
}

func (a *adminRedis) Close() {
	for _, c := range a.c {
		_ = c.Close()
	}
}

// scan calls f with each batch of keys matching pattern in database db.
func (a *adminRedis) scan(ctx context.Context, db int, pattern string, f func(keys []string) error) error {
	c := a.db(db)
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return redactErr(err)
		}
		if len(keys) > 0 {
			if err := f(keys); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// stubClients counts connections authenticated as legacy_stub.
func (a *adminRedis) stubClients(ctx context.Context) (int, error) {
	list, err := a.db(0).ClientList(ctx).Result()
	if err != nil {
		return 0, redactErr(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		for _, f := range strings.Fields(line) {
			if f == "user="+rds.LegacyStubUser {
				n++
			}
		}
	}
	return n, nil
}

// stubUserExists reports whether the legacy_stub ACL user exists.
func (a *adminRedis) stubUserExists(ctx context.Context) (bool, error) {
	users, err := a.db(0).Do(ctx, "acl", "users").StringSlice()
	if err != nil {
		return false, redactErr(err)
	}
	for _, u := range users {
		if u == rds.LegacyStubUser {
			return true, nil
		}
	}
	return false, nil
}

// adminRedisTimeout bounds each command of the admin connection.
const adminRedisTimeout = 10 * time.Second

// redisFailure is a failed command over the Redis URL in variable name,
// each command bounded by timeout: a server that did not answer in time
// (stalled, or a partition) says so; other errors as redactErr keeps them.
func redisFailure(name string, timeout time.Duration, err error) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: Redis did not answer within %s (a stalled server, or a network partition)", name, timeout)
	}
	return fmt.Errorf("%s: %w", name, redactErr(err))
}

// openRedis opens a client over the Redis URL in variable name; a URL it
// cannot read is named, never echoed (it holds a password).
func openRedis(name string, getenv func(string) string, cfg rds.RedisConfig) (redis.UniversalClient, error) {
	c, err := rds.NewRedis(getenv(name), cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}

// redactErr keeps a Redis error's class, not text that could quote values:
// a server's error reply keeps its error code (its first word: READONLY,
// MISCONF, BUSY, NOPERM, WRONGPASS, ...), which tells the operator what the
// server refused, and loses the rest; any other error is classified.
func redactErr(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var reply redis.Error
	isReply := errors.As(err, &reply)
	if isReply {
		msg = reply.Error()
	}
	for _, prefix := range []string{"ERR unknown command", "ERR This Redis instance is not configured to use an ACL file"} {
		if strings.HasPrefix(msg, prefix) {
			return errors.New(prefix)
		}
	}
	if isReply {
		if code := errorCode(msg); code != "" {
			if hint, ok := errorHints[code]; ok {
				return fmt.Errorf("%s: %s", code, hint)
			}
			return fmt.Errorf("%s (the rest of the server's reply is not shown)", code)
		}
	}
	return rds.ClassifyRedisError(err)
}

// errorCode is the error code of a server's error reply: its first word,
// upper-case letters only; "" when it has none.
func errorCode(reply string) string {
	code, _, _ := strings.Cut(reply, " ")
	if len(code) < 2 || len(code) > 32 {
		return ""
	}
	for _, r := range code {
		if r < 'A' || r > 'Z' {
			return ""
		}
	}
	return code
}

// errorHints says what the codes an operator meets here mean.
var errorHints = map[string]string{
	"READONLY":   "the server is a read-only replica: point HAN_REDIS_ADMIN_URL at the master",
	"MISCONF":    "the server refuses writes because it cannot persist (stop-writes-on-bgsave-error): check its disk and log",
	"BUSY":       "the server is busy running a script: retry when it has finished",
	"LOADING":    "the server is loading its data set: retry when it has finished",
	"MASTERDOWN": "the replica lost its master",
}

// cmdRedisCutover removes the legacy DB2 safety stub from a Redis instance
// (docs/legacy-stub.md): the legacy_stub ACL user first (ACL DELUSER, which
// closes its connections, so no instance still running with the stub on can
// write a task behind the deletion), then every han:stub:* key in every
// database, checked gone by a second scan, then ACL SAVE, so the user does
// not come back on restart. It refuses while connections are still
// authenticated as legacy_stub (instances with the stub on) unless --force,
// and refuses a replica. It is idempotent.
func cmdRedisCutover(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("redis cutover", flag.ContinueOnError)
	force := fs.Bool("force", false, "cut over even while instances are still connected as legacy_stub")
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	a, err := openAdmin(ctx, getenv)
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.refuseReplica(ctx); err != nil {
		return err
	}
	n, err := a.stubClients(ctx)
	if err != nil {
		return fmt.Errorf("client list: %w", err)
	}
	if n > 0 && !*force {
		return fmt.Errorf("%d connection(s) still authenticated as %s: set HAN_LEGACY_STUB_ENABLED=false on every instance and restart them first (or pass --force)",
			n, rds.LegacyStubUser)
	}
	removed, err := a.db(0).Do(ctx, "acl", "deluser", rds.LegacyStubUser).Int()
	if err != nil {
		return fmt.Errorf("ACL DELUSER: %w", redactErr(err))
	}
	if removed > 0 {
		fmt.Fprintf(out, "deleted ACL user %s (its connections were closed)\n", rds.LegacyStubUser)
	} else {
		fmt.Fprintf(out, "ACL user %s: already absent\n", rds.LegacyStubUser)
	}
	deleted, err := a.unlinkStubKeys(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "deleted %d %s key(s) in %d database(s)\n", deleted, store.StubKeyPattern, a.dbs)
	if err := a.db(0).Do(ctx, "acl", "save").Err(); err != nil {
		return fmt.Errorf("ACL SAVE failed (%w): the user would come back on restart; render the ACL file again "+
			"with `hanctl redis acl` without HAN_LEGACY_STUB_PASSWORD and reload it", redactErr(err))
	}
	// Redis writes the file anew under its own umask (0644 under the usual
	// 022): readable by every local user until rendered again.
	fmt.Fprintln(out, "ACL saved to the server's ACL file (Redis wrote it with its default mode: render it again with "+
		"`hanctl redis acl --out` to make it private)")
	fmt.Fprintln(out, "next: remove HAN_LEGACY_STUB_ENABLED and HAN_LEGACY_STUB_URL from every instance's environment "+
		"(and HAN_LEGACY_STUB_PASSWORD from the ACL rendering), then run `hanctl redis verify`")
	return nil
}

// refuseReplica fails on a replica, before anything is changed: its data
// is the master's, and an ACL change would stay on the replica alone. A
// server that does not let the admin run ROLE is not refused here; a write
// to a replica still fails with READONLY.
func (a *adminRedis) refuseReplica(ctx context.Context) error {
	role, err := a.db(0).Do(ctx, "role").Slice()
	if err != nil || len(role) == 0 {
		return nil
	}
	if r, _ := role[0].(string); r == "slave" || r == "replica" {
		return errors.New("HAN_REDIS_ADMIN_URL names a replica: run the cutover against the master")
	}
	return nil
}

// unlinkStubKeys deletes every han:stub:* key in every database and scans
// again: a key left (written by a user other than legacy_stub, which no
// longer exists) fails the cutover instead of being reported as done.
func (a *adminRedis) unlinkStubKeys(ctx context.Context) (int, error) {
	deleted := 0
	for db := 0; db < a.dbs; db++ {
		err := a.scan(ctx, db, store.StubKeyPattern, func(keys []string) error {
			m, err := a.db(db).Unlink(ctx, keys...).Result()
			deleted += int(m)
			return redactErr(err)
		})
		if err != nil {
			return deleted, fmt.Errorf("delete %s in db%d: %w", store.StubKeyPattern, db, err)
		}
	}
	left := 0
	for db := 0; db < a.dbs; db++ {
		if err := a.scan(ctx, db, store.StubKeyPattern, func(keys []string) error { left += len(keys); return nil }); err != nil {
			return deleted, fmt.Errorf("scan db%d: %w", db, err)
		}
	}
	if left > 0 {
		return deleted, fmt.Errorf("%d %s key(s) appeared while the cutover deleted them, though %s is gone: another ACL user "+
			"writes them (see CLIENT LIST); stop it and run the cutover again", left, store.StubKeyPattern, rds.LegacyStubUser)
	}
	return deleted, nil
}

// cmdRedisVerify proves the cutover and the TTL rules on a live instance:
// no han:stub:* key in any database, no legacy_stub ACL user, DB2 empty,
// and every han:api/rt/coord/settings key carries a TTL. Each check prints
// ok or FAIL; any failure makes the command fail.
func cmdRedisVerify(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("redis verify", flag.ContinueOnError)
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	a, err := openAdmin(ctx, getenv)
	if err != nil {
		return err
	}
	defer a.Close()
	failed := 0
	report := func(ok bool, format string, v ...any) {
		status := "ok  "
		if !ok {
			status = "FAIL"
			failed++
		}
		fmt.Fprintf(out, "%s  %s\n", status, fmt.Sprintf(format, v...))
	}

	stubKeys := 0
	for db := 0; db < a.dbs; db++ {
		if err := a.scan(ctx, db, store.StubKeyPattern, func(keys []string) error { stubKeys += len(keys); return nil }); err != nil {
			return fmt.Errorf("scan db%d: %w", db, err)
		}
	}
	report(stubKeys == 0, "no %s keys (%d found in %d database(s))", store.StubKeyPattern, stubKeys, a.dbs)

	exists, err := a.stubUserExists(ctx)
	if err != nil {
		return fmt.Errorf("ACL USERS: %w", err)
	}
	report(!exists, "no ACL user %s", rds.LegacyStubUser)

	if a.dbs > legacyDB {
		n, err := a.db(legacyDB).DBSize(ctx).Result()
		if err != nil {
			return fmt.Errorf("DBSIZE db%d: %w", legacyDB, redactErr(err))
		}
		report(n == 0, "legacy DB%d holds no keys (%d)", legacyDB, n)
	}

	var noTTL []string
	total := 0
	for db := 0; db < a.dbs; db++ {
		for _, p := range ttlPatterns {
			err := a.scan(ctx, db, p, func(keys []string) error {
				pipe := a.db(db).Pipeline()
				cmds := make([]*redis.DurationCmd, len(keys))
				for i, k := range keys {
					cmds[i] = pipe.PTTL(ctx, k)
				}
				if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
					return redactErr(err)
				}
				for i, c := range cmds {
					total++
					if c.Val() == -1 && c.Err() == nil {
						noTTL = append(noTTL, fmt.Sprintf("db%d:%s", db, keys[i]))
					}
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("scan db%d %s: %w", db, p, err)
			}
		}
	}
	shown := noTTL
	if len(shown) > 10 {
		shown = shown[:10]
	}
	report(len(noTTL) == 0, "every %s key has a TTL (%d checked, %d without)%s", strings.Join(ttlPatterns, " "), total, len(noTTL),
		listSuffix(shown))
	if failed > 0 {
		return fmt.Errorf("verify: %d check(s) failed", failed)
	}
	return nil
}

func listSuffix(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	return ": " + strings.Join(keys, " ")
}
