package ratelimit

import (
	"strconv"
	"strings"
)

// The RateLimit fields of draft-ietf-httpapi-ratelimit-headers revision 11:
// Structured Field lists with one item per family, named by a String:
//
//	RateLimit-Policy: "user";q=30;w=10, "dialog";q=60;w=10
//	RateLimit: "user";r=29;t=10, "dialog";r=59;t=10
//
// q is the quota, w the window in seconds (rounded up), r the remaining
// quota and t the seconds until that family's quota resets (rounded up).

// PolicyField is the RateLimit-Policy value of d ("" when no family applied).
func PolicyField(d Decision) string {
	var b strings.Builder
	for i, f := range d.Families {
		if i > 0 {
			b.WriteString(", ")
		}
		w := ceilSeconds(f.Rule.Window.Milliseconds())
		b.WriteString(`"` + string(f.Rule.Family) + `";q=` + strconv.Itoa(f.Rule.Limit) + ";w=" + strconv.FormatInt(w, 10))
	}
	return b.String()
}

// StateField is the RateLimit value of d ("" when no family applied).
func StateField(d Decision) string {
	var b strings.Builder
	for i, f := range d.Families {
		if i > 0 {
			b.WriteString(", ")
		}
		r := f.Remaining
		if r < 0 {
			r = 0
		}
		b.WriteString(`"` + string(f.Rule.Family) + `";r=` + strconv.FormatInt(r, 10) + ";t=" + strconv.FormatInt(ceilSeconds(f.ResetAtMs-d.NowMs), 10))
	}
	return b.String()
}
