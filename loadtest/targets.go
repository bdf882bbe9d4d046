package loadtest

import (
	"errors"
	"strings"
)

// MetricTargetTag is the tag that splits ws_sessions, http_reqs and errors
// per target when a run spreads over several gateways
// (ws_sessions{target=http://127.0.0.1:8081}).
const MetricTargetTag = "target"

// SplitTargets splits a target list: base URLs separated by commas, as
// -target takes them ("http://127.0.0.1:8080,http://127.0.0.1:8081").
// Blanks around each entry are dropped; an empty entry is an error. A
// single target comes back as a one-element list.
func SplitTargets(list string) ([]string, error) {
	parts := strings.Split(list, ",")
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, errors.New("loadtest: empty entry in the target list")
		}
		out = append(out, p)
	}
	return out, nil
}

// targetLabel is the per-target tag value of a ws://, wss://, http:// or
// https:// URL: its http(s) base.
func targetLabel(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	if host, _, _ := strings.Cut(rest, "/"); host != "" {
		rest = host
	}
	switch scheme {
	case "ws":
		scheme = "http"
	case "wss":
		scheme = "https"
	}
	return scheme + "://" + rest
}
