package restapi_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The cost of refusing or accepting a publish grows with its body like the
// raw-body checks every route runs do, whatever the payload holds. Each
// test compares a publish with a baseline request of the same size
// measured in the same test, so the bounds are ratios, not wall-clock
// limits, and each only against a blow-up (work or memory that grows
// faster than the body: seconds where the baseline takes milliseconds),
// with room for a machine whose cores other processes share and for what
// the process's other goroutines allocate meanwhile.

// cost sends one request and returns the answer with the wall time it took
// and the bytes the process allocated meanwhile (the server runs in this
// process; the client side of one request allocates a few KiB).
func (h *prjHarness) cost(tok, method, path, body string) (code int, b []byte, took time.Duration, alloc uint64) {
	h.t.Helper()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	start := time.Now()
	code, b = h.do(tok, method, path, body)
	took = time.Since(start)
	runtime.ReadMemStats(&ms)
	return code, b, took, ms.TotalAlloc - before
}

// manyMembers returns an object of about n bytes of distinct short members
// {"x":0,"k0":0,"k1":0,…}: the densest way to fill a body with members.
func manyMembers(n int) string {
	var b strings.Builder
	b.WriteString(`{"x":0`)
	for i := 0; b.Len() < n-1; i++ {
		b.WriteString(`,"k`)
		b.WriteString(strconv.FormatInt(int64(i), 36))
		b.WriteString(`":0`)
	}
	b.WriteString(`}`)
	return b.String()
}

// A payload holding one 2,000,000-digit number is decided as fast as one
// holding a 2,000,000-byte string: a long spelling of a value a double holds
// (1.000…0) is published as that value, and a number with more significant
// digits than any double has is refused with 400 invalid_payload, both
// without arbitrary-precision arithmetic over the token.
func TestPublishLongNumberTokenCostsAsMuchAsAString(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "numbers")
	const n = 2_000_000
	publish := func(event, payload string) (int, []byte, time.Duration, uint64) {
		t.Helper()
		body := `{"producerId":"p","clientEventId":"` + event + `","payload":` + payload + `}`
		return h.cost(p.write, "POST", p.path("/topics/"+top.ID+"/messages"), body)
	}
	var baseline time.Duration
	var baseAlloc uint64
	for i := range 2 {
		code, b, took, alloc := publish("string-"+strconv.Itoa(i), `{"a":"`+strings.Repeat("x", n)+`"}`)
		wantError(t, code, b, 400, "message_too_large")
		if i == 0 || took < baseline {
			baseline = took
		}
		if i == 0 || alloc < baseAlloc {
			baseAlloc = alloc
		}
	}
	for _, c := range []struct {
		name, payload string
		status        int
		want          string
	}{
		{"value one", `{"a":1.` + strings.Repeat("0", n) + `}`, 201, `"payload":{"a":1}`},
		{"too many digits", `{"a":1.` + strings.Repeat("7", n) + `}`, 400, `{"error":"invalid_payload"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer h.as(t)()
			code, b, took, alloc := publish(c.name, c.payload)
			if code != c.status || !strings.Contains(string(b), c.want) {
				t.Errorf("got %d %.200s, want %d with %s", code, b, c.status, c.want)
			}
			t.Logf("%v, %d KiB; a string of the same size %v, %d KiB", took, alloc>>10, baseline, baseAlloc>>10)
			// A copy or two of the token is fine; what grows with the
			// number's digits beyond that (big-number arithmetic) is not.
			// The process's other goroutines allocate meanwhile too, so
			// the bound is the baseline plus a multiple of the body.
			if limit := baseAlloc + 8*n; alloc > limit {
				t.Errorf("allocated %d KiB, a string payload of the same size %d KiB (limit %d KiB)", alloc>>10, baseAlloc>>10, limit>>10)
			}
			if limit := 20*baseline + time.Second; took > limit {
				t.Errorf("took %v, a string payload of the same size %v (limit %v)", took, baseline, limit)
			}
		})
	}
}

// A payload of ~1.9 million members (a 16 MiB body) can only be refused
// with 400 message_too_large (its normalized form is far above 16 KiB).
// The refusal costs about what the raw-body checks of the same bytes cost
// (measured as the same members ignored in a cache PUT): the length of the
// normalized form is measured before the payload is decoded or sorted.
func TestPublishOversizedPayloadIsRefusedWithoutDecoding(t *testing.T) {
	h := newPrjHarness(t)
	p := h.project()
	top := h.qTopic(p, "big")
	members := manyMembers(16<<20 - 200)

	code, b, baseTook, baseAlloc := h.cost(p.write, "PUT", p.path("/cache"),
		`{"key":"k","type":"string","value":"v","ignored":`+members+`}`)
	if code != 201 {
		t.Fatalf("cache PUT with ignored members: %d %s", code, b)
	}
	code, b, took, alloc := h.cost(p.write, "POST", p.path("/topics/"+top.ID+"/messages"),
		`{"producerId":"p","clientEventId":"e","payload":`+members+`}`)
	wantError(t, code, b, 400, "message_too_large")
	t.Logf("publish %v, %d MiB; cache PUT of the same members %v, %d MiB", took, alloc>>20, baseTook, baseAlloc>>20)
	if alloc > baseAlloc*3/2 {
		t.Errorf("refusing the publish allocated %d MiB, the raw-body checks of the same members %d MiB", alloc>>20, baseAlloc>>20)
	}
	if limit := 20*baseTook + time.Second; took > limit {
		t.Errorf("refusing the publish took %v, the raw-body checks of the same members %v (limit %v)", took, baseTook, limit)
	}
}
