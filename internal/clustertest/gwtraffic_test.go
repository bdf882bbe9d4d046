package clustertest_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/internal/ids"
)

// traffic sends messages to every dialog of a layout, one sender loop per
// dialog, each send through the instances in turn, as a client does: a
// fresh Idempotency-Key per message, and a refused or unanswered send
// retried with the same key (on the next instance) until it is accepted.
type traffic struct {
	t    *testing.T
	gws  []*gw
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex // guards the fields below
	accepted map[string][]accepted
	refused  map[string]int // answers other than 201 by status and code
	failures []string
}

// accepted is a send answered 201: its key (also its body), the seq and
// id the answer named, and when the attempt that got the 201 began.
type accepted struct {
	key   string
	seq   int64
	id    string
	began time.Time
}

// sendPace is the time between two sends of one loop: 2 per second per
// sender stays under the default per-user limit of the send route.
const sendPace = 500 * time.Millisecond

// sendRetryWithin bounds how long one send may be retried before the test
// fails it: the service must accept it again within that time.
const sendRetryWithin = 30 * time.Second

func startTraffic(t *testing.T, gws []*gw, ds []*gwDialog) *traffic {
	tr := &traffic{t: t, gws: gws, stop: make(chan struct{}), accepted: map[string][]accepted{}, refused: map[string]int{}}
	for n, d := range ds {
		tr.wg.Go(func() { tr.loop(n, d) })
	}
	t.Cleanup(func() {
		tr.halt()
		if t.Failed() {
			t.Logf("send refusals: %s", tr.refusals())
		}
	})
	return tr
}

// halt stops the loops after the send each has in progress; idempotent.
func (tr *traffic) halt() {
	select {
	case <-tr.stop:
	default:
		close(tr.stop)
	}
	tr.wg.Wait()
}

func (tr *traffic) loop(n int, d *gwDialog) {
	next := n // the instance of the next attempt
	for i := 0; ; i++ {
		select {
		case <-tr.stop:
			return
		default:
		}
		key := fmt.Sprintf("clgw-%d-%d-%s", n, i, ids.New()[:8])
		a, ok := tr.sendOnce(d, key, &next)
		tr.mu.Lock()
		if ok {
			tr.accepted[d.id] = append(tr.accepted[d.id], a)
		} else {
			tr.failures = append(tr.failures, fmt.Sprintf("dialog %s: send %s not accepted within %v", d.id, key, sendRetryWithin))
		}
		tr.mu.Unlock()
		if !ok {
			return
		}
		select {
		case <-tr.stop:
			return
		case <-time.After(sendPace):
		}
	}
}

// sendOnce sends one message until an instance answers 201.
func (tr *traffic) sendOnce(d *gwDialog, key string, next *int) (accepted, bool) {
	hdr := map[string]string{"Idempotency-Key": key}
	deadline := time.Now().Add(sendRetryWithin)
	for time.Now().Before(deadline) {
		g := tr.gws[*next%len(tr.gws)]
		*next++
		began := time.Now()
		code, body, h, err := apiCall("POST", g.url()+"/v1/dialogs/"+d.id+"/messages", d.senderTok, `{"body":"`+key+`"}`, hdr)
		if err == nil && code == 201 {
			var m struct {
				ID  string `json:"id"`
				Seq int64  `json:"seq"`
			}
			if json.Unmarshal([]byte(body), &m) != nil || m.Seq <= 0 {
				tr.fail("dialog %s: undecodable 201 %q", d.id, body)
				return accepted{}, false
			}
			return accepted{key: key, seq: m.Seq, id: m.ID, began: began}, true
		}
		wait := 100 * time.Millisecond
		tr.mu.Lock()
		switch {
		case err != nil:
			tr.refused["transport"]++
		default:
			tr.refused[strconv.Itoa(code)+" "+body]++
		}
		tr.mu.Unlock()
		switch {
		case err != nil, code == 503, code == 409 && strings.Contains(body, "idempotency_in_progress"):
		case code == 429:
			if s, perr := strconv.Atoi(h.Get("Retry-After")); perr == nil {
				wait = time.Duration(s) * time.Second
			}
		default:
			// Anything else is not a refusal a client retries.
			tr.fail("dialog %s: send %s answered %d %s", d.id, key, code, body)
			return accepted{}, false
		}
		time.Sleep(wait)
	}
	return accepted{}, false
}

func (tr *traffic) fail(format string, args ...any) {
	tr.mu.Lock()
	tr.failures = append(tr.failures, fmt.Sprintf(format, args...))
	tr.mu.Unlock()
}

// since returns the seqs of d's sends whose accepted attempt began at or
// after t.
func (tr *traffic) since(d *gwDialog, t time.Time) []int64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []int64
	for _, a := range tr.accepted[d.id] {
		if !a.began.Before(t) {
			out = append(out, a.seq)
		}
	}
	return out
}

// waitSends waits until every dialog of ds has at least n sends accepted
// that began at or after t.
func (tr *traffic) waitSends(ds []*gwDialog, n int, t time.Time, within time.Duration) {
	tr.t.Helper()
	deadline := time.Now().Add(within)
	for _, d := range ds {
		for len(tr.since(d, t)) < n {
			tr.mu.Lock()
			failures := slices.Clone(tr.failures)
			tr.mu.Unlock()
			if len(failures) > 0 {
				tr.t.Fatalf("traffic failed: %v", failures)
			}
			if time.Now().After(deadline) {
				tr.t.Fatalf("dialog on %s: %d sends accepted since %s, want %d within %v (refusals: %v)",
					d.master.Addr(), len(tr.since(d, t)), t.Format(time.StampMilli), n, within, tr.refusals())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// refusals is the refusals seen so far, for reports.
func (tr *traffic) refusals() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	keys := make([]string, 0, len(tr.refused))
	for k := range tr.refused {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "[%s ×%d] ", k, tr.refused[k])
	}
	return b.String()
}

// checkStored stops the traffic and checks PostgreSQL: every dialog's seqs
// are exactly 1..n, and every accepted send is there exactly once, with
// the seq and id its 201 named; no other message is.
func (tr *traffic) checkStored(ds []*gwDialog) {
	tr.t.Helper()
	tr.halt()
	t := tr.t
	if len(tr.failures) > 0 {
		t.Fatalf("traffic failed: %v", tr.failures)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, env.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	total := 0
	for _, d := range ds {
		rows, err := conn.Query(ctx, `SELECT seq, id::text, body FROM messages WHERE dialog_id = $1 ORDER BY seq`, d.id)
		if err != nil {
			t.Fatal(err)
		}
		type row struct {
			seq  int64
			id   string
			body string
		}
		stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.seq, &x.id, &x.body)
		})
		if err != nil {
			t.Fatal(err)
		}
		byBody := map[string][]row{}
		for i, r := range stored {
			if r.seq != int64(i+1) {
				t.Fatalf("dialog on %s: stored seqs are not 1..%d: position %d holds seq %d", d.master.Addr(), len(stored), i+1, r.seq)
			}
			byBody[r.body] = append(byBody[r.body], r)
		}
		acc := tr.accepted[d.id]
		if len(stored) != len(acc) {
			t.Errorf("dialog on %s: %d messages stored, %d sends accepted", d.master.Addr(), len(stored), len(acc))
		}
		for _, a := range acc {
			got := byBody[a.key]
			switch {
			case len(got) != 1:
				t.Errorf("dialog on %s: accepted send %s stored %d times, want once", d.master.Addr(), a.key, len(got))
			case got[0].seq != a.seq || got[0].id != a.id:
				t.Errorf("dialog on %s: send %s stored as seq %d id %s, its 201 said seq %d id %s",
					d.master.Addr(), a.key, got[0].seq, got[0].id, a.seq, a.id)
			}
		}
		total += len(acc)
	}
	t.Logf("%d sends accepted; refusals on the way: %s", total, tr.refusals())
}

// allSeqs returns the seqs of every accepted send to d.
func (tr *traffic) allSeqs(d *gwDialog) []int64 { return tr.since(d, time.Time{}) }
