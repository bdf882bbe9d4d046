package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
	"github.com/han-app/gateway/loadtest"
	"github.com/han-app/gateway/store"
)

// Config is one soak run.
type Config struct {
	BinDir, Dir  string
	Duration     time.Duration // traffic and faults; the drain and checks follow
	Seed         uint64
	Users        int           // each with one WebSocket client
	Dialogs      int           // each user is a member of two
	Senders      int           // chat sender loops
	SendEvery    time.Duration // per sender
	PublishEvery time.Duration // project-queue producer
	RetryFor     time.Duration // how long a send or publish is retried
	Recovery     time.Duration // bound on every fault's recovery
	LivenessTTL  time.Duration // HAN_INSTANCE_LIVENESS_TTL of the gateways
	Reg          *loadtest.Registry
	Src          *loadtest.SourceAddrs
	Logf         func(format string, args ...any)
}

// runner is one soak in progress.
type runner struct {
	cfg     Config
	stack   *Stack
	api     [2]*loadtest.API
	ledger  ledger
	tl      timeline
	checker *Checker

	vmu        sync.Mutex
	violations map[string]Violation // invariant + detail → first occurrence
}

func (r *runner) apiFor(addr string) *loadtest.API {
	if addr == r.stack.GWAddr[1] {
		return r.api[1]
	}
	return r.api[0]
}

func (r *runner) violate(vs ...Violation) {
	r.vmu.Lock()
	defer r.vmu.Unlock()
	for _, v := range vs {
		k := v.Invariant + "\x00" + v.Detail
		if _, ok := r.violations[k]; !ok {
			r.violations[k] = v
			r.cfg.Logf("soak: VIOLATION %s: %s", v.Invariant, v.Detail)
		}
	}
}

// Run starts the stack, drives the soak and returns its report. An error
// means the soak could not run; broken invariants are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	// The checker's and injector's own connections fail during Redis faults
	// by design; go-redis would print every failed dial.
	redis.SetLogger(quietRedisLogger{})
	stack, err := StartStack(ctx, StackConfig{BinDir: cfg.BinDir, Dir: cfg.Dir, LivenessTTL: cfg.LivenessTTL})
	if err != nil {
		return nil, fmt.Errorf("soak: start the stack: %w", err)
	}
	defer stack.Close()
	r := &runner{cfg: cfg, stack: stack, violations: map[string]Violation{}}
	for i := range r.api {
		api, err := loadtest.NewAPI("http://"+stack.GWAddr[i], loadtest.NewHTTPClient(cfg.Src, 64, 10*time.Second), cfg.Reg)
		if err != nil {
			return nil, err
		}
		defer api.Close()
		r.api[i] = api
	}
	pool, err := pgxpool.New(ctx, stack.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	r0, r1 := stack.AdminRedis(0), stack.AdminRedis(1)
	defer r0.Close()
	defer r1.Close()
	r.checker = &Checker{DB: pool, Redis0: r0, Redis1: r1, Env: "dev"}
	return r.run(ctx)
}

func (r *runner) run(ctx context.Context) (*Report, error) {
	cfg := r.cfg
	users, err := loadtest.MintUsers([]byte(r.stack.DevSecret), cfg.Users, cfg.Duration+time.Hour)
	if err != nil {
		return nil, err
	}
	for _, u := range users {
		if err := r.api[0].Me(ctx, u); err != nil {
			return nil, fmt.Errorf("soak: create user: %w", err)
		}
	}
	dialogIDs := make([]string, cfg.Dialogs)
	members := map[string][]string{}
	memberIdx := make([][]int, cfg.Dialogs)
	for u := range users {
		for _, d := range []int{u % cfg.Dialogs, (u + 1) % cfg.Dialogs} {
			memberIdx[d] = append(memberIdx[d], u)
		}
	}
	for d := range dialogIDs {
		var others []string
		for _, u := range memberIdx[d][1:] {
			others = append(others, users[u].ID)
		}
		dl, err := r.api[0].CreateDialog(ctx, users[memberIdx[d][0]], others)
		if err != nil {
			return nil, fmt.Errorf("soak: create dialog: %w", err)
		}
		dialogIDs[d] = dl.ID
		for _, u := range memberIdx[d] {
			members[dl.ID] = append(members[dl.ID], users[u].ID)
		}
	}
	project := ids.New()
	if err := store.New(r.checker.DB).CreateProject(ctx, project, "soak", []store.ProjectMember{
		{UserID: users[0].ID, Role: store.RoleWrite}, {UserID: users[1].ID, Role: store.RoleWrite}}); err != nil {
		return nil, fmt.Errorf("soak: create project: %w", err)
	}
	r.checker.ProjectID = project
	q := &queue{r: r, producer: users[0], consumer: users[1], root: "/projects/" + project + "/redis", published: map[string]*pubState{}}
	if err := q.setup(ctx); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}

	// Clients connect first and stay until the end.
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	var lwg sync.WaitGroup
	listeners := make([]*listener, len(users))
	for u := range users {
		var mine []string
		for _, d := range []int{u % cfg.Dialogs, (u + 1) % cfg.Dialogs} {
			mine = append(mine, dialogIDs[d])
		}
		l := newListener(r, users[u], u%2, mine)
		listeners[u] = l
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(1000+u)))
		lwg.Go(func() { l.run(lctx, rng) })
	}
	cfg.Logf("soak: stack up (gateways %s, %s); %d users, %d dialogs, project queue; seed %d, %s",
		r.stack.GWAddr[0], r.stack.GWAddr[1], cfg.Users, cfg.Dialogs, cfg.Seed, cfg.Duration)

	start := time.Now()
	cfg.Reg.ResetClock()
	tctx, tcancel := context.WithTimeout(ctx, cfg.Duration)
	defer tcancel()
	var twg sync.WaitGroup // senders and the producer
	for i := range cfg.Senders {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
		twg.Go(func() {
			tick := time.NewTicker(cfg.SendEvery)
			defer tick.Stop()
			for {
				select {
				case <-tctx.Done():
					return
				case <-tick.C:
				}
				d := rng.IntN(cfg.Dialogs)
				u := memberIdx[d][rng.IntN(len(memberIdx[d]))]
				r.send(ctx, rng, users[u], dialogIDs[d])
			}
		})
	}
	twg.Go(func() {
		rng := rand.New(rand.NewPCG(cfg.Seed, 500))
		tick := time.NewTicker(cfg.PublishEvery)
		defer tick.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-tick.C:
			}
			q.publish(ctx, rng)
		}
	})
	cctx, ccancel := context.WithCancel(ctx) // consumers, trimmer, monitors
	defer ccancel()
	var cwg sync.WaitGroup
	for i := range 2 {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(600+i)))
		cwg.Go(func() { q.consume(cctx, rng, i) })
	}
	cwg.Go(func() {
		for sleepCtx(cctx, 5*time.Second) {
			q.trim(cctx, 0)
		}
	})
	cwg.Go(func() { r.monitor(cctx, dialogIDs) })
	res := &resources{}
	cwg.Go(func() { res.sample(cctx, r.stack) })

	// Faults on the seeded schedule.
	plan := Schedule(cfg.Seed, cfg.Duration)
	var faults []FaultRecord
	for _, pf := range plan {
		if !sleepCtx(tctx, time.Until(start.Add(pf.At))) {
			break
		}
		cfg.Logf("soak: [%s] fault %s for %s", time.Since(start).Round(time.Second), pf.Kind, pf.Hold)
		rec := r.inject(ctx, pf)
		if rec.InjectError != "" {
			cfg.Logf("soak: fault %s: %s", pf.Kind, rec.InjectError)
		}
		faults = append(faults, rec)
	}
	<-tctx.Done()
	twg.Wait()
	cfg.Logf("soak: [%s] traffic stopped; draining the queue", time.Since(start).Round(time.Second))

	// Drain: an ack lost in a fault leaves its lease to expire (60 s) before
	// the message is claimed again.
	for deadline := time.Now().Add(90 * time.Second); len(q.unacked()) > 0 && time.Now().Before(deadline); {
		if !sleepCtx(ctx, 500*time.Millisecond) {
			break
		}
	}
	for i := 0; i < 30 && ctx.Err() == nil; i++ {
		if q.trim(ctx, i%2) {
			break
		}
		sleepCtx(ctx, time.Second)
	}
	ccancel()
	cwg.Wait()
	// Let the last publishes and the outbox relay reach the clients.
	sleepCtx(ctx, 3*time.Second)
	lcancel()
	lwg.Wait()
	end := time.Now()
	cfg.Reg.StopClock()
	cctx2, cancel2 := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel2()
	for _, l := range listeners {
		l.finalReconcile(cctx2)
	}
	rep := r.finalCheck(cctx2, q, dialogIDs, members, listeners, faults, res, start, end)
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	return rep, nil
}

// monitor checks the invariants that hold at any moment while the soak
// runs: rows per key, seqs, budget counters (every second) and TTLs. A
// check that fails because a store is down (a fault) is skipped.
func (r *runner) monitor(ctx context.Context, dialogs []string) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if vs, _, err := r.checker.Budgets(cctx); err == nil {
			r.violate(vs...)
		}
		if n%10 == 0 {
			if _, vs, err := r.checker.Messages(cctx, dialogs, r.ledger.snapshot()); err == nil {
				r.violate(vs...)
			}
		}
		if n%15 == 0 {
			if vs, err := r.checker.TTLs(cctx); err == nil {
				r.violate(vs...)
			}
		}
		cancel()
	}
}

func (r *runner) finalCheck(ctx context.Context, q *queue, dialogs []string, members map[string][]string, listeners []*listener,
	faults []FaultRecord, res *resources, start, end time.Time) *Report {
	cfg := r.cfg
	sends := r.ledger.snapshot()
	if rows, vs, err := r.checker.Messages(ctx, dialogs, sends); err != nil {
		r.violate(Violation{"check_failed", "messages: " + err.Error(), time.Now()})
	} else {
		r.violate(vs...)
		views := make([]ClientView, len(listeners))
		for i, l := range listeners {
			views[i] = l.clientView()
		}
		r.violate(CheckClients(rows, members, views)...)
	}
	r.tl.mu.Lock()
	r.violate(r.tl.conflict...)
	r.tl.mu.Unlock()
	// Redis acknowledges a write before its AOF fsync (appendfsync
	// everysec, as deployed): a kill -9 may take the last second or two of
	// acknowledged writes with it (docs/runbook-redis.md). Queue messages
	// published, and acks made, in that window before a kill are counted
	// apart; every other loss or redelivery is a violation.
	var kills []time.Time
	for _, f := range faults {
		if f.Kind == FaultRedisKill {
			kills = append(kills, f.Start)
		}
	}
	inAOFWindow := func(t time.Time) bool {
		for _, k := range kills {
			if !t.IsZero() && !t.After(k) && k.Sub(t) <= aofWindow {
				return true
			}
		}
		return false
	}
	q.mu.Lock()
	minDD, maxDD := q.confirmedDD, q.confirmedDD+q.unsureDD
	published, acks := len(q.published), q.acks
	aofLost := 0
	for _, rd := range q.redelivered {
		if inAOFWindow(rd.ackedAt) {
			aofLost++
			cfg.Logf("soak: ack of %s at %s lost with a Redis kill (AOF window)", rd.id, rd.ackedAt.Format(timeFmt))
			continue
		}
		r.violate(Violation{InvQueueRedelivered, fmt.Sprintf("message %s acknowledged at %s, claimed again at %s", rd.id,
			rd.ackedAt.Format(timeFmt), rd.seenAt.Format(timeFmt)), rd.seenAt})
	}
	q.mu.Unlock()
	for _, st := range q.unacked() {
		if inAOFWindow(st.publishedAt) {
			aofLost++
			cfg.Logf("soak: publish at %s lost with a Redis kill (AOF window)", st.publishedAt.Format(timeFmt))
			minDD -= st.dedupe
			continue
		}
		r.violate(Violation{InvQueueLost, fmt.Sprintf("a message published at %s was never claimed and acknowledged", st.publishedAt.Format(timeFmt)), end})
	}
	if vs, budget, err := r.checker.Budgets(ctx); err != nil {
		r.violate(Violation{"check_failed", "budgets: " + err.Error(), time.Now()})
	} else {
		r.violate(vs...)
		r.violate(BudgetFloor(budget, minDD, maxDD)...)
	}
	if vs, err := r.checker.TTLs(ctx); err != nil {
		r.violate(Violation{"check_failed", "ttl: " + err.Error(), time.Now()})
	} else {
		r.violate(vs...)
	}
	for i := range faults {
		until := end
		if i+1 < len(faults) {
			until = faults[i+1].Start
		}
		f := &faults[i]
		r.tl.recovery(f, until)
		if f.InjectError != "" {
			r.violate(Violation{"fault_failed", f.Kind + ": " + f.InjectError, f.Start})
		}
		switch {
		case f.SendRecoveryMs < 0:
			r.violate(Violation{InvNoRecovery, fmt.Sprintf("%s at %s: no successful send before the next fault", f.Kind, f.Start.Format(time.TimeOnly)), f.End})
		case f.SendRecoveryMs > cfg.Recovery.Milliseconds():
			r.violate(Violation{InvRecovery, fmt.Sprintf("%s: first send %d ms after the fault", f.Kind, f.SendRecoveryMs), f.End})
		}
		switch {
		case f.SocketRecoveryMs == -2:
			r.violate(Violation{InvNoRecovery, fmt.Sprintf("%s at %s: no lost socket resubscribed before the next fault", f.Kind, f.Start.Format(time.TimeOnly)), f.End})
		case f.SocketRecoveryMs > cfg.Recovery.Milliseconds():
			r.violate(Violation{InvRecovery, fmt.Sprintf("%s: first socket resubscribed %d ms after the fault", f.Kind, f.SocketRecoveryMs), f.End})
		}
		cfg.Reg.Trend(MetricRecovery).Add(time.Duration(max(f.SendRecoveryMs, f.SocketRecoveryMs, 0)) * time.Millisecond)
	}
	slopes := res.slopes(start, end)
	for _, s := range slopes {
		if s.Judged && s.PctPerMin >= 1 {
			r.violate(Violation{InvResourceGrowth, fmt.Sprintf("%s %s grows %.2f %% of its mean per minute over the last half", s.Instance, s.Metric, s.PctPerMin), end})
		}
	}
	confirmed := 0
	for _, s := range sends {
		if s.Confirmed {
			confirmed++
		}
	}
	r.tl.mu.Lock()
	rep := &Report{AOFWindowLosses: aofLost, Seed: cfg.Seed, Duration: cfg.Duration.String(), LivenessTTL: cfg.LivenessTTL.String(), Faults: faults,
		Sends: len(sends), SendsConfirmed: confirmed, QueuePublished: published, QueueAcked: acks,
		RawDuplicates: r.tl.rawDups, Reconnects: len(r.tl.outages), Resources: slopes}
	r.tl.mu.Unlock()
	r.vmu.Lock()
	for _, v := range r.violations {
		rep.Violations = append(rep.Violations, v)
	}
	r.vmu.Unlock()
	sort.Slice(rep.Violations, func(i, j int) bool { return rep.Violations[i].At.Before(rep.Violations[j].At) })
	cfg.Reg.Counter(MetricViolations).Add(int64(len(rep.Violations)))
	return rep
}

// aofWindow is how long before a Redis kill -9 an acknowledged write may
// still be unwritten: the everysec fsync, and Redis postpones the AOF write
// up to 2 s more while a slow fsync runs.
const aofWindow = 3 * time.Second

const timeFmt = "15:04:05.000"

// Metrics of the soak.
const (
	MetricViolations = "soak_violations" // counter: broken invariants
	MetricRecovery   = "soak_recovery"   // trend: per fault, the later of send and socket recovery
)

// resources samples each gateway's RSS, goroutines and open descriptors.
type resources struct {
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at       time.Time
	instance int
	pid      int
	rss      float64
	gor      float64
	fds      float64
}

func (res *resources) sample(ctx context.Context, st *Stack) {
	client := &http.Client{Timeout: 3 * time.Second}
	for sleepCtx(ctx, 5*time.Second) {
		for i, g := range st.GW {
			pid := g.Pid()
			if pid == 0 {
				continue
			}
			s := sample{at: time.Now(), instance: i, pid: pid}
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status"); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
						kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
						s.rss = kb * 1024
					}
				}
			}
			if ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd"); err == nil {
				s.fds = float64(len(ents))
			}
			resp, err := client.Get("http://" + st.GWAddr[i] + "/debug/memstats")
			if err != nil {
				continue
			}
			var ms struct {
				Goroutines int `json:"goroutines"`
			}
			err = json.NewDecoder(resp.Body).Decode(&ms)
			resp.Body.Close()
			if err != nil || s.rss == 0 {
				continue
			}
			s.gor = float64(ms.Goroutines)
			res.mu.Lock()
			res.samples = append(res.samples, s)
			res.mu.Unlock()
		}
	}
	client.CloseIdleConnections()
}

// ResourceSlope is one gateway metric's trend over the last half of a run.
type ResourceSlope struct {
	Instance  string  `json:"instance"`
	Metric    string  `json:"metric"`
	Mean      float64 `json:"mean"`
	PerMin    float64 `json:"slopePerMinute"`
	PctPerMin float64 `json:"slopePctOfMeanPerMinute"`
	Samples   int     `json:"samples"`
	// Judged is false when the window is too short to tell growth from
	// warm-up and noise (under 5 minutes) or the instance was restarted in it.
	Judged bool `json:"judged"`
}

// minJudgedWindow is the shortest last half whose slope is judged.
const minJudgedWindow = 5 * time.Minute

// slopes computes, per instance and metric, the Theil–Sen slope (the
// median of pairwise slopes, robust against the spikes a fault causes)
// over the last half of the run.
func (res *resources) slopes(start, end time.Time) []ResourceSlope {
	res.mu.Lock()
	defer res.mu.Unlock()
	mid := start.Add(end.Sub(start) / 2)
	var out []ResourceSlope
	for inst := range 2 {
		var ss []sample
		pids := map[int]bool{}
		for _, s := range res.samples {
			if s.instance == inst && !s.at.Before(mid) {
				ss = append(ss, s)
				pids[s.pid] = true
			}
		}
		if len(ss) < 3 {
			continue
		}
		for _, m := range []struct {
			name string
			get  func(sample) float64
		}{{"rss_bytes", func(s sample) float64 { return s.rss }}, {"goroutines", func(s sample) float64 { return s.gor }}, {"open_fds", func(s sample) float64 { return s.fds }}} {
			var sum float64
			var pair []float64
			for i, a := range ss {
				sum += m.get(a)
				for _, b := range ss[i+1:] {
					if dt := b.at.Sub(a.at).Minutes(); dt > 0 {
						pair = append(pair, (m.get(b)-m.get(a))/dt)
					}
				}
			}
			sort.Float64s(pair)
			mean := sum / float64(len(ss))
			rs := ResourceSlope{Instance: "gateway" + strconv.Itoa(inst), Metric: m.name, Mean: mean, Samples: len(ss),
				Judged: len(pids) == 1 && ss[len(ss)-1].at.Sub(ss[0].at) >= minJudgedWindow-10*time.Second}
			if len(pair) > 0 {
				rs.PerMin = pair[len(pair)/2]
			}
			if mean > 0 {
				rs.PctPerMin = 100 * rs.PerMin / mean
			}
			out = append(out, rs)
		}
	}
	return out
}

// Report is a soak's result (exported as JSON with the summary).
type Report struct {
	Seed           uint64        `json:"seed"`
	Duration       string        `json:"duration"`
	LivenessTTL    string        `json:"instanceLivenessTtl"`
	Faults         []FaultRecord `json:"faults"`
	Violations     []Violation   `json:"violations"`
	Sends          int           `json:"sends"`
	SendsConfirmed int           `json:"sendsConfirmed"`
	QueuePublished int           `json:"queuePublished"`
	QueueAcked     int           `json:"queueAcked"`
	RawDuplicates  int           `json:"rawDuplicateEvents"`
	// AOFWindowLosses are queue publishes and acks Redis acknowledged in
	// the last aofWindow before a kill -9 and lost with it.
	AOFWindowLosses int             `json:"aofWindowLosses"`
	Reconnects      int             `json:"socketOutages"`
	Resources       []ResourceSlope `json:"resources"`
}

// FaultTable is the per-fault table; its String is the text form.
type FaultTable []FaultRecord

func (ft FaultTable) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n      %-16s %8s %10s %5s %10s %10s  %s\n", "fault", "held", "send rec.", "lost", "sock rec.", "all socks", "client errors by code")
	ms := func(v int64) string {
		switch v {
		case -1:
			return "-"
		case -2:
			return "never"
		}
		return strconv.FormatInt(v, 10) + "ms"
	}
	for _, f := range ft {
		var codes []string
		for c, n := range f.Errors {
			codes = append(codes, fmt.Sprintf("%s×%d", c, n))
		}
		sort.Strings(codes)
		fmt.Fprintf(&b, "      %-16s %8s %10s %5d %10s %10s  %s\n", f.Kind, ms(f.DurationMs), ms(f.SendRecoveryMs), f.SocketsLost, ms(f.SocketRecoveryMs), ms(f.AllSocketsMs), strings.Join(codes, " "))
	}
	return strings.TrimRight(b.String(), "\n")
}

// ViolationList is the violations; its String is the text form.
type ViolationList []Violation

func (vl ViolationList) String() string {
	if len(vl) == 0 {
		return "0"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d", len(vl))
	for _, v := range vl {
		fmt.Fprintf(&b, "\n      %s: %s", v.Invariant, v.Detail)
	}
	return b.String()
}

type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

// ResourceTable is the resource slopes; its String is the text form.
type ResourceTable []ResourceSlope

func (rt ResourceTable) String() string {
	var b strings.Builder
	for _, s := range rt {
		judged := "not judged (window < 5 min or restarted)"
		if s.Judged {
			judged = "judged, bound < 1 %/min"
		}
		fmt.Fprintf(&b, "\n      %s %-10s mean %12.0f  slope %+10.1f/min (%+.2f %%/min, %d samples, %s)",
			s.Instance, s.Metric, s.Mean, s.PerMin, s.PctPerMin, s.Samples, judged)
	}
	return b.String()
}

// ErrViolations is returned by the scenario when any invariant broke.
var ErrViolations = errors.New("soak: invariants violated")
