package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Fault kinds.
const (
	FaultRedisStop      = "redis-sigstop"   // SIGSTOP, then SIGCONT
	FaultRedisKill      = "redis-kill"      // kill -9, restart from the AOF
	FaultPGStop         = "postgres-stop"   // fast shutdown, then start
	FaultGatewayKill    = "gateway-kill"    // kill -9 of instance 1, then restart
	FaultProxyLatency   = "redis-latency"   // 150 ms each way through the proxy
	FaultProxyPartition = "redis-partition" // bytes dropped both ways, then connections cut
	FaultPubSubKill     = "pubsub-kill"     // CLIENT KILL TYPE pubsub (instant)
	FaultMaxMemory      = "redis-maxmemory" // maxmemory just above what is used
	scheduleWarmup      = 15 * time.Second  // traffic before the first fault
	scheduleTail        = 15 * time.Second  // no fault starts this close to the end
	minHold, maxHold    = 2 * time.Second, 5 * time.Second
	minGap, maxGap      = 8 * time.Second, 14 * time.Second
)

// FaultKinds lists every fault the schedule draws from.
var FaultKinds = []string{FaultRedisStop, FaultRedisKill, FaultPGStop, FaultGatewayKill,
	FaultProxyLatency, FaultProxyPartition, FaultPubSubKill, FaultMaxMemory}

// PlannedFault is one entry of the schedule: at At after the start, hold
// the fault for Hold.
type PlannedFault struct {
	Kind string
	At   time.Duration
	Hold time.Duration
}

// Schedule derives the fault schedule of a run of length d from seed: every
// kind once in a seeded order, then again, until the run is full. The same
// seed and duration give the same schedule.
func Schedule(seed uint64, d time.Duration) []PlannedFault {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out []PlannedFault
	at := scheduleWarmup
	for {
		order := append([]string(nil), FaultKinds...)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, k := range order {
			hold := minHold + time.Duration(rng.Int64N(int64(maxHold-minHold)))
			if k == FaultPubSubKill {
				hold = 0
			}
			hold = hold.Round(100 * time.Millisecond)
			if at+hold+scheduleTail > d {
				return out
			}
			out = append(out, PlannedFault{Kind: k, At: at, Hold: hold})
			at += hold + minGap + time.Duration(rng.Int64N(int64(maxGap-minGap))).Round(100*time.Millisecond)
		}
	}
}

// FaultRecord is one injected fault as the report shows it.
type FaultRecord struct {
	Kind       string         `json:"kind"`
	Start      time.Time      `json:"start"`
	End        time.Time      `json:"end"`
	DurationMs int64          `json:"durationMs"`
	Errors     map[string]int `json:"clientErrors"`
	// SendRecoveryMs: fault end → the first 201; SocketRecoveryMs: fault
	// end → the first resubscribed socket of those still down then (0:
	// every lost socket was back before the end; -1: none was lost; -2:
	// none came back). AllSocketsMs: until every lost socket was back.
	SocketsLost      int    `json:"socketsLost"`
	SendRecoveryMs   int64  `json:"sendRecoveryMs"`
	SocketRecoveryMs int64  `json:"socketRecoveryMs"`
	AllSocketsMs     int64  `json:"allSocketsMs"`
	InjectError      string `json:"injectError,omitempty"`
}

// inject applies one fault, holds it and lifts it; the record's Start and
// End are when the fault began and when it was lifted.
func (r *runner) inject(ctx context.Context, pf PlannedFault) FaultRecord {
	st := r.stack
	rec := FaultRecord{Kind: pf.Kind, Start: time.Now()}
	hold := func() { sleepCtx(ctx, pf.Hold) }
	var err error
	switch pf.Kind {
	case FaultRedisStop:
		if err = st.Redis.signal(syscall.SIGSTOP); err == nil {
			hold()
			err = st.Redis.signal(syscall.SIGCONT)
		}
	case FaultRedisKill:
		st.Redis.kill()
		hold()
		err = st.Redis.start(context.WithoutCancel(ctx), 60*time.Second)
	case FaultPGStop:
		st.PG.stop(syscall.SIGINT, 20*time.Second)
		hold()
		err = st.PG.start(context.WithoutCancel(ctx), 60*time.Second)
	case FaultGatewayKill:
		st.GW[1].kill()
		hold()
		err = st.GW[1].start(context.WithoutCancel(ctx), 60*time.Second)
	case FaultProxyLatency:
		st.Proxy.SetLatency(150 * time.Millisecond)
		hold()
		st.Proxy.SetLatency(0)
	case FaultProxyPartition:
		st.Proxy.Blackhole(true)
		hold()
		st.Proxy.Blackhole(false)
		// Connections whose bytes were swallowed are out of step: cut
		// them, as a partition that heals with resets does.
		st.Proxy.Cut()
	case FaultPubSubKill:
		c := st.AdminRedis(1)
		err = c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err()
		c.Close()
	case FaultMaxMemory:
		err = r.memoryPressure(ctx, hold)
	}
	rec.End = time.Now()
	rec.DurationMs = rec.End.Sub(rec.Start).Milliseconds()
	if err != nil {
		rec.InjectError = err.Error()
	}
	return rec
}

// memoryPressure sets maxmemory a little below what Redis uses, holds,
// and lifts the limit.
func (r *runner) memoryPressure(ctx context.Context, hold func()) error {
	c := r.stack.AdminRedis(0)
	defer c.Close()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return err
	}
	var used int64
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if used == 0 {
		return fmt.Errorf("maxmemory: used_memory not found")
	}
	// Below what is used: Redis must evict (volatile-lru: only keys with a
	// TTL) on every write, and refuses writes it cannot make room for.
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(max(used-128<<10, 1<<20), 10)).Err(); err != nil {
		return err
	}
	hold()
	return c.ConfigSet(context.WithoutCancel(ctx), "maxmemory", "0").Err()
}

// recovery fills the record's recovery times and error counts from the
// timeline; until bounds the search (the next fault's start or the end).
func (tl *timeline) recovery(rec *FaultRecord, until time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	end := rec.End
	rec.SendRecoveryMs = -1
	i := sort.Search(len(tl.sendsOK), func(i int) bool { return !tl.sendsOK[i].Before(end) })
	if i < len(tl.sendsOK) && tl.sendsOK[i].Before(until) {
		rec.SendRecoveryMs = tl.sendsOK[i].Sub(end).Milliseconds()
	}
	rec.SocketRecoveryMs, rec.AllSocketsMs = -1, -1
	downAtEnd := 0
	var first, last time.Time
	for _, o := range tl.outages {
		if !o.down.Before(rec.Start) && !o.down.After(end.Add(time.Second)) {
			rec.SocketsLost++
		}
		// The sockets still down when the fault was lifted.
		if o.down.After(end) || (!o.up.IsZero() && !o.up.After(end)) {
			continue
		}
		downAtEnd++
		if o.up.IsZero() || !o.up.Before(until) {
			last = until
			continue
		}
		if first.IsZero() || o.up.Before(first) {
			first = o.up
		}
		if o.up.After(last) {
			last = o.up
		}
	}
	switch {
	case downAtEnd > 0 && first.IsZero():
		rec.SocketRecoveryMs, rec.AllSocketsMs = -2, last.Sub(end).Milliseconds()
	case downAtEnd > 0:
		rec.SocketRecoveryMs, rec.AllSocketsMs = first.Sub(end).Milliseconds(), last.Sub(end).Milliseconds()
	case rec.SocketsLost > 0:
		// Every lost socket was back (on the other instance) before the
		// fault was lifted.
		rec.SocketRecoveryMs, rec.AllSocketsMs = 0, 0
	}
	rec.Errors = map[string]int{}
	to := end.Add(time.Duration(max(rec.SendRecoveryMs, rec.SocketRecoveryMs, 1000)) * time.Millisecond)
	for _, e := range tl.errs {
		if !e.at.Before(rec.Start) && e.at.Before(to) {
			rec.Errors[e.code]++
		}
	}
}
