package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"
)

// Algorithm is the way a policy counts.
type Algorithm string

// The rate-limit algorithms (docs/ratelimit.md).
const (
	SlidingLog  Algorithm = "sliding" // ZSET of admission times: exact over any window
	FixedWindow Algorithm = "fixed"   // INCR counter per window starting at its first request
	TokenBucket Algorithm = "bucket"  // HASH of credit and last admission: bursts up to the limit, steady refill
)

// Family is the identity a limit is counted against.
type Family string

// The key families (docs/redis-keys.md).
const (
	FamilyUser    Family = "user"    // the user id of a user token
	FamilyIP      Family = "ip"      // HMAC of the client address
	FamilyDialog  Family = "dialog"  // the dialog a message is sent to
	FamilyService Family = "service" // the svc claim of a service token
)

// Rule is one family's limit: Limit requests per Window.
type Rule struct {
	Family Family
	Limit  int
	Window time.Duration
}

// OnFailure says what a route does when Redis cannot decide.
type OnFailure int

const (
	// FailClosed refuses the request (503 redis_unavailable / redis_oom):
	// for writes whose limit must hold (message send, attachments).
	FailClosed OnFailure = iota
	// FallbackLocal decides with the in-process conservative limiter:
	// for reads that PostgreSQL can serve (profile, history, public GETs).
	FallbackLocal
)

func (f OnFailure) String() string {
	if f == FallbackLocal {
		return "local"
	}
	return "fail-closed"
}

// Policy is the limit of one route: one algorithm for all its families (so
// they are evaluated by one script), the families, and the failure mode. A
// policy without rules does not limit.
type Policy struct {
	Algorithm Algorithm
	Rules     []Rule
	OnFailure OnFailure
}

// OtherRoute is the label of every route outside the allow-list.
const OtherRoute = "other"

// MessageSendRoute is the one route label whose policy may have a dialog
// family. The dialog key is shared by every route (it names the dialog, not
// the route), and only message send gives a non-member's admission back:
// on any other route outsiders who know a dialog's id could spend its limit
// and silence its members.
const MessageSendRoute = "POST /v1/dialogs/{id}/messages"

// PolicySet is an immutable snapshot of the policies of every route, keyed by
// route label "METHOD /template" (the mux path template of the route).
type PolicySet struct {
	// Version names the snapshot (versioned PostgreSQL settings plug in
	// through a PolicyProvider that swaps snapshots).
	Version string

	routes map[string]Policy
	other  Policy
}

// PolicyProvider hands out the current policy snapshot. Policies is called
// on every request and must not block; a settings-backed provider refreshes
// in the background and swaps snapshots atomically.
type PolicyProvider interface {
	Policies() *PolicySet
}

// Static is a PolicyProvider over one fixed snapshot.
type Static struct{ Set *PolicySet }

// Policies returns the snapshot.
func (s Static) Policies() *PolicySet { return s.Set }

// Label is the route label of a request: "METHOD /template". A HEAD is
// labelled as its route's GET: the same handler answers it with the same
// status and headers, so it spends the GET's limit rather than an "other"
// one of its own.
func Label(method, template string) string {
	if method == http.MethodHead {
		method = http.MethodGet
	}
	return method + " " + template
}

// maxCredit bounds limit × window (ms) so the token bucket's integer credit
// stays exact in Lua's doubles.
const maxCredit = 1 << 50

// NewPolicySet validates and builds a snapshot. routes is keyed by Label;
// other applies to every route not in it.
func NewPolicySet(version string, routes map[string]Policy, other Policy) (*PolicySet, error) {
	s := &PolicySet{Version: version, routes: make(map[string]Policy, len(routes)), other: other}
	for label, p := range routes {
		if label == OtherRoute {
			return nil, errors.New("ratelimit: \"other\" is given as the other policy, not as a route")
		}
		if err := checkPolicy(label, p); err != nil {
			return nil, err
		}
		s.routes[label] = p
	}
	if err := checkPolicy(OtherRoute, other); err != nil {
		return nil, err
	}
	return s, nil
}

// checkPolicy validates the policy of route label.
func checkPolicy(label string, p Policy) error {
	switch p.Algorithm {
	case SlidingLog, FixedWindow, TokenBucket:
	case "":
		if len(p.Rules) > 0 {
			return fmt.Errorf("ratelimit: policy %q: no algorithm", label)
		}
	default:
		return fmt.Errorf("ratelimit: policy %q: unknown algorithm %q", label, p.Algorithm)
	}
	seen := map[Family]bool{}
	for _, r := range p.Rules {
		switch r.Family {
		case FamilyUser, FamilyIP, FamilyDialog, FamilyService:
		default:
			return fmt.Errorf("ratelimit: policy %q: unknown family %q", label, r.Family)
		}
		if r.Family == FamilyDialog && label != MessageSendRoute {
			return fmt.Errorf("ratelimit: policy %q: the dialog family applies to %s only", label, MessageSendRoute)
		}
		if seen[r.Family] {
			return fmt.Errorf("ratelimit: policy %q: family %s twice", label, r.Family)
		}
		seen[r.Family] = true
		ms := r.Window.Milliseconds()
		if r.Limit < 1 || ms < 1 || r.Window%time.Millisecond != 0 {
			return fmt.Errorf("ratelimit: policy %q family %s: limit must be >= 1 and window a positive whole number of ms", label, r.Family)
		}
		// Divided, not multiplied: the product of a huge limit and a
		// window wraps around in 64 bits and would pass.
		if int64(r.Limit) > maxCredit/ms {
			return fmt.Errorf("ratelimit: policy %q family %s: limit × window (ms) must be at most 2^50", label, r.Family)
		}
	}
	if len(p.Rules) == 0 {
		return nil // not limited, said explicitly
	}
	for _, c := range Callers(label) {
		if !slices.ContainsFunc(c.Families, func(f Family) bool { return seen[f] }) {
			return fmt.Errorf("ratelimit: policy %q: no family counts %s (%s); [] is the way to leave a route unlimited",
				label, c.Name, familyList(c.Families))
		}
	}
	return nil
}

// Caller is a kind of principal that reaches a route, with the families
// whose subject it always has.
type Caller struct {
	Name     string
	Families []Family
}

// The kinds of caller. Every caller has a client address (ip). The dialog
// family counts a dialog, not its caller: it alone never limits who calls.
var (
	AnonymousCaller = Caller{"an anonymous caller", []Family{FamilyIP}}
	UserCaller      = Caller{"a user", []Family{FamilyUser, FamilyIP}}
	ServiceCaller   = Caller{"a service", []Family{FamilyService, FamilyIP}}
)

// Callers are the kinds of caller that reach the routes of label: the
// public routes (/v1/public/…) take no token, the internal ones
// (/v1/internal/…) service tokens only, every other limited route user
// tokens only, and "other" gathers user and service routes. A policy that
// limits must count each of them by at least one family: the limiter skips
// a family whose subject the caller lacks, and a request left with no
// family would not be limited at all.
func Callers(label string) []Caller {
	if label == OtherRoute {
		return []Caller{UserCaller, ServiceCaller}
	}
	_, template, _ := strings.Cut(label, " ")
	switch {
	case strings.HasPrefix(template+"/", "/v1/public/"):
		return []Caller{AnonymousCaller}
	case strings.HasPrefix(template+"/", "/v1/internal/"):
		return []Caller{ServiceCaller}
	}
	return []Caller{UserCaller}
}

func familyList(fs []Family) string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = string(f)
	}
	return strings.Join(out, " or ")
}

// MustPolicySet is NewPolicySet for configuration known to be valid.
func MustPolicySet(version string, routes map[string]Policy, other Policy) *PolicySet {
	s, err := NewPolicySet(version, routes, other)
	if err != nil {
		panic(err)
	}
	return s
}

// Lookup returns the label and policy of a route: the route's own when its
// label is on the allow-list, else "other" and the catch-all policy, so the
// number of distinct labels (and keys per identity) stays bounded.
func (s *PolicySet) Lookup(method, template string) (string, Policy) {
	label := Label(method, template)
	if p, ok := s.routes[label]; ok {
		return label, p
	}
	return OtherRoute, s.other
}

// Labels lists the allow-listed route labels, sorted.
func (s *PolicySet) Labels() []string {
	out := make([]string, 0, len(s.routes))
	for l := range s.routes {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// DefaultPolicies are the static route policies (docs/ratelimit.md has the
// table and the reasons). User limits are the real per-person limits; ip
// limits are a coarse abuse guard set high, because many users can share one
// address (NAT, and every client when a proxy hides addresses).
func DefaultPolicies() *PolicySet {
	user := func(limit int, w time.Duration) Rule { return Rule{FamilyUser, limit, w} }
	ip := func(limit int, w time.Duration) Rule { return Rule{FamilyIP, limit, w} }
	get, post := http.MethodGet, http.MethodPost
	const m, s10 = time.Minute, 10 * time.Second
	routes := map[string]Policy{
		Label(get, "/v1/me"):                            {FixedWindow, []Rule{user(120, m)}, FallbackLocal},
		Label(get, "/v1/dialogs"):                       {FixedWindow, []Rule{user(120, m)}, FallbackLocal},
		Label(post, "/v1/dialogs"):                      {SlidingLog, []Rule{user(20, m), ip(600, m)}, FallbackLocal},
		Label(get, "/v1/dialogs/{id}/messages"):         {FixedWindow, []Rule{user(300, m)}, FallbackLocal},
		Label(post, "/v1/dialogs/{id}/messages"):        {SlidingLog, []Rule{user(30, s10), ip(600, s10), {FamilyDialog, 60, s10}}, FailClosed},
		Label(post, "/v1/attachments"):                  {SlidingLog, []Rule{user(30, m), ip(600, m)}, FailClosed},
		Label(get, "/v1/attachments/{id}/download-url"): {FixedWindow, []Rule{user(300, m)}, FailClosed},
		Label(get, "/v1/users/{id}/presence"):           {FixedWindow, []Rule{user(300, m)}, FallbackLocal},
		Label(post, "/v1/realtime/tickets"):             {FixedWindow, []Rule{user(30, m), ip(1200, m)}, FallbackLocal},
		Label(get, "/v1/public/config"):                 {FixedWindow, []Rule{ip(300, m)}, FallbackLocal},
		Label(post, "/v1/internal/inbox"):               {TokenBucket, []Rule{{FamilyService, 200, s10}}, FallbackLocal},
	}
	// Everything else (routes added later, project API routes behind the
	// user subrouter): a generous per-identity ceiling.
	other := Policy{FixedWindow, []Rule{user(600, m), {FamilyService, 600, m}}, FallbackLocal}
	return MustPolicySet("static-1", routes, other)
}
