package settings_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/han-app/gateway/settings"
)

// A known tunable whose value cannot be used (a string, a fraction, a
// boolean, below its range) does not read as the default: the value in
// force stays, a warning names the tunable (never the value), and the
// version applies all the same, so a policy change that comes with it still
// reaches the instance. An instance that starts while the value is unusable
// has no value in force and reads the default. JSON null is no value: the
// default applies, for any name. A usable value applies again at once.
func TestUnusableTunableKeepsTheValueInForce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	var mu sync.Mutex
	var logs bytes.Buffer
	// Without the time: a time such as 13:48:35.552 holds "5.5", which
	// the check below looks for as a leaked value.
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	logger := slog.New(slog.NewTextHandler(&lockedWriter{mu: &mu, w: &logs}, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: noTime}))
	p := f.provider(settings.Config{Logger: logger})
	const name = "legacy_stub.verdict_after_polls" // legacystub.TunableVerdictAfterPolls

	f.exec(`INSERT INTO runtime_settings(name, value) VALUES ($1, '5'), ('other.tunable', 'null')`, name)
	if err := p.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := p.Int(name, 3); got != 5 {
		t.Fatalf("a usable value: Int = %d, want 5", got)
	}
	if got := p.Int("other.tunable", 3); got != 3 {
		t.Errorf("JSON null of another tunable: Int = %d, want the default 3", got)
	}
	for i, bad := range []string{`"5"`, `5.5`, `true`, `0`, `-2`, `[5]`, `{"n":5}`, `99999999999999999999`} {
		limit := 11 + i
		// One version: the bad value and a policy change.
		f.exec(`WITH t AS (UPDATE runtime_settings SET value = $2::jsonb WHERE name = $1)
			INSERT INTO rate_limit_policies(route, algorithm, on_failure, rules)
			VALUES ('GET /v1/me', 'fixed', 'local', $3::jsonb)
			ON CONFLICT (route) DO UPDATE SET rules = EXCLUDED.rules`,
			name, bad, `[{"family":"user","limit":`+itoa(int64(limit))+`,"windowMs":60000}]`)
		if err := p.Refresh(ctx); err != nil {
			t.Errorf("value %s: refresh: %v", bad, err)
		}
		if got := p.Int(name, 3); got != 5 {
			t.Errorf("value %s: Int = %d, want the value in force 5", bad, got)
		}
		if p.Version() != f.version() || userLimit(t, p, "GET", "/v1/me") != limit {
			t.Errorf("value %s held back the version: at %d, PostgreSQL at %d", bad, p.Version(), f.version())
		}
		if fresh := f.provider(settings.Config{}); fresh.Int(name, 3) != 3 {
			t.Errorf("value %s: an instance started now reads %d, want the default 3", bad, fresh.Int(name, 3))
		}
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	if n := strings.Count(out, "tunable value unusable"); n != 8 || !strings.Contains(out, "name="+name) {
		t.Errorf("%d warnings naming the tunable, want one per version; log:\n%s", n, out)
	}
	if strings.Contains(out, "5.5") || strings.Contains(out, `\"5\"`) || strings.Contains(out, "99999999999999999999") {
		t.Errorf("the log holds a tunable's value:\n%s", out)
	}

	f.exec(`UPDATE runtime_settings SET value = 'null' WHERE name = $1`, name)
	if err := p.Refresh(ctx); err != nil || p.Int(name, 3) != 3 {
		t.Errorf("JSON null: refresh %v, Int = %d, want the default 3", err, p.Int(name, 3))
	}
	f.exec(`UPDATE runtime_settings SET value = '2' WHERE name = $1`, name)
	if err := p.Refresh(ctx); err != nil || p.Int(name, 3) != 2 {
		t.Errorf("a usable value again: refresh %v, Int = %d, want 2", err, p.Int(name, 3))
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
