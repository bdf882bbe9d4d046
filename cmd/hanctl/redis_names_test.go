package main

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/han-app/gateway/internal/faultproxy"
	"github.com/han-app/gateway/internal/testenv"
)

// The Redis commands against a Redis that accepts the connection and then
// never answers end within their per-command timeout, saying which
// variable's server did not answer and that it stalled: sizing --sample
// used to print "store: redis unavailable" for either of its two URLs, and
// redis verify / cutover "admin connection: store: redis unavailable",
// leaving the operator to guess which server and why. The password in the
// URL is never printed.
func TestRedisCommandsNameTheStalledVariable(t *testing.T) {
	r, err := testenv.StartRedis(testenv.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	p0, u0 := faultproxy.ForURL(t, r.URL(0))
	p1, u1 := faultproxy.ForURL(t, r.URL(1))
	pa, ua := faultproxy.ForURL(t, r.AdminURL(0))
	for _, p := range []*faultproxy.Proxy{p0, p1, pa} {
		p.Blackhole(true)
	}
	healthy0, healthy1 := r.URL(0), r.URL(1)
	for _, tc := range []struct {
		name, stalled string
		vars          map[string]string
		args          []string
	}{
		{"sizing, DB0 stalled", "REDIS_URL", map[string]string{"REDIS_URL": u0, "REDIS_REALTIME_URL": healthy1}, []string{"sizing", "--sample"}},
		{"sizing, DB1 stalled", "REDIS_REALTIME_URL", map[string]string{"REDIS_URL": healthy0, "REDIS_REALTIME_URL": u1}, []string{"sizing", "--sample"}},
		{"verify", "HAN_REDIS_ADMIN_URL", map[string]string{"HAN_REDIS_ADMIN_URL": ua}, []string{"redis", "verify"}},
		{"cutover", "HAN_REDIS_ADMIN_URL", map[string]string{"HAN_REDIS_ADMIN_URL": ua}, []string{"redis", "cutover"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runBounded(t, time.Minute, tc.vars, tc.args...)
			if res.hung || res.err == nil {
				t.Fatalf("hanctl %v with %s stalled: hung %v, error %v\n%s", tc.args, tc.stalled, res.hung, res.err, res.out)
			}
			msg := res.err.Error()
			if !strings.Contains(msg, tc.stalled+": Redis did not answer within") {
				t.Errorf("hanctl %v with %s stalled: %q, want the variable named and the stall said", tc.args, tc.stalled, msg)
			}
			for name, v := range tc.vars {
				if u, err := url.Parse(v); err == nil {
					if pw, ok := u.User.Password(); ok && strings.Contains(msg, pw) {
						t.Errorf("hanctl %v: the error prints the password of %s: %q", tc.args, name, msg)
					}
				}
			}
		})
	}
}

// A setting hanctl cannot use is named in its error, its value never
// shown: a Redis URL it cannot read said "store: invalid redis URL",
// whichever of REDIS_URL and REDIS_REALTIME_URL it was, and a
// HAN_DB_EXEC_MODE with a trailing space (an env file) said only what the
// valid modes are.
func TestHanctlNamesTheSettingItCannotUse(t *testing.T) {
	if _, err := run(t, nil, "migrate"); err != nil {
		t.Fatal(err)
	}
	const pw = "s3cret-pw"
	bad := "redis://api_backend:" + pw + "%zz@127.0.0.1:1/0" // a stray % in the password
	entries := filepath.Join(t.TempDir(), "entries.json")
	if err := os.WriteFile(entries, []byte(`[{"key":"a","type":"string","value":"1"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
	}{
		{"REDIS_URL", map[string]string{"REDIS_URL": bad, "REDIS_REALTIME_URL": "redis://127.0.0.1:1/1"}, []string{"sizing", "--sample"}},
		{"REDIS_REALTIME_URL", map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_REALTIME_URL": bad}, []string{"sizing", "--sample"}},
		{"REDIS_URL", map[string]string{"REDIS_URL": bad, "HAN_ENV": "stage"},
			[]string{"project", "legacy-import", "--project", newProject(t), "--file", entries}},
		{"HAN_DB_EXEC_MODE", map[string]string{"HAN_DB_EXEC_MODE": "exec "}, []string{"migrate"}},
	} {
		out, err := run(t, tc.vars, tc.args...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.name+":") {
			t.Errorf("hanctl %v with %s unusable: %v, want an error naming %s\n%s", tc.args, tc.name, err, tc.name, out)
		} else if strings.Contains(err.Error(), pw) {
			t.Errorf("hanctl %v: the error prints the password: %q", tc.args, err)
		}
	}
}
