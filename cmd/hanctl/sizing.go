package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/store/rds"
)

// sizingInputs are the terms of the Redis memory sizing formula
// (docs/runbook-redis.md):
//
//	DB0 rate = peak identities × routes × active windows × bytes/key
//	DB0 idem = mutating requests/24h × avg sanitized record
//	DB1      = peak connections × connection metadata + Pub/Sub buffers
//	total × 1.5 allocator/fragmentation × 1.3 growth reserve
type sizingInputs struct {
	Identities      float64
	Routes          float64
	Windows         float64
	RateKeyBytes    float64
	MutationsPerDay float64
	IdemRecordBytes float64
	Connections     float64
	ConnBytes       float64
	PubSubBuffers   float64
	Fragmentation   float64
	Growth          float64
}

type sizingResult struct {
	Rate, Idem, Realtime, Raw, Total float64
}

func (in sizingInputs) estimate() sizingResult {
	var r sizingResult
	r.Rate = in.Identities * in.Routes * in.Windows * in.RateKeyBytes
	r.Idem = in.MutationsPerDay * in.IdemRecordBytes
	r.Realtime = in.Connections*in.ConnBytes + in.PubSubBuffers
	r.Raw = r.Rate + r.Idem + r.Realtime
	r.Total = r.Raw * in.Fragmentation * in.Growth
	return r
}

// check refuses inputs the formula cannot use: every term a finite
// non-negative number, the factors finite and at least 1. Every comparison
// with NaN is false, so each bound is checked as !(v >= bound), which NaN
// fails.
func (in sizingInputs) check() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"identities", in.Identities}, {"routes", in.Routes}, {"windows", in.Windows},
		{"rate-key-bytes", in.RateKeyBytes}, {"mutations-per-day", in.MutationsPerDay}, {"idem-record-bytes", in.IdemRecordBytes},
		{"connections", in.Connections}, {"conn-bytes", in.ConnBytes}, {"pubsub-buffers", in.PubSubBuffers}} {
		if !(f.v >= 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("--%s must be a finite non-negative number", f.name)
		}
	}
	if !(in.Fragmentation >= 1) || !(in.Growth >= 1) || math.IsInf(in.Fragmentation, 0) || math.IsInf(in.Growth, 0) {
		return errors.New("--fragmentation and --growth must be finite numbers of at least 1")
	}
	return nil
}

// check refuses an estimate that overflowed: inputs each finite can still
// multiply past the largest float64.
func (r sizingResult) check() error {
	for _, v := range []float64{r.Rate, r.Idem, r.Realtime, r.Raw, r.Total} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return errors.New("the inputs are too large: the estimate is not a finite number of bytes")
		}
	}
	return nil
}

// sampleFamilies maps a sizing term to the key pattern whose average
// MEMORY USAGE replaces its bytes-per-key input, and the DB it lives in.
var sampleFamilies = []struct {
	term, pattern string
	realtime      bool
	// skip: keys the pattern matches that are not of the family (a
	// closed connection's small marker string beside the connections'
	// HASHes, which would pull the average down).
	skip string
}{
	{"rate", "han:api:rl:*", false, ""},
	{"idem", "han:api:idem:*", false, ""},
	{"conn", "han:rt:conn:*", true, ":closed"},
}

// sampleBytes scans at most limit keys of pattern (but those ending in
// skip, when set) and returns the average MEMORY USAGE and how many keys it
// saw.
func sampleBytes(ctx context.Context, c redis.UniversalClient, pattern, skip string, limit int) (float64, int, error) {
	var total int64
	n := 0
	var cursor uint64
	for n < limit {
		keys, next, err := c.Scan(ctx, cursor, pattern, 200).Result()
		if err != nil {
			return 0, 0, err
		}
		for _, k := range keys {
			if n >= limit {
				break
			}
			if skip != "" && strings.HasSuffix(k, skip) {
				continue
			}
			b, err := c.MemoryUsage(ctx, k).Result()
			if errors.Is(err, redis.Nil) {
				continue // expired between SCAN and MEMORY USAGE
			}
			if err != nil {
				return 0, 0, err
			}
			total += b
			n++
		}
		cursor = next
		if cursor == 0 {
			break
		}
	}
	if n == 0 {
		return 0, 0, nil
	}
	return float64(total) / float64(n), n, nil
}

// sampleRedisTimeout bounds each command of sizing --sample.
const sampleRedisTimeout = 5 * time.Second

func cmdSizing(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("sizing", flag.ContinueOnError)
	in := sizingInputs{}
	fs.Float64Var(&in.Identities, "identities", 50000, "peak rate-limited identities (users + IPs + dialogs + services)")
	fs.Float64Var(&in.Routes, "routes", 6, "limited routes per identity")
	fs.Float64Var(&in.Windows, "windows", 2, "active windows per route")
	fs.Float64Var(&in.RateKeyBytes, "rate-key-bytes", 200, "bytes per rate-limit key")
	fs.Float64Var(&in.MutationsPerDay, "mutations-per-day", 5e6, "mutating requests in 24 h (idempotency records)")
	fs.Float64Var(&in.IdemRecordBytes, "idem-record-bytes", 350, "bytes per sanitized idempotency record")
	fs.Float64Var(&in.Connections, "connections", 100000, "peak WebSocket connections")
	fs.Float64Var(&in.ConnBytes, "conn-bytes", 450, "bytes of presence metadata per connection (HASH + ZSET members)")
	fs.Float64Var(&in.PubSubBuffers, "pubsub-buffers", 64<<20, "bytes of Pub/Sub output buffers across instances")
	fs.Float64Var(&in.Fragmentation, "fragmentation", 1.5, "allocator/fragmentation factor")
	fs.Float64Var(&in.Growth, "growth", 1.3, "growth reserve factor")
	sample := fs.Bool("sample", false, "measure bytes per key on the live instances of REDIS_URL / REDIS_REALTIME_URL (SCAN + MEMORY USAGE)")
	sampleMax := fs.Int("sample-keys", 1000, "at most this many keys sampled per family")
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	if err := in.check(); err != nil {
		return err
	}
	notes := []string{}
	if *sample {
		if *sampleMax < 1 || *sampleMax > 100000 {
			return errors.New("--sample-keys must be 1..100000")
		}
		if getenv("REDIS_URL") == "" || getenv("REDIS_REALTIME_URL") == "" {
			return errors.New("--sample needs REDIS_URL and REDIS_REALTIME_URL")
		}
		c0, err := openRedis("REDIS_URL", getenv, rds.RedisConfig{ReadTimeout: sampleRedisTimeout})
		if err != nil {
			return err
		}
		defer c0.Close()
		c1, err := openRedis("REDIS_REALTIME_URL", getenv, rds.RedisConfig{ReadTimeout: sampleRedisTimeout})
		if err != nil {
			return err
		}
		defer c1.Close()
		measured := map[string]float64{}
		for _, f := range sampleFamilies {
			c, name := c0, "REDIS_URL"
			if f.realtime {
				c, name = c1, "REDIS_REALTIME_URL"
			}
			avg, n, err := sampleBytes(ctx, c, f.pattern, f.skip, *sampleMax)
			if err != nil {
				return fmt.Errorf("sample %s: %w", f.pattern, redisFailure(name, sampleRedisTimeout, err))
			}
			notes = append(notes, fmt.Sprintf("sampled %s: %d keys, %.0f bytes/key", f.pattern, n, avg))
			if n > 0 {
				measured[f.term] = avg
			}
		}
		if v, ok := measured["rate"]; ok {
			in.RateKeyBytes = v
		}
		if v, ok := measured["idem"]; ok {
			in.IdemRecordBytes = v
		}
		if v, ok := measured["conn"]; ok {
			// A connection costs its HASH plus its members in the user's
			// connection ZSET and the instance's index (≈ one ZSET member
			// each; a user key holds several connections on average).
			in.ConnBytes = v + 2*64
		}
	}
	r := in.estimate()
	if err := r.check(); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "term\tformula\tbytes\n")
	fmt.Fprintf(tw, "DB0 rate\t%.0f identities × %.0f routes × %.0f windows × %.0f B\t%s\n", in.Identities, in.Routes, in.Windows, in.RateKeyBytes, human(r.Rate))
	fmt.Fprintf(tw, "DB0 idem\t%.0f mutations/24h × %.0f B\t%s\n", in.MutationsPerDay, in.IdemRecordBytes, human(r.Idem))
	fmt.Fprintf(tw, "DB1\t%.0f connections × %.0f B + %s Pub/Sub buffers\t%s\n", in.Connections, in.ConnBytes, human(in.PubSubBuffers), human(r.Realtime))
	fmt.Fprintf(tw, "raw\t\t%s\n", human(r.Raw))
	fmt.Fprintf(tw, "maxmemory\traw × %.2f fragmentation × %.2f growth\t%s\n", in.Fragmentation, in.Growth, human(r.Total))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(notes) > 0 {
		fmt.Fprintln(out, strings.Join(notes, "\n"))
	}
	return nil
}

func human(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
