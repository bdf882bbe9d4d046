package settings

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/encoding/json"

	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/store"
)

// Snapshot is one settings version as shared in Redis (JSON).
type Snapshot struct {
	Version int64  `json:"version"`
	Stamp   string `json:"stamp"` // settings_head.stamp of Version

	Policies map[string]PolicyOverride  `json:"policies"` // route label → override
	Tunables map[string]json.RawMessage `json:"tunables"`
}

// PolicyOverride replaces the built-in policy of one route label
// ("METHOD /template" or "other").
type PolicyOverride struct {
	Algorithm string `json:"algorithm"`
	OnFailure string `json:"onFailure"` // "local" or "fail-closed"
	Rules     []Rule `json:"rules"`
}

// Rule is one family's limit.
type Rule struct {
	Family   string `json:"family"`
	Limit    int    `json:"limit"`
	WindowMs int64  `json:"windowMs"`
}

// PolicyVersion names a settings version in ratelimit.PolicySet.Version.
func PolicyVersion(v int64) string { return "settings-" + strconv.FormatInt(v, 10) }

func (s Snapshot) head() head { return head{version: s.Version, stamp: s.Stamp} }

// fromRows converts a PostgreSQL read of the state stamped stamp into a
// snapshot, checking the JSON of every rule list strictly: field names
// exactly as written (family, limit, windowMs: "Limit" is no field), unknown
// fields refused.
func fromRows(r store.SettingsRows, stamp string) (Snapshot, error) {
	s := Snapshot{Version: r.Version, Stamp: stamp, Policies: map[string]PolicyOverride{}, Tunables: map[string]json.RawMessage{}}
	for _, p := range r.Policies {
		var rules []Rule
		rest, err := json.Parse(p.Rules, &rules, json.DisallowUnknownFields|json.DontMatchCaseInsensitiveStructFields)
		if err != nil || len(bytes.TrimSpace(rest)) > 0 {
			return Snapshot{}, fmt.Errorf("settings: route %q: rules must be an array of {family, limit, windowMs}", p.Route)
		}
		s.Policies[p.Route] = PolicyOverride{Algorithm: p.Algorithm, OnFailure: p.OnFailure, Rules: rules}
	}
	for name, v := range r.Tunables {
		s.Tunables[name] = json.RawMessage(v)
	}
	return s, nil
}

// PolicySet builds the rate-limit policies of the snapshot: base with every
// override applied (a route without a row keeps its built-in policy). It
// fails when an override is invalid (ratelimit.NewPolicySet's rules).
func (s Snapshot) PolicySet(base *ratelimit.PolicySet) (*ratelimit.PolicySet, error) {
	routes := map[string]ratelimit.Policy{}
	for _, label := range base.Labels() {
		method, template, _ := strings.Cut(label, " ")
		_, p := base.Lookup(method, template)
		routes[label] = p
	}
	_, other := base.Lookup("", "")
	for label, o := range s.Policies {
		p, err := o.policy()
		if err != nil {
			return nil, fmt.Errorf("settings: route %q: %w", label, err)
		}
		if label == ratelimit.OtherRoute {
			other = p
		} else {
			routes[label] = p
		}
	}
	return ratelimit.NewPolicySet(PolicyVersion(s.Version), routes, other)
}

func (o PolicyOverride) policy() (ratelimit.Policy, error) {
	p := ratelimit.Policy{Algorithm: ratelimit.Algorithm(o.Algorithm)}
	switch o.OnFailure {
	case "local":
		p.OnFailure = ratelimit.FallbackLocal
	case "fail-closed":
		p.OnFailure = ratelimit.FailClosed
	default:
		return p, errors.New("onFailure must be local or fail-closed")
	}
	for _, r := range o.Rules {
		if r.WindowMs < 1 || r.WindowMs > int64(365*24*time.Hour/time.Millisecond) {
			return p, errors.New("windowMs must be 1 ms .. 1 year")
		}
		p.Rules = append(p.Rules, ratelimit.Rule{Family: ratelimit.Family(r.Family), Limit: r.Limit,
			Window: time.Duration(r.WindowMs) * time.Millisecond})
	}
	return p, nil
}
