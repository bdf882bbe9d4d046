package project_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/project"
	"github.com/han-app/gateway/store/rds"
)

// leaseEnv is one isolated environment (its own module budget) whose
// queues lease the module budget.
type leaseEnv struct {
	t     *testing.T
	rdb   redis.UniversalClient
	admin *redis.Client
	env   string
	mk    project.ModuleKeys
	cap   int64
}

func newLeaseEnv(t *testing.T, capBytes int64) *leaseEnv {
	t.Helper()
	rdb, err := rds.NewRedis(env.Redis.URL(0), rds.RedisConfig{PoolSize: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	admin := env.Redis.AdminClient(0)
	t.Cleanup(func() { admin.Close() })
	e := "ls" + ids.New()[24:]
	return &leaseEnv{t: t, rdb: rdb, admin: admin, env: e, mk: project.NewModuleKeys(e), cap: capBytes}
}

// queue is one instance: its own Queue and ModuleBudget values.
func (e *leaseEnv) queue(cfg project.QueueConfig) *project.Queue {
	cfg.ModuleBudgetBytes = e.cap
	if cfg.ProjectBudgetBytes == 0 {
		cfg.ProjectBudgetBytes = 1 << 30
	}
	if cfg.ModuleLeaseBytes == 0 {
		cfg.ModuleLeaseBytes = project.ModuleLeaseMaxBytes
	}
	return project.NewQueue(e.rdb, project.NewModuleBudget(e.rdb, e.env, e.cap), cfg)
}

// topic is one project with a topic and a subscription.
type leaseTopic struct {
	k        project.Keys
	pid, tid string
	sid      string
}

func (e *leaseEnv) topic(q *project.Queue) leaseTopic {
	e.t.Helper()
	ctx := context.Background()
	pid := ids.New()
	k := project.NewKeys(e.env, pid)
	top, err := q.CreateTopic(ctx, k, ids.New(), "t", "")
	if err != nil {
		e.t.Fatal(err)
	}
	sub, err := q.CreateSubscription(ctx, k, ids.New(), top.ID, "s")
	if err != nil {
		e.t.Fatal(err)
	}
	return leaseTopic{k: k, pid: pid, tid: top.ID, sid: sub.ID}
}

func publishOne(q *project.Queue, tp leaseTopic, event string) error {
	_, _, err := q.Publish(context.Background(), tp.k, tp.pid, tp.tid, project.PublishInput{ProducerID: "p", ClientEventID: event,
		Payload: []byte(`{"body":"` + strings.Repeat("x", 200) + `"}`)})
	return err
}

// module reads committed, reserved, leased and the entry counts.
func (e *leaseEnv) module() (committed, reserved, leased, resv, leases int64) {
	e.t.Helper()
	ctx := context.Background()
	v := e.admin.HMGet(ctx, e.mk.Budget(), "committed", "reserved", "leased").Val()
	n := func(x any) int64 {
		s, _ := x.(string)
		i, _ := strconv.ParseInt(s, 10, 64)
		return i
	}
	return n(v[0]), n(v[1]), n(v[2]), e.admin.HLen(ctx, e.mk.Reservations()).Val(), e.admin.HLen(ctx, e.mk.Leases()).Val()
}

// projectBytes sums the reliable bytes of the projects.
func (e *leaseEnv) projectBytes(tps ...leaseTopic) int64 {
	var sum int64
	for _, tp := range tps {
		for _, v := range e.admin.HMGet(context.Background(), tp.k.Budget(), "msg", "rcpt", "dd").Val() {
			s, _ := v.(string)
			n, _ := strconv.ParseInt(s, 10, 64)
			sum += n
		}
	}
	return sum
}

// Far from the cap publishes draw on one lease and make no module call of
// their own; when the lease runs out near the cap, no new lease is granted
// and publishes reserve exactly, so the module budget fills up to the
// byte and never past it.
func TestModuleLeaseFallsBackToExactNearTheCap(t *testing.T) {
	e := newLeaseEnv(t, 4<<20)
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	for i := range 5 {
		if err := publishOne(q, tp, fmt.Sprint("far", i)); err != nil {
			t.Fatal(err)
		}
	}
	committed, reserved, leased, resv, leases := e.module()
	if leases != 1 || leased != project.ModuleLeaseMaxBytes || resv != 0 || reserved != 0 || committed != 0 {
		t.Fatalf("far from the cap: committed %d reserved %d leased %d, %d reservations, %d leases", committed, reserved, leased, resv, leases)
	}
	// Other projects fill the module (as their settles would) to just
	// below the part no lease may take.
	other := e.cap - e.cap/project.ModuleLeaseKeepDivisor - project.ModuleLeaseMaxBytes/2
	if err := e.admin.HIncrBy(context.Background(), e.mk.Budget(), "committed", other).Err(); err != nil {
		t.Fatal(err)
	}
	var n int
	for n = 0; n < 1000; n++ {
		err := publishOne(q, tp, fmt.Sprint("near", n))
		if errors.Is(err, project.ErrBudgetExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	committed, reserved, leased, resv, leases = e.module()
	used := e.projectBytes(tp)
	need := used / int64(5+n)
	if leases != 0 || leased != 0 || reserved != 0 || resv != 0 {
		t.Fatalf("near the cap: the lease was not returned or a reservation was left: reserved %d leased %d, %d reservations, %d leases",
			reserved, leased, resv, leases)
	}
	if committed != other+used {
		t.Fatalf("committed %d, want the other projects' %d + this project's %d", committed, other, used)
	}
	if committed > e.cap || committed <= e.cap-need {
		t.Fatalf("exact reservations should fill the module to within one publish (%d bytes) of the cap %d: committed %d", need, e.cap, committed)
	}
}

// Before a lease runs out the instance takes the next one, and the lease
// it replaced is returned with the bytes its publishes kept: the module
// then holds one lease and commits exactly what the project holds beyond
// it, so a renewal neither loses nor double-counts bytes.
func TestModuleLeaseRenewedAheadReturnsTheOldOne(t *testing.T) {
	e := newLeaseEnv(t, 4<<20)
	q := e.queue(project.QueueConfig{})
	tp := e.topic(q)
	// Each publish with one subscription needs a little under 5 KiB (a
	// receipt, the message and its dedupe record), so a 64 KiB lease is
	// renewed ahead at its tenth: 15 cross one renewal.
	for i := range 15 {
		if err := publishOne(q, tp, fmt.Sprint("e", i)); err != nil {
			t.Fatal(err)
		}
	}
	committed, reserved, leased, resv, leases := e.module()
	used := e.projectBytes(tp)
	if leases != 1 || leased != project.ModuleLeaseMaxBytes || reserved != 0 || resv != 0 {
		t.Fatalf("after a renewal: reserved %d leased %d, %d reservations, %d leases; want one lease", reserved, leased, resv, leases)
	}
	if committed <= 0 || committed >= used || used-committed > project.ModuleLeaseMaxBytes {
		t.Fatalf("committed %d of the project's %d bytes: the replaced lease was not returned with its bytes", committed, used)
	}
}

// A lease whose instance died is never returned by it: its bytes stay
// counted (nothing is over-admitted) until it expires, then the reconcile
// drops it and the module counter is exact again.
func TestModuleLeaseOfDeadInstanceReturnedByReconcile(t *testing.T) {
	e := newLeaseEnv(t, 64<<20)
	dead := e.queue(project.QueueConfig{})
	tp := e.topic(dead)
	for i := range 3 {
		if err := publishOne(dead, tp, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	committed, _, leased, _, leases := e.module()
	used := e.projectBytes(tp)
	if leases != 1 || leased != project.ModuleLeaseMaxBytes || committed+leased < used {
		t.Fatalf("committed %d leased %d (%d leases) must cover the project's %d bytes", committed, leased, leases, used)
	}
	mb := project.NewModuleBudget(e.rdb, e.env, e.cap)
	// A live lease survives a reconcile.
	if res, err := mb.Reconcile(ctx, time.Hour); err != nil || !res.Ran || res.DroppedReservations != 0 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	if _, _, _, _, leases := e.module(); leases != 1 {
		t.Fatal("a live lease was dropped")
	}
	// The instance is gone; its lease expires (moved back in time here
	// instead of waiting for its TTL).
	ids := e.admin.HKeys(ctx, e.mk.Leases()).Val()
	e.admin.HSet(ctx, e.mk.Leases(), ids[0], fmt.Sprintf("%d:%d", project.ModuleLeaseMaxBytes, time.Now().Add(-time.Second).UnixMilli()))
	res, err := mb.Reconcile(ctx, time.Hour)
	if err != nil || !res.Ran || res.DroppedReservations != 1 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	committed, reserved, leased, resv, leases := e.module()
	if committed != used || reserved != 0 || leased != 0 || resv != 0 || leases != 0 {
		t.Fatalf("after reconcile: committed %d (projects %d) reserved %d leased %d, %d reservations, %d leases",
			committed, used, reserved, leased, resv, leases)
	}
	// Another instance publishes on with a lease of its own.
	live := e.queue(project.QueueConfig{})
	if err := publishOne(live, tp, "after"); err != nil {
		t.Fatal(err)
	}
	if _, _, leased, _, leases := e.module(); leases != 1 || leased != project.ModuleLeaseMaxBytes {
		t.Fatalf("new lease: leased %d, %d leases", leased, leases)
	}
}

// Two instances (two Queue values, each with its own ModuleBudget) publish
// concurrently for four projects until the module budget refuses: the
// projects' bytes never pass the cap, the module counter never counts less
// than they hold, and after the leases are dropped a reconcile makes it
// exact.
func TestModuleBudgetNeverExceededByTwoLeasingInstances(t *testing.T) {
	const capBytes = 1 << 20
	e := newLeaseEnv(t, capBytes)
	qs := []*project.Queue{e.queue(project.QueueConfig{}), e.queue(project.QueueConfig{})}
	var tps []leaseTopic
	for range 4 {
		tps = append(tps, e.topic(qs[0]))
	}
	ctx := context.Background()
	var stop atomic.Bool
	var maxSeen, overSeen atomic.Int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for !stop.Load() {
			committed, reserved, leased, _, _ := e.module()
			sum := e.projectBytes(tps...)
			if sum > maxSeen.Load() {
				maxSeen.Store(sum)
			}
			if committed+reserved+leased > capBytes {
				overSeen.Store(committed + reserved + leased)
			}
		}
	})
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for i, q := range qs {
		for w := range 4 {
			wg.Go(func() {
				tp := tps[(i*4+w)%len(tps)]
				for n := range 1000 {
					err := publishOne(q, tp, fmt.Sprint(i, "-", w, "-", n))
					if errors.Is(err, project.ErrBudgetExhausted) {
						return
					}
					if err != nil {
						t.Errorf("publish: %v", err)
						return
					}
					admitted.Add(1)
				}
			})
		}
	}
	wg.Wait()
	stop.Store(true)
	sampler.Wait()
	sum := e.projectBytes(tps...)
	committed, reserved, leased, _, _ := e.module()
	if sum > capBytes || maxSeen.Load() > capBytes || overSeen.Load() != 0 {
		t.Fatalf("module budget passed: projects %d, most seen %d, module total seen %d, cap %d", sum, maxSeen.Load(),
			overSeen.Load(), capBytes)
	}
	if committed+reserved+leased < sum {
		t.Fatalf("module counts %d+%d+%d, less than the projects' %d", committed, reserved, leased, sum)
	}
	if sum < capBytes-capBytes/project.ModuleLeaseKeepDivisor {
		t.Fatalf("the budget was not used: %d of %d", sum, capBytes)
	}
	// The instances stop; their leases expire and the reconcile drops them.
	for _, id := range e.admin.HKeys(ctx, e.mk.Leases()).Val() {
		e.admin.HSet(ctx, e.mk.Leases(), id, fmt.Sprintf("%d:%d", project.ModuleLeaseMaxBytes, time.Now().Add(-time.Second).UnixMilli()))
	}
	if res, err := project.NewModuleBudget(e.rdb, e.env, capBytes).Reconcile(ctx, time.Hour); err != nil || !res.Ran {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	committed, reserved, leased, resv, leases := e.module()
	if committed != sum || reserved != 0 || leased != 0 || resv != 0 || leases != 0 {
		t.Fatalf("after reconcile: committed %d (projects %d) reserved %d leased %d, %d reservations, %d leases",
			committed, sum, reserved, leased, resv, leases)
	}
	t.Logf("%d publishes admitted, %d bytes of %d", admitted.Load(), sum, capBytes)
}

// dumpKeys serialises every key under the prefixes, so a test can prove a
// refused call wrote nothing.
func dumpKeys(t *testing.T, admin *redis.Client, prefixes ...string) string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	for _, p := range prefixes {
		keys = append(keys, admin.Keys(ctx, strings.NewReplacer("{", `\{`, "}", `\}`).Replace(p)+"*").Val()...)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		if admin.Type(ctx, k).Val() == "set" {
			m := admin.SMembers(ctx, k).Val()
			slices.Sort(m)
			fmt.Fprintf(&sb, "%s=%v;", k, m)
			continue
		}
		fmt.Fprintf(&sb, "%s=%x;", k, admin.Dump(ctx, k).Val())
	}
	return sb.String()
}

// Out of memory a publish leaves Redis untouched, the module budget
// included, whether it draws on a lease it holds or would renew one; once
// memory is back it publishes again.
func TestModuleLeaseUnderOOM(t *testing.T) {
	rs, err := testenv.StartRedis(testenv.RedisOptions{MaxMemory: "64mb", EvictionPolicy: "noeviction"})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Stop()
	rdb, err := rds.NewRedis(rs.URL(0), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	admin := rs.AdminClient(0)
	defer admin.Close()
	e := &leaseEnv{t: t, rdb: rdb, admin: admin, env: "oom" + ids.New()[24:], cap: 64 << 20}
	e.mk = project.NewModuleKeys(e.env)
	q := e.queue(project.QueueConfig{})
	held, other := e.topic(q), e.topic(q)
	if err := publishOne(q, held, "warm"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(ctx, "filler", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("the server is not out of memory: %v", err)
	}
	before := dumpKeys(t, admin, "han:prj:")
	// other's first publish on this instance renews the lease.
	for _, tp := range []leaseTopic{held, other} {
		if err := publishOne(q, tp, "oom"); !errors.Is(err, rds.ErrRedisOOM) {
			t.Fatalf("publish under OOM: %v", err)
		}
	}
	if dumpKeys(t, admin, "han:prj:") != before {
		t.Fatal("a publish refused under OOM wrote to Redis")
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tp := range []leaseTopic{held, other} {
		if err := publishOne(q, tp, "after"); err != nil {
			t.Fatal(err)
		}
	}
}
