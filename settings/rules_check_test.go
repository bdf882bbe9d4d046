package settings_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/settings"
	"github.com/han-app/gateway/store"
	"github.com/han-app/gateway/store/rds"
)

// rulesConstraint is the CHECK constraint of rate_limit_policies that
// refuses at write time the rules a refresh would refuse (migration 0014).
const rulesConstraint = "rate_limit_policies_rules_valid"

// sendRoute is the one route whose policy may count the dialog family.
const sendRoute = "POST /v1/dialogs/{id}/messages"

// publicRoute takes no token (its callers are counted by ip only);
// inboxRoute takes service tokens only.
const (
	publicRoute = "GET /v1/public/config"
	inboxRoute  = "POST /v1/internal/inbox"
)

// ruleCase is one rules value written to a route, and whether it is a valid
// version: the Go validator of the refresh and PostgreSQL must both accept
// it, or both refuse it.
type ruleCase struct {
	name  string
	route string // "" = GET /v1/me
	rules string
	ok    bool
}

var ruleCases = []ruleCase{
	{name: "empty array: not limited", rules: `[]`, ok: true},
	{name: "limit 1, window 1 ms", rules: `[{"family":"user","limit":1,"windowMs":1}]`, ok: true},
	{name: "window of one year", rules: `[{"family":"user","limit":1,"windowMs":31536000000}]`, ok: true},
	{name: "window of one year and 1 ms", rules: `[{"family":"user","limit":1,"windowMs":31536000001}]`},
	{name: "window 0", rules: `[{"family":"user","limit":1,"windowMs":0}]`},
	{name: "window negative", rules: `[{"family":"user","limit":1,"windowMs":-1000}]`},
	{name: "window missing", rules: `[{"family":"user","limit":1}]`},
	{name: "window null", rules: `[{"family":"user","limit":1,"windowMs":null}]`},
	{name: "window 1.5", rules: `[{"family":"user","limit":1,"windowMs":1.5}]`},
	{name: "window as a string", rules: `[{"family":"user","limit":1,"windowMs":"1000"}]`},
	{name: "window 2^63", rules: `[{"family":"user","limit":1,"windowMs":9223372036854775808}]`},
	{name: "limit × window exactly 2^50 (window 1)", rules: `[{"family":"user","limit":1125899906842624,"windowMs":1}]`, ok: true},
	{name: "limit × window 2^50+1 (window 1)", rules: `[{"family":"user","limit":1125899906842625,"windowMs":1}]`},
	{name: "limit × window exactly 2^50 (2^30 × 2^20)", rules: `[{"family":"ip","limit":1073741824,"windowMs":1048576}]`, ok: true},
	{name: "limit × window 2^50+2^20", rules: `[{"family":"ip","limit":1073741825,"windowMs":1048576}]`},
	{name: "largest limit over a year", rules: `[{"family":"user","limit":35702,"windowMs":31536000000}]`, ok: true},
	{name: "one more over a year", rules: `[{"family":"user","limit":35703,"windowMs":31536000000}]`},
	{name: "limit × window wraps 64 bits", rules: `[{"family":"user","limit":2305843009213693952,"windowMs":8}]`},
	{name: "limit 2^63-1", rules: `[{"family":"user","limit":9223372036854775807,"windowMs":1}]`},
	{name: "limit 2^63", rules: `[{"family":"user","limit":9223372036854775808,"windowMs":1}]`},
	{name: "limit 1e400", rules: `[{"family":"user","limit":1e400,"windowMs":1}]`},
	{name: "limit beyond what numeric holds", rules: `[{"family":"user","limit":1e200000,"windowMs":1}]`},
	{name: "limit 0", rules: `[{"family":"user","limit":0,"windowMs":1000}]`},
	{name: "limit negative", rules: `[{"family":"user","limit":-5,"windowMs":1000}]`},
	{name: "limit negative zero (stored as 0)", rules: `[{"family":"user","limit":-0,"windowMs":1000}]`},
	{name: "limit -0.0", rules: `[{"family":"user","limit":-0.0,"windowMs":1000}]`},
	{name: "limit missing", rules: `[{"family":"user","windowMs":1000}]`},
	{name: "limit null", rules: `[{"family":"user","limit":null,"windowMs":1000}]`},
	{name: "limit 1.0", rules: `[{"family":"user","limit":1.0,"windowMs":1000}]`},
	{name: "limit 0.5", rules: `[{"family":"user","limit":0.5,"windowMs":1000}]`},
	{name: "limit 10e-1 (stored as 1.0)", rules: `[{"family":"user","limit":10e-1,"windowMs":1000}]`},
	{name: "limit 1e3 (stored as 1000)", rules: `[{"family":"user","limit":1e3,"windowMs":1000}]`, ok: true},
	{name: "window 1E+3 (stored as 1000)", rules: `[{"family":"user","limit":5,"windowMs":1E+3}]`, ok: true},
	{name: "limit 1.5e1 (stored as 15)", rules: `[{"family":"user","limit":1.5e1,"windowMs":1000}]`, ok: true},
	{name: "limit 1e-0 (stored as 1)", rules: `[{"family":"user","limit":1e-0,"windowMs":1000}]`, ok: true},
	{name: "limit as a string", rules: `[{"family":"user","limit":"5","windowMs":1000}]`},
	{name: "limit true", rules: `[{"family":"user","limit":true,"windowMs":1000}]`},
	{name: "limit a nested object", rules: `[{"family":"user","limit":{"value":5},"windowMs":1000}]`},
	{name: "limit an array", rules: `[{"family":"user","limit":[5],"windowMs":1000}]`},
	{name: "unknown family", rules: `[{"family":"planet","limit":5,"windowMs":1000}]`},
	{name: "family in capitals", rules: `[{"family":"USER","limit":5,"windowMs":1000}]`},
	{name: "family with a trailing space", rules: `[{"family":"user ","limit":5,"windowMs":1000}]`},
	{name: "family with an accent", rules: `[{"family":"úser","limit":5,"windowMs":1000}]`},
	{name: "family with a long s", rules: `[{"family":"ſervice","limit":5,"windowMs":1000}]`},
	{name: "family in full-width letters", rules: `[{"family":"ｕｓｅｒ","limit":5,"windowMs":1000}]`},
	{name: "family escaped \\u0075ser is user", rules: `[{"family":"\u0075ser","limit":5,"windowMs":1000}]`, ok: true},
	{name: "family with an escaped NUL", rules: `[{"family":"user\u0000","limit":5,"windowMs":1000}]`},
	{name: "family with a NUL byte", rules: "[{\"family\":\"user\x00\",\"limit\":5,\"windowMs\":1000}]"},
	{name: "family empty", rules: `[{"family":"","limit":5,"windowMs":1000}]`},
	{name: "family missing", rules: `[{"limit":5,"windowMs":1000}]`},
	{name: "family null", rules: `[{"family":null,"limit":5,"windowMs":1000}]`},
	{name: "family a number", rules: `[{"family":1,"limit":5,"windowMs":1000}]`},
	{name: "family a nested object", rules: `[{"family":{"name":"user"},"limit":5,"windowMs":1000}]`},
	{name: "family an array", rules: `[{"family":["user"],"limit":5,"windowMs":1000}]`},
	{name: "family twice", rules: `[{"family":"user","limit":5,"windowMs":1000},{"family":"user","limit":9,"windowMs":60000}]`},
	{name: "two families", rules: `[{"family":"user","limit":5,"windowMs":1000},{"family":"ip","limit":9,"windowMs":60000}]`, ok: true},
	{name: "service family on a service route", route: inboxRoute, rules: `[{"family":"service","limit":5,"windowMs":1000}]`, ok: true},
	{name: "service family alone on a user route", rules: `[{"family":"service","limit":5,"windowMs":1000}]`},
	{name: "a bad second rule", rules: `[{"family":"user","limit":5,"windowMs":1000},{"family":"ip","limit":0,"windowMs":1000}]`},
	{name: "unknown field", rules: `[{"family":"user","limit":5,"windowMs":1000,"burst":9}]`},
	{name: "unknown field null", rules: `[{"family":"user","limit":5,"windowMs":1000,"x":null}]`},
	{name: "unknown field with an empty name", rules: `[{"family":"user","limit":5,"windowMs":1000,"":1}]`},
	{name: "unknown field wındowMs (dotless i)", rules: `[{"family":"user","limit":5,"wındowMs":1000}]`},
	{name: "unknown field famİly (dotted I)", rules: `[{"famİly":"user","limit":5,"windowMs":1000}]`},
	{name: "field names in another case", rules: `[{"Family":"user","LIMIT":5,"windowms":1000}]`},
	{name: "field windowMſ (long s)", rules: `[{"family":"user","limit":5,"windowMſ":1000}]`},
	{name: "duplicate key: the last is stored", rules: `[{"family":"user","limit":0,"windowMs":1000,"limit":5}]`, ok: true},
	{name: "duplicate key: a bad last", rules: `[{"family":"user","limit":5,"windowMs":1000,"limit":0}]`},
	{name: "duplicate family key: the last is stored", rules: `[{"family":"planet","limit":5,"windowMs":1000,"family":"ip"}]`, ok: true},
	{name: "Limit beside limit", rules: `[{"family":"user","limit":5,"Limit":0,"windowMs":1000}]`},
	{name: "LIMIT beside limit", rules: `[{"family":"user","LIMIT":5,"limit":0,"windowMs":1000}]`},
	{name: "a null beside a case variant", rules: `[{"family":null,"Family":"user","limit":5,"windowMs":1000}]`},
	{name: "a case variant of the wrong type", rules: `[{"family":"user","limit":5,"windowMs":1000,"Limit":"x"}]`},
	{name: "a case variant out of range", rules: `[{"family":"user","Limit":1e30,"limit":5,"windowMs":1000}]`},
	{name: "spaces and another key order", rules: ` [ {"windowMs" : 1000 , "limit" : 5 , "family" : "ip"} ] `, ok: true},
	{name: "rule null", rules: `[null]`},
	{name: "rule an empty object", rules: `[{}]`},
	{name: "rule a number", rules: `[1]`},
	{name: "rule a string", rules: `["user"]`},
	{name: "rule true", rules: `[true]`},
	{name: "rules nested in an array", rules: `[[{"family":"user","limit":5,"windowMs":1000}]]`},
	{name: "not JSON", rules: `[{"family":"user",}]`},
	{name: "every family on message send", route: sendRoute, ok: true,
		rules: `[{"family":"user","limit":30,"windowMs":10000},{"family":"ip","limit":600,"windowMs":10000},{"family":"dialog","limit":60,"windowMs":10000},{"family":"service","limit":9,"windowMs":1}]`},
	{name: "dialog twice on message send", route: sendRoute,
		rules: `[{"family":"dialog","limit":30,"windowMs":10000},{"family":"dialog","limit":60,"windowMs":60000}]`},
	{name: "dialog on history", route: "GET /v1/dialogs/{id}/messages", rules: `[{"family":"dialog","limit":60,"windowMs":10000}]`},
	{name: "dialog on other", route: "other", rules: `[{"family":"dialog","limit":60,"windowMs":10000}]`},
	{name: "user and service on other", route: "other", ok: true,
		rules: `[{"family":"user","limit":600,"windowMs":60000},{"family":"service","limit":600,"windowMs":60000}]`},
	{name: "ip on other", route: "other", rules: `[{"family":"ip","limit":600,"windowMs":60000}]`, ok: true},
	{name: "user alone on other", route: "other", rules: `[{"family":"user","limit":600,"windowMs":60000}]`},
	{name: "service alone on other", route: "other", rules: `[{"family":"service","limit":600,"windowMs":60000}]`},
	{name: "empty array on other", route: "other", rules: `[]`, ok: true},
	{name: "ip on the public config", route: publicRoute, rules: `[{"family":"ip","limit":300,"windowMs":60000}]`, ok: true},
	{name: "user on the public config", route: publicRoute, rules: `[{"family":"user","limit":1,"windowMs":60000}]`},
	{name: "user and service on the public config", route: publicRoute,
		rules: `[{"family":"user","limit":1,"windowMs":60000},{"family":"service","limit":1,"windowMs":60000}]`},
	{name: "empty array on the public config", route: publicRoute, rules: `[]`, ok: true},
	{name: "service alone on message send", route: sendRoute, rules: `[{"family":"service","limit":1,"windowMs":10000}]`},
	{name: "dialog alone on message send", route: sendRoute, rules: `[{"family":"dialog","limit":60,"windowMs":10000}]`},
	{name: "ip and dialog on message send", route: sendRoute, ok: true,
		rules: `[{"family":"ip","limit":600,"windowMs":10000},{"family":"dialog","limit":60,"windowMs":10000}]`},
	{name: "user on the internal inbox", route: inboxRoute, rules: `[{"family":"user","limit":200,"windowMs":10000}]`},
	{name: "ip on the internal inbox", route: inboxRoute, rules: `[{"family":"ip","limit":200,"windowMs":10000}]`, ok: true},
	{name: "a route under /v1/public that is not the config", route: "GET /v1/public/other",
		rules: `[{"family":"user","limit":1,"windowMs":1000}]`},
	{name: "a route that only begins like /v1/public", route: "GET /v1/publicx",
		rules: `[{"family":"user","limit":1,"windowMs":1000}]`, ok: true},
	{name: "a project route", route: "GET /projects/{projectId}/redis/cache",
		rules: `[{"family":"service","limit":1,"windowMs":1000}]`},
}

// The Go validator of the refresh and the table's CHECK never disagree: every
// rules value is refused by PostgreSQL on INSERT and on UPDATE exactly when a
// refresh would refuse it. What the validator gets is what PostgreSQL stores
// and returns (rules is jsonb: the last of duplicate keys kept, keys
// reordered, numbers normalised); a value jsonb cannot hold at all is
// refused by both. PostgreSQL's refusal names the rule and the reason.
func TestRulesCheckAgreesWithTheRefresh(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	for _, c := range ruleCases {
		t.Run(c.name, func(t *testing.T) {
			route := c.route
			if route == "" {
				route = "GET /v1/me"
			}
			var stored string
			castErr := f.pool.QueryRow(ctx, "SELECT $1::text::jsonb::text", c.rules).Scan(&stored)
			goErr := castErr
			if castErr == nil {
				goErr = settings.ValidateRow(route, "fixed", "local", stored)
			} else if settings.ValidateRow(route, "fixed", "local", c.rules) == nil {
				t.Fatalf("jsonb cannot hold %q (%v) but the Go validator accepts the text", c.rules, castErr)
			}
			if (goErr == nil) != c.ok {
				t.Fatalf("Go validator on %s: %v, want ok=%v", stored, goErr, c.ok)
			}
			insErr, updErr := writeRules(t, f, route, c.rules)
			for _, w := range []struct {
				op  string
				err error
			}{{"INSERT", insErr}, {"UPDATE", updErr}} {
				if (w.err == nil) != c.ok {
					t.Errorf("%s of %s on %s: %v; the Go validator says %v", w.op, c.rules, route, w.err, goErr)
				}
				if w.err != nil && castErr == nil {
					checkRefusal(t, w.err)
				}
			}
			if c.ok {
				var back string
				if err := f.pool.QueryRow(ctx, "SELECT rules::text FROM rate_limit_policies WHERE route = $1", route).Scan(&back); err != nil || back != stored {
					t.Fatalf("stored %q (%v), the validator checked %q", back, err, stored)
				}
			}
			f.exec("DELETE FROM rate_limit_policies WHERE route = $1", route)
		})
	}
}

// writeRules writes rules to route by an INSERT of a new row, then by an
// UPDATE of a valid row (an ip rule: it counts every caller of every
// route), and returns each statement's error.
func writeRules(t *testing.T, f *fixture, route, rules string) (insErr, updErr error) {
	t.Helper()
	ctx := context.Background()
	f.exec("DELETE FROM rate_limit_policies WHERE route = $1", route)
	_, insErr = f.pool.Exec(ctx, `INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ($1, 'fixed', 'local', $2::text::jsonb)`, route, rules)
	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
		VALUES ($1, 'fixed', 'local', '[{"family":"ip","limit":1,"windowMs":1000}]')
		ON CONFLICT (route) DO UPDATE SET rules = EXCLUDED.rules`, route)
	_, updErr = f.pool.Exec(ctx, "UPDATE rate_limit_policies SET rules = $2::text::jsonb WHERE route = $1", route, rules)
	return insErr, updErr
}

// checkRefusal asserts that err is the rules CHECK's refusal, naming the
// rule by its index in the array, or the caller of the route no rule counts.
func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" || pe.ConstraintName != rulesConstraint ||
		!strings.Contains(pe.Message, "rules[") && !strings.Contains(pe.Message, "rules: no family counts ") {
		t.Errorf("want a check violation of %s naming the rule or the caller, got %v", rulesConstraint, err)
	}
}

// execOldRow runs q as on a database from before the write-time check of
// the rules (migration 0014): the constraint is dropped for the statement
// and put back NOT VALID in the same transaction, as the migration leaves
// it over a row it would refuse. Tests of the refresh-time check use it to
// write what the table now refuses.
func (f *fixture) execOldRow(q string, args ...any) {
	f.t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		var def string
		if err := tx.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
			WHERE conrelid = 'rate_limit_policies'::regclass AND conname = $1`, rulesConstraint).Scan(&def); err != nil {
			return err
		}
		def = strings.TrimSuffix(def, " NOT VALID")
		if _, err := tx.Exec(ctx, "ALTER TABLE rate_limit_policies DROP CONSTRAINT "+rulesConstraint); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, q, args...); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "ALTER TABLE rate_limit_policies ADD CONSTRAINT "+rulesConstraint+" "+def+" NOT VALID")
		return err
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// A write the rules CHECK refuses changes nothing: the statement fails
// (and its transaction with it), settings_head keeps its version and stamp,
// no history row is added, the rows in force stay as they were, and the
// instances keep the settings in force. The refusal names the route, the
// rule's index and the reason.
func TestRefusedRulesWriteChangesNothing(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	f.exec(`INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules) VALUES
		('GET /v1/me', 'fixed', 'local', '[{"family":"user","limit":7,"windowMs":60000}]'),
		($1, 'sliding', 'fail-closed', '[{"family":"dialog","limit":5,"windowMs":10000},{"family":"user","limit":5,"windowMs":10000}]')`, sendRoute)
	p := f.provider(settings.Config{})
	v, stamp := f.head()
	rows := f.policyRows()
	for _, w := range []struct {
		name, sql, want string
		args            []any
	}{
		{name: "an upsert", want: `route 'GET /v1/me': rules[0]: limit must be >= 1`,
			sql: `INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
				VALUES ('GET /v1/me', 'fixed', 'local', '[{"family":"user","limit":0,"windowMs":60000}]')
				ON CONFLICT (route) DO UPDATE SET rules = EXCLUDED.rules, updated_at = now()`},
		{name: "an update", want: `rules[1]: family user twice`,
			sql: `UPDATE rate_limit_policies SET updated_at = now(),
				rules = '[{"family":"user","limit":7,"windowMs":60000},{"family":"user","limit":9,"windowMs":1000}]'
				WHERE route = 'GET /v1/me'`},
		{name: "a route change", want: `rules[0]: the dialog family applies to POST /v1/dialogs/{id}/messages only`,
			sql: `UPDATE rate_limit_policies SET route = 'GET /v1/dialogs/{id}/messages' WHERE route = $1`, args: []any{sendRoute}},
		{name: "one bad row of several", want: `route 'POST /v1/attachments': rules[0]: unknown field 'burst'`,
			sql: `INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules) VALUES
				('GET /v1/dialogs', 'fixed', 'local', '[{"family":"user","limit":3,"windowMs":1000}]'),
				('POST /v1/attachments', 'sliding', 'fail-closed', '[{"family":"user","limit":3,"windowMs":1000,"burst":1}]')`},
		{name: "a transaction that changed a tunable first", want: `rules[0]: windowMs must be 1 .. 31536000000`,
			sql: `INSERT INTO runtime_settings(name, value) VALUES ('rules.check', '1');
				UPDATE rate_limit_policies SET rules = '[{"family":"user","limit":7,"windowMs":0}]' WHERE route = 'GET /v1/me'`},
	} {
		_, err := f.pool.Exec(ctx, w.sql, w.args...)
		checkRefusal(t, err)
		if err == nil || !strings.Contains(err.Error(), w.want) {
			t.Errorf("%s: %v, want a refusal saying %q", w.name, err, w.want)
		}
		var history, tunables int
		if err := f.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM settings_versions WHERE version > $1),
			(SELECT count(*) FROM runtime_settings)`, v).Scan(&history, &tunables); err != nil {
			t.Fatal(err)
		}
		if v2, stamp2 := f.head(); v2 != v || stamp2 != stamp || history != 0 || tunables != 0 {
			t.Fatalf("%s refused, yet the settings moved: version %d → %d, stamp %s → %s, %d history rows, %d tunables",
				w.name, v, v2, stamp, stamp2, history, tunables)
		}
		if got := f.policyRows(); !reflect.DeepEqual(got, rows) {
			t.Fatalf("%s refused, yet the rows changed:\n%v\nwere\n%v", w.name, got, rows)
		}
	}
	if err := p.Refresh(ctx); err != nil || p.Version() != v || userLimit(t, p, "GET", "/v1/me") != 7 {
		t.Fatalf("refresh: %v, version %d (want %d), user limit %d (want 7)", err, p.Version(), v, userLimit(t, p, "GET", "/v1/me"))
	}
}

// policyRows is every rate_limit_policies row as text, by route.
func (f *fixture) policyRows() map[string]string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(),
		"SELECT route, concat_ws(' ', algorithm, on_failure, rules::text, updated_at::text) FROM rate_limit_policies")
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var route, row string
		if err := rows.Scan(&route, &row); err != nil {
			f.t.Fatal(err)
		}
		out[route] = row
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// The migration that adds the rules CHECK applies on a database that
// already holds a row it refuses: the row stays, the constraint is left NOT
// VALID, and the refresh refuses that version as before. From then on the
// row can be fixed or deleted but not written again as it is; once fixed,
// the constraint validates. On a database without such a row the migration
// leaves the constraint validated.
func TestRulesCheckMigrationKeepsAnOldBadRow(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, "settings_rules_check_clean", "")
	if !rulesConstraintValid(t, pool) {
		t.Fatal("on a database without a bad row the rules constraint was left NOT VALID")
	}
	bad := `[{"family":"user","limit":5,"windowMs":1000},{"family":"planet","limit":5,"windowMs":1000}]`
	pool = migratedDatabase(t, "settings_rules_check_bad", bad)
	if rulesConstraintValid(t, pool) {
		t.Fatal("the constraint is validated over a row it refuses")
	}
	db1, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer db1.Close()
	p, err := settings.New(settings.Config{Scope: "rulescheck", Secret: testSecret}, store.New(pool), db1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Refresh(ctx); !errors.Is(err, settings.ErrInvalid) || p.Version() != 0 || userLimit(t, p, "GET", "/v1/me") != 120 {
		t.Fatalf("refresh over the old bad row: %v, version %d, user limit %d; want ErrInvalid and the built-in policy",
			err, p.Version(), userLimit(t, p, "GET", "/v1/me"))
	}
	_, err = pool.Exec(ctx, "UPDATE rate_limit_policies SET algorithm = 'sliding' WHERE route = 'GET /v1/me'")
	checkRefusal(t, err)
	if _, err := pool.Exec(ctx, `UPDATE rate_limit_policies SET rules = '[{"family":"user","limit":5,"windowMs":1000}]'
		WHERE route = 'GET /v1/me'`); err != nil {
		t.Fatalf("fixing the old row: %v", err)
	}
	if err := p.Refresh(ctx); err != nil || userLimit(t, p, "GET", "/v1/me") != 5 {
		t.Fatalf("refresh after the fix: %v, user limit %d", err, userLimit(t, p, "GET", "/v1/me"))
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE rate_limit_policies VALIDATE CONSTRAINT "+rulesConstraint); err != nil || !rulesConstraintValid(t, pool) {
		t.Fatalf("validating the constraint after the fix: %v", err)
	}
}

// migratedDatabase creates a database at the migrations before 0014,
// writes badRules (when given) to GET /v1/me there, then runs Migrate as the
// service does (through PgBouncer when the package runs behind one) and
// checks that it applied 0014.
func migratedDatabase(t *testing.T, name, badRules string) *pgxpool.Pool {
	return migratedFrom(t, name, "0014_rate_limit_rules_check", "GET /v1/me", badRules)
}

// migratedFrom creates a database at the migrations before migration,
// writes badRules (when given) to route there, then runs Migrate as the
// service does (through PgBouncer when the package runs behind one) and
// checks that it applied migration.
func migratedFrom(t *testing.T, name, migration, route, badRules string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	direct, drop, err := testenv.CreateDatabase(ctx, env.DirectURL, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	old, err := store.OpenPG(ctx, direct, store.PGConfig{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := store.MigrateBefore(ctx, old, migration[:4]); err != nil {
		t.Fatal(err)
	}
	if badRules != "" {
		if _, err := old.Exec(ctx, `INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
			VALUES ($1, 'fixed', 'local', $2::text::jsonb)`, route, badRules); err != nil {
			t.Fatal(err)
		}
	}
	url := direct
	if env.Bouncer != nil {
		url = env.Bouncer.URL(direct, "")
	}
	pool, err := store.OpenPG(ctx, url, store.PGConfig{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	applied, err := store.Migrate(ctx, pool)
	if err != nil || !slices.Contains(applied, migration) {
		t.Fatalf("migrate: applied %v, %v", applied, err)
	}
	return pool
}

func rulesConstraintValid(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var valid bool
	if err := pool.QueryRow(context.Background(), `SELECT convalidated FROM pg_constraint
		WHERE conrelid = 'rate_limit_policies'::regclass AND conname = $1`, rulesConstraint).Scan(&valid); err != nil {
		t.Fatal(err)
	}
	return valid
}

// The migration that refuses an override counting none of its route's
// callers applies on a database that already holds such a row (user on the
// public config, accepted before): the row stays, the constraint is left
// NOT VALID, and the refresh refuses that version, so the public config keeps
// its ip limit. The row can be fixed but not rewritten as it is; once fixed,
// the constraint validates. On a database without such a row the migration
// leaves the constraint validated.
func TestRulesCallersMigrationKeepsAnOldBadRow(t *testing.T) {
	ctx := context.Background()
	const migration = "0019_rate_limit_rules_callers"
	pool := migratedFrom(t, "settings_rules_callers_clean", migration, publicRoute, `[{"family":"ip","limit":5,"windowMs":1000}]`)
	if !rulesConstraintValid(t, pool) {
		t.Fatal("on a database without a bad row the rules constraint was left NOT VALID")
	}
	pool = migratedFrom(t, "settings_rules_callers_bad", migration, publicRoute, `[{"family":"user","limit":1,"windowMs":60000}]`)
	if rulesConstraintValid(t, pool) {
		t.Fatal("the constraint is validated over a row it refuses")
	}
	db1, err := rds.NewRedis(env.Redis.URL(1), rds.RedisConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer db1.Close()
	p, err := settings.New(settings.Config{Scope: "rulescallers", Secret: testSecret}, store.New(pool), db1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ipLimit := func() int {
		_, pol := p.Policies().Lookup("GET", "/v1/public/config")
		if len(pol.Rules) != 1 || pol.Rules[0].Family != "ip" {
			t.Fatalf("public config policy: %+v", pol)
		}
		return pol.Rules[0].Limit
	}
	if err := p.Refresh(ctx); !errors.Is(err, settings.ErrInvalid) || p.Version() != 0 || ipLimit() != 300 {
		t.Fatalf("refresh over the old bad row: %v, version %d; want ErrInvalid and the built-in policy", err, p.Version())
	}
	_, err = pool.Exec(ctx, "UPDATE rate_limit_policies SET algorithm = 'sliding' WHERE route = $1", publicRoute)
	checkRefusal(t, err)
	if _, err := pool.Exec(ctx, `UPDATE rate_limit_policies SET rules = '[{"family":"ip","limit":5,"windowMs":1000}]'
		WHERE route = $1`, publicRoute); err != nil {
		t.Fatalf("fixing the old row: %v", err)
	}
	if err := p.Refresh(ctx); err != nil || ipLimit() != 5 {
		t.Fatalf("refresh after the fix: %v", err)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE rate_limit_policies VALIDATE CONSTRAINT "+rulesConstraint); err != nil || !rulesConstraintValid(t, pool) {
		t.Fatalf("validating the constraint after the fix: %v", err)
	}
}
