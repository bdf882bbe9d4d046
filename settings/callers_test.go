package settings_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/han-app/gateway/ratelimit"
	"github.com/han-app/gateway/settings"
)

// An override that limits a route must count every caller that reaches it:
// the limiter skips a family whose subject the caller lacks, and a request
// left with no family is admitted with no limit and no RateLimit fields.
// A rule list that counts none of a route's callers - user on the public
// config (no token there), service on message send (user tokens only), the
// dialog alone on message send (it counts the dialog, not the sender), user
// on the internal inbox (service tokens only), user alone on "other" (which
// service routes fall to too) - is refused when it is written, and a refresh
// over such a row (a database from before that check) refuses the version
// and keeps the policy in force, which still counts the caller.
func TestOverrideThatCountsNoCallerIsRefused(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	p := f.provider(settings.Config{})
	lim := f.instance(p)
	const (
		ip     = "00112233445566ff"
		user   = "0190f3a0-0000-7000-8000-000000000001"
		dialog = "0190f3a0-0000-7000-8000-0000000000d1"
	)
	for _, c := range []struct {
		route, algorithm, rules string
		subj                    ratelimit.Subject // what the REST API's rate-limit step builds for the caller
	}{
		{publicRoute, "fixed", `[{"family":"user","limit":1,"windowMs":60000}]`, ratelimit.Subject{IPHMAC: ip}},
		{sendRoute, "sliding", `[{"family":"service","limit":1,"windowMs":10000}]`,
			ratelimit.Subject{UserID: user, IPHMAC: ip, DialogID: dialog}},
		{sendRoute, "sliding", `[{"family":"dialog","limit":60,"windowMs":10000}]`,
			ratelimit.Subject{UserID: user, IPHMAC: ip, DialogID: dialog}},
		{inboxRoute, "bucket", `[{"family":"user","limit":200,"windowMs":10000}]`, ratelimit.Subject{Service: "crm", IPHMAC: ip}},
		{"other", "fixed", `[{"family":"user","limit":600,"windowMs":60000}]`, ratelimit.Subject{Service: "crm", IPHMAC: ip}},
	} {
		method, template, _ := strings.Cut(c.route, " ")
		if c.route == "other" {
			method, template = "GET", "/v1/internal/not-listed"
		}
		_, inForce := p.Policies().Lookup(method, template)

		_, err := f.pool.Exec(ctx, `INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
			VALUES ($1, $2, 'fail-closed', $3)`, c.route, c.algorithm, c.rules)
		checkRefusal(t, err)
		if err == nil || !strings.Contains(err.Error(), "no family counts") {
			t.Errorf("%s %s: written (%v); the route would be unlimited", c.route, c.rules, err)
		}
		f.exec(`DELETE FROM rate_limit_policies`)
		if err := p.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		before := p.Version()

		f.execOldRow(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
			VALUES ($1, $2, 'fail-closed', $3)`, c.route, c.algorithm, c.rules)
		if err := p.Refresh(ctx); !errors.Is(err, settings.ErrInvalid) {
			t.Errorf("%s %s: version applied (err %v)", c.route, c.rules, err)
		}
		label, pol := lim.Policies().Lookup(method, template)
		if p.Version() != before || !reflect.DeepEqual(pol, inForce) {
			t.Errorf("%s %s replaced the policy in force: version %d (was %d), %+v", c.route, c.rules, p.Version(), before, pol)
		}
		d, err := lim.Decide(ctx, label, pol, c.subj)
		if err != nil {
			t.Fatal(err)
		}
		counted := false
		for _, fd := range d.Families {
			counted = counted || fd.Rule.Family != ratelimit.FamilyDialog
		}
		if !d.Allowed || !counted || ratelimit.PolicyField(d) == "" {
			t.Errorf("%s %s: the caller's request is not counted: %+v", c.route, c.rules, d)
		}
		f.exec(`DELETE FROM rate_limit_policies`)
		if err := p.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
